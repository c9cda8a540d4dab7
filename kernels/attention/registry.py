"""Decode / prefill attention kernels over a KV cache.

Every kernel has one signature:
    fn(q, k, v, fmt, *, mask, scale, tile_kv) -> out
q [B, Hq, Lq, D]; k and v are the format's stored dicts ([B, Hkv, Lk, ...]); mask is None,
"causal" (query i sees keys j <= i + Lk - Lq, i.e. queries are the last Lq positions) or a
boolean array broadcastable to [B, Hq, Lq, Lk] (True = visible); out [B, Hq, Lq, D].
`reference` is the float32 oracle every other kernel is checked against before it is timed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from kvbench.kernels.attention.gpu import kernels as gpu_kernels
from kvbench.kernels.attention.gpu import launch
from kvbench.kernels.attention.sharded import decode_only, partial
from kvbench.kernels.attention.tiled import DEFAULT_TILE_KV, tiled
from kvbench.kernels.attention.turbo import turbo_only, turbo_sdpa, turbo_tiled
from kvbench.kernels.formats.rotation import rotate


def causal_mask(lq: int, lk: int) -> mx.array:
    """Boolean [Lq, Lk]: query i (the (Lk-Lq+i)-th position) sees keys at or before it."""
    rows = mx.arange(lq)[:, None] + (lk - lq)
    return mx.arange(lk)[None, :] <= rows


def _bool_mask(mask, lq: int, lk: int) -> mx.array | None:
    if mask is None:
        return None
    return causal_mask(lq, lk) if isinstance(mask, str) else mask


def reference(q, k, v, fmt, *, mask=None, scale: float, tile_kv=None) -> mx.array:
    """float32 oracle: K/V decoded to float32 and repeated per query head, plain softmax."""
    kf, vf = fmt.decode(k, mx.float32), fmt.decode(v, mx.float32)
    group = q.shape[1] // kf.shape[1]
    kf, vf = mx.repeat(kf, group, axis=1), mx.repeat(vf, group, axis=1)  # [B, Hq, Lk, D]
    scores = (q.astype(mx.float32) * scale) @ kf.swapaxes(-1, -2)  # [B, Hq, Lq, Lk]
    visible = _bool_mask(mask, q.shape[2], kf.shape[2])
    if visible is not None:
        scores = mx.where(visible, scores, -mx.inf)
    return mx.softmax(scores, axis=-1) @ vf


def sdpa(q, k, v, fmt, *, mask=None, scale: float, tile_kv=None) -> mx.array:
    """MLX's fused scaled_dot_product_attention on a dense cache (GQA handled inside)."""
    return mx.fast.scaled_dot_product_attention(q, k["data"], v["data"], scale=scale, mask=mask)


def f32_sdpa(q, k, v, fmt, *, mask=None, scale: float, tile_kv=None) -> mx.array:
    """K/V decoded to float32 (an fp16 / bf16 cache converted, a quantized one dequantized),
    then MLX's fused SDPA in float32. On MLX's CPU backend half-precision matmuls run without
    BLAS (docs/blas.md: fp16 SDPA ~4.5x fp32's), so this is the fast way to read a half-precision
    cache there; the float32 copies are materialized every call (their bytes and peak memory
    are this path's cost)."""
    kf, vf = fmt.decode(k, mx.float32), fmt.decode(v, mx.float32)  # [B, Hkv, Lk, D]
    q32 = q.astype(mx.float32)
    return mx.fast.scaled_dot_product_attention(q32, kf, vf, scale=scale, mask=mask)


def ops(q, k, v, fmt, *, mask=None, scale: float, tile_kv=None) -> mx.array:
    """Plain MLX ops, GQA folded into rows: each KV head serves its G query heads in one matmul,
    so K/V are never repeated."""
    kd, vd = k["data"], v["data"]
    b, hq, lq, d = q.shape
    hkv, lk = kd.shape[1], kd.shape[2]
    group = hq // hkv
    qg = (q * scale).reshape(b, hkv, group * lq, d)  # [B, Hkv, G*Lq, D], rows g-major
    scores = (qg @ kd.swapaxes(-1, -2)).astype(mx.float32)  # [B, Hkv, G*Lq, Lk]
    visible = _bool_mask(mask, lq, lk)
    if visible is not None:
        visible = mx.broadcast_to(visible, (b, hq, lq, lk)).reshape(b, hkv, group * lq, lk)
        scores = mx.where(visible, scores, -mx.inf)
    probs = mx.softmax(scores, axis=-1).astype(vd.dtype)
    return (probs @ vd).reshape(b, hq, lq, d)  # [B, Hkv, G*Lq, D] -> [B, Hq, Lq, D]


def dequant_sdpa(q, k, v, fmt, *, mask=None, scale: float, tile_kv=None) -> mx.array:
    """Dequantize the whole stored K/V to the compute dtype, then MLX's fused SDPA. The
    dequantized copies are materialized: this path pays their bytes (and peak memory)."""
    kd, vd = fmt.decode(k, q.dtype), fmt.decode(v, q.dtype)  # [B, Hkv, Lk, D]
    return mx.fast.scaled_dot_product_attention(q, kd, vd, scale=scale, mask=mask)


def quantized_matmul(q, k, v, fmt, *, mask=None, scale: float, tile_kv=None) -> mx.array:
    """mx.quantized_matmul straight on the packed cache, as mlx-lm's
    quantized_scaled_dot_product_attention does: GQA by folding q to [B, Hkv, G, Lq, D],
    scores = q @ K^T (transpose=True), softmax in float32, out = P @ V (transpose=False)."""
    b, hq, lq, d = q.shape
    hkv, lk = k["data"].shape[1], k["data"].shape[2]
    group = hq // hkv
    qargs = fmt.mx_quantize_args()
    qg = (q * scale).reshape(b, hkv, group, lq, d)  # [B, Hkv, G, Lq, D]
    kx = {n: mx.expand_dims(a, 2) for n, a in k.items()}  # [B, Hkv, 1, Lk, ...]
    vx = {n: mx.expand_dims(a, 2) for n, a in v.items()}
    scores = mx.quantized_matmul(
        qg, kx["data"], kx["scales"], kx.get("biases"), transpose=True, **qargs
    )  # [B, Hkv, G, Lq, Lk]
    scores = scores.astype(mx.float32)
    visible = _bool_mask(mask, lq, lk)
    if visible is not None:
        visible = mx.broadcast_to(visible, (b, hq, lq, lk)).reshape(b, hkv, group, lq, lk)
        scores = mx.where(visible, scores, mx.finfo(mx.float32).min)
    probs = mx.softmax(scores, axis=-1).astype(q.dtype)
    out = mx.quantized_matmul(
        probs, vx["data"], vx["scales"], vx.get("biases"), transpose=False, **qargs
    )  # [B, Hkv, G, Lq, D]
    return out.reshape(b, hq, lq, d)


def dense_only(fmt) -> str | None:
    return f"needs a dense cache, {fmt.name} is quantized" if fmt.quantized else None


def quantized_only(fmt) -> str | None:
    return None if fmt.quantized else f"needs a quantized cache, {fmt.name} is dense"


def mlx_modes_only(fmt) -> str | None:
    if fmt.mx_quantize_args() is not None:
        return None
    return f"needs an MLX-native quantized format (mx.quantize), not {fmt.name}"


def any_format(fmt) -> str | None:
    return None


@dataclass(frozen=True)
class Kernel:
    fn: Callable
    accepts: Callable  # fmt -> None if supported, else the reason it is not
    backends: tuple[str, ...] = ("cpu", "metal", "cuda")
    # (fmt, launch.Problem, tile_kv) -> why this shape / tile config cannot launch, or None
    fits: Callable | None = None
    # KV positions per tile when the case's tile_kv is None; None: the kernel has no tiles
    default_tile: int | None = None
    # computes in float32 whatever the cache stores: a model hands it float32 queries and a
    # float32 dense view of a mixed cache (kernels/model/cache.py)
    float32: bool = False


GPU_TILE = launch.DEFAULT_TILE_KV
KERNELS = {
    "reference": Kernel(reference, any_format, float32=True),
    "sdpa": Kernel(sdpa, dense_only),
    "f32_sdpa": Kernel(f32_sdpa, any_format, float32=True),
    "ops": Kernel(ops, dense_only),
    "dequant_sdpa": Kernel(dequant_sdpa, quantized_only),
    # not on CUDA: MLX 0.32.4's CUDA quantized_matmul gave rel_err 1.3 against the reference on
    # per-head packed caches and "No implementation for problem shape" at 3000 positions (H200,
    # 2026-11-26, tests/test_gpu_parity.py); scripts/gpu_overhead.py's qmm_check isolates it
    "quantized_matmul": Kernel(quantized_matmul, mlx_modes_only, ("cpu", "metal")),
    "tiled": Kernel(tiled, any_format, default_tile=DEFAULT_TILE_KV),
    "partial": Kernel(partial, any_format, fits=decode_only),  # one rank of a sharded step
    # TurboQuant read in its rotated basis: q rotated once, not every row (attention/turbo.py)
    "turbo_sdpa": Kernel(turbo_sdpa, turbo_only),
    "turbo_tiled": Kernel(turbo_tiled, turbo_only, default_tile=DEFAULT_TILE_KV),
    "metal": Kernel(
        gpu_kernels.metal, gpu_kernels.accepts, ("metal",), gpu_kernels.fits("metal"), GPU_TILE
    ),
    "cuda": Kernel(
        gpu_kernels.cuda, gpu_kernels.accepts, ("cuda",), gpu_kernels.fits("cuda"), GPU_TILE
    ),
}


def kv_scaled(fn: Callable, k_scale: tuple = (1.0,), v_scale: tuple = (1.0,)) -> Callable:
    """Kernel `fn` over a cache whose rows are read at scale 1 but stand for value * scale (FP8
    with a per-tensor or per-KV-head scale, kernels/formats/fp8.py): q * k_scale in, the
    output * v_scale out (each query head by its KV head's scale), since q.(s k) = (s q).k and
    sum p (s v) = s sum p v; the stored rows never touched, as FP8 attention kernels fold it."""
    if k_scale == v_scale == (1.0,):
        return fn

    def per_q_head(s: tuple, q: mx.array) -> mx.array:
        g = q.shape[1] // len(s) if len(s) > 1 else 1  # query heads per KV head
        return mx.repeat(mx.array(s, dtype=mx.float32), g).reshape(1, -1, 1, 1)  # [1, Hq, 1, 1]

    def run(q, k, v, fmt, **kw) -> mx.array:
        out = fn((q * per_q_head(k_scale, q)).astype(q.dtype), k, v, fmt, **kw)
        return (out * per_q_head(v_scale, q)).astype(out.dtype)

    return run


def rotated(
    fn: Callable,
    rotate_k: str = "none",
    rotate_v: str = "none",
    block_k: int | None = None,
    block_v: int | None = None,
) -> Callable:
    """Kernel `fn` over a cache whose keys / values are stored rotated (kernels/formats/
    rotation.py, blocks of block_k / block_v): q rotated once before the kernel by K's matrix,
    the output rotated back once after it by V's, the stored cache never touched, so every
    kernel (GPU ones included) runs it unchanged."""
    if rotate_k == rotate_v == "none":
        return fn

    def run(q, k, v, fmt, **kw) -> mx.array:
        out = fn(rotate(q, rotate_k, block_k), k, v, fmt, **kw)
        return rotate(out, rotate_v, block_v)

    return run


def effective_tile(kernel: str, tile_kv: int | None) -> int | None:
    """The tile length `kernel` really uses for a case's tile_kv: the case's value, else the
    kernel's default; None for kernels without tiles (the case's tile_kv is then unused)."""
    default = KERNELS[kernel].default_tile
    return None if default is None else tile_kv or default


def unsupported_reason(
    kernel: str, fmt, backend: str, problem=None, tile_kv: int | None = None
) -> str | None:
    """Why `kernel` cannot run `fmt` on `backend` (and, given the problem, this shape and tile
    configuration, e.g. over the threadgroup memory limit), or None when it can."""
    spec = KERNELS[kernel]
    if backend not in spec.backends:
        return f"kernel {kernel} runs on {'/'.join(spec.backends)}, not {backend}"
    reason = spec.accepts(fmt)
    if reason is None and problem is not None and spec.fits is not None:
        reason = spec.fits(fmt, problem, tile_kv)
    return reason
