"""Quantize-on-write in one kernel: the new token's K and V of one layer encoded by a single
`mx.fast.cuda_kernel` / `mx.fast.metal_kernel` launch (scale, codes, packing), bit for bit what
the MLX-ops encoders of kernels/formats/ store for fp4, int4 (quant.py), q4_0, q8_0 (ggml.py),
fp8_e4m3 and fp8_e5m2 (fp8.py).

Why: on an H200 the MLX-ops encode of one token cost more than the whole fp16 decode step (fp4
192 us a layer, int4 85 us, fp16's plain write 6 us: docs/kernels.md), a chain of small ops each
its own launch. Here one launch does K and V.

Source: header = `#define ENC_CODE n` + the backend prelude (flash_decode.metal / .cu above
`// ==== entry ====`) + src/kv_encode_common.h; source = the backend's encode entry + the shared
body src/kv_encode_body.inc. Template: T (input dtype), D, GS (elements per thread: a scale
group, ggml's block of 32, or 32 FP8 elements). Launch: grid (units, 2, 1) in THREADS (x: the
units of all rows; y: K then V), threadgroup (min(units, 64), 1, 1); the row count is an int32
input, so a new batch size never recompiles.

Verified on the CPU only: the shared body compiled by g++ under the CPU prelude equals the MLX
ops bit for bit (tests/test_kv_encode.py); the CUDA and Metal texts pass the compile gates.
NEVER RUN ON A GPU (tests/test_gpu_parity.py holds the device check for the next lent GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import mlx.core as mx

from kvbench.kernels.attention.gpu import kernels as gk

HERE = gk.HERE
ENCODE_COMMON = HERE / "src" / "kv_encode_common.h"
ENCODE_BODY = HERE / "src" / "kv_encode_body.inc"
ENCODE_CODES = {"fp4": 1, "int4": 2, "q4_0": 3, "q8_0": 4, "fp8_e4m3": 5, "fp8_e5m2": 6}
FP8 = ("fp8_e4m3", "fp8_e5m2")
INPUTS = ["k_new", "v_new", "head_scales", "params"]
THREADGROUP = 64  # threads per threadgroup along x (a decode token: a few hundred units at most)
QK = 32  # ggml's block; also the FP8 unit when it divides the row
# code dtype and codes per row (of head_dim d) of each format, as kernels/formats/ store them
CODES = {
    "fp4": (mx.uint32, lambda d: d // 8),
    "int4": (mx.uint32, lambda d: d // 8),
    "q4_0": (mx.uint8, lambda d: d // 2),
    "q8_0": (mx.int8, lambda d: d),
    "fp8_e4m3": (mx.uint8, lambda d: d),
    "fp8_e5m2": (mx.uint8, lambda d: d),
}


def accepts(fmt) -> str | None:
    """None when the encode kernel writes `fmt`; else why not."""
    if fmt.name not in ENCODE_CODES:
        return f"no encode kernel for {fmt.name} ({', '.join(ENCODE_CODES)} only)"
    if fmt.name in FP8 and fmt.pending:
        return f"{fmt.name}: scale not calibrated yet"
    return None


def unit_elems(name: str, head_dim: int, group_size: int | None) -> int:
    """Elements one thread encodes: the scale group (fp4 / int4: group_size or the row), ggml's
    block (q4_0, q8_0), FP8 32 (or the row when 32 does not divide it)."""
    if name in ("fp4", "int4"):
        return group_size or head_dim
    if name in FP8:
        return QK if head_dim % QK == 0 else head_dim
    return QK


@dataclass(frozen=True)
class EncodePlan:
    grid: tuple[int, int, int]  # in threads (MLX's contract): units x (K, V)
    threadgroup: tuple[int, int, int]
    template: tuple[tuple[str, object], ...]
    params: tuple[int, int, int]  # int32 input: (rows, n_kv_heads, rows per head = L)
    output_names: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple


def plan(name: str, shape: tuple[int, ...], dtype, group_size: int | None) -> EncodePlan:
    """The launch for new rows of `shape` [B, Hkv, L, D] (L = 1 on decode) in format `name`."""
    if len(shape) != 4:
        raise ValueError(f"{name}: new rows must be [B, Hkv, L, D], got {shape}")
    *lead, d = shape
    gs = unit_elems(name, d, group_size)
    if d % gs or (name in ("fp4", "int4") and gs % 8) or (name in ("q4_0", "q8_0") and d % QK):
        raise ValueError(f"{name}: head_dim {d} does not cut into units of {gs} elements")
    rows = 1
    for n in lead:
        rows *= n
    units = rows * (d // gs)
    code_dtype, width = CODES[name]
    names, shapes, dtypes = ["k_codes", "v_codes"], [(*lead, width(d))] * 2, [code_dtype] * 2
    if name not in FP8:
        names += ["k_scales", "v_scales"]
        shapes += [(*lead, d // gs)] * 2
        dtypes += [mx.float16] * 2
    return EncodePlan(
        grid=(units, 2, 1),
        threadgroup=(min(units, THREADGROUP), 1, 1),
        template=(("T", gk.DTYPE_NAMES[dtype]), ("D", d), ("GS", gs)),
        params=(rows, shape[1], shape[2]),
        output_names=tuple(names),
        output_shapes=tuple(shapes),
        output_dtypes=tuple(dtypes),
    )


def encode_source(backend: str, name: str) -> tuple[str, str]:
    """(header, source) of the encode kernel of format `name` on `backend`."""
    prelude, _, _, entry = gk._parts(backend)
    header = f"#define ENC_CODE {ENCODE_CODES[name]}\n{prelude}{gk.read(ENCODE_COMMON)}"
    return header, entry + gk.read(ENCODE_BODY)


@cache
def compiled(backend: str, name: str):
    """The kernel object of format `name` (MLX compiles it per template on first call);
    the caller that swaps mx.fast's factory clears this cache (compiled.cache_clear())."""
    header, source = encode_source(backend, name)
    outputs = ["k_codes", "v_codes"] + ([] if name in FP8 else ["k_scales", "v_scales"])
    factory = mx.fast.metal_kernel if backend == "metal" else mx.fast.cuda_kernel
    return factory(
        name=f"kvbench_kv_encode_{name}",
        input_names=INPUTS,
        output_names=outputs,
        source=source,
        header=header,
    )


def head_scales(k_fmt, v_fmt, n_kv_heads: int) -> mx.array:
    """float32 [2, Hkv]: K's then V's FP8 scale per KV head (a per-tensor scale repeated);
    a dummy for the formats with per-row scales."""
    if k_fmt.name not in FP8:
        return gk.const_array((0.0,), mx.float32)
    rows = [gk.head_scales(f, n_kv_heads) for f in (k_fmt, v_fmt)]
    return mx.stack(rows)


def encode_kv(backend: str, k_fmt, v_fmt, k_new: mx.array, v_new: mx.array):
    """(K parts, V parts) of the new rows [B, Hkv, L, D], as k_fmt.encode / v_fmt.encode
    return them, from one launch. K and V share the format's kind (a calibrated FP8 K and V
    differ only in their scales)."""
    if k_fmt.name != v_fmt.name or k_new.shape != v_new.shape:
        raise ValueError("K and V must share the format and the shape")
    why = accepts(k_fmt) or accepts(v_fmt)
    if why:
        raise ValueError(why)
    p = plan(k_fmt.name, k_new.shape, k_new.dtype, getattr(k_fmt, "group_size", None))
    outs = compiled(backend, k_fmt.name)(
        inputs=[
            k_new,
            v_new,
            head_scales(k_fmt, v_fmt, k_new.shape[1]),
            gk.const_array(p.params, mx.int32),
        ],
        template=gk.mx_template(p.template),
        grid=p.grid,
        threadgroup=p.threadgroup,
        output_shapes=list(p.output_shapes),
        output_dtypes=list(p.output_dtypes),
    )
    if k_fmt.name in FP8:
        return {"data": outs[0]}, {"data": outs[1]}
    return {"data": outs[0], "scales": outs[2]}, {"data": outs[1], "scales": outs[3]}
