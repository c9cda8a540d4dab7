"""Launch planner for the flash-decode GPU kernels (pure Python: no mlx, testable anywhere).

Given a decode problem and a configuration (tile, threads, splits), `plan()` returns everything
the two launches need: the split kernel's grid and threadgroup (both counted in THREADS, the
contract of mx.fast.metal_kernel and of mx.fast.cuda_kernel, which divides grid by threadgroup
to get blocks), its template arguments, the split of the KV extent and the threadgroup memory
it declares; and the combine kernel's launch. A configuration the kernel cannot run is refused
here, before any launch. `LaunchPlan.config()` is the configuration actually launched, for the
result row.

Work decomposition (flash-decoding): one threadgroup per (sequence x kv head, split). A split is
a run of whole tiles; inside it each simdgroup reads RPS rows at a time with 16-byte (or 8- /
4-byte) vector loads, one row per slot of LPR lanes, and every slot keeps its own online
softmax for all G = Hq / Hkv query heads (q and accumulators in registers), so each K/V byte is
loaded once for the G heads. Slots merge by shuffles and simdgroups through threadgroup memory
at the end of the split; a second small kernel merges the splits (log-sum-exp).
The number of splits comes from the device's core count and the context (`plan_splits`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

SIMD_WIDTH = 32  # Apple simdgroup and NVIDIA warp width; the kernels reduce across it
DEFAULT_TILE_KV = 32
DEFAULT_THREADS = 128
VEC_CHOICES = (16, 8, 4)  # bytes of one vector load, widest first
REG_ELEMS = 64  # most q elements a lane holds over the G heads (as many accumulators again)
# 4-bit rows decode in registers too: NVRTC 13 (sm_80 / sm_90a) gave 186-198 registers at G=4
# with 8-byte vectors (16 nibbles per lane) and 128 with 4-byte ones, so 4-bit keeps fewer;
# FP8 (decoded in registers as well) takes the same limit
REG_ELEMS_4BIT = 32
MAX_INFLIGHT_WORDS = 64  # most 32-bit K/V words a lane holds per tile (loads in flight)
# q and accumulators (2 per q element) plus the words in flight: NVRTC 13 spilled (255
# registers, 48-64 B of stack) at G=8, D=128, tile 64 (2*64 + 64 = 192 words) and did not at
# G=8, tile 32 (160 words) or G=4, tile 64 (128 words): tests/test_compile_gates.py
MAX_LANE_WORDS = 160
TG_PER_CORE = 4  # threadgroups the split planner wants resident per core / SM
MIN_SPLIT_ROWS = 256  # a split reads at least this many rows: partials stay small beside K/V
# the kernel's KV_CODE: how a row is decoded (flash_decode_common.h KV_DENSE .. KV_IQ4_NL)
KV_CODES = {"dense": 0, "fp4": 1, "int4": 2, "fp8_e4m3": 3, "fp8_e5m2": 4, "iq4_nl": 5,
            "tq4_mse": 6, "tq2_mse": 7}  # fmt: skip
# 8 codes per 32-bit word, float16 scales (TurboQuant's: the row norm, one group per row)
NIBBLE_CODES = ("fp4", "int4", "iq4_nl", "tq4_mse")
TQ_CODES = ("tq4_mse", "tq2_mse")  # q rotated in and the output back by the wrapper
FP8_CODES = ("fp8_e4m3", "fp8_e5m2")  # 4 bytes per word, one float32 scale per KV head
FIXED_GROUP = {"iq4_nl": 32}  # ggml's block: the scale group whatever the format's group_size
ELEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
SCALE_BYTES = 2  # 4-bit group scales are float16
HEAD_SCALE_BYTES = 4  # an FP8 head's scale is float32


class TileConfigError(ValueError):
    """A tile configuration the device cannot launch (refused before launch)."""


@dataclass(frozen=True)
class DeviceLimits:
    name: str
    shared_bytes: int  # threadgroup (Metal) / static shared (CUDA) memory per threadgroup
    max_threads: int  # threads per threadgroup
    default_cores: int  # cores / SMs assumed when the device cannot be asked


# default_cores: an M2 Max has 30 or 38 GPU cores, an H100 SXM 132 SMs (NVIDIA's datasheet);
# used only when kernels/attention/gpu/device.py cannot read the real count.
METAL = DeviceLimits("metal", 32 * 1024, 1024, 32)  # Apple GPUs: 32 KB threadgroup memory
CUDA = DeviceLimits("cuda", 48 * 1024, 1024, 132)  # static __shared__ limit per block (48 KB)
LIMITS = {"metal": METAL, "cuda": CUDA}


@dataclass(frozen=True)
class Problem:
    """One decode attention call: q [B, Hq, 1, D] over K/V [B, Hkv, L, D]."""

    n_seqs: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    kv_len: int
    dtype: str = "float16"  # compute dtype: of q, the output and dense K/V storage
    kv_code: str = "dense"  # a key of KV_CODES
    group_size: int | None = None  # 4-bit scale group (None: one scale per row, G = D)
    q_len: int = 1

    @property
    def group(self) -> int:
        return self.n_q_heads // self.n_kv_heads

    @property
    def scale_group(self) -> int:
        """Elements per stored scale: iq4_nl's block (32) whatever group_size says, else
        group_size, else the row (FP8's head scale counts as one per row here)."""
        return FIXED_GROUP.get(self.kv_code) or self.group_size or self.head_dim

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored K (or V) row: D elements; D/2 for 4-bit, D/4 for tq2, D for FP8
        (scales apart)."""
        if self.kv_code == "dense":
            return self.head_dim * ELEM_BYTES[self.dtype]
        return self.head_dim * 4 // self.elems_per_word

    @property
    def elems_per_word(self) -> int:
        """Elements one 32-bit word of a stored row holds (the kernel's EPW)."""
        if self.kv_code == "dense":
            return 4 // ELEM_BYTES[self.dtype]
        return 4 if self.kv_code in FP8_CODES else 16 if self.kv_code == "tq2_mse" else 8


@dataclass(frozen=True)
class LaneLayout:
    """How a simdgroup reads rows (mirrors the constexpr block of flash_decode_body.inc)."""

    vec_bytes: int  # VEC
    elems_per_vec: int  # EPV
    vecs_per_row: int  # VPR
    lanes_per_row: int  # LPR
    vecs_per_lane: int  # VPL
    rows_per_step: int  # RPS: slots of a simdgroup
    steps: int  # STEPS: rows per slot per tile (loads in flight)
    n_simd: int  # simdgroups per threadgroup


def lane_layout(problem: Problem, vec_bytes: int, threads: int, tile_kv: int) -> LaneLayout:
    epv = vec_bytes // 4 * problem.elems_per_word
    vpr = problem.head_dim // epv
    lpr = min(vpr, SIMD_WIDTH)
    n_simd = threads // SIMD_WIDTH
    rps = SIMD_WIDTH // lpr
    steps = -(-tile_kv // (n_simd * rps))
    return LaneLayout(vec_bytes, epv, vpr, lpr, vpr // lpr, rps, steps, n_simd)


def layout_refusal(problem: Problem, vec_bytes: int) -> str | None:
    """Why a row of this problem cannot be split into vectors of `vec_bytes`, or None."""
    d = problem.head_dim
    if problem.row_bytes % vec_bytes:
        return f"head_dim {d} rows are not a whole number of {vec_bytes}-byte vectors"
    lay = lane_layout(problem, vec_bytes, SIMD_WIDTH, 1)
    vpr = lay.vecs_per_row
    if not (SIMD_WIDTH % vpr == 0 or vpr % SIMD_WIDTH == 0):
        return f"head_dim {d}: {vpr} vectors of {vec_bytes} B per row do not tile 32 lanes"
    if problem.kv_code != "dense" and problem.scale_group % lay.elems_per_vec:
        return f"scale group {problem.scale_group} is not a whole number of vectors"
    return None


def choose_vec(problem: Problem) -> int | None:
    """The widest vector whose per-lane q elements over G heads fit REG_ELEMS (16 bytes for
    fp16 up to G = 8; REG_ELEMS_4BIT for 4-bit and FP8), or the narrowest valid one; None when
    no width tiles the row."""
    valid = [v for v in VEC_CHOICES if layout_refusal(problem, v) is None]
    limit = REG_ELEMS if problem.kv_code == "dense" else REG_ELEMS_4BIT
    for v in valid:
        if problem.group * lane_layout(problem, v, SIMD_WIDTH, 1).elems_per_vec <= limit:
            return v
    return valid[-1] if valid else None


def shared_bytes(problem: Problem, threads: int) -> int:
    """Bytes of the kernel's threadgroup arrays: sh_o [2*N_SIMD*D] and sh_ml [2*N_SIMD*2] f32
    (the double-buffered merge of simdgroups, flash_decode_body.inc step 6)."""
    n_simd = threads // SIMD_WIDTH
    return 4 * (2 * n_simd * problem.head_dim + 4 * n_simd)


def _problem_refusal(problem: Problem) -> str | None:
    if problem.q_len != 1:
        return f"decode only (q_len 1), got q_len {problem.q_len}"
    if problem.dtype not in ELEM_BYTES:
        return f"compute dtype {problem.dtype} not supported"
    if problem.kv_code not in KV_CODES:
        return f"kv format {problem.kv_code} not supported ({', '.join(KV_CODES)})"
    if problem.n_q_heads % problem.n_kv_heads:
        return f"n_q_heads {problem.n_q_heads} not divisible by n_kv_heads {problem.n_kv_heads}"
    if problem.kv_code == "tq2_mse" and problem.head_dim % 16:
        return f"tq2_mse needs head_dim a multiple of 16 (D={problem.head_dim})"
    if problem.kv_code in NIBBLE_CODES:
        gs = problem.scale_group
        if problem.head_dim % 8 or gs % 8 or problem.head_dim % gs:
            return (
                f"4-bit needs head_dim and group size multiples of 8 (D={problem.head_dim}, G={gs})"
            )
    return None


def refusal(
    problem: Problem,
    tile_kv: int,
    threads: int,
    limits: DeviceLimits,
    vec_bytes: int | None = None,
) -> str | None:
    """Why this configuration cannot launch on `limits`, or None when it can."""
    reason = _problem_refusal(problem)
    if reason:
        return reason
    if threads % SIMD_WIDTH or not 0 < threads <= limits.max_threads:
        return f"threads {threads} must be a multiple of {SIMD_WIDTH} up to {limits.max_threads}"
    if tile_kv <= 0:
        return f"tile_kv must be positive, got {tile_kv}"
    vec = vec_bytes or choose_vec(problem)
    reason = layout_refusal(problem, vec) if vec else "no vector width tiles a row"
    if reason:
        return reason
    lay = lane_layout(problem, vec, threads, tile_kv)
    words = 2 * lay.steps * lay.vecs_per_lane * vec // 4
    if words > MAX_INFLIGHT_WORDS:
        return (
            f"tile_kv {tile_kv} puts {words} K/V words in flight per lane (> {MAX_INFLIGHT_WORDS}:"
            f" registers spill) at {threads} threads, {vec}-byte vectors"
        )
    q_elems = problem.group * lay.elems_per_vec * lay.vecs_per_lane
    if 2 * q_elems + words > MAX_LANE_WORDS:
        return (
            f"tile_kv {tile_kv} at G={problem.group}: {2 * q_elems} q/accumulator + {words} K/V "
            f"words per lane (> {MAX_LANE_WORDS}: registers spill)"
        )
    need = shared_bytes(problem, threads)
    if need > limits.shared_bytes:
        return f"{threads} threads need {need} B of threadgroup memory > {limits.shared_bytes} B"
    return None


def plan_splits(
    n_kv: int,
    n_bh: int,
    n_cores: int,
    tile_kv: int,
    *,
    tg_per_core: int = TG_PER_CORE,
    min_split_rows: int = MIN_SPLIT_ROWS,
) -> tuple[int, int]:
    """(split_len, n_splits) for n_kv positions over n_bh (sequence x kv head) threadgroup rows.

    Wants n_bh * n_splits >= n_cores * tg_per_core (every core busy), but no split shorter than
    min_split_rows (each split writes G*(D+2) floats that the combine reads back) and none
    shorter than a tile. Splits are whole tiles and never empty."""
    n_tiles = math.ceil(n_kv / tile_kv)
    want = math.ceil(n_cores * tg_per_core / n_bh)
    cap = max(1, n_kv // min_split_rows)
    n = max(1, min(want, cap, n_tiles))
    split_len = math.ceil(n_tiles / n) * tile_kv
    return split_len, math.ceil(n_kv / split_len)


def fixed_splits(n_kv: int, tile_kv: int, n_splits: int) -> tuple[int, int]:
    """(split_len, n_splits) for a requested split count (a sweep); fewer if tiles run out."""
    n_tiles = math.ceil(n_kv / tile_kv)
    split_len = math.ceil(n_tiles / max(1, min(n_splits, n_tiles))) * tile_kv
    return split_len, math.ceil(n_kv / split_len)


@dataclass(frozen=True)
class LaunchPlan:
    grid: tuple[int, int, int]  # in threads (not threadgroups), as metal_kernel expects
    threadgroup: tuple[int, int, int]
    shared_bytes: int  # threadgroup / shared memory the split kernel declares
    template: tuple[tuple[str, object], ...]  # (name, value); "T" is the dtype name
    n_splits: int
    split_len: int  # positions per split, a multiple of tile_kv
    params: tuple[int, int, int, int]  # int32 input: (kv_len, split_len, n_splits, n_kv_heads)
    output_shapes: tuple[tuple[int, ...], ...]  # o_part, m_part, l_part
    combine_grid: tuple[int, int, int]
    combine_threadgroup: tuple[int, int, int]
    combine_template: tuple[tuple[str, object], ...]
    combine_params: tuple[int]  # int32 input of the combine: (n_splits,)
    layout: LaneLayout
    n_cores: int  # the core / SM count the split planner used

    @property
    def threadgroups(self) -> tuple[int, int, int]:
        return tuple(g // t for g, t in zip(self.grid, self.threadgroup))

    def config(self) -> dict:
        """The configuration actually launched, as plain columns for a result row."""
        t = dict(self.template)
        return {
            "tile_kv": t["TILE_KV"],
            "threads": t["THREADS"],
            "n_splits": self.n_splits,
            "split_len": self.split_len,
            "vec_bytes": t["VEC"],
            "n_cores": self.n_cores,
            "launches": 2,
        }


def plan(
    problem: Problem,
    tile_kv: int,
    threads: int = DEFAULT_THREADS,
    limits: DeviceLimits = METAL,
    *,
    n_splits: int | None = None,
    n_cores: int | None = None,
    vec_bytes: int | None = None,
) -> LaunchPlan:
    """The two launches of the flash-decode kernel for `problem`; TileConfigError if refused.
    n_splits None: from `plan_splits` with n_cores (None: the backend's default count)."""
    reason = refusal(problem, tile_kv, threads, limits, vec_bytes)
    if reason:
        raise TileConfigError(reason)
    vec = vec_bytes or choose_vec(problem)
    cores = n_cores or limits.default_cores
    bh = problem.n_seqs * problem.n_kv_heads
    if n_splits is None:
        split_len, n_split = plan_splits(problem.kv_len, bh, cores, tile_kv)
    else:
        split_len, n_split = fixed_splits(problem.kv_len, tile_kv, n_splits)
    rows, d = problem.n_seqs * problem.n_q_heads, problem.head_dim
    template = (
        ("T", problem.dtype),
        ("G", problem.group),
        ("D", d),
        ("TILE_KV", tile_kv),
        ("THREADS", threads),
        ("GS", problem.scale_group),
        ("VEC", vec),
    )
    return LaunchPlan(
        grid=(threads * n_split, bh, 1),  # threads: n_splits threadgroups along x
        threadgroup=(threads, 1, 1),
        shared_bytes=shared_bytes(problem, threads),
        template=template,
        n_splits=n_split,
        split_len=split_len,
        params=(problem.kv_len, split_len, n_split, problem.n_kv_heads),
        output_shapes=((rows, n_split, d), (rows, n_split), (rows, n_split)),
        combine_grid=(SIMD_WIDTH, rows, 1),  # one simdgroup per output row
        combine_threadgroup=(SIMD_WIDTH, 1, 1),
        combine_template=(("T", problem.dtype), ("D", d)),
        combine_params=(n_split,),
        layout=lane_layout(problem, vec, threads, tile_kv),
        n_cores=cores,
    )


# Every kernel call plans its launch; the plan is a pure function of frozen, hashable values, so
# it is computed once per (problem, configuration). Uncached it cost about a quarter of the
# wrapper's host time per call (docs/kernels.md, "fixed cost per call"). A refusal raises and is
# not cached (it is raised again, with the same reason, on the next call).
cached_plan = lru_cache(maxsize=1024)(plan)
