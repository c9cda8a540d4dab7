"""TurboQuant attention in the format's rotated basis: the query rotated once per step, the
output rotated back once, the stored rows never (kernels/formats/turbo.py).

A TurboQuant row reads back as k~ = n c R^T (mse: c the Lloyd-Max centroids of its codes, R the
random-sign Hadamard rotation, n its norm), so

    q . k~ = n (q R) . c                      one d x d product for q, none per row;
    sum_j p_j v~_j = (sum_j p_j n_j c_j) R^T  one for the output.

The prod variant adds the QJL term n g sign_j S R^T to each row (g = sqrt(pi/2)/d * gamma):
q . (n g sign S R^T) = n g ((q R) S^T) . sign, and sum_j p_j n_j g_j sign_j S R^T is one S and
one R^T on the summed signs. So a prod row is read as the 2d-wide [n c | n g sign] against the
query [q R | q R S^T], and the 2d-wide output o becomes (o[:d] + o[d:] S) R^T. Both are the
dequantize-then-attend result up to rounding; the decode kernels (dequant_sdpa, tiled) instead
rotate every row back, 2 d^2 flops per row (plus S for prod) where these pay 2 d^2 per query
row. The format supplies the three maps (basis_query, basis_rows, basis_output); the kernels
below are dequant_sdpa and tiled with those maps in place of decode.
"""

from __future__ import annotations

import mlx.core as mx

from kvbench.kernels.attention.tiled import (
    DEFAULT_TILE_KV,
    fold_tile,
    folded_mask,
    init_state,
    tile_view,
)
from kvbench.kernels.formats.turbo import TurboQuant


def turbo_only(fmt) -> str | None:
    """KERNELS `accepts`: the TurboQuant formats (they read in a rotated basis)."""
    if isinstance(fmt, TurboQuant):
        return None
    return f"reads TurboQuant's rotated basis (tq*_mse, tq*_prod), not {fmt.name}"


def turbo_sdpa(q, k, v, fmt, *, mask=None, scale: float, tile_kv=None) -> mx.array:
    """The whole cache read in the rotated basis (codes times norms, no rotation), then MLX's
    fused SDPA on the rotated query; the output rotated back once."""
    act = fmt.compute_dtype
    qx = fmt.basis_query(q).astype(act)  # [B, Hq, Lq, Dx], Dx = d (mse) or 2d (prod)
    kx, vx = fmt.basis_rows(k, act), fmt.basis_rows(v, act)  # [B, Hkv, Lk, Dx]
    out = mx.fast.scaled_dot_product_attention(qx, kx, vx, scale=scale, mask=mask)
    return fmt.basis_output(out).astype(q.dtype)  # [B, Hq, Lq, D]


def turbo_tiled(q, k, v, fmt, *, mask=None, scale: float, tile_kv: int | None = None):
    """kernels/attention/tiled.py's online softmax over tiles of `tile_kv` positions, each tile
    read in the rotated basis; the query rotated before the loop, the output after it."""
    tile = tile_kv or DEFAULT_TILE_KV
    b, hq, lq, d = q.shape
    hkv, lk = k["norms"].shape[1], k["norms"].shape[2]
    group = hq // hkv
    act = fmt.compute_dtype
    qx = fmt.basis_query(q * scale).astype(act)  # [B, Hq, Lq, Dx]
    dx = qx.shape[-1]
    qg = qx.reshape(b, hkv, group * lq, dx)  # [B, Hkv, G*Lq, Dx], rows g-major
    state = init_state(b, hkv, group * lq, dx)
    for t0 in range(0, lk, tile):
        t1 = min(t0 + tile, lk)
        kt = fmt.basis_rows(tile_view(k, t0, t1), act)  # [B, Hkv, n, Dx], this tile only
        vt = fmt.basis_rows(tile_view(v, t0, t1), act)
        vis = folded_mask(mask, b, hkv, group, lq, lk, t0, t1)
        state = fold_tile(state, qg, kt, vt, vis, act)
    m, l, acc = state
    out = (acc / l).reshape(b, hq, lq, dx)  # [B, Hkv, G*Lq, Dx] -> [B, Hq, Lq, Dx]
    return fmt.basis_output(out).astype(q.dtype)
