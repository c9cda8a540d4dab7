"""The residency gate: the full cache is really there when it is measured.

Beside the parity gate (engines/parity.py), which proves a kernel computes the right thing, this
gate proves the bytes exist. MLX hands back the update itself when a slice update covers a whole
array, so a store can hold n_layers references to one buffer while its byte model counts
n_layers buffers (docs: DESIGN.md, traps). Two measurements, both from MLX itself:
* resident bytes: active memory above the case's baseline (taken before the cache existed);
* shared storage: two of the cache's arrays whose data overlap in memory (each array's data
  pointer and length, read through the buffer protocol; on MLX's CPU and unified-memory backends
  that is the buffer itself), or one array object listed for two places.
A case whose resident bytes fall short of the bytes its cache's arrays declare, by more than
RESIDENT_TOL, or whose arrays share storage, fails the gate: an error row, never a time.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvbench.engines.contract import active_above

# resident bytes may fall short of the declared bytes by this fraction before the gate fails:
# MLX's allocator never rounds an allocation down, so an honest cache is at or above its bytes;
# the slack only absorbs a measurement taken while a small temporary was being freed
RESIDENT_TOL = 0.01


class ResidencyError(RuntimeError):
    """The cache is not resident as declared: the case gets an error row."""


def declared_bytes(arrays: list[mx.array]) -> int:
    """The bytes the cache's arrays declare (each array object once)."""
    unique = {id(a): a for a in arrays}
    return sum(a.nbytes for a in unique.values())


def resident_bytes(baseline: int) -> int:
    """Active memory above `baseline`, after everything queued has run."""
    return active_above(baseline)


def _span(a: mx.array) -> tuple[int, int] | None:
    """(first byte address, one past the last) of a's data; None where it cannot be read."""
    try:
        view = memoryview(a if a.dtype != mx.bfloat16 else a.view(mx.uint16))
        start = np.asarray(view).__array_interface__["data"][0]
    except (TypeError, ValueError, RuntimeError):
        return None
    return start, start + a.nbytes


def shared_pairs(arrays: list[mx.array]) -> int | None:
    """How many pairs of the cache's arrays share storage: one array object listed again (the
    same buffer standing for two layers) and distinct objects that overlap in memory; None
    where a pointer cannot be read (a backend whose buffers the buffer protocol copies)."""
    unique = list({id(a): a for a in arrays}.values())
    repeats = len(arrays) - len(unique)  # [a] * 8 declares one buffer for eight places
    mx.eval(unique)
    spans = [_span(a) for a in unique]
    if any(s is None for s in spans):
        return repeats or None
    spans.sort()
    pairs = repeats
    for i, (_, end) in enumerate(spans):
        for other_start, _ in spans[i + 1 :]:
            if other_start >= end:
                break
            pairs += 1
    return pairs


def measure(arrays: list[mx.array], baseline: int) -> dict:
    """The residency of a cache: its declared bytes, resident bytes and shared pairs."""
    shared = shared_pairs(arrays)  # evaluates the arrays first
    return {
        "declared": declared_bytes(arrays),
        "resident": resident_bytes(baseline),
        "shared": shared,
    }


def residency_gate(m: dict, when: str) -> None:
    """Raise ResidencyError when the measured residency `m` (measure()) falls short."""
    floor = m["declared"] * (1 - RESIDENT_TOL)
    if m["resident"] < floor:
        raise ResidencyError(
            f"cache not resident {when}: {m['resident']} bytes above the baseline, "
            f"short of the {m['declared']} bytes its arrays declare by "
            f"{m['declared'] - m['resident']} (tolerance {RESIDENT_TOL:.0%})"
        )
    if m["shared"]:
        pairs = m["shared"]
        raise ResidencyError(f"cache not resident {when}: {pairs} pairs of arrays share storage")


def check(cache, baseline: int | None, when: str) -> dict | None:
    """Measure and gate a State's cache (`cache`: its arrays' callable); None where there is no
    MLX cache or baseline to measure against (torch and numpy peers, llama.cpp)."""
    if cache is None or baseline is None:
        return None
    m = measure(cache(), baseline)
    residency_gate(m, when)
    return m


def row_fields(filled: dict | None, ended: dict | None) -> dict:
    """The row's residency columns from the measurements after the fill and after the stages."""
    if filled is None or ended is None:
        return {}
    return {
        "cache_bytes": filled["declared"],
        "resident_bytes": filled["resident"],
        "resident_end_bytes": ended["resident"],
    }


def worst(prior: dict, new: dict) -> dict:
    """Over rounds, each resident figure at its lowest (the one a gate would fail first)."""
    if not prior:
        return new
    return {k: min(prior[k], new[k]) if k.startswith("resident") else new[k] for k in new}
