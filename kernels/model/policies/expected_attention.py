"""expected_attention: kvpress's Expected Attention (Devoto et al. 2025, arXiv:2510.00636;
kvpress/presses/expected_attention_press.py, ExpectedAttentionPress): from the mean mu and the
covariance S of the context's queries before RoPE (positions n_sink.., S centred and divided
by their count), both carried to the next `n_future` positions by the mean RoPE rotation
R = mean_p R(p), p = n .. n + n_future - 1 (mu R^T, R S R^T), each key's expected attention
score k.mu / sqrt(D) + k S k^T / (2 D), softmax over the positions after the sinks, averaged
over each KV head's query heads (GQA), times ||v||_2; the n_sink sinks score max + 1. Once, at
the end of the context's prefill.

The queries before RoPE are the pass's queries rotated back by their own positions (R(-p) =
F R(p) F, F negating the rotated pair's second member), through the layer's own RoPE module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from kvbench.kernels.model.policies.common import Budget, group_mean, pad_max, top
from kvbench.kernels.model.protocol import Observation


def flip(rope, d: int) -> mx.array:
    """F [D]: -1 on the second member of each rotated pair (traditional: odd channels of the
    rotated dims; else the second half of them), 1 elsewhere."""
    dims = getattr(rope, "dims", d)
    f = np.ones(d, np.float32)
    if getattr(rope, "traditional", False):
        f[1:dims:2] = -1
    else:
        f[dims // 2 : dims] = -1
    return mx.array(f)


def unrope(rope, q: mx.array, start: int) -> mx.array:
    """q [1, H, n, D] after RoPE at positions start.. -> before RoPE."""
    f = flip(rope, q.shape[-1])
    return rope(q * f, start) * f


def mean_rotation(rope, d: int, start: int, n_future: int) -> mx.array:
    """R [D, D] = mean over p in start..start+n_future-1 of RoPE's rotation at p."""
    eye = mx.broadcast_to(mx.eye(d)[:, None, :], (d, n_future, d))[None]  # [1, D(j), P, D]
    cols = rope(eye, start).mean(axis=2)[0]  # [D(j), D]: R e_j
    return cols.T


def scores(obs: Observation, q_pre: mx.array, n_sink: int, n_future: int) -> mx.array:
    """float32 [Hkv, m]; q_pre [1, Hq, n, D] the context's queries before RoPE."""
    n, d = obs.n_positions, obs.k.shape[-1]
    q = q_pre[:, :, n_sink:]
    mu = q.mean(axis=2, keepdims=True)  # [1, Hq, 1, D]
    c = q - mu
    cov = (c.swapaxes(-1, -2) @ c) / q.shape[2]  # [1, Hq, D, D]
    r = mean_rotation(obs.rope, d, n, n_future)
    mu = mu[:, :, 0] @ r.T  # [1, Hq, D]
    cov = r @ cov @ r.T
    group = q.shape[1] // obs.k.shape[1]
    k = mx.repeat(obs.k[:, :, n_sink:], group, axis=1)  # [1, Hq, m', D]
    s = (k @ mu[..., None])[..., 0] / math.sqrt(d)
    s = s + ((k @ cov) * k).sum(axis=-1) / d / 2
    s = group_mean(mx.softmax(s, axis=-1), obs.k.shape[1])  # [1, Hkv, m']
    s = s * mx.linalg.norm(obs.v[:, :, n_sink:], axis=-1)
    return pad_max(s, n_sink, left=True)[0]


@dataclass
class ExpectedAttention:
    budget: Budget
    n_sink: int = 4  # kvpress defaults: n_sink 4, n_future_positions 512
    n_future: int = 512
    name: str = "expected_attention"
    decode: bool = False
    queries: dict = field(default_factory=dict)  # layer -> [q before RoPE [1, Hq, n, D], ...]

    def observe(self, obs: Observation) -> None:
        if obs.rope is None:
            raise ValueError("expected_attention needs the layer's RoPE (a model cache)")
        self.queries.setdefault(obs.layer, []).append(unrope(obs.rope, obs.q, obs.q_start))

    def score(self, obs: Observation) -> mx.array:
        if obs.k.shape[2] <= self.n_sink:
            raise ValueError(f"expected_attention: context of {obs.k.shape[2]} tokens, not "
                             f"longer than n_sink {self.n_sink}")  # fmt: skip
        q_pre = mx.concatenate(self.queries.pop(obs.layer), axis=2)
        return scores(obs, q_pre, self.n_sink, self.n_future)

    def select(self, obs: Observation) -> np.ndarray:
        return top(self.score(obs), self.budget.kept(obs.n_positions))

    def state_bytes(self) -> int:
        return 0
