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

Formats (launch.KV_CODES): dense fp16 / bf16 / fp32, fp4, int4 (both ran on the H200), and,
since 2026-11-27, fp8_e4m3 / fp8_e5m2 (a float32 scale per KV head), iq4_nl and TurboQuant
tq4_mse / tq2_mse (q rotated in and the output back around the kernels): these last ones are
compiled (NVRTC, clang + MSL shim) and decode-checked on the CPU, never run on a GPU.
"""

from __future__ import annotations

from functools import cache, lru_cache
from pathlib import Path

import mlx.core as mx
import numpy as np

from kvbench.kernels.attention.gpu import device as gpu_device
from kvbench.kernels.attention.gpu import launch
from kvbench.kernels.formats import turbo

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
ENCODE_MARK = "// ==== encode entry ===="
INPUTS = ["q", "k", "v", "k_scales", "v_scales", "params", "scale"]
OUTPUTS = ["o_part", "m_part", "l_part"]
COMBINE_INPUTS = ["o_part", "m_part", "l_part", "params"]
COMBINE_OUTPUTS = ["out"]
COMBINE = "combine"  # compiled()'s key for the combine kernel
DTYPE_NAMES = {mx.float16: "float16", mx.bfloat16: "bfloat16", mx.float32: "float32"}
MX_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}


def kv_code(fmt) -> str | None:
    """The kernel's row decoder for a format: dense, or the quantized format's own name where
    the kernel decodes it (launch.KV_CODES: fp4, int4, fp8_e4m3, fp8_e5m2, iq4_nl, tq4_mse,
    tq2_mse); None when it cannot (the other TurboQuant formats: see `accepts`)."""
    if not fmt.quantized:
        return "dense"
    return fmt.name if fmt.name in launch.KV_CODES else None


def compact(text: str) -> str:
    """The text without comments, indentation and blank lines (one line per code line, so
    preprocessor lines stay whole). MLX builds the whole source string for every call and
    hashes it at every evaluation (mlx/backend/cuda/custom_kernel.cpp: build_kernel, then
    std::hash of the source for the module cache): a shorter text is less host work per call.
    A `//` inside a string literal is kept (an odd count of quotes before it)."""
    out = []
    for line in text.splitlines():
        cut = line.find("//")
        while cut >= 0 and line[:cut].count('"') % 2:
            cut = line.find("//", cut + 2)
        code = (line[:cut] if cut >= 0 else line).strip()
        if code:
            out.append(code)
    return "\n".join(out) + "\n"


@cache
def read(path: Path) -> str:
    """A source file's compacted text, read once per process (the sources ship with the
    package and do not change while it runs)."""
    return compact(path.read_text())


def _parts(backend: str) -> tuple[str, str, str, str]:
    """(prelude, split entry, combine entry, encode entry) of the backend's source file,
    compacted (the encode entry: kernels/attention/gpu/encode.py)."""
    prelude, entries = SOURCES[backend].read_text().split(ENTRY_MARK)
    entry, rest = entries.split(COMBINE_MARK)
    combine_entry, encode_entry = rest.split(ENCODE_MARK)
    return tuple(compact(x) for x in (prelude, entry, combine_entry, encode_entry))


def tq_codebook(code: str, head_dim: int) -> np.ndarray:
    """float32 [2^b]: the centroids TurboQuant's codes index (kernels/formats/turbo.py: the
    Lloyd-Max codebook of b bits at head_dim, divided by sqrt(head_dim)), as its decode uses."""
    bits = turbo.parse_name(code)[0]
    return np.array(turbo._mx_tables(bits, head_dim, turbo.SEED)[2], dtype=np.float32)


def codebook_defines(code: str, head_dim: int) -> str:
    """TQ_CODEBOOK and TQ_C0.. (flash_decode_common.h tq_value) for a TurboQuant kernel:
    9 significant digits, so each literal is the float32 centroid exactly."""
    lines = ["#define TQ_CODEBOOK"]
    lines += [f"#define TQ_C{i} {c:.8e}f" for i, c in enumerate(tq_codebook(code, head_dim))]
    return "\n".join(lines) + "\n"


def kernel_source(backend: str, code: str, head_dim: int | None = None) -> tuple[str, str]:
    """(header, source) of the `backend` split kernel for row decoder `code` (TurboQuant:
    head_dim picks the codebook written into the header)."""
    prelude, entry, _, _ = _parts(backend)
    book = codebook_defines(code, head_dim) if code in launch.TQ_CODES else ""
    header = f"#define KV_CODE {launch.KV_CODES[code]}\n{book}{prelude}{read(COMMON)}"
    return header, entry + read(BODY)


def combine_source(backend: str) -> tuple[str, str]:
    """(header, source) of the `backend` combine kernel (no KV_CODE: it reads partials)."""
    prelude, _, combine_entry, _ = _parts(backend)
    return prelude + read(COMMON), combine_entry + read(COMBINE_BODY)


def _make(backend: str):
    return mx.fast.metal_kernel if backend == "metal" else mx.fast.cuda_kernel


@cache
def compiled(backend: str, code: str, head_dim: int | None = None):
    """The kernel object for row decoder `code` (a launch.KV_CODES key; TurboQuant's per
    head_dim, its codebook being in the header) or COMBINE; MLX compiles it
    per template instantiation on first call. One cache for both kernels, so a caller that
    swaps mx.fast's factory clears them together (compiled.cache_clear()).
    Split kernel: ensure_row_contiguous=False, the body addresses K/V through their strides."""
    if code == COMBINE:
        header, source = combine_source(backend)
        names = dict(input_names=COMBINE_INPUTS, output_names=COMBINE_OUTPUTS)
        return _make(backend)(
            name="kvbench_flash_decode_combine", source=source, header=header, **names
        )
    header, source = kernel_source(backend, code, head_dim)
    return _make(backend)(
        # one name per decoder (KV_CODE is in the header) and TurboQuant codebook
        name=f"kvbench_flash_decode_{code}" + (f"_d{head_dim}" if code in launch.TQ_CODES else ""),
        input_names=INPUTS,
        output_names=OUTPUTS,
        source=source,
        header=header,
        ensure_row_contiguous=False,
    )


def kernel_rows(k: dict) -> dict:
    """The stored arrays under the kernel's names: TurboQuant's codes and norms are its data
    and its scales (one group per row); every other format's as they are."""
    return {"data": k["codes"], "scales": k["norms"]} if "codes" in k else k


def problem_of(q, k: dict, fmt) -> launch.Problem:
    b, hq, lq, d = q.shape
    _, hkv, lk = kernel_rows(k)["data"].shape[:3]
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
    dummy = const_array((0.0,), mx.float16)
    return k.get("scales", dummy), v.get("scales", dummy)


@lru_cache(maxsize=512)
def const_array(values: tuple, dtype) -> mx.array:
    """A small constant input (launch params, the softmax scale, a dummy) made once per value,
    not per call: one Python-side array build less per launch. Arrays are immutable, so
    sharing one between calls is safe."""
    return mx.array(values, dtype=dtype)


def launch_inputs(q, k: dict, v: dict, plan: launch.LaunchPlan, scale: float, fmt=None) -> list:
    """The split kernel's inputs, in INPUTS order (fmt None: a format without head scales)."""
    k_scales, v_scales = scale_inputs(k, v, fmt)
    return [
        q,
        device_sized(k["data"]),
        device_sized(v["data"]),
        k_scales,
        v_scales,
        const_array(plan.params, mx.int32),
        const_array((float(scale),), mx.float32),
    ]


@lru_cache(maxsize=512)
def mx_template(template: tuple) -> list:
    """A plan's template arguments as MLX takes them ("T" as an mx dtype), once per plan."""
    return [(n, MX_DTYPES[x] if n == "T" else x) for n, x in template]


def plan_for(backend: str, q, k: dict, fmt, *, tile_kv=None, threads=None, n_splits=None):
    """The LaunchPlan a call with these arguments launches (TileConfigError if refused);
    `plan.config()` is what a result row records."""
    k_dtype = kernel_rows(k)["data"].dtype
    return _plan(backend, problem_of(q, k, fmt), k_dtype, q.dtype, tile_kv, threads, n_splits)


def _plan(backend: str, problem: launch.Problem, k_dtype, q_dtype, tile_kv, threads, n_splits):
    if problem.kv_code == "dense" and k_dtype != q_dtype:
        raise launch.TileConfigError(f"dense K/V {k_dtype} differ from q {q_dtype}")
    return launch.cached_plan(
        problem,
        tile_kv or launch.DEFAULT_TILE_KV,
        threads or launch.DEFAULT_THREADS,
        launch.LIMITS[backend],
        n_splits=n_splits,
        n_cores=gpu_device.core_count(backend)[0],
    )


def flash_decode(backend: str, q, k, v, fmt, *, scale: float, tile_kv=None, **config):
    """Split kernel then combine kernel: two launches, out [B, Hq, 1, D] in q's dtype.
    TurboQuant (tq4_mse, tq2_mse) is read in its rotated basis: q rotated once before the
    kernels, the output rotated back once after (fmt.basis_query / basis_output, as
    kernels/attention/turbo.py)."""
    problem = problem_of(q, k, fmt)
    k, v = kernel_rows(k), kernel_rows(v)
    plan = _plan(backend, problem, k["data"].dtype, q.dtype, tile_kv, **config)  # may refuse
    tq = problem.kv_code in launch.TQ_CODES
    q_in = fmt.basis_query(q).astype(q.dtype) if tq else q
    parts = compiled(backend, problem.kv_code, problem.head_dim if tq else None)(
        inputs=launch_inputs(q_in, k, v, plan, scale, fmt),
        template=mx_template(plan.template),
        grid=plan.grid,
        threadgroup=plan.threadgroup,
        output_shapes=list(plan.output_shapes),
        output_dtypes=[mx.float32] * 3,
    )
    (out,) = compiled(backend, COMBINE)(
        inputs=[*parts, const_array(plan.combine_params, mx.int32)],
        template=mx_template(plan.combine_template),
        grid=plan.combine_grid,
        threadgroup=plan.combine_threadgroup,
        output_shapes=[(plan.output_shapes[1][0], problem.head_dim)],
        output_dtypes=[q.dtype],
    )
    out = out.reshape(q.shape)  # [B*Hq, D] -> [B, Hq, 1, D]
    return fmt.basis_output(out).astype(q.dtype) if tq else out


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


# docs/kernels.md: tq4_mse and tq2_mse are read (q rotated once, codebook in the header, the
# row norm as a one-group scale); tq3's codes straddle the 32-bit words a lane decodes, and
# tq*_prod's rows are 2d wide in the rotated basis ([n c | n g sign], from two stored arrays)
TURBO_REASON = (
    "no GPU tile loader for tq3 (3-bit codes straddle 32-bit words) or tq*_prod (2d-wide rows "
    "from codes and QJL signs); tq4_mse / tq2_mse only; turbo_tiled reads every tq format"
)


def accepts(fmt) -> str | None:
    """Formats the kernels load: any dense dtype, fp4, int4, iq4_nl, FP8, tq4_mse and tq2_mse
    (decoded in registers, fused)."""
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
