"""adakv: Ada-KV (Feng et al. 2024, arXiv:2407.11550), head-adaptive budgets over any scorer,
as kvpress's AdaKVPress selects (kvpress/presses/adakv_press.py): n_kept = int(n (1 - ratio))
per head on average; each head first keeps its int(n_kept * alpha) best cells (the safeguard),
then the Hkv * (n - n_kept) lowest scores over all heads of the layer together are removed, so
heads whose scores concentrate keep fewer cells and the others more. Once, at the end of the
context's prefill; per-head counts differ (rows record them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvbench.kernels.model.policies.common import Budget, top
from kvbench.kernels.model.protocol import Observation


def select(scores: np.ndarray, n_kept: int, alpha: float) -> np.ndarray:
    """bool [H, m] from float32 scores [H, m]."""
    h, m = scores.shape
    s = np.array(scores, dtype=np.float32)
    safe = top(s, int(n_kept * alpha))
    s[safe] = np.finfo(np.float32).max
    flat = np.argsort(s.reshape(-1), kind="stable")[: h * (m - n_kept)]  # the lowest, removed
    keep = np.ones(h * m, dtype=bool)
    keep[flat] = False
    return keep.reshape(h, m)


@dataclass
class AdaKV:
    budget: Budget
    scorer: object  # a policy with score(obs) -> [Hkv, m]
    alpha: float = 0.20  # kvpress alpha_safeguard
    name: str = "adakv"
    decode: bool = False

    def observe(self, obs: Observation) -> None:
        self.scorer.observe(obs)

    def select(self, obs: Observation) -> np.ndarray:
        s = np.array(self.scorer.score(obs), dtype=np.float32)
        return select(s, self.budget.kept(obs.n_positions), self.alpha)

    def state_bytes(self) -> int:
        return 0
