"""The custom flash-decode kernels: Metal (mx.fast.metal_kernel) and CUDA (mx.fast.cuda_kernel).

NOT YET RUN ON HARDWARE: no Apple GPU or NVIDIA GPU was available when they were written. The
algorithm is verified on CPU by a numpy emulation of the same tiling, thread partition and
reduction order (kernels/gpu_emulate.py, tests/test_gpu_emulate.py), and the launch parameters
by tests of kernels/launch.py.

Sources: each backend's kernel is its prelude (kernels/metal/flash_decode.metal or
kernels/cuda/flash_decode.cu, the part above `// ==== entry ====`) + the shared helpers
(kernels/gpu/flash_decode_common.h) as the header, and its entry lines + the shared body
(kernels/gpu/flash_decode_body.inc) as the source, so the two backends run one algorithm text.
Template arguments: T, G, D, TILE_KV, THREADS, GS (one compile per shape and tile config); the
sequence length, split length and split count are an int32 input, so a new length never
recompiles. Decode only (one query per sequence).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import mlx.core as mx

from . import launch

HERE = Path(__file__).parent
SOURCES = {
    "metal": HERE / "metal" / "flash_decode.metal",
    "cuda": HERE / "cuda" / "flash_decode.cu",
}
COMMON = HERE / "gpu" / "flash_decode_common.h"
BODY = HERE / "gpu" / "flash_decode_body.inc"
ENTRY_MARK = "// ==== entry ===="
INPUTS = ["q", "k", "v", "k_scales", "v_scales", "params", "scale"]
OUTPUTS = ["o_part", "m_part", "l_part"]
DTYPE_NAMES = {mx.float16: "float16", mx.bfloat16: "bfloat16", mx.float32: "float32"}
MX_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}


def kv_code(fmt) -> str | None:
    """The kernel's tile loader for a format: dense, fp4, int4, or None (unsupported)."""
    if not fmt.quantized:
        return "dense"
    return fmt.name if fmt.name in ("fp4", "int4") else None


def kernel_source(backend: str, code: str) -> tuple[str, str]:
    """(header, source) of the `backend` kernel for tile loader `code`."""
    prelude, entry = SOURCES[backend].read_text().split(ENTRY_MARK)
    header = f"#define KV_CODE {launch.KV_CODES[code]}\n{prelude}\n{COMMON.read_text()}"
    return header, entry + BODY.read_text()


@cache
def compiled(backend: str, code: str):
    """The mx.fast kernel object (MLX compiles it per template instantiation on first call)."""
    header, source = kernel_source(backend, code)
    name = f"kvbench_flash_decode_{code}"  # one name per loader: KV_CODE is in the header
    make = mx.fast.metal_kernel if backend == "metal" else mx.fast.cuda_kernel
    return make(name=name, input_names=INPUTS, output_names=OUTPUTS, source=source, header=header)


def problem_of(q, k: dict, fmt) -> launch.Problem:
    b, hq, lq, d = q.shape
    _, hkv, lk = k["data"].shape[:3]
    return launch.Problem(
        n_seqs=b,
        n_q_heads=hq,
        n_kv_heads=hkv,
        head_dim=d,
        kv_len=lk,
        dtype=DTYPE_NAMES.get(q.dtype, str(q.dtype)),
        kv_code=kv_code(fmt) or fmt.name,
        group_size=fmt.group_size,
        q_len=lq,
    )


def combine_splits(o_part, m_part, l_part) -> mx.array:
    """Exact log-sum-exp combine of per-split partials -> [B*Hq, D] float32."""
    m_max = mx.max(m_part, axis=-1, keepdims=True)  # [B*Hq, 1]
    w = mx.exp(m_part - m_max)  # [B*Hq, S]; splits never empty, so m_part is finite
    num = mx.sum(w[..., None] * o_part, axis=1)  # [B*Hq, D]
    return num / mx.sum(w * l_part, axis=1, keepdims=True)


def launch_inputs(q, k: dict, v: dict, plan: launch.LaunchPlan, scale: float) -> list:
    dummy = mx.zeros((1,), dtype=mx.float16)  # dense caches have no scales
    return [
        q,
        k["data"],
        v["data"],
        k.get("scales", dummy),
        v.get("scales", dummy),
        mx.array(plan.params, dtype=mx.int32),
        mx.array([scale], dtype=mx.float32),
    ]


def flash_decode(backend: str, q, k, v, fmt, *, scale: float, tile_kv: int | None, threads: int):
    problem = problem_of(q, k, fmt)
    tile = tile_kv or launch.DEFAULT_TILE_KV
    plan = launch.plan(problem, tile, threads, launch.LIMITS[backend])  # refuses before launch
    template = [(n, MX_DTYPES[v] if n == "T" else v) for n, v in plan.template]
    o_part, m_part, l_part = compiled(backend, problem.kv_code)(
        inputs=launch_inputs(q, k, v, plan, scale),
        template=template,
        grid=plan.grid,
        threadgroup=plan.threadgroup,
        output_shapes=list(plan.output_shapes),
        output_dtypes=[mx.float32] * 3,
    )
    out = combine_splits(o_part, m_part, l_part)  # [B*Hq, D]
    return out.reshape(q.shape).astype(q.dtype)


def _check_mask(mask) -> None:
    if mask is not None and not isinstance(mask, str):
        raise NotImplementedError("the flash-decode kernels take no mask array (decode only)")


def metal(q, k, v, fmt, *, mask=None, scale: float, tile_kv=None, threads=launch.DEFAULT_THREADS):
    """Flash-decode on Metal; mask None or "causal" (one query sees every key)."""
    _check_mask(mask)
    return flash_decode("metal", q, k, v, fmt, scale=scale, tile_kv=tile_kv, threads=threads)


def cuda(q, k, v, fmt, *, mask=None, scale: float, tile_kv=None, threads=launch.DEFAULT_THREADS):
    """Flash-decode on CUDA: the same algorithm, tiling and names as `metal`."""
    _check_mask(mask)
    return flash_decode("cuda", q, k, v, fmt, scale=scale, tile_kv=tile_kv, threads=threads)


def accepts(fmt) -> str | None:
    """Formats the kernels load: any dense dtype, fp4 and int4 (packed, fused dequant)."""
    return None if kv_code(fmt) else f"no tile loader for {fmt.name} (dense, fp4, int4 only)"


def fits(backend: str):
    """(fmt, problem, tile_kv) -> why the launch would be refused on `backend`, or None."""

    def check(fmt, problem: launch.Problem, tile_kv: int | None) -> str | None:
        tile = tile_kv or launch.DEFAULT_TILE_KV
        return launch.refusal(problem, tile, launch.DEFAULT_THREADS, launch.LIMITS[backend])

    return check
