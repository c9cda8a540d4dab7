"""tova: TOVA (Oren et al. 2024, "Transformers are Multi-State RNNs", arXiv:2401.06104), as
kvpress's TOVAPress scores it (kvpress/presses/tova_press.py): the last query's attention
(softmax over every held position, float32) averaged over all query heads, the same score for
every KV head; the newest position scores max + 1 (kept). A decode policy, as the paper's
cache: after every decode step the lowest-scored position goes, the budget fixed at the
context's (kvpress compresses at the end of the context only: the prefill's selection is the
one held against it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from kvbench.kernels.model.policies.common import Budget, attention, pad_max, top
from kvbench.kernels.model.protocol import Observation


def scores(obs: Observation) -> mx.array:
    """float32 [Hkv, m]: cells in position order within each head, the newest last (every
    head holds the same positions: TOVA's selection is shared)."""
    attn = attention(obs.q[:, :, -1:], obs.n_positions - 1, obs)[:, :, 0, :-1]  # [1, Hq, m-1]
    s = attn.mean(axis=1)  # [1, m - 1]
    s = mx.broadcast_to(s, (obs.k.shape[1], s.shape[-1]))  # [Hkv, m - 1]
    return pad_max(s, 1)


@dataclass
class TOVA:
    budget: Budget
    name: str = "tova"
    decode: bool = True
    kept: dict = field(default_factory=dict)  # layer -> tokens kept (fixed at the context's)

    def observe(self, obs: Observation) -> None:
        return None

    def score(self, obs: Observation) -> mx.array:
        return scores(obs)

    def select(self, obs: Observation) -> np.ndarray:
        n = self.kept.setdefault(obs.layer, self.budget.kept(obs.n_positions))
        return top(scores(obs), n)

    def state_bytes(self) -> int:
        return 0
