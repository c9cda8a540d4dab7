"""h2o: Heavy-Hitter Oracle (Zhang et al. 2023, arXiv:2306.14048): each position's attention
accumulated over every query that saw it (summed over a KV head's query heads; the prefill's
queries, then every decode step's), and the cache keeps the most recent `recent` share of the
budget plus the heaviest of the rest (the paper's heavy + recent split, half and half by
default). A decode policy: after every decode step it selects again, the budget fixed at the
context's. kvpress has no H2O press (its ObservedAttentionPress averages instead of summing
and never evicts while decoding), so no kvpress agreement is claimed for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvbench.kernels.model.policies.common import Budget, attention, group_mean, top
from kvbench.kernels.model.protocol import Observation


@dataclass
class H2O:
    budget: Budget
    recent_share: float = 0.5  # of the budget kept for the newest positions
    name: str = "h2o"
    decode: bool = True
    kept: dict = field(default_factory=dict)  # layer -> tokens kept (fixed at the context's)
    acc: dict = field(default_factory=dict)  # layer -> float32 [Hkv, positions] accumulated

    def observe(self, obs: Observation) -> None:
        attn = group_mean(attention(obs.q, obs.q_start, obs), obs.k.shape[1])
        got = np.array(attn[0].sum(axis=1), dtype=np.float32) * (obs.q.shape[1] // obs.k.shape[1])
        acc = self.acc.get(obs.layer)
        need = obs.n_positions
        if acc is None or acc.shape[1] < need:
            grown = np.zeros(
                (got.shape[0], max(need, 2 * (0 if acc is None else acc.shape[1]))), np.float32
            )
            if acc is not None:
                grown[:, : acc.shape[1]] = acc
            acc = self.acc[obs.layer] = grown
        pos = obs.positions
        rows = np.arange(pos.shape[0])[:, None]
        np.add.at(acc, (np.broadcast_to(rows, pos.shape)[pos >= 0], pos[pos >= 0]), got[pos >= 0])

    def select(self, obs: Observation) -> np.ndarray:
        n = self.kept.setdefault(obs.layer, self.budget.kept(obs.n_positions))
        pos = obs.positions
        n_recent = int(n * self.recent_share)
        newest = np.sort(pos, axis=-1)[:, -n_recent:][:, :1] if n_recent else None
        recent = (pos >= newest) if n_recent else np.zeros(pos.shape, bool)
        acc = self.acc[obs.layer]
        s = np.where(pos >= 0, acc[np.arange(pos.shape[0])[:, None], np.maximum(pos, 0)], -np.inf)
        s = np.where(recent, np.inf, s)
        return top(s, n) & (pos >= 0)

    def state_bytes(self) -> int:
        """One float32 accumulated score per kept cell and KV head."""
        return sum(
            4 * n * a.shape[0] for n, a in ((self.kept.get(k, 0), a) for k, a in self.acc.items())
        )
