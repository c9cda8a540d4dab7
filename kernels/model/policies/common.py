"""What the policies share: the budget in tokens, the selection of the top-scored cells, and the
attention weights a query pays to the held cells.

Budgets as kvpress sets them (kvpress/presses/scorer_press.py, 0.5.x): `compression_ratio` is
the fraction of the context's positions removed, n_kept = int(n * (1 - compression_ratio)) in
Python float arithmetic; or `kv_budget`, the tokens kept. Scores are float32, higher is kept;
ties go to the lower cell (a stable sort), where torch.topk leaves the order unspecified.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from kvbench.kernels.model.protocol import Observation


@dataclass(frozen=True)
class Budget:
    compression_ratio: float | None = None  # fraction of the context's positions removed
    kv_budget: int | None = None  # or: tokens kept per layer and KV head

    def __post_init__(self):
        if (self.compression_ratio is None) == (self.kv_budget is None):
            raise ValueError("set one of compression_ratio and kv_budget")
        if self.compression_ratio is not None and not 0 <= self.compression_ratio < 1:
            raise ValueError(f"compression_ratio {self.compression_ratio}: must be in [0, 1)")
        if self.kv_budget is not None and self.kv_budget < 1:
            raise ValueError(f"kv_budget {self.kv_budget}: must be >= 1")

    def kept(self, n: int) -> int:
        """Tokens kept of a context of n (kvpress's ScorerPress.compress rounding)."""
        if self.kv_budget is not None:
            if self.kv_budget > n:
                raise ValueError(f"kv_budget {self.kv_budget}: larger than the context ({n})")
            return self.kv_budget
        return int(n * (1 - self.compression_ratio))


def top(scores: mx.array | np.ndarray, n_kept) -> np.ndarray:
    """bool [H, m]: each head's n_kept highest-scored cells (n_kept an int or one per head);
    equal scores: the lower cell first."""
    s = np.asarray(scores, dtype=np.float32)
    order = np.argsort(-s, axis=-1, kind="stable")  # [H, m]
    counts = np.broadcast_to(np.asarray(n_kept), (s.shape[0],))
    keep = np.zeros(s.shape, dtype=bool)
    for h, c in enumerate(counts):
        keep[h, order[h, : int(c)]] = True
    return keep


def visible(positions: np.ndarray, q_positions: np.ndarray) -> mx.array:
    """bool [1, Hkv, nq, m]: the cells each query sees (held, at or before it)."""
    pos, q = positions[:, None, :], np.asarray(q_positions)[None, :, None]
    return mx.array(((pos >= 0) & (pos <= q))[None])


def attention(q: mx.array, q_start: int, obs: Observation) -> mx.array:
    """float32 [1, Hq, nq, m]: softmax(q k / sqrt(D)) of queries q [1, Hq, nq, D] (positions
    q_start..) over obs's held cells (kvpress scales by 1 / sqrt(head_dim) whatever the model's
    own scale), each query seeing the cells at or before its position."""
    group = q.shape[1] // obs.k.shape[1]
    k = mx.repeat(obs.k, group, axis=1)  # [1, Hq, m, D]
    scores = (q @ k.swapaxes(-1, -2)) / math.sqrt(q.shape[-1])
    qpos = np.arange(q_start, q_start + q.shape[2])
    mask = mx.repeat(visible(obs.positions, qpos), group, axis=1)
    return mx.softmax(mx.where(mask, scores, -mx.inf), axis=-1)


@dataclass
class Tail:
    """The last n queries of each layer seen so far (passes joined), with their first
    position: what SnapKV's observation window and TOVA's last query read."""

    n: int
    held: dict = field(default_factory=dict)  # layer -> (q [1, Hq, <=n, D], first position)

    def add(self, obs: Observation) -> None:
        q, start = obs.q, obs.q_start
        if obs.layer in self.held and q.shape[2] < self.n:
            prev, _ = self.held[obs.layer]
            q = mx.concatenate([prev, q], axis=2)
        q = mx.contiguous(q[:, :, -self.n :])  # a copy: a slice would hold the whole pass
        self.held[obs.layer] = (q, obs.n_positions - q.shape[2])
        del start

    def of(self, layer: int) -> tuple[mx.array, int]:
        return self.held[layer]


def group_mean(x: mx.array, n_kv_heads: int) -> mx.array:
    """[1, Hq, ...] -> [1, Hkv, ...]: the mean over each KV head's query heads (GQA, as kvpress
    views scores [B, Hkv, groups, n] and takes mean(2))."""
    b, hq = x.shape[:2]
    return x.reshape(b, n_kv_heads, hq // n_kv_heads, *x.shape[2:]).mean(axis=2)


def pad_max(scores: mx.array, n: int, left: bool = False) -> mx.array:
    """scores [.., m] with n cells appended (prepended with left) scored max + 1: always kept
    (kvpress's F.pad(scores, .., value=scores.max().item() + 1))."""
    fill = mx.full((*scores.shape[:-1], n), scores.max().item() + 1, dtype=scores.dtype)
    return mx.concatenate([fill, scores] if left else [scores, fill], axis=-1)
