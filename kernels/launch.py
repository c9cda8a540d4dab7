"""Launch planner for the flash-decode GPU kernels (pure Python: no mlx, testable anywhere).

Given a decode problem and a tile configuration, `plan()` returns everything a launch needs:
grid and threadgroup (both counted in THREADS, the contract of mx.fast.metal_kernel and of
mx.fast.cuda_kernel, which divides grid by threadgroup to get blocks), the template arguments,
the output shapes, the split of the KV extent, and the threadgroup / shared memory the kernel
declares. A configuration over the device's limit is refused here, before any launch.

Work decomposition (flash-decoding): one threadgroup per (sequence, kv head, split). A split is
a run of whole tiles of TILE_KV positions; the threadgroup walks its tiles with an online
softmax and writes an unnormalised partial (acc, running max m, running sum l) per query head;
an exact log-sum-exp combine over splits finishes the output (kernels/gpu_kernels.py).
The G = Hq / Hkv query heads of a kv head share the threadgroup, so a K/V tile is read from
memory once for all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SIMD_WIDTH = 32  # Apple simdgroup and NVIDIA warp width; the kernels reduce across it
DEFAULT_TILE_KV = 32
DEFAULT_THREADS = 128
TARGET_THREADGROUPS = 128  # enough threadgroups to fill an M-series GPU or an H100's 132 SMs
KV_CODES = {"dense": 0, "fp4": 1, "int4": 2}  # the kernel's KV_CODE: how a tile is loaded
ELEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


class TileConfigError(ValueError):
    """A tile configuration the device cannot launch (refused before launch)."""


@dataclass(frozen=True)
class DeviceLimits:
    name: str
    shared_bytes: int  # threadgroup (Metal) / static shared (CUDA) memory per threadgroup
    max_threads: int  # threads per threadgroup


METAL = DeviceLimits("metal", 32 * 1024, 1024)  # Apple GPUs: 32 KB threadgroup memory
CUDA = DeviceLimits("cuda", 48 * 1024, 1024)  # static __shared__ limit per block (48 KB)
LIMITS = {"metal": METAL, "cuda": CUDA}


@dataclass(frozen=True)
class Problem:
    """One decode attention call: q [B, Hq, 1, D] over K/V [B, Hkv, L, D]."""

    n_seqs: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    kv_len: int
    dtype: str = "float16"  # compute dtype: of q, the output and the tiles in shared memory
    kv_code: str = "dense"  # dense | fp4 | int4
    group_size: int | None = None  # 4-bit scale group (None: one scale per row, G = D)
    q_len: int = 1

    @property
    def group(self) -> int:
        return self.n_q_heads // self.n_kv_heads

    @property
    def scale_group(self) -> int:
        return self.group_size or self.head_dim


@dataclass(frozen=True)
class LaunchPlan:
    grid: tuple[int, int, int]  # in threads (not threadgroups), as metal_kernel expects
    threadgroup: tuple[int, int, int]
    shared_bytes: int  # threadgroup / shared memory the kernel declares
    template: tuple[tuple[str, object], ...]  # (name, value); "T" is the dtype name
    n_splits: int
    split_len: int  # positions per split, a multiple of tile_kv
    params: tuple[int, int, int]  # the kernel's int32 input: (kv_len, split_len, n_splits)
    output_shapes: tuple[tuple[int, ...], ...]  # o_part, m_part, l_part

    @property
    def threadgroups(self) -> tuple[int, int, int]:
        return tuple(g // t for g, t in zip(self.grid, self.threadgroup))


def shared_bytes(problem: Problem, tile_kv: int) -> int:
    """Bytes of the kernel's threadgroup arrays: q_s [G*D] f32, k_tile and v_tile
    [TILE_KV*D] T, p_s [G*TILE_KV] f32, m_s, l_s, alpha_s [G] f32 (see flash_decode_body)."""
    g, d = problem.group, problem.head_dim
    elem = ELEM_BYTES[problem.dtype]
    return 4 * g * d + 2 * tile_kv * d * elem + 4 * g * tile_kv + 3 * 4 * g


def refusal(problem: Problem, tile_kv: int, threads: int, limits: DeviceLimits) -> str | None:
    """Why this configuration cannot launch on `limits`, or None when it can."""
    if problem.q_len != 1:
        return f"decode only (q_len 1), got q_len {problem.q_len}"
    if problem.dtype not in ELEM_BYTES:
        return f"compute dtype {problem.dtype} not supported"
    if problem.kv_code not in KV_CODES:
        return f"kv format {problem.kv_code} not supported (dense, fp4, int4)"
    if problem.n_q_heads % problem.n_kv_heads:
        return f"n_q_heads {problem.n_q_heads} not divisible by n_kv_heads {problem.n_kv_heads}"
    if threads % SIMD_WIDTH or not 0 < threads <= limits.max_threads:
        return f"threads {threads} must be a multiple of {SIMD_WIDTH} up to {limits.max_threads}"
    if tile_kv <= 0:
        return f"tile_kv must be positive, got {tile_kv}"
    if problem.kv_code != "dense":
        gs = problem.scale_group
        if problem.head_dim % 8 or gs % 8 or problem.head_dim % gs:
            return (
                f"4-bit needs head_dim and group size multiples of 8 (D={problem.head_dim}, G={gs})"
            )
    need = shared_bytes(problem, tile_kv)
    if need > limits.shared_bytes:
        return (
            f"tile_kv {tile_kv} needs {need} B of {limits.name} threadgroup memory "
            f"(G={problem.group}, D={problem.head_dim}, {problem.dtype}) > {limits.shared_bytes} B"
        )
    return None


def split_plan(problem: Problem, tile_kv: int) -> tuple[int, int]:
    """(split_len, n_splits): whole tiles per split, enough splits to fill the device."""
    n_tiles = math.ceil(problem.kv_len / tile_kv)
    heads = problem.n_seqs * problem.n_kv_heads
    want_splits = max(1, math.ceil(TARGET_THREADGROUPS / heads))
    split_len = math.ceil(n_tiles / want_splits) * tile_kv
    return split_len, math.ceil(problem.kv_len / split_len)


def plan(
    problem: Problem, tile_kv: int, threads: int = DEFAULT_THREADS, limits: DeviceLimits = METAL
) -> LaunchPlan:
    """The launch of the flash-decode kernel for `problem`; TileConfigError if refused."""
    reason = refusal(problem, tile_kv, threads, limits)
    if reason:
        raise TileConfigError(reason)
    split_len, n_splits = split_plan(problem, tile_kv)
    bh = problem.n_seqs * problem.n_kv_heads
    rows = problem.n_seqs * problem.n_q_heads
    template = (
        ("T", problem.dtype),
        ("G", problem.group),
        ("D", problem.head_dim),
        ("TILE_KV", tile_kv),
        ("THREADS", threads),
        ("GS", problem.scale_group),
    )
    return LaunchPlan(
        grid=(threads * n_splits, bh, 1),  # threads: n_splits threadgroups along x
        threadgroup=(threads, 1, 1),
        shared_bytes=shared_bytes(problem, tile_kv),
        template=template,
        n_splits=n_splits,
        split_len=split_len,
        params=(problem.kv_len, split_len, n_splits),
        output_shapes=((rows, n_splits, problem.head_dim), (rows, n_splits), (rows, n_splits)),
    )
