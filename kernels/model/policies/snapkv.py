"""snapkv: SnapKV (Li et al. 2024, arXiv:2404.14469), as kvpress's SnapKVPress computes it
(kvpress/presses/snapkv_press.py): the last `window` queries of the context attend over every
context position (softmax in float32, causal); each earlier position's score is the mean of
that attention over the window's queries, smoothed by an average pool of `kernel_size`
(padding kernel_size // 2, the padding counted, as F.avg_pool1d), then averaged over each KV
head's query heads (GQA); the window's own positions score max + 1 (always kept). Once, at
the end of the context's prefill; the context must be longer than the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from kvbench.kernels.model.policies.common import Budget, Tail, attention, group_mean, pad_max, top
from kvbench.kernels.model.protocol import Observation


def pool(x: mx.array, kernel_size: int) -> mx.array:
    """Average pool over the last axis, stride 1, zero padding kernel_size // 2 counted in
    every mean (F.avg_pool1d's count_include_pad): the same length for an odd kernel."""
    p = kernel_size // 2
    xp = mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(p, p)])
    n = xp.shape[-1] - kernel_size + 1
    return sum(xp[..., i : i + n] for i in range(kernel_size)) / kernel_size


def scores(obs: Observation, q: mx.array, q_start: int, window: int, kernel_size: int):
    """float32 [Hkv, m] for cells in position order (the context, nothing evicted yet)."""
    m = obs.k.shape[2]
    if m <= window:
        raise ValueError(f"snapkv: context of {m} tokens, not longer than window {window}")
    attn = attention(q, q_start, obs)[..., : m - window]  # [1, Hq, w, m - w]
    s = pool(attn.mean(axis=-2), kernel_size)  # [1, Hq, m - w]
    s = group_mean(s, obs.k.shape[1])  # [1, Hkv, m - w]
    return pad_max(s, window)[0]


@dataclass
class SnapKV:
    budget: Budget
    window: int = 64  # kvpress window_size
    kernel_size: int = 5
    name: str = "snapkv"
    decode: bool = False
    tail: Tail = field(default=None)

    def __post_init__(self):
        self.tail = Tail(self.window)

    def observe(self, obs: Observation) -> None:
        self.tail.add(obs)

    def score(self, obs: Observation) -> mx.array:
        q, start = self.tail.of(obs.layer)
        return scores(obs, q, start, self.window, self.kernel_size)

    def select(self, obs: Observation) -> np.ndarray:
        return top(self.score(obs), self.budget.kept(obs.n_positions))

    def state_bytes(self) -> int:
        return 0
