"""The window engine: decode over a sliding-window cache with sinks (layout: window).

Build (untimed): the case's K/V (kernels/data.py make_qkv, the same data the cache engine and
the mlx_lm_rotating peer get for the case) written position by position into a Ring
(kernels/stores/window.py) of sink_tokens + window cells per sequence: after L-1 positions each cell
holds the last position that went into it (the ring has wrapped (L-1-sinks) // window times).
One timed step writes position L-1 into its cell (every sample rewrites the same cell, so every
sample is the same step) and attends over all cells with a mask showing the sinks and the last
`window` positions: per layer one kernel call over the n_seqs buffers.
Stages: write, attend, step, and mask (the host mask from the cells' positions -> MLX) while
the ring is not yet full; once it is, every cell holds a visible position and the kernel gets
no mask (as mlx-lm's decode step passes none).
check: layer 0's output against the float32 reference over the explicitly materialised visible
K/V (positions [0, sinks) and [L - window, L), taken from the original data by position, not
from the ring; stored in the format and decoded), then accuracy against the float32 reference
over the un-quantized visible K/V, and kv_recon_err over them.
Counting: cells_alloc = n_seqs x (sinks + window) (the bytes bound, whatever the context);
cells_used = cells holding a position; bytes_touched = the cells each call covers (all of them,
masked); bytes_needed = the visible positions.
"""

from __future__ import annotations

import dataclasses
import math

import mlx.core as mx
import numpy as np

from kvbench.case import Case
from kvbench.engines import common, metrics
from kvbench.engines.contract import State, allocated
from kvbench.engines.parity import compare_outputs, parity_gate, recon_err
from kvbench.kernels.attention.registry import KERNELS, reference, unsupported_reason
from kvbench.kernels.data import make_qkv
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.stores.cache import ALL, KVStore
from kvbench.kernels.stores.footprint import row_bytes
from kvbench.kernels.stores.window import Ring
from kvbench.suite import resolved
from kvbench.suite.resolved import Resolved


def claims(case: Case) -> bool:
    return case.layout == "window"


def skip_reason(case: Case, backend: str) -> str | None:
    """The cache engine's kernels, asked about a call over the ring's cells."""
    fmt = resolved.of_case(case).k_fmt
    problem = common.problem_of(case, fmt)
    ring = case.sink_tokens + case.window
    problem = dataclasses.replace(problem, kv_len=ring)
    if case.kernel in ("metal", "cuda") and case.context_len < ring:
        return f"kernel {case.kernel} takes no mask array: the ring is not full at this context"
    return unsupported_reason(case.kernel, fmt, backend, problem, case.tile_kv)


def filled_ring(case: Case) -> Ring:
    """A ring after positions 0..L-2 (the state before the timed step)."""
    ring = Ring(case.window, case.sink_tokens)
    for _ in range(case.context_len - 1):
        ring.write(1)
    return ring


def cells_of(x: mx.array, pos: np.ndarray) -> mx.array:
    """[B, Hkv, n_cells, D]: x [B, Hkv, L, D] at the cells' positions; empty cells (-1) zero."""
    zero = mx.zeros((*x.shape[:2], 1, x.shape[3]), dtype=x.dtype)
    idx = mx.array(np.where(pos >= 0, pos, x.shape[2]))
    return mx.take(mx.concatenate([x, zero], axis=2), idx, axis=2)


def visible_kv(k32, v32, ring: Ring, q: int) -> tuple[mx.array, mx.array]:
    """The K/V query q sees, materialised from the original data by position."""
    idx = mx.array(ring.visible(q))
    return mx.take(k32, idx, axis=2), mx.take(v32, idx, axis=2)


def counts(case: Case, ring: Ring, fmt) -> dict:
    def nbytes(cells: int) -> int:
        return metrics.cache_bytes_of(case, fmt, cells * case.n_seqs)

    needed = len(ring.visible(case.context_len - 1))
    return {
        "cells_alloc": case.n_seqs * ring.size,
        "cells_used": case.n_seqs * ring.held(),
        "n_kv": ring.size,
        "bytes_alloc": nbytes(ring.size),
        "bytes_used": nbytes(ring.held()),
        "kv_util": ring.held() / ring.size,
        "bytes_touched": nbytes(ring.size),
        "bytes_needed": nbytes(needed),
    }


def traffic(case: Case, fmt, touched: int) -> tuple[int, int]:
    """(read, written): K/V over every cell, the new K/V, q and the mask read; the new K/V
    (format bytes) and the output written; per layer."""
    act = fmt.compute_dtype.size
    s, hq, hkv, d = case.n_seqs, case.n_q_heads, case.n_kv_heads, case.head_dim
    mask = case.sink_tokens + case.window  # bool, one byte a cell, shared by the sequences
    read = 2 * s * hkv * d * act + s * hq * d * act + mask
    written = row_bytes(fmt, s, n_layers=1, n_kv_heads=hkv, head_dim=d) + s * hq * d * act
    return touched + case.n_layers * read, case.n_layers * written


def build(case: Case, r: Resolved) -> State:
    fmt = r.k_fmt
    act = fmt.compute_dtype
    ctx = case.context_len
    q32, k32, v32 = make_qkv(
        case.kv_data,
        (case.n_seqs, case.n_q_heads, 1, case.head_dim),
        (case.n_seqs, case.n_kv_heads, ctx, case.head_dim),
        case.seed,
        case.kv_file,
    )
    q, k_act, v_act = q32.astype(act), k32.astype(act), v32.astype(act)
    mx.eval(q32, k32, v32, q, k_act, v_act)
    ring = filled_ring(case)
    shape = (case.n_layers, case.n_seqs, case.n_kv_heads, ring.size, case.head_dim)
    store, baseline, alloc = allocated(lambda: KVStore(fmt, *shape))
    store.put_every_layer((ALL, ALL, ALL), cells_of(k_act, ring.pos), cells_of(v_act, ring.pos))
    cell = int(ring.write(1)[0])  # the timed step's position L-1
    index = (ALL, ALL, slice(cell, cell + 1))
    k_new, v_new = k_act[:, :, ctx - 1 :], v_act[:, :, ctx - 1 :]
    scale, kernel = 1.0 / math.sqrt(case.head_dim), KERNELS[case.kernel].fn

    # once the ring is full every cell holds a visible position: no mask (as mlx-lm's decode
    # passes none); before, a mask hides the empty cells
    full = bool(ring.mask([ctx - 1]).all())

    def make_mask() -> mx.array | None:
        return None if full else mx.array(ring.mask([ctx - 1]))[None, None]  # [1, 1, 1, cells]

    masks = [make_mask()]
    mx.eval(masks, k_new, v_new)

    def attend(layer: int, mask: mx.array) -> mx.array:
        k, v = store.view(layer, ring.size)
        return kernel(q, k, v, fmt, mask=mask, scale=scale, tile_kv=case.tile_kv)

    def write() -> list[mx.array]:
        for layer in range(store.n_layers):
            store.put(layer, index, k_new, v_new)
        return store.arrays()

    def attend_all() -> list[mx.array]:
        return [attend(layer, masks[0]) for layer in range(store.n_layers)]

    def step() -> list[mx.array]:
        mask, outs = make_mask(), []
        for layer in range(store.n_layers):
            store.put(layer, index, k_new, v_new)
            outs.append(attend(layer, mask))
        return outs + store.arrays()

    def mask() -> list:
        return [make_mask()]

    def check() -> dict:
        mx.eval(step())
        out = attend(0, masks[0])
        k0, v0 = visible_kv(k32, v32, ring, ctx - 1)
        # the visible positions encoded as the store encoded them (from the compute dtype)
        ks, vs = (fmt.encode(x) for x in visible_kv(k_act, v_act, ring, ctx - 1))
        parity_gate(f"{case.kernel} (window)", out, reference(q32, ks, vs, fmt, scale=scale), act)
        dense = get_format("fp32")
        exact = reference(q32, {"data": k0}, {"data": v0}, dense, scale=scale)
        decoded = tuple(fmt.decode(x, mx.float32) for x in (ks, vs))
        # FP8: what layer 0's ring holds after the step (each cell's last position)
        sat = common.saturated(fmt, cells_of(k_act, ring.pos), cells_of(v_act, ring.pos))
        return {**compare_outputs(out, exact), "kv_recon_err": recon_err(decoded, (k0, v0))} | sat

    row = counts(case, ring, fmt)
    return State(
        {"step": step, "write": write, "attend": attend_all, **({} if full else {"mask": mask})},
        check,
        traffic=traffic(case, fmt, row["bytes_touched"]),
        kv_bytes=row["bytes_used"],
        alloc_bytes=alloc,
        baseline_bytes=baseline,
        cache=store.arrays,
        effective=common.effective(case),
        extra=row,
    )
