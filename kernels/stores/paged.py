"""Paged KV cache: a shared pool of fixed-size pages and a block table per sequence (vLLM).

Pool: `n_pages` pages of `page_size` slots; per layer one K and one V store
[n_pages, n_kv_heads, page_size, ...] in the case's format (a KVStore whose buffers are pages).
Position p of sequence s lives in page table[s][p // page_size], slot p % page_size, so a block
table lists a sequence's pages in position order.
* Allocation by page: a sequence takes a page from the free queue when its last page is full.
* Prefix sharing at page granularity: a token held by several sequences (a shared prompt) is
  written once; every holder's block table points at the same pages (ref count = holders).
* Copy-on-write: a sequence appending into a page that others still hold (the partly filled
  last page of a shared prefix) first copies that page's filled slots into a new page of its
  own; the last holder writes in place (vLLM's copy-on-write of a partly shared block).
* Freeing: seq_rm(s, p0) cuts s's table to the pages holding positions < p0; a page nobody holds
  goes back to the free queue, FIFO (vLLM's free block queue hands out the page freed longest
  ago first), and is reused by later allocations.
The pool holds no K/V here: slots record the token id whose K/V they store (PagedStore fills
and writes the K/V). Reading: gather_pages copies a block table's pages into a dense
[S, Hkv, n_blocks * page_size, ...] view (the naive gather-then-dense path); paged_tiled reads
page groups through the table inside the tile loop (kernels/attention/tiled.py's online softmax).
"""

from __future__ import annotations

from collections import deque

import mlx.core as mx
import numpy as np

from kvbench.kernels.attention.tiled import fold_tile, folded_mask, init_state
from kvbench.kernels.formats.protocol import Format
from kvbench.kernels.stores.cache import ALL, KVStore
from kvbench.kernels.stores.layouts import CacheFullError, cells_from_tokens

TABLE_ENTRY_BYTES = 4  # int32 page ids, as vLLM's block_tables tensor
PAGE_SIZES = (8, 256)  # the range of page_size (inclusive)


def blocks_for(n_tokens: int, page_size: int) -> int:
    return -(-n_tokens // page_size)


class PagedLayout:
    """Page pool metadata, block tables and ref counts (no K/V: see PagedStore)."""

    def __init__(self, n_seq_max: int, page_size: int, n_pages: int):
        self.page_size, self.n_seq_max = page_size, n_seq_max
        self.token = np.full((n_pages, page_size), -1, np.int64)  # -1 = empty slot
        self.ref = np.zeros(n_pages, np.int64)  # sequences holding each page
        self.free = deque(range(n_pages))
        self.tables: list[list[int]] = [[] for _ in range(n_seq_max)]
        self.length = [0] * n_seq_max
        self.peak_pages = 0
        self.cow_pages = 0  # pages copied on write

    @property
    def n_pages(self) -> int:
        return len(self.ref)

    @property
    def pages_used(self) -> int:
        return self.n_pages - len(self.free)

    def _alloc(self, holders: int) -> int:
        if not self.free:
            raise CacheFullError(f"page pool full: all {self.n_pages} pages in use")
        page = self.free.popleft()
        self.ref[page] = holders
        self.peak_pages = max(self.peak_pages, self.pages_used)
        return page

    def _release(self, page: int, holders: int = 1) -> int:
        """Drop `holders` references; a page nobody holds is emptied and freed (returns 1)."""
        self.ref[page] -= holders
        if self.ref[page]:
            return 0
        self.token[page] = -1
        self.free.append(page)
        return 1

    def _page_for(self, seqs: tuple[int, ...], pos: int) -> int:
        """The page position `pos` of `seqs` (all at the same table) goes to: a new page when the
        last is full, or the last page, copied first if others hold it too."""
        table, blk = self.tables[seqs[0]], pos // self.page_size
        if blk == len(table):
            page = self._alloc(len(seqs))
            for s in seqs:
                self.tables[s].append(page)
            return page
        page = table[blk]
        if self.ref[page] > len(seqs):  # copy-on-write: the filled slots into a new page
            new, fill = self._alloc(len(seqs)), pos % self.page_size
            self.token[new, :fill] = self.token[page, :fill]
            self._release(page, len(seqs))
            self.cow_pages += 1
            for s in seqs:
                self.tables[s][blk] = new
            page = new
        return page

    def _append(self, seqs: tuple[int, ...], pos: int, tok: int) -> tuple[int, int]:
        first = self.tables[seqs[0]]
        for s in seqs[1:]:  # O(1) per holder: same length and same last page
            table = self.tables[s]
            if len(table) != len(first) or (table and table[-1] != first[-1]):
                raise ValueError(f"token at {pos}: sequences {seqs} are not at one shared table")
        if any(self.length[s] != pos for s in seqs):
            raise ValueError(f"token at {pos}: not the next position of every one of {seqs}")
        page, slot = self._page_for(seqs, pos), pos % self.page_size
        assert self.token[page, slot] < 0, "write into an occupied slot"
        self.token[page, slot] = tok
        for s in seqs:
            self.length[s] += 1
        return page, slot

    def add(self, tokens: list[tuple[tuple[int, ...], int, int]]) -> list[list[tuple[int, int]]]:
        """One batch of (seq_ids, pos, token) in order; per token its [(page, slot)] (the
        interface of kernels/stores/layouts.py Layout.add, so workloads.replay drives both)."""
        return [[self._append(tuple(seqs), pos, tok)] for seqs, pos, tok in tokens]

    def remove(self, seq: int, p0: int = 0) -> int:
        """seq leaves its positions >= p0: pages past them are released, its own slots >= p0 in
        its last kept page emptied. Returns the pages freed."""
        keep, table = blocks_for(p0, self.page_size), self.tables[seq]
        freed = sum(self._release(page) for page in table[keep:])
        del table[keep:]
        if keep and p0 % self.page_size and self.ref[table[-1]] == 1:
            self.token[table[-1], p0 % self.page_size :] = -1
        self.length[seq] = min(self.length[seq], p0)
        return freed

    def seq_slots(self, seq: int) -> list[tuple[int, int]]:
        """(page, slot) of every position of seq, in position order."""
        p = self.page_size
        return [(self.tables[seq][i // p], i % p) for i in range(self.length[seq])]

    @property
    def live_slots(self) -> int:
        """Slots holding a token that some sequence reads (a shared page counted once)."""
        return int((self.token >= 0).sum())

    @property
    def frag_slots(self) -> int:
        """Internal fragmentation: empty slots inside pages in use."""
        return self.pages_used * self.page_size - self.live_slots

    def block_table(self, seqs: list[int], n_blocks: int) -> np.ndarray:
        """int32 [len(seqs), n_blocks]; entries past a sequence's pages point at page 0 (their
        slots are masked out), as vLLM pads its block_tables tensor."""
        out = np.zeros((len(seqs), n_blocks), np.int32)
        for i, s in enumerate(seqs):
            out[i, : len(self.tables[s])] = self.tables[s]
        return out

    def mask(self, seqs: list[int], n_blocks: int) -> np.ndarray:
        """bool [len(seqs), 1, 1, n_blocks * page_size]: each sequence's own positions (the
        query is its last position, so every earlier one is visible)."""
        span = np.arange(n_blocks * self.page_size)
        lens = np.asarray([self.length[s] for s in seqs])
        return (span[None, :] < lens[:, None])[:, None, None, :]


class PagedStore(KVStore):
    """Per layer K and V pools [n_pages, n_kv_heads, page_size, ...] for a PagedLayout."""

    def __init__(self, layout: PagedLayout, fmt: Format, n_layers: int, hkv: int, head_dim: int):
        super().__init__(fmt, n_layers, layout.n_pages, hkv, layout.page_size, head_dim)
        self.layout = layout

    def fill(self, k_tab: mx.array, v_tab: mx.array) -> None:
        """Every occupied slot's token from tables [1, Hkv, n_tokens, D] into every layer."""
        full = [cells_from_tokens(self.layout.token, tab) for tab in (k_tab, v_tab)]
        self.put_every_layer((ALL, ALL, ALL), *full)

    def write(self, layer: int, pages: mx.array, slots: mx.array, k, v) -> None:
        """Token i's k, v [n, Hkv, D] into (pages[i], slots[i]) of `layer` (one scatter)."""
        self.put(layer, (pages, ALL, slots), k, v)


def gather_pages(stored: dict, table: mx.array) -> dict:
    """The pages a block table [S, nb] lists, as a dense copy [S, Hkv, nb * page, ...] of every
    stored array (pool arrays are [n_pages, Hkv, page, ...])."""
    s, nb = table.shape
    out = {}
    for name, a in stored.items():
        g = mx.take(a, table.reshape(-1), axis=0)  # [S*nb, Hkv, P, ...]
        g = g.reshape(s, nb, *a.shape[1:]).swapaxes(1, 2)  # [S, Hkv, nb, P, ...]
        out[name] = g.reshape(s, a.shape[1], nb * a.shape[2], *a.shape[3:])
    return out


def pages_per_tile(tile_kv: int | None, page_size: int, default: int) -> int:
    """Whole pages per tile of the table-reading kernel: tile_kv // page_size, at least 1."""
    return max(1, (tile_kv or default) // page_size)


def paged_tiled(q, k_pool, v_pool, table, fmt, *, mask, scale: float, tile_pages: int):
    """Online-softmax attention reading `tile_pages` pages per tile through the block table
    [S, nb] (kernels/attention/tiled.py's fold; each tile decodes only its own pages). q [S, Hq,
    Lq, D];
    mask bool [S, 1, Lq, nb * page] or None."""
    b, hq, lq, d = q.shape
    nb, page = table.shape[1], next(iter(k_pool.values())).shape[2]
    hkv = next(iter(k_pool.values())).shape[1]
    group, act, lk = hq // hkv, fmt.compute_dtype, nb * page
    qg = (q * scale).astype(act).reshape(b, hkv, group * lq, d)  # [B, Hkv, G*Lq, D]
    state = init_state(b, hkv, group * lq, d)
    for j0 in range(0, nb, tile_pages):
        cols = table[:, j0 : j0 + tile_pages]  # [S, n] page ids of this tile
        kt = fmt.decode(gather_pages(k_pool, cols), act)  # [S, Hkv, n*page, D]
        vt = fmt.decode(gather_pages(v_pool, cols), act)
        t0 = j0 * page
        vis = folded_mask(mask, b, hkv, group, lq, lk, t0, t0 + cols.shape[1] * page)
        state = fold_tile(state, qg, kt, vt, vis, act)
    m, l, acc = state
    return (acc / l).reshape(b, hq, lq, d).astype(q.dtype)


def paged_counts(n_seqs: int, ctx: int, page_size: int, prefix: int = 0) -> dict:
    """Pages (cells = pages x page_size) and block-table bytes of n_seqs sequences of ctx
    tokens: whole prefix pages stored once, a partial last prefix page copied on write."""
    full = prefix // page_size
    pages = full + n_seqs * blocks_for(ctx - full * page_size, page_size)
    table = n_seqs * blocks_for(ctx, page_size) * TABLE_ENTRY_BYTES
    return {"cells": pages * page_size, "pages": pages, "block_table_bytes": table}
