"""Cache layouts for many sequences, with llama.cpp's semantics (src/llama-kv-cache.cpp).

A layout has `n_stream` streams of `size` cells each, and per layer one K and one V store of
shape [n_stream, n_kv_heads, size, ...] in a cache format (kernels/formats/registry.py), as
llama.cpp's
`[n_embd_gqa, kv_size, n_stream]` tensors with `n_stream = unified ? 1 : n_seq_max`:
* per-stream: one stream per sequence (seq_to_stream[s] = s); a sequence only reads its own.
* unified: one stream; a cell records its position and the set of sequences holding it, so a
  shared prefix is stored once and referenced by every sequence that shares it.
Cells: pos (-1 = empty), a boolean sequence-membership row, and the token id whose K/V the
cell holds (the data identity; only a true common prefix shares token ids).
Slots are found from the stream's head, wrapping, gathering free cells that need not be
contiguous (llama.cpp's find_slot for decode); when fewer are free, CacheFullError.
Padding: a stream's size is rounded up to KV_PAD (llama.cpp requires kv_size % n_pad == 0),
and the extent attended over is n_kv = min(size, max(pad, round_up(last used cell + 1, pad)))
with pad = 256, as llama.cpp's get_n_kv pads it (max(n_pad, 256)) to keep graph shapes stable.
Mask: query (sequence s, position p) sees cell j < n_kv iff s holds j and pos[j] <= p.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvbench.kernels.formats.protocol import Format
from kvbench.kernels.stores.cache import ALL, KVStore

KV_PAD = 256
LAYOUT_KINDS = ("per-stream", "unified")


def pad_to(n: int, pad: int) -> int:
    return -(-n // pad) * pad


class CacheFullError(RuntimeError):
    """No room for a batch of tokens in a stream."""


class Cells:
    """One stream's cell metadata."""

    def __init__(self, size: int, n_seq_max: int):
        self.pos = np.full(size, -1, np.int64)  # -1 = empty
        self.seq = np.zeros((size, n_seq_max), bool)  # [cell, seq]: does seq hold the cell
        self.token = np.full(size, -1, np.int64)  # which token's K/V the cell stores
        self.head = 0
        self.used = 0
        self.peak_used = 0

    @property
    def size(self) -> int:
        return len(self.pos)

    def used_max_p1(self) -> int:
        used = np.flatnonzero(self.pos >= 0)
        return int(used[-1]) + 1 if used.size else 0

    def find_slot(self, n: int) -> np.ndarray:
        """n free cells, searched from the head and wrapping (not necessarily contiguous)."""
        if n > self.size:
            raise CacheFullError(f"{n} tokens do not fit in a stream of {self.size} cells")
        if self.head > self.used + 2 * n:  # llama.cpp: enough holes before the head, refill
            self.head = 0
        h = self.head
        if h + n <= self.size and not (self.pos[h : h + n] >= 0).any():
            return np.arange(h, h + n)  # the common case: free cells right at the head
        order = (np.arange(self.size) + h) % self.size
        free = order[self.pos[order] < 0][:n]
        if len(free) < n:
            raise CacheFullError(
                f"no slot for {n} tokens: {self.size - self.used} of {self.size} cells free"
            )
        return free

    def apply(self, idxs: np.ndarray, pos, seq_rows: np.ndarray, tokens) -> None:
        """Occupy cells idxs with positions pos, memberships seq_rows [n, n_seq_max], tokens."""
        assert (self.pos[idxs] < 0).all(), "apply to occupied cells"
        self.pos[idxs], self.seq[idxs], self.token[idxs] = pos, seq_rows, tokens
        self.used += len(idxs)
        self.peak_used = max(self.peak_used, self.used)
        self.head = int(idxs[-1]) + 1  # may equal size: the next search wraps

    def seq_rm(self, seq_id: int, p0: int = 0) -> int:
        """Drop seq_id from its cells at positions >= p0; free cells nobody holds any more.
        Returns the number of cells freed; the head moves back to the first one."""
        sel = self.seq[:, seq_id] & (self.pos >= p0)
        self.seq[sel, seq_id] = False
        freed = np.flatnonzero(sel & ~self.seq.any(axis=1))
        self.pos[freed], self.token[freed] = -1, -1
        self.used -= len(freed)
        if freed.size and freed[0] < self.head:
            self.head = int(freed[0])
        return len(freed)

    def seq_cells(self, seq_id: int) -> np.ndarray:
        """The cells seq_id holds, in position order."""
        idx = np.flatnonzero(self.seq[:, seq_id])
        return idx[np.argsort(self.pos[idx], kind="stable")]

    def n_kv(self, pad: int = KV_PAD) -> int:
        return min(self.size, max(pad, pad_to(self.used_max_p1(), pad)))

    def mask(self, seq_ids, q_pos, n_kv: int) -> np.ndarray:
        """bool [len(seq_ids), n_kv]: row i sees cells of seq_ids[i] at positions <= q_pos[i]."""
        pos = self.pos[:n_kv]
        mine = self.seq[:n_kv][:, list(seq_ids)].T  # [n_q, n_kv]
        return mine & (pos >= 0)[None, :] & (pos[None, :] <= np.asarray(q_pos)[:, None])


class Layout:
    """Cell metadata of a per-stream or unified layout (no K/V: see LayoutStore)."""

    def __init__(self, kind: str, n_seq_max: int, size: int, pad: int = KV_PAD):
        if kind not in LAYOUT_KINDS:
            raise ValueError(f"unknown layout {kind!r}; known: {', '.join(LAYOUT_KINDS)}")
        self.kind, self.n_seq_max, self.pad = kind, n_seq_max, pad
        self.size = pad_to(size, pad)
        n_stream = 1 if kind == "unified" else n_seq_max
        self.streams = [Cells(self.size, n_seq_max) for _ in range(n_stream)]

    @property
    def n_stream(self) -> int:
        return len(self.streams)

    def stream_of(self, seq_id: int) -> int:
        return 0 if self.kind == "unified" else seq_id

    def add(self, tokens: list[tuple[tuple[int, ...], int, int]]) -> list[list[tuple[int, int]]]:
        """One batch: tokens as (seq_ids, pos, token). A token held by several sequences takes
        one cell in each stream involved (unified: one cell). Returns, per token, its
        (stream, cell) slots."""
        per_stream: dict[int, list] = {}
        for i, (seq_ids, pos, tok) in enumerate(tokens):
            for st in sorted({self.stream_of(s) for s in seq_ids}):
                mine = [s for s in seq_ids if self.stream_of(s) == st]
                per_stream.setdefault(st, []).append((i, mine, pos, tok))
        slots: list[list[tuple[int, int]]] = [[] for _ in tokens]
        for st, items in per_stream.items():
            cells = self.streams[st]
            idxs = cells.find_slot(len(items))
            rows = np.zeros((len(items), self.n_seq_max), bool)
            for j, (_, mine, _, _) in enumerate(items):
                rows[j, mine] = True
            cells.apply(idxs, [it[2] for it in items], rows, [it[3] for it in items])
            for (i, *_), cell in zip(items, idxs):
                slots[i].append((st, int(cell)))
        return slots

    def remove(self, seq_id: int, p0: int = 0) -> int:
        return self.streams[self.stream_of(seq_id)].seq_rm(seq_id, p0)

    def seq_cells(self, seq_id: int) -> tuple[int, np.ndarray]:
        st = self.stream_of(seq_id)
        return st, self.streams[st].seq_cells(seq_id)

    def n_kv(self, streams=None) -> int:
        """The extent attended over by a call reading `streams` (all by default): the largest
        padded extent among them, as llama.cpp's get_n_kv."""
        ids = range(self.n_stream) if streams is None else streams
        return max(self.streams[s].n_kv(self.pad) for s in ids)

    def mask(self, groups, n_kv: int) -> np.ndarray:
        """bool [n_groups, 1, Lq, n_kv] for groups [(stream, seq_ids, q_pos)] of equal Lq."""
        return np.stack([self.streams[st].mask(s, p, n_kv) for st, s, p in groups])[:, None]

    @property
    def cells_alloc(self) -> int:
        return self.n_stream * self.size

    @property
    def cells_used(self) -> int:
        return sum(c.used for c in self.streams)

    @property
    def peak_used(self) -> int:
        return sum(c.peak_used for c in self.streams)


def cells_from_tokens(tokens: np.ndarray, tab: mx.array) -> mx.array:
    """[S, Hkv, L, D]: the K (or V) rows of table tab [1, Hkv, n_tokens, D] for token ids
    tokens [S, L] (-1: an empty cell, zeros)."""
    n_stream, size = tokens.shape
    idx = mx.array(np.where(tokens >= 0, tokens, tab.shape[2]).reshape(-1))
    zero = mx.zeros((*tab.shape[:2], 1, tab.shape[3]), dtype=tab.dtype)
    cells = mx.take(mx.concatenate([tab, zero], axis=2), idx, axis=2)
    cells = cells.reshape(tab.shape[1], n_stream, size, tab.shape[3])  # [Hkv, S, L, D]
    return cells.transpose(1, 0, 2, 3)  # [S, Hkv, L, D]


class LayoutStore(KVStore):
    """Per layer K and V stores [n_stream, n_kv_heads, size, ...] for a Layout, in fmt."""

    def __init__(self, layout: Layout, fmt: Format, n_layers: int, n_kv_heads: int, head_dim: int):
        super().__init__(fmt, n_layers, layout.n_stream, n_kv_heads, layout.size, head_dim)
        self.layout = layout

    def fill(self, k_tab: mx.array, v_tab: mx.array) -> None:
        """Write every occupied cell's token from tables [1, Hkv, n_tokens, D] into every layer
        (empty cells hold zeros)."""
        tokens = np.stack([c.token for c in self.layout.streams])  # [n_stream, size]
        full = [cells_from_tokens(tokens, tab) for tab in (k_tab, v_tab)]
        self.put_every_layer((ALL, ALL, ALL), *full)

    def write(self, layer: int, streams: mx.array, cells: mx.array, k, v) -> None:
        """Store token i's k, v [n, Hkv, D] at (streams[i], cells[i]) of `layer`, encoding on
        write: one scatter over all streams (llama.cpp's set_rows with global indices)."""
        self.put(layer, (streams, ALL, cells), k, v)


def per_stream_cells(n_seqs: int, ctx: int) -> int:
    """Cells (positions of one layer's K, per K/V head) of per-stream buffers: every sequence
    holds its own context_len positions."""
    return n_seqs * ctx


def unified_cells(n_seqs: int, ctx: int, prefix: int = 0) -> int:
    """Cells of one unified buffer: a shared prefix stored once, then each sequence's own
    tokens, padded to KV_PAD."""
    return pad_to(prefix + n_seqs * (ctx - prefix), KV_PAD)
