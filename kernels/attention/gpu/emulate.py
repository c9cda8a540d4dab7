"""numpy emulation of the flash-decode GPU kernels (kernels/attention/gpu/src/flash_decode_body.inc
and
flash_decode_combine.inc).

It runs the kernels' algorithm as written, on the CPU, in float32 with the kernels' order of
operations: the threadgroups the launch plan's grid actually creates (grid / threadgroup in each
dimension: a grid given in threadgroups would leave most of the KV extent unread), the same
splits and tiles, the same lane layout (launch.lane_layout: slot, lane j, vectors j + LPR*i),
per-vector dot products summed in element order and scaled once per group, the butterfly inside
a slot (xor LPR/2 .. 1), one online-softmax rescale per tile per slot, P V accumulated in step
order, the slot merge (xor LPR .. 16), the simdgroup merge in simdgroup order, and the combine
kernel (lanes over splits, butterfly, splits in order per element). K/V rows are read through
the arrays' strides (numpy views), and a view the kernel cannot vector-load gives NaN, as on the
GPU. What it cannot check is the source itself (compilation, address spaces, barriers): the
C++ simulation (tests/cpu_sim) runs the shared text; only a GPU runs the backends.
Threadgroups are vectorised: arrays carry leading axes [bh, split, simdgroup, slot].
"""

from __future__ import annotations

import numpy as np

from kvbench.kernels.attention.gpu.kernels import tq_codebook
from kvbench.kernels.attention.gpu.launch import (
    FP8_CODES,
    SIMD_WIDTH,
    TQ_CODES,
    LaunchPlan,
    Problem,
)
from kvbench.kernels.formats.fp8 import _table_np as fp8_table
from kvbench.kernels.formats.ggml import IQ4_NL_VALUES

F32 = np.float32
FP4_MAG2 = np.array([(0xC8643210 >> (4 * c)) & 0xF for c in range(8)], dtype=F32)  # 2*|v|
NP_DTYPES = {"float16": np.float16, "float32": np.float32}


def nibble_value(code: np.ndarray, kv_code: str) -> np.ndarray:
    """4-bit codes -> the kernel's value before scaling: fp4 2*value (the 1/2 is folded into
    the scale), int4 the integer in [-8, 7], iq4_nl its codebook value; float32."""
    code = code.astype(np.int64)
    if kv_code == "fp4":
        mag2 = FP4_MAG2[code & 7]
        return np.where(code & 8, -mag2, mag2).astype(F32)
    if kv_code == "iq4_nl":
        return np.array(IQ4_NL_VALUES, F32)[code]
    return ((code ^ 8) - 8).astype(F32)


def vector_columns(problem: Problem, epv: int, vpr: int) -> np.ndarray:
    """[VPR, EPV]: the row column of each vector's elements in storage order (the kernel's
    elem_col): in order, except iq4_nl, whose byte t of a 32-column block holds columns t (low
    nibble) and t + 16 (high)."""
    v, x = np.arange(vpr)[:, None], np.arange(epv)[None, :]
    if problem.kv_code != "iq4_nl":
        return v * epv + x
    byte = v * (epv // 2) + x // 2
    return (byte // 16) * 32 + byte % 16 + 16 * (x % 2)


def decode_rows(stored: dict, problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """(values [B*Hkv, L, D] f32 before scaling, scales [B*Hkv, L, D/GS] f32 incl. the fp4
    factor 1/2; ones for dense), as the kernel decodes each element it loads."""
    data = stored["data"]
    bh = data.shape[0] * data.shape[1]
    if problem.kv_code == "dense":
        vals = data.astype(F32).reshape(bh, data.shape[2], -1)
        return vals, np.ones((*vals.shape[:2], 1), F32)
    if problem.kv_code in FP8_CODES:  # bytes; "scales": the float32 scale of each KV head
        vals = fp8_table(problem.kv_code)[data].reshape(bh, data.shape[2], -1)
        heads = np.tile(stored["scales"].astype(F32), data.shape[0])  # [B*Hkv]
        return vals, np.broadcast_to(heads[:, None, None], (*vals.shape[:2], 1))
    if problem.kv_code in TQ_CODES:  # a little-endian bit stream of b-bit codes; norms
        bits = 4 if problem.kv_code == "tq4_mse" else 2
        stream = np.unpackbits(data.reshape(bh, data.shape[2], -1), axis=-1, bitorder="little")
        per_code = stream.reshape(bh, data.shape[2], -1, bits).astype(np.int64)
        codes = np.sum(per_code << np.arange(bits), axis=-1)
        vals = tq_codebook(problem.kv_code, problem.head_dim)[codes]
        norms = stored["scales"]  # [B, Hkv, L, 1], TurboQuant's row norms
        return vals, norms.astype(F32).reshape(bh, norms.shape[2], 1)
    if problem.kv_code == "iq4_nl":  # ggml's blocks: 16 bytes, low nibbles then high ones
        blocks = data.reshape(bh, data.shape[2], -1, 16)
        codes = np.concatenate([blocks & 15, blocks >> 4], axis=-1)
        vals = nibble_value(codes, "iq4_nl").reshape(bh, data.shape[2], -1)
        scales = stored["scales"]
        return vals, scales.astype(F32).reshape(bh, scales.shape[2], -1)
    words = data.astype(np.uint64).reshape(bh, data.shape[2], -1)  # [bh, L, D/8]
    codes = (words[..., None] >> (4 * np.arange(8, dtype=np.uint64))) & 0xF  # element j of a word
    vals = nibble_value(codes, problem.kv_code).reshape(bh, data.shape[2], -1)
    factor = F32(0.5 if problem.kv_code == "fp4" else 1.0)
    scales = stored["scales"]  # its own positions: K/V data may be padded (gpu_kernels)
    scales = scales.astype(F32).reshape(bh, scales.shape[2], -1) * factor
    return vals, scales


def readable(a: np.ndarray, plan: LaunchPlan) -> bool:
    """The kernel's stride guard: unit last-axis stride and rows aligned to VEC bytes."""
    item = a.itemsize
    vstride = plan.layout.vec_bytes // item
    st = [s // item for s in a.strides]
    return st[3] == 1 and all(s % vstride == 0 for s in st[:3])


def butterfly(x: np.ndarray, axis_len: int, offsets, op) -> np.ndarray:
    """x [..., n] -> every position combined with position ^ off, for off in `offsets` (order)."""
    idx = np.arange(axis_len)
    for off in offsets:
        x = op(x, x[..., idx ^ off])
    return x


def merge_weight(m: np.ndarray, m_all: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(m == -np.inf, F32(0), np.exp(m - m_all)).astype(F32)


def scores(qr, kt, ks, lay, cols: np.ndarray) -> np.ndarray:
    """qr [bh, 1, 1, 1, 1, G, D]; kt [bh, S, NS, RPS, STEPS, 1, D]; ks [..., 1, VPR]; cols
    [VPR, EPV] (vector_columns) -> the slot's score [bh, S, NS, RPS, STEPS, G] (per-lane dots
    in storage order, group scale, butterfly)."""
    epv, vpr, lpr = lay.elems_per_vec, lay.vecs_per_row, lay.lanes_per_row
    dots = np.zeros(np.broadcast_shapes(qr.shape, kt.shape)[:-1] + (vpr,), F32)
    for x in range(epv):
        dots = dots + qr[..., cols[:, x]] * kt[..., cols[:, x]]  # [..., G, VPR]
    part = np.zeros(dots.shape[:-1] + (lpr,), F32)
    for i in range(lay.vecs_per_lane):
        v = np.arange(lpr) + lpr * i  # lane j's i-th vector
        part = part + dots[..., v] * ks[..., v]
    offsets = [1 << b for b in range(lpr.bit_length() - 2, -1, -1)]  # LPR/2 .. 1
    return butterfly(part, lpr, offsets, np.add)[..., 0]


def tile_rows(plan: LaunchPlan, t0: np.ndarray, end: np.ndarray):
    """(rows, ok) [S, NS, RPS, STEPS] of one tile iteration: row of each slot at each step."""
    lay, tile = plan.layout, dict(plan.template)["TILE_KV"]
    ns, rps = lay.n_simd, lay.rows_per_step
    st = np.arange(lay.steps)[None, None, None, :]
    sg = np.arange(ns)[None, :, None, None]
    slot = np.arange(rps)[None, None, :, None]
    in_tile = st * ns * rps + sg * rps + slot
    rows = t0[:, None, None, None] + in_tile
    return rows, (in_tile < tile) & (rows < end[:, None, None, None])


def gather(vals: np.ndarray, scales: np.ndarray, rows, ok, lay, group: int):
    """Values [bh, S, NS, RPS, STEPS, 1, D] and per-vector scales [..., 1, VPR] (0 / 1 where
    the row is not loaded)."""
    safe = np.where(ok, rows, 0)
    v = np.where(ok[None, ..., None], vals[:, safe], F32(0))[..., None, :]
    vec_group = np.arange(lay.vecs_per_row) * lay.elems_per_vec // group  # a vector's group
    s = np.where(ok[None, ..., None], scales[:, safe][..., vec_group], F32(1))[..., None, :]
    return v, s


def split_state(q, k, v, problem: Problem, plan: LaunchPlan, scale: float):
    """Per-slot (acc [bh,S,NS,RPS,G,D], m, l [bh,S,NS,RPS,G]) after the tile loop."""
    lay, g_, d = plan.layout, problem.group, problem.head_dim
    n_s, n_bh = plan.threadgroups[0], plan.threadgroups[1]
    kvals, kscl = decode_rows(k, problem)
    vvals, vscl = decode_rows(v, problem)
    qr = (q.reshape(n_bh, g_, d).astype(F32) * F32(scale))[:, None, None, None, None]
    kv_len, split_len = plan.params[0], plan.params[1]
    start = np.arange(n_s) * split_len
    end = np.minimum(start + split_len, kv_len)
    shape = (n_bh, n_s, lay.n_simd, lay.rows_per_step, g_)
    m, l_ = np.full(shape, -np.inf, F32), np.zeros(shape, F32)
    acc = np.zeros((*shape, d), F32)
    tile = dict(plan.template)["TILE_KV"]
    group = d if problem.kv_code == "dense" else problem.scale_group  # dense: one "scale" 1
    cols = vector_columns(problem, lay.elems_per_vec, lay.vecs_per_row)
    for it in range(-(-split_len // tile)):
        rows, ok = tile_rows(plan, start + it * tile, end)
        kt, ks = gather(kvals, kscl, rows, ok, lay, group)
        vt, vs = gather(vvals, vscl, rows, ok, lay, group)
        sc = scores(qr, kt, ks, lay, cols)  # [bh, S, NS, RPS, STEPS, G]
        okb = np.broadcast_to(ok[None, ..., None], sc.shape)
        m_new = m
        for st in range(lay.steps):
            m_new = np.where(okb[..., st, :], np.maximum(m_new, sc[..., st, :]), m_new)
        alpha = merge_weight(m, m_new)
        l_, acc, m = l_ * alpha, acc * alpha[..., None], m_new
        elem_vec = np.empty(d, np.int64)  # the vector of each element (column)
        elem_vec[cols] = np.arange(lay.vecs_per_row)[:, None]
        for st in range(lay.steps):
            p = np.exp(np.where(okb[..., st, :], sc[..., st, :] - m, F32(0))).astype(F32)
            pv = p[..., None] * vs[..., st, :, :][..., elem_vec]  # [..., G, D]
            okd = okb[..., st, :, None]
            l_ = np.where(okb[..., st, :], l_ + p, l_)
            acc = np.where(okd, acc + pv * vt[..., st, :, :], acc)
    return acc, m, l_


def merge_slots(acc, m, l_, lay):
    """The slot butterfly (lane xor LPR, 2 LPR, .. 16 = slot xor 1, 2, ..); slot 0 after it."""
    slots = np.arange(lay.rows_per_step)
    off = 1
    while off < lay.rows_per_step:
        other = slots ^ off
        m_o, l_o, acc_o = m[:, :, :, other], l_[:, :, :, other], acc[:, :, :, other]
        m_all = np.maximum(m, m_o)
        wa, wb = merge_weight(m, m_all), merge_weight(m_o, m_all)
        l_ = l_ * wa + l_o * wb
        acc = acc * wa[..., None] + acc_o * wb[..., None]
        m, off = m_all, off * 2
    return acc[:, :, :, 0], m[:, :, :, 0], l_[:, :, :, 0]  # [bh, S, NS, G, (D)]


def partials(q, k: dict, v: dict, problem: Problem, plan: LaunchPlan, scale: float):
    """(o_part, m_part, l_part) as the split kernel writes them."""
    n_s, n_bh, g_, d = plan.threadgroups[0], plan.threadgroups[1], problem.group, problem.head_dim
    rows_out = (n_bh * g_, n_s)
    if not (readable(k["data"], plan) and readable(v["data"], plan)):
        nan = np.full((*rows_out, d), np.nan, F32)
        return nan, np.zeros(rows_out, F32), np.full(rows_out, np.nan, F32)
    acc, m, l_ = merge_slots(*split_state(q, k, v, problem, plan, scale), plan.layout)
    m_all = np.full(m.shape[:2] + m.shape[3:], -np.inf, F32)  # [bh, S, G]
    for s in range(plan.layout.n_simd):
        m_all = np.maximum(m_all, m[:, :, s])
    l_all, o = np.zeros_like(m_all), np.zeros(m_all.shape + (d,), F32)
    for s in range(plan.layout.n_simd):
        w = merge_weight(m[:, :, s], m_all)
        l_all = l_all + w * l_[:, :, s]
        o = o + w[..., None] * acc[:, :, s]
    to_rows = lambda x: np.moveaxis(x, 2, 1).reshape(*rows_out, *x.shape[3:])  # noqa: E731
    return to_rows(o), to_rows(m_all), to_rows(l_all)


def combine(o_part, m_part, l_part, dtype) -> np.ndarray:
    """The combine kernel: rows [R, S] -> out [R, D] in `dtype`."""
    r, s = m_part.shape
    n_lanes = SIMD_WIDTH * -(-s // SIMD_WIDTH)
    m_lanes = np.full((r, n_lanes), -np.inf, F32)
    m_lanes[:, :s] = m_part
    m_lanes = m_lanes.reshape(r, -1, SIMD_WIDTH)  # [R, i, lane]: split lane + 32 i
    m_lane = np.full((r, SIMD_WIDTH), -np.inf, F32)
    for i in range(m_lanes.shape[1]):
        m_lane = np.maximum(m_lane, m_lanes[:, i])
    offsets = (16, 8, 4, 2, 1)
    m_all = butterfly(m_lane, SIMD_WIDTH, offsets, np.maximum)[:, :1]  # [R, 1]
    w = merge_weight(m_part, m_all)  # [R, S]
    wl = np.zeros((r, n_lanes), F32)
    wl[:, :s] = w * l_part
    l_lane = np.zeros((r, SIMD_WIDTH), F32)
    for i in range(n_lanes // SIMD_WIDTH):
        l_lane = l_lane + wl.reshape(r, -1, SIMD_WIDTH)[:, i]
    l_all = butterfly(l_lane, SIMD_WIDTH, offsets, np.add)[:, :1]
    o = np.zeros((r, o_part.shape[-1]), F32)
    for j in range(s):
        o = o + w[:, j : j + 1] * o_part[:, j]
    return (o / l_all).astype(dtype)


def flash_decode(q, k: dict, v: dict, problem: Problem, plan: LaunchPlan, scale: float):
    """The kernels' output [B, Hq, 1, D] in the compute dtype, for numpy q and stored K/V."""
    if any(gr % tg for gr, tg in zip(plan.grid, plan.threadgroup)):
        raise ValueError(f"grid {plan.grid} is not a whole number of threadgroups")
    out = combine(*partials(q, k, v, problem, plan, scale), NP_DTYPES[problem.dtype])
    return out.reshape(q.shape)


def ownership(plan: LaunchPlan, split_len: int | None = None) -> dict[str, np.ndarray]:
    """How often each index is handled by the body's loops (each must be exactly 1): rows of a
    split by (tile, step, simdgroup, slot); elements of a row by (lane j, vector i, x); merged
    output elements of a head by threads (step 6)."""
    lay, t = plan.layout, dict(plan.template)
    split_len = split_len or plan.split_len
    count = {"rows": np.zeros(split_len, int), "elems": np.zeros(t["D"], int)}
    count["out"] = np.zeros(t["D"], int)
    for it in range(-(-split_len // t["TILE_KV"])):
        rows, ok = tile_rows(plan, np.array([it * t["TILE_KV"]]), np.array([split_len]))
        np.add.at(count["rows"], rows[ok], 1)
    for j in range(lay.lanes_per_row):
        for i in range(lay.vecs_per_lane):
            base = (j + lay.lanes_per_row * i) * lay.elems_per_vec
            count["elems"][base : base + lay.elems_per_vec] += 1
    for tid in range(t["THREADS"]):
        count["out"][tid : t["D"] : t["THREADS"]] += 1
    return count
