"""Many sequences through one model cache: a real model's K/V in the layout stores.

The cache holds every layer's K and V in kernels/stores/layouts.py's LayoutStore, [n_stream,
Hkv, size, ...] in one plain format (rotation and key order as PlainCache's), with llama.cpp's
cell semantics: per-stream (a stream per sequence, n_stream = n_seqs) or unified (one stream
whose cells record which sequences hold them). Before each forward pass `plan(rows, tokens)`
says which sequences each batch row carries (llama_batch's seq_id lists); without one, batch row
b is sequence b. A row carrying several sequences is a prompt they share, stored once in a
unified stream and once in each sequence's stream per-stream (llama-batched-bench -pps: the
prompt decoded once, then llama_memory_seq_cp). Every row of a pass is at the same positions
offset..offset+n-1 (mlx-lm's RoPE reads one offset): equal-length prompts, then one token a
sequence a step.

Attention (read): per-stream, the rows read their own streams as a batch, each with its stream's
mask; unified, every row's queries become query rows of one call over the shared stream (a
llama.cpp ubatch), the mask of each row being its sequence's cells at positions up to the
query's. The extent read is llama.cpp's padded n_kv (KV_PAD cells), so masked cells are read and
count in the bytes a step moves, as they do in llama.cpp.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvbench.kernels.model.cache import LayerFormats, attend_kernel, check_kernel, stored_basis
from kvbench.kernels.stores.cache import ALL
from kvbench.kernels.stores.layouts import Layout, LayoutStore


class SeqCache:
    """A PartedCache (kernels/model/protocol.py) for many sequences over a Layout."""

    def __init__(self, spec, config, layout: Layout, kernel: str, tile_kv=None):
        if not spec.plain:
            raise ValueError(f"many sequences store one plain format; {spec.label} is not")
        if any(getattr(config, "windows", None) or ()):
            raise ValueError("sliding-window layers (Gemma's rings) hold one sequence")
        self.formats = LayerFormats(spec, config.n_layers)
        self.fmt = self.formats.read
        check_kernel(kernel, self.fmt)
        h, d = config.n_kv_heads, config.head_dim
        self.layout = layout
        self.store = LayoutStore(layout, self.fmt, config.n_layers, h, d)
        self.kernel, self.tile_kv, self.offset = kernel, tile_kv, 0
        self.rot, self.spec = spec.rot(d), spec
        self.rows: list[tuple[int, ...]] = []
        self.index: tuple = ()  # (token rows, streams, cells) of the planned pass's writes
        self._geometry: tuple | None = None  # (n_kv, mask, streams) of the planned pass

    def plan(self, rows: list[tuple[int, ...]], tokens: np.ndarray) -> None:
        """The next pass: batch row b carries sequences rows[b] and tokens[b] [n] at positions
        offset..offset+n-1; finds each token's cells (find_slot), one per stream involved."""
        tokens = np.asarray(tokens).reshape(len(rows), -1)  # [B, n]
        n = tokens.shape[1]
        items = [(tuple(r), self.offset + t, int(tokens[b, t])) for b, r in enumerate(rows)
                 for t in range(n)]  # fmt: skip
        slots = self.layout.add(items)  # per token (b-major), its (stream, cell) pairs
        src = [i for i, pairs in enumerate(slots) for _ in pairs]
        streams = [st for pairs in slots for st, _ in pairs]
        cells = [c for pairs in slots for _, c in pairs]
        self.rows = [tuple(r) for r in rows]
        self.index = (mx.array(src), mx.array(streams), mx.array(cells))
        self._geometry = None

    def attend(self, layer: int, q, k, v, scale: float) -> mx.array:
        self.write(layer, k, v)
        return self.read(layer, q, scale)

    def write(self, layer: int, k, v) -> None:
        """The pass's k, v [B, Hkv, n, D] into the planned cells (rotated, encoded on write)."""
        b, h, n, d = k.shape
        if not self.rows:  # no plan: batch row b is sequence b, its tokens unknown (-1)
            self.plan([(s,) for s in range(b)], np.full((b, n), -1))
        k, v = stored_basis(self.spec, self.rot, k, v)
        src, streams, cells = self.index
        flat = lambda x: x.transpose(0, 2, 1, 3).reshape(b * n, h, d)[src]  # noqa: E731  [T, Hkv, D]
        parts = self.formats.encode(layer, flat(k), flat(v))
        self.store.put_encoded(layer, (streams, ALL, cells), *parts)

    def geometry(self, n: int) -> tuple:
        """(n_kv, mask, streams read) of the planned pass of n tokens a row, the same for every
        layer, so built once a pass (a host-built mask, as llama.cpp's kq_mask): unified, bool
        [1, 1, B*n, n_kv] over stream 0; per-stream, [B, 1, n, n_kv] over each row's stream
        (None: every stream in order)."""
        if self._geometry is not None:
            return self._geometry
        q_pos = list(range(self.offset, self.offset + n))
        first = [r[0] for r in self.rows]
        if self.layout.kind == "unified":
            n_kv, cells = self.layout.n_kv(), self.layout.streams[0]
            mask = np.concatenate([cells.mask([s] * n, q_pos, n_kv) for s in first])[None, None]
            self._geometry = (n_kv, mx.array(mask), slice(0, 1))
            return self._geometry
        sts = [self.layout.stream_of(s) for s in first]
        n_kv = self.layout.n_kv(sts)
        mask = self.layout.mask([(st, [s] * n, q_pos) for st, s in zip(sts, first)], n_kv)
        order = None if sts == list(range(self.layout.n_stream)) else mx.array(sts)
        self._geometry = (n_kv, mx.array(mask), order)
        return self._geometry

    def read(self, layer: int, q, scale: float) -> mx.array:
        """Attention of q [B, Hq, n, D] (row b: its first sequence's cells, positions up to
        each query's) over the layout: float32 [B, Hq, n, D]."""
        b, hq, n, d = q.shape
        n_kv, mask, streams = self.geometry(n)
        q, sc = self.spec.query_in_order(q), self.formats.scales(layer)
        if self.layout.kind == "unified":
            ks, vs = self.store.view(layer, n_kv, streams)
            q_rows = q.transpose(1, 0, 2, 3).reshape(1, hq, b * n, d)  # sequences as query rows
            out = self._attend(q_rows, ks, vs, mask, scale, sc)
            return out.reshape(hq, b, n, d).transpose(1, 0, 2, 3)
        ks, vs = self.store.view(layer, n_kv)
        if streams is not None:
            ks, vs = ({a: x[streams] for a, x in s.items()} for s in (ks, vs))
        return self._attend(q, ks, vs, mask, scale, sc)

    def _attend(self, q, ks, vs, mask, scale: float, sc) -> mx.array:
        args = (self.fmt, scale, self.tile_kv, self.rot, mask, sc)
        return attend_kernel(self.kernel, q, ks, vs, *args)

    def advance(self, n: int) -> None:
        self.offset += n
        self.rows, self.index, self._geometry = [], (), None

    def mark(self):
        """Every stream's cells (positions, memberships, tokens, head, counts) and the offset."""
        return self.offset, [
            (c.pos.copy(), c.seq.copy(), c.token.copy(), c.head, c.used, c.peak_used)
            for c in self.layout.streams
        ]

    def rewind(self, mark) -> None:
        self.offset, saved = mark
        self.rows, self.index, self._geometry = [], (), None
        for c, (pos, seq, tok, head, used, peak) in zip(self.layout.streams, saved):
            c.pos, c.seq, c.token = pos.copy(), seq.copy(), tok.copy()
            c.head, c.used, c.peak_used = head, used, peak

    def arrays(self) -> list[mx.array]:
        return self.store.arrays()

    def held_bytes(self) -> int:
        """The stored arrays' bytes in proportion to the cells in use (a cell's bytes are
        equal in every stream and position of a plain format)."""
        total = sum(a.nbytes for a in self.store.arrays())
        return total * self.layout.cells_used // self.layout.cells_alloc

    def saturated(self) -> int:
        return self.formats.saturated()
