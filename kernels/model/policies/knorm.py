"""knorm: keep the keys of smallest L2 norm (Devoto et al. 2024, "A Simple and Effective L2
Norm-Based Strategy for KV Cache Compression", arXiv:2406.11430): kvpress's KnormPress scores
a cell -||k||_2 (kvpress/presses/knorm_press.py), so the highest scores are the smallest norms.
Once, at the end of the context's prefill."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvbench.kernels.model.policies.common import Budget, top
from kvbench.kernels.model.protocol import Observation


def scores(obs: Observation) -> mx.array:
    """float32 [Hkv, m]: -||k|| per held cell."""
    return -mx.linalg.norm(obs.k[0], axis=-1)


@dataclass
class Knorm:
    budget: Budget
    name: str = "knorm"
    decode: bool = False

    def observe(self, obs: Observation) -> None:
        return None

    def score(self, obs: Observation) -> mx.array:
        return scores(obs)

    def select(self, obs: Observation) -> np.ndarray:
        return top(scores(obs), self.budget.kept(obs.n_positions))

    def state_bytes(self) -> int:
        return 0
