"""numpy emulation of the flash-decode GPU kernels (kernels/gpu/flash_decode_body.inc).

It runs the kernels' algorithm as written, on the CPU: the threadgroups the launch plan's grid
actually creates (grid / threadgroup in each dimension; a grid given in threadgroups would
leave most of the KV extent unread and fail the parity test), the same splits and tiles, tiles
held in the compute dtype (fp16 here; 4-bit dequantized in float32 and rounded to it), float32
scores summed per lane over d = lane, lane + 32, ... then by the xor butterfly 16, 8, 4, 2, 1,
the same online-softmax update and the same row order in the accumulation, then the same
log-sum-exp combine over splits. What it cannot check is the source itself (compilation,
barriers, address spaces): that needs a GPU. Threadgroups are vectorised: arrays carry a
leading [n_bh, n_splits] pair of axes, one entry per threadgroup.
"""

from __future__ import annotations

import numpy as np

from .launch import SIMD_WIDTH, LaunchPlan, Problem

FP4_MAGNITUDE = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
NP_DTYPES = {"float16": np.float16, "float32": np.float32}


def decode_nibble(code: np.ndarray, kv_code: str) -> np.ndarray:
    """4-bit codes -> values before scaling (fp4 E2M1 or int4 two's complement), float32."""
    code = code.astype(np.int64)
    if kv_code == "fp4":
        mag = FP4_MAGNITUDE[code & 7]
        return np.where(code & 8, -mag, mag).astype(np.float32)
    return ((code ^ 8) - 8).astype(np.float32)


def load_rows(stored: dict, problem: Problem, rows: np.ndarray, t_dtype) -> np.ndarray:
    """Rows [..., D] of K or V in the tile dtype for row indices `rows` [...] (into L)."""
    d = problem.head_dim
    if problem.kv_code == "dense":
        return stored["data"][..., rows, :].astype(t_dtype)
    words = stored["data"][..., rows, :].astype(np.uint64)  # [..., D/8]
    shifts = 4 * np.arange(8, dtype=np.uint64)
    codes = (words[..., None] >> shifts) & 0xF  # [..., D/8, 8]: element j of each word
    vals = decode_nibble(codes, problem.kv_code).reshape(*codes.shape[:-2], d)
    gs = problem.scale_group
    scales = stored["scales"][..., rows, :].astype(np.float32)  # [..., D/GS]
    return (vals * np.repeat(scales, gs, axis=-1)).astype(t_dtype)


def lane_sum(x: np.ndarray) -> np.ndarray:
    """xor butterfly over the last axis (32 lanes), as lane_sum(); every lane ends equal."""
    for off in (16, 8, 4, 2, 1):
        x = x + x[..., np.arange(SIMD_WIDTH) ^ off]
    return x[..., 0]


def lane_partials(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-lane float32 partial dot products over d = lane, lane + 32, ... (in that order)."""
    d = a.shape[-1]
    out = np.zeros((*np.broadcast_shapes(a.shape[:-1], b.shape[:-1]), SIMD_WIDTH), np.float32)
    for base in range(0, d, SIMD_WIDTH):
        n = min(SIMD_WIDTH, d - base)
        out[..., :n] += a[..., base : base + n] * b[..., base : base + n]
    return out


@np.errstate(invalid="ignore")  # finished threadgroups compute -inf - -inf, then are masked
def partials(q: np.ndarray, k: dict, v: dict, problem: Problem, plan: LaunchPlan, scale: float):
    """(o_part, m_part, l_part) as the kernel writes them, for every launched threadgroup."""
    n_split_groups, n_bh = plan.threadgroups[0], plan.threadgroups[1]
    g_, d = problem.group, problem.head_dim
    tile = dict(plan.template)["TILE_KV"]
    t_dtype = NP_DTYPES[problem.dtype]
    kv_len, split_len, n_splits = plan.params
    flat = lambda s: {n: a.reshape(n_bh, kv_len, -1) for n, a in s.items()}  # noqa: E731
    k, v = flat(k), flat(v)  # [B*Hkv, L, ...]
    q_s = q.reshape(n_bh, 1, g_, d).astype(np.float32) * np.float32(scale)  # [bh, 1, G, D]
    start = np.arange(n_split_groups) * split_len  # [S]
    end = np.minimum(start + split_len, kv_len)
    m = np.full((n_bh, n_split_groups, g_), -np.inf, np.float32)
    l = np.zeros_like(m)
    acc = np.zeros((n_bh, n_split_groups, g_, d), np.float32)
    for t in range(split_len // tile):
        t0 = start + t * tile  # [S]
        n_rows = np.clip(end - t0, 0, tile)  # [S]; 0: this threadgroup's loop has ended
        rows = t0[:, None] + np.arange(tile)  # [S, TILE]
        valid = np.arange(tile)[None, :] < n_rows[:, None]  # [S, TILE]
        safe = np.where(valid, rows, 0)
        kt = np.where(valid[..., None], load_rows(k, problem, safe, t_dtype), 0)
        vt = np.where(valid[..., None], load_rows(v, problem, safe, t_dtype), 0)
        kt, vt = kt.astype(np.float32), vt.astype(np.float32)  # [bh, S, TILE, D]
        part = lane_partials(q_s[:, :, :, None, :], kt[:, :, None, :, :])  # [bh,S,G,TILE,32]
        s = np.where(valid[None, :, None, :], lane_sum(part), -np.inf)  # [bh, S, G, TILE]
        lanes = np.full((*s.shape[:-1], SIMD_WIDTH * -(-tile // SIMD_WIDTH)), -np.inf, np.float32)
        lanes[..., :tile] = s  # row r = lane + 32 i
        by_lane = lanes.reshape(*s.shape[:-1], -1, SIMD_WIDTH)  # [..., i, lane]
        m_new = np.maximum(m, by_lane.max(axis=(-2, -1)))
        e = np.exp(by_lane - m_new[..., None, None]).astype(np.float32)
        t_sum = np.zeros((*s.shape[:-1], SIMD_WIDTH), np.float32)
        for i in range(by_lane.shape[-2]):
            t_sum += e[..., i, :]
        alpha = np.exp(m - m_new).astype(np.float32)
        p = e.reshape(*s.shape[:-1], -1)[..., :tile]  # [bh, S, G, TILE]
        o = acc * alpha[..., None]
        for r in range(tile):  # rows in order; rows past n_rows add p = 0 times v = 0
            o = o + p[..., r, None] * vt[:, :, None, r, :]
        live = (n_rows > 0)[None, :, None]
        acc = np.where(live[..., None], o, acc)
        l = np.where(live, l * alpha + lane_sum(t_sum), l)
        m = np.where(live, m_new, m)
    rows_out = (n_bh * g_, n_splits)
    o_part = acc.transpose(0, 2, 1, 3).reshape(*rows_out, d)  # [B*Hq, S, D]
    return o_part, m.transpose(0, 2, 1).reshape(rows_out), l.transpose(0, 2, 1).reshape(rows_out)


def combine_splits(o_part, m_part, l_part) -> np.ndarray:
    """The log-sum-exp combine of kernels/gpu_kernels.combine_splits, in numpy float32."""
    w = np.exp(m_part - m_part.max(axis=-1, keepdims=True))
    return (w[..., None] * o_part).sum(axis=1) / (w * l_part).sum(axis=1, keepdims=True)


def flash_decode(q, k: dict, v: dict, problem: Problem, plan: LaunchPlan, scale: float):
    """The kernels' output [B, Hq, 1, D] (float32) for numpy q and stored K/V dicts."""
    if any(gr % tg for gr, tg in zip(plan.grid, plan.threadgroup)):
        raise ValueError(f"grid {plan.grid} is not a whole number of threadgroups")
    out = combine_splits(*partials(q, k, v, problem, plan, scale))
    return out.reshape(q.shape)


def ownership(plan: LaunchPlan) -> dict[str, np.ndarray]:
    """How often each element is handled by the body's loops (each must be exactly 1):
    tile loads over [TILE*D] (dense) or [TILE*D/8] words, score pairs over [G*TILE] by
    simdgroup, outputs over [G*D] by thread."""
    t = dict(plan.template)
    g, d, tile, threads = t["G"], t["D"], t["TILE_KV"], t["THREADS"]
    n_simd, acc = threads // SIMD_WIDTH, -(-(g * d) // threads)
    count = {k: np.zeros(n, int) for k, n in (("load", tile * d), ("words", tile * d // 8))}
    count |= {"pairs": np.zeros(g * tile, int), "out": np.zeros(g * d, int)}
    for tid in range(threads):
        count["load"][tid : tile * d : threads] += 1
        count["words"][tid : tile * d // 8 : threads] += 1
        for i in range(acc):
            if tid + i * threads < g * d:
                count["out"][tid + i * threads] += 1
    for sg in range(n_simd):
        count["pairs"][sg : g * tile : n_simd] += 1
    return count
