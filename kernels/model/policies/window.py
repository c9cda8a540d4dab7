"""window: StreamingLLM (Xiao et al. 2023, arXiv:2309.17453): the first `sinks` positions
(attention sinks) and the most recent ones, as kvpress's StreamingLLMPress scores them
(kvpress/presses/streaming_llm_press.py: n_pruned = n - int(n * (1 - ratio)) positions right
after the n_sink sinks are dropped). A decode policy: after every decode step the oldest
non-sink position goes, the budget fixed at the context's. The sliding-window layer
(kernels/model/cache.py WindowCache) keeps the same set at every write: `sees` is its rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvbench.kernels.model.policies.common import Budget
from kvbench.kernels.model.protocol import Observation


def sees(positions: np.ndarray, q_positions, sinks: int, window: int) -> np.ndarray:
    """bool [n_q, m]: query q sees a held position p (>= 0) iff p <= q and p is a sink or one
    of the last `window` positions up to q (StreamingLLM; mlx-lm's RotatingKVCache)."""
    pos, q = np.asarray(positions)[None, :], np.asarray(q_positions)[:, None]
    near = (pos < sinks) | (pos > q - window)
    return (pos >= 0) & (pos <= q) & near


@dataclass
class Window:
    budget: Budget
    sinks: int = 4  # kvpress StreamingLLMPress n_sink
    name: str = "window"
    decode: bool = True
    kept: dict = field(default_factory=dict)  # layer -> tokens kept (fixed at the context's)

    def observe(self, obs: Observation) -> None:
        return None

    def select(self, obs: Observation) -> np.ndarray:
        n = self.kept.setdefault(obs.layer, self.budget.kept(obs.n_positions))
        if n < self.sinks:
            raise ValueError(f"budget {n} tokens: smaller than the {self.sinks} sinks")
        pos = obs.positions
        recent = n - self.sinks  # the newest positions after the sinks
        newest = (
            np.sort(np.where(pos >= self.sinks, pos, -1), axis=-1)[:, -recent:] if recent else None
        )
        cut = newest[:, :1] if recent else np.full((pos.shape[0], 1), np.iinfo(np.int64).max)
        return (pos >= 0) & ((pos < self.sinks) | (pos >= cut))

    def state_bytes(self) -> int:
        return 0
