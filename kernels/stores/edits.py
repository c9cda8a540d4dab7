"""llama.cpp's cache edits on the unified layout: context shift, self-extend and defrag.

Keys are stored rotated by RoPE at their position (rotate-half form, as HF / MLX's
fast.rope(traditional=False): pair (x_i, x_{i+D/2}) turned by angle p * theta^(-2i/D)).
Rotations compose, rope(rope(x, a), b) = rope(x, a + b), so moving a key from position p to
p' only needs a rotation by p' - p of the stored key (llama.cpp's K-shift graph), never the
un-rotated key.
* shift (llama.cpp's context shift: seq_rm(s, keep, keep + n) then seq_add(s, keep + n, end, -n)):
  positions [keep, keep + n) of the sequence are evicted, later ones move back by n and their
  keys are re-rotated by -n.
* self-extend (grouped attention, llama.cpp's ga_n / ga_w, arXiv 2401.01325; seq_div): the
  positions of [p0, p1) become p0 + (p - p0) // g and their keys are re-rotated by the change.
* defrag: the occupied cells move to the front of the buffer (K/V rows and metadata), so the
  extent attended over (n_kv) shrinks to the used cells.
Metadata edits are host numpy (kernels/stores/layouts.py Cells); K/V edits go through the format
(decode, rotate, encode), so any format works; a quantized key is re-quantized after rotating.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvbench.kernels.stores.cache import ALL
from kvbench.kernels.stores.layouts import Cells, LayoutStore


def rope(x: mx.array, positions, theta: float) -> mx.array:
    """x [..., L, D] rotated by RoPE at positions [L] (float32 angles, rotate-half)."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [D/2]
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]  # [L, D/2]
    cos, sin = mx.array(np.cos(ang), mx.float32), mx.array(np.sin(ang), mx.float32)
    x1, x2 = x[..., : d // 2].astype(mx.float32), x[..., d // 2 :].astype(mx.float32)
    out = mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def rerotate(store: LayoutStore, cells: np.ndarray, delta: np.ndarray, theta: float) -> list:
    """Re-rotate the stored keys of `cells` (stream 0) by `delta` positions, every layer; returns
    the arrays to evaluate (the K-shift stage)."""
    if not len(cells):
        return []
    idx = mx.array(cells)
    for layer in range(store.n_layers):
        keys = {n: mx.take(a[0], idx, axis=1) for n, a in store.keys[layer].items()}  # [Hkv,n,.]
        k = store.fmt.decode({n: a[None] for n, a in keys.items()}, mx.float32)  # [1, Hkv, n, D]
        parts = store.fmt.encode(rope(k, delta, theta).astype(store.fmt.compute_dtype))
        for name, part in parts.items():
            store.keys[layer][name][0:1, ALL, idx] = part
    return store.arrays()


def _unshared(cells: Cells, sel: np.ndarray) -> None:
    if (cells.seq[sel].sum(axis=1) > 1).any():
        raise ValueError("these cells are shared: a position edit would move them for all")


def plan_shift(cells: Cells, seq: int, keep: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Metadata of a shift: evict positions [keep, keep + n) of seq, move later ones back by n.
    Returns (cells whose key must be re-rotated, their deltas)."""
    held = cells.seq[:, seq]
    evict = held & (cells.pos >= keep) & (cells.pos < keep + n)
    moved = np.flatnonzero(held & (cells.pos >= keep + n))
    _unshared(cells, evict | np.isin(np.arange(cells.size), moved))
    cells.seq[evict, seq] = False
    cells.pos[evict], cells.token[evict] = -1, -1
    cells.used -= int(evict.sum())
    cells.pos[moved] -= n
    return moved, np.full(len(moved), -n)


def plan_self_extend(cells: Cells, seq: int, p0: int, p1: int, g: int):
    """Metadata of self-extend (llama.cpp's seq_div then seq_add): positions p in [p0, p1)
    become p0 + (p - p0) // g, later ones move back by (p1 - p0) - (p1 - p0) // g. Returns
    (cells whose key must be re-rotated, their deltas)."""
    held = cells.seq[:, seq]
    sel = np.flatnonzero(held & (cells.pos >= p0))
    _unshared(cells, np.isin(np.arange(cells.size), sel))
    old = cells.pos[sel]
    inside = old < p1
    new = np.where(inside, p0 + (old - p0) // g, old - ((p1 - p0) - (p1 - p0) // g))
    cells.pos[sel] = new
    keep = new != old
    return sel[keep], (new - old)[keep]


def shift(cells: Cells, store: LayoutStore, seq: int, keep: int, n: int, theta: float) -> int:
    """A shift applied (metadata and keys); returns the keys re-rotated."""
    moved, delta = plan_shift(cells, seq, keep, n)
    rerotate(store, moved, delta, theta)
    return len(moved)


def self_extend(cells: Cells, store: LayoutStore, seq: int, p0: int, p1: int, g: int, theta):
    """Self-extend applied (metadata and keys); returns the keys re-rotated."""
    moved, delta = plan_self_extend(cells, seq, p0, p1, g)
    rerotate(store, moved, delta, theta)
    return len(moved)


def plan_defrag(cells: Cells) -> tuple[np.ndarray, np.ndarray]:
    """Metadata of a defrag: the occupied cells move to the front in cell order. Returns the
    (source, destination) cells of the moves."""
    src = np.flatnonzero(cells.pos >= 0)
    dst = np.arange(len(src))
    move = src != dst
    s, d = src[move], dst[move]
    for arr, empty in ((cells.pos, -1), (cells.token, -1), (cells.seq, False)):
        arr[d] = arr[s]
        arr[s[s >= len(src)]] = empty
    cells.head = len(src)
    return s, d


def move_cells(store: LayoutStore, src: np.ndarray, dst: np.ndarray) -> list:
    """Copy K/V rows of cells src to cells dst (stream 0), every layer (the defrag stage)."""
    if not len(src):
        return []
    s, d = mx.array(src), mx.array(dst)
    for layer in range(store.n_layers):
        for stored in (store.keys[layer], store.values[layer]):
            for name, a in stored.items():
                stored[name][0:1, ALL, d] = mx.take(a, s, axis=2)
    return store.arrays()


def defrag(cells: Cells, store: LayoutStore) -> int:
    """A defrag applied (metadata and K/V); returns the cells moved."""
    src, dst = plan_defrag(cells)
    move_cells(store, src, dst)
    return len(src)
