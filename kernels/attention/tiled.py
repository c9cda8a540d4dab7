"""Tiled flash-decoding attention in plain MLX ops (runs on every backend).

The KV extent is cut into tiles of `tile_kv` positions (the last one may be shorter). Each tile
is decoded from the cache's stored format on its own (fused dequantization: a quantized cache is
never decoded whole), scored against the queries, and folded into a running softmax: running
max m, running sum l and an accumulator rescaled by exp(m_old - m_new), the exact online-softmax
combine, so the result equals softmax(QK^T)V up to rounding. GQA is folded into rows: the G
query heads of a KV head are G*Lq rows of one matmul against that head's tile (K/V are never
repeated). Scores, statistics and the accumulator are float32; the matmuls run in the cache's
compute dtype, as a flash-attention kernel's would.
"""

from __future__ import annotations

import mlx.core as mx

DEFAULT_TILE_KV = 256


def tile_view(stored: dict, t0: int, t1: int) -> dict:
    """Positions t0..t1 of every stored array (leading axes [B, H, L, ...]; a slice, no copy)."""
    return {name: a[:, :, t0:t1, ...] for name, a in stored.items()}


def folded_mask(mask, b: int, hkv: int, group: int, lq: int, lk: int, t0: int, t1: int):
    """Visibility of keys t0..t1 for the folded rows [B, Hkv, G*Lq, t1-t0], or None."""
    if mask is None:
        return None
    if isinstance(mask, str):  # causal: query i is position lk - lq + i
        rows = mx.arange(lq)[:, None] + (lk - lq)
        vis = mx.arange(t0, t1)[None, :] <= rows  # [Lq, n]
        return mx.tile(vis, (group, 1))  # [G*Lq, n], rows g-major like the folded queries
    part = mx.broadcast_to(mask, (*mask.shape[:-1], lk))[..., t0:t1]
    part = mx.broadcast_to(part, (b, hkv * group, lq, t1 - t0))
    return part.reshape(b, hkv, group * lq, t1 - t0)


def init_state(b: int, hkv: int, rows: int, d: int) -> tuple:
    """Running max m, running sum l [B, Hkv, rows, 1] and accumulator [B, Hkv, rows, D]."""
    m = mx.full((b, hkv, rows, 1), -mx.inf, dtype=mx.float32)
    return m, mx.zeros((b, hkv, rows, 1), dtype=mx.float32), mx.zeros((b, hkv, rows, d), mx.float32)


def fold_tile(state: tuple, qg, kt, vt, vis, act) -> tuple:
    """Fold one tile (kt, vt [B, Hkv, n, D]; vis [B, Hkv, rows, n] or None) into the running
    softmax: the exact online-softmax combine."""
    m, l, acc = state
    s = (qg @ kt.swapaxes(-1, -2)).astype(mx.float32)  # [B, Hkv, rows, n]
    if vis is not None:
        s = mx.where(vis, s, -mx.inf)
    m_new = mx.maximum(m, mx.max(s, axis=-1, keepdims=True))
    m_safe = mx.where(m_new == -mx.inf, 0.0, m_new)  # rows that have seen nothing yet
    p = mx.exp(s - m_safe)  # masked -> 0
    alpha = mx.exp(m - m_safe)  # 0 while m is -inf
    l = alpha * l + mx.sum(p, axis=-1, keepdims=True)
    acc = alpha * acc + (p.astype(act) @ vt).astype(mx.float32)
    return m_new, l, acc


def tiled(q, k, v, fmt, *, mask=None, scale: float, tile_kv: int | None = None) -> mx.array:
    """Online-softmax attention over KV tiles of `tile_kv` positions (any stored format)."""
    tile = tile_kv or DEFAULT_TILE_KV
    b, hq, lq, d = q.shape
    first = next(iter(k.values()))
    hkv, lk = first.shape[1], first.shape[2]
    group = hq // hkv
    act = fmt.compute_dtype
    qg = (q * scale).astype(act).reshape(b, hkv, group * lq, d)  # [B, Hkv, G*Lq, D]
    state = init_state(b, hkv, group * lq, d)
    for t0 in range(0, lk, tile):
        t1 = min(t0 + tile, lk)
        kt = fmt.decode(tile_view(k, t0, t1), act)  # [B, Hkv, n, D], this tile only
        vt = fmt.decode(tile_view(v, t0, t1), act)
        vis = folded_mask(mask, b, hkv, group, lq, lk, t0, t1)
        state = fold_tile(state, qg, kt, vt, vis, act)
    m, l, acc = state
    out = acc / l  # [B, Hkv, G*Lq, D]
    return out.reshape(b, hq, lq, d).astype(q.dtype)
