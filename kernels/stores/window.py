"""Sliding-window KV cache with attention sinks: a ring buffer per sequence (StreamingLLM;
mlx-lm's RotatingKVCache(max_size, keep); llama.cpp's SWA cache).

Visibility: the query at position q sees the first `sinks` positions and the last `window`
positions up to itself: {p <= q : p < sinks or p > q - window}.
Cells: `sinks` fixed cells (position p < sinks lives in cell p), then a ring of
`window + max_step - 1` cells: position p >= sinks lives in cell
sinks + (p - sinks) % ring. A write of n <= max_step tokens at q0..q0+n-1 overwrites
positions <= q0 + n - 1 - ring <= q0 - window, which no query of the step sees (the first one,
q0, needs positions > q0 - window). A ring of only `window` cells would lose keys the early
queries of a multi-token step still need (mlx-lm#1914 grew its cache to max_size + S - 1 for
this reason; llama.cpp sizes its SWA cache n_swa + n_ubatch).
So the cache's bytes are bounded by sinks + window + max_step - 1 cells per sequence, whatever
the context. Every sequence of a batch has the same length here, so one Ring serves them all.
"""

from __future__ import annotations

import numpy as np


class Ring:
    """Cell metadata of a sinks + ring buffer: which position each cell holds."""

    def __init__(self, window: int, sinks: int = 0, max_step: int = 1):
        if window < 1 or sinks < 0 or max_step < 1:
            raise ValueError(f"window {window}, sinks {sinks}, max_step {max_step}: out of range")
        self.window, self.sinks, self.max_step = window, sinks, max_step
        self.ring = window + max_step - 1
        self.pos = np.full(sinks + self.ring, -1, np.int64)  # -1 = empty
        self.next = 0  # the next position to write

    @property
    def size(self) -> int:
        return len(self.pos)

    def cell_of(self, p: int) -> int:
        return p if p < self.sinks else self.sinks + (p - self.sinks) % self.ring

    def write(self, n: int) -> np.ndarray:
        """Positions next..next+n-1 go into their cells; returns the cells, in position order."""
        if not 1 <= n <= self.max_step:
            raise ValueError(f"a step of {n} tokens; this ring takes 1 to {self.max_step}")
        cells = np.array([self.cell_of(p) for p in range(self.next, self.next + n)])
        self.pos[cells] = np.arange(self.next, self.next + n)
        self.next += n
        return cells

    def visible(self, q: int) -> np.ndarray:
        """Positions the query at q sees, ascending (the definition, not the cells)."""
        sinks = np.arange(min(self.sinks, q + 1))
        recent = np.arange(max(self.sinks, q - self.window + 1), q + 1)
        return np.concatenate([sinks, recent])

    def mask(self, q_positions) -> np.ndarray:
        """bool [n_q, size]: query i sees cell j iff the cell's position is visible from it."""
        pos, q = self.pos[None, :], np.asarray(q_positions)[:, None]
        near = (pos < self.sinks) | (pos > q - self.window)
        return (pos >= 0) & (pos <= q) & near

    def held(self) -> int:
        """Cells holding a position."""
        return int((self.pos >= 0).sum())


def window_cells(n_seqs: int, window: int, sinks: int = 0) -> int:
    """Cells of n_seqs rings of `window` positions after `sinks` fixed ones (decode: max_step 1),
    whatever the context: the ring is allocated whole."""
    return n_seqs * (sinks + window)
