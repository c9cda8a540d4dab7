"""The custom flash-decode kernels: Metal (mx.fast.metal_kernel) and CUDA (mx.fast.cuda_kernel).

The CUDA kernel ran on an NVIDIA H200 (2026-11-26, docs/kernels.md: parity at every tested format
and shape, slow); the Metal kernel has never run on hardware. The
algorithm is verified on CPU by a numpy emulation of the same lane layout, splits and reduction
order (kernels/attention/gpu/emulate.py) and by the shared source itself compiled with g++ and run
on CPU
threads (tests/cpu_sim); the launch parameters by tests of kernels/attention/gpu/launch.py.

Two launches per call: the split kernel (prelude + kernels/attention/gpu/src/flash_decode_common.h
as the
header; entry + kernels/attention/gpu/src/flash_decode_body.inc as the source) writes per-split
partials, and
the combine kernel (same header; combine entry +
kernels/attention/gpu/src/flash_decode_combine.inc) merges
them into the output in the compute dtype. The two backends differ only in the prelude and the
entry lines. Template arguments: T, G, D, TILE_KV, THREADS, GS, VEC (one compile per shape and
configuration); the sequence length, split length, split count and kv head count are an int32
input, so a new length never recompiles. Inputs are passed as they are
(ensure_row_contiguous=False): the kernel reads every array through the strides MLX passes, so a
sliced cache view is never copied. Decode only (one query per sequence).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import mlx.core as mx

from kvbench.kernels.attention.gpu import device as gpu_device
from kvbench.kernels.attention.gpu import launch

HERE = Path(__file__).parent
SOURCES = {
    "metal": HERE / "metal" / "flash_decode.metal",
    "cuda": HERE / "cuda" / "flash_decode.cu",
}
COMMON = HERE / "src" / "flash_decode_common.h"
BODY = HERE / "src" / "flash_decode_body.inc"
COMBINE_BODY = HERE / "src" / "flash_decode_combine.inc"
ENTRY_MARK = "// ==== entry ===="
COMBINE_MARK = "// ==== combine entry ===="
INPUTS = ["q", "k", "v", "k_scales", "v_scales", "params", "scale"]
OUTPUTS = ["o_part", "m_part", "l_part"]
COMBINE_INPUTS = ["o_part", "m_part", "l_part", "params"]
COMBINE_OUTPUTS = ["out"]
COMBINE = "combine"  # compiled()'s key for the combine kernel
DTYPE_NAMES = {mx.float16: "float16", mx.bfloat16: "bfloat16", mx.float32: "float32"}
MX_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}


def kv_code(fmt) -> str | None:
    """The kernel's row decoder for a format: dense, or the quantized format's own name where
    the kernel decodes it (launch.KV_CODES: fp4, int4, fp8_e4m3, fp8_e5m2, iq4_nl); None when
    it cannot. TurboQuant is not there: see `accepts`."""
    if not fmt.quantized:
        return "dense"
    return fmt.name if fmt.name in launch.KV_CODES else None


def _parts(backend: str) -> tuple[str, str, str]:
    """(prelude, split entry, combine entry) of the backend's source file."""
    prelude, entries = SOURCES[backend].read_text().split(ENTRY_MARK)
    entry, combine_entry = entries.split(COMBINE_MARK)
    return prelude, entry, combine_entry


def kernel_source(backend: str, code: str) -> tuple[str, str]:
    """(header, source) of the `backend` split kernel for row decoder `code`."""
    prelude, entry, _ = _parts(backend)
    header = f"#define KV_CODE {launch.KV_CODES[code]}\n{prelude}\n{COMMON.read_text()}"
    return header, entry + BODY.read_text()


def combine_source(backend: str) -> tuple[str, str]:
    """(header, source) of the `backend` combine kernel (no KV_CODE: it reads partials)."""
    prelude, _, combine_entry = _parts(backend)
    return f"{prelude}\n{COMMON.read_text()}", combine_entry + COMBINE_BODY.read_text()


def _make(backend: str):
    return mx.fast.metal_kernel if backend == "metal" else mx.fast.cuda_kernel


@cache
def compiled(backend: str, code: str):
    """The kernel object for row decoder `code` (dense, fp4, int4) or COMBINE; MLX compiles it
    per template instantiation on first call. One cache for both kernels, so a caller that
    swaps mx.fast's factory clears them together (compiled.cache_clear()).
    Split kernel: ensure_row_contiguous=False, the body addresses K/V through their strides."""
    if code == COMBINE:
        header, source = combine_source(backend)
        names = dict(input_names=COMBINE_INPUTS, output_names=COMBINE_OUTPUTS)
        return _make(backend)(
            name="kvbench_flash_decode_combine", source=source, header=header, **names
        )
    header, source = kernel_source(backend, code)
    return _make(backend)(
        name=f"kvbench_flash_decode_{code}",  # one name per decoder: KV_CODE is in the header
        input_names=INPUTS,
        output_names=OUTPUTS,
        source=source,
        header=header,
        ensure_row_contiguous=False,
    )


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
        group_size=getattr(fmt, "group_size", None) if fmt.quantized else None,  # dense: 1 compile
        q_len=lq,
    )


METAL_CONSTANT_ELEMS = 8  # MLX's metal_kernel passes an input of fewer elements as `constant`


def device_sized(data: mx.array) -> mx.array:
    """K/V data of fewer than 8 elements (toy shapes) padded with unread positions, so Metal
    gets it in `device` memory, which the body's vector loads need. Copies at most 7 elements;
    any real cache is passed as it is (a view, never copied)."""
    if data.size >= METAL_CONSTANT_ELEMS:
        return data
    b, h, n, w = data.shape
    extra = -(-METAL_CONSTANT_ELEMS // (b * h * w)) - n  # positions >= kv_len are never read
    return mx.pad(data, [(0, 0), (0, 0), (0, extra), (0, 0)])


def head_scales(fmt, n_kv_heads: int) -> mx.array:
    """FP8's scale as the kernel reads it: float32 [Hkv], one per KV head (a per-tensor scale
    repeated). The same for K and V: a format holds one scale (the model cache passes FP8 at
    scale 1 and folds each layer's K and V scales around the kernel, registry.kv_scaled)."""
    s = fmt.tensor_scale()
    if len(s) not in (1, n_kv_heads):
        raise launch.TileConfigError(f"{fmt.name}: {len(s)} head scales for {n_kv_heads} KV heads")
    return mx.array(s * (n_kv_heads if len(s) == 1 else 1), dtype=mx.float32)


def scale_inputs(k: dict, v: dict, fmt) -> tuple[mx.array, mx.array]:
    """(k_scales, v_scales) as the split kernel takes them: the stored float16 group scales
    (4-bit), FP8's float32 head scales, or a dummy (dense: no scales)."""
    if fmt is not None and fmt.quantized and fmt.name in launch.FP8_CODES:
        s = head_scales(fmt, k["data"].shape[1])
        return s, s
    dummy = mx.zeros((1,), dtype=mx.float16)
    return k.get("scales", dummy), v.get("scales", dummy)


def launch_inputs(q, k: dict, v: dict, plan: launch.LaunchPlan, scale: float, fmt=None) -> list:
    """The split kernel's inputs, in INPUTS order (fmt None: a format without head scales)."""
    k_scales, v_scales = scale_inputs(k, v, fmt)
    return [
        q,
        device_sized(k["data"]),
        device_sized(v["data"]),
        k_scales,
        v_scales,
        mx.array(plan.params, dtype=mx.int32),
        mx.array([scale], dtype=mx.float32),
    ]


def plan_for(backend: str, q, k: dict, fmt, *, tile_kv=None, threads=None, n_splits=None):
    """The LaunchPlan a call with these arguments launches (TileConfigError if refused);
    `plan.config()` is what a result row records."""
    problem = problem_of(q, k, fmt)
    if problem.kv_code == "dense" and k["data"].dtype != q.dtype:
        raise launch.TileConfigError(f"dense K/V {k['data'].dtype} differ from q {q.dtype}")
    return launch.plan(
        problem,
        tile_kv or launch.DEFAULT_TILE_KV,
        threads or launch.DEFAULT_THREADS,
        launch.LIMITS[backend],
        n_splits=n_splits,
        n_cores=gpu_device.core_count(backend)[0],
    )


def flash_decode(backend: str, q, k, v, fmt, *, scale: float, tile_kv=None, **config):
    """Split kernel then combine kernel: two launches, out [B, Hq, 1, D] in q's dtype."""
    problem = problem_of(q, k, fmt)
    plan = plan_for(backend, q, k, fmt, tile_kv=tile_kv, **config)  # refuses before launch
    as_mx = lambda t: [(n, MX_DTYPES[x] if n == "T" else x) for n, x in t]  # noqa: E731
    parts = compiled(backend, problem.kv_code)(
        inputs=launch_inputs(q, k, v, plan, scale, fmt),
        template=as_mx(plan.template),
        grid=plan.grid,
        threadgroup=plan.threadgroup,
        output_shapes=list(plan.output_shapes),
        output_dtypes=[mx.float32] * 3,
    )
    (out,) = compiled(backend, COMBINE)(
        inputs=[*parts, mx.array(plan.combine_params, dtype=mx.int32)],
        template=as_mx(plan.combine_template),
        grid=plan.combine_grid,
        threadgroup=plan.combine_threadgroup,
        output_shapes=[(plan.output_shapes[1][0], problem.head_dim)],
        output_dtypes=[q.dtype],
    )
    return out.reshape(q.shape)  # [B*Hq, D] -> [B, Hq, 1, D]


def _check_mask(mask) -> None:
    if mask is not None and not isinstance(mask, str):
        raise NotImplementedError("the flash-decode kernels take no mask array (decode only)")


def metal(q, k, v, fmt, *, mask=None, scale: float, tile_kv=None, threads=None, n_splits=None):
    """Flash-decode on Metal; mask None or "causal" (one query sees every key)."""
    _check_mask(mask)
    config = dict(threads=threads, n_splits=n_splits)
    return flash_decode("metal", q, k, v, fmt, scale=scale, tile_kv=tile_kv, **config)


def cuda(q, k, v, fmt, *, mask=None, scale: float, tile_kv=None, threads=None, n_splits=None):
    """Flash-decode on CUDA: the same algorithm, lane layout and names as `metal`."""
    _check_mask(mask)
    config = dict(threads=threads, n_splits=n_splits)
    return flash_decode("cuda", q, k, v, fmt, scale=scale, tile_kv=tile_kv, **config)


# docs/kernels.md: tq2/tq4_mse would fit (q rotated once outside, a 2^b-entry codebook input,
# the row norm as a one-group scale); tq3's codes straddle the 32-bit words a lane decodes and
# tq*_prod's QJL sketch needs q projected by a second d x d matrix and a second accumulator
TURBO_REASON = (
    "TurboQuant has no GPU tile loader yet (tq3 codes straddle 32-bit words; tq*_prod needs a "
    "second projection of q); the tiled kernel reads every tq format"
)


def accepts(fmt) -> str | None:
    """Formats the kernels load: any dense dtype, fp4, int4, iq4_nl and FP8 (decoded in
    registers, fused)."""
    if kv_code(fmt):
        return None
    if fmt.name.startswith("tq"):
        return TURBO_REASON
    return f"no tile loader for {fmt.name} ({', '.join(launch.KV_CODES)} only)"


def fits(backend: str):
    """(fmt, problem, tile_kv) -> why the launch would be refused on `backend`, or None."""

    def check(fmt, problem: launch.Problem, tile_kv: int | None) -> str | None:
        tile = tile_kv or launch.DEFAULT_TILE_KV
        return launch.refusal(problem, tile, launch.DEFAULT_THREADS, launch.LIMITS[backend])

    return check
