"""What a model phase's evidence cost: wall seconds, and tokens through the model in batches
(prefill) and one at a time (decode), each with its seconds.

The run loop (prefill micro-batches, decode steps) reports every evaluated forward pass to
`add`, which credits each meter open at the time (`metered`). A pass is timed from the call
that builds its graph to the end of the `mx.eval` that computes it (MLX is lazy: the work
happens in the eval, which returns when it is done), with time.perf_counter. A meter's wall
time runs from entering `metered` to leaving it, so it also holds what no pass holds (scoring,
tokenizing, building caches). The row fields (`fields`) are Record columns (store/schema.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

KINDS = ("prefill", "decode")  # batched passes, single-token steps


@dataclass
class Meter:
    tokens: dict
    seconds: dict
    wall_s: float = 0.0

    def fields(self) -> dict:
        """The row fields: wall_s and, per kind, its tokens, seconds and tokens per second
        (None where the phase ran no pass of that kind)."""
        out: dict = {"wall_s": self.wall_s}
        for kind in KINDS:
            n, s = self.tokens[kind], self.seconds[kind]
            out[f"{kind}_tokens"] = n
            out[f"{kind}_s"] = s if n else None
            out[f"{kind}_tokens_per_s"] = n / s if n and s > 0 else None
        return out


_OPEN: list[Meter] = []


@contextmanager
def metered() -> Iterator[Meter]:
    """A meter credited with every pass run until the block ends; its wall time is the
    block's."""
    m = Meter(dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0.0))
    _OPEN.append(m)
    t0 = time.perf_counter()
    try:
        yield m
    finally:
        m.wall_s = time.perf_counter() - t0
        _OPEN.remove(m)


def add(kind: str, tokens: int, seconds: float) -> None:
    """Credit one evaluated pass (`kind` of KINDS) to every open meter."""
    if kind not in KINDS:
        raise ValueError(f"meter: unknown pass kind {kind!r} (one of {', '.join(KINDS)})")
    for m in _OPEN:
        m.tokens[kind] += tokens
        m.seconds[kind] += seconds


@contextmanager
def timed(kind: str, tokens: int) -> Iterator[None]:
    """Credit the block (build a pass's graph and evaluate it) as one pass of `tokens`."""
    t0 = time.perf_counter()
    yield
    add(kind, tokens, time.perf_counter() - t0)
