"""Where a custom-kernel decode step's time goes on a GPU, measured in one process on one device
(issues #37, #45; docs/kernels.md, "fixed cost per call"). Per attention call at Llama-3-8B's
shape (32 q heads, D=128, one sequence), for 4K and 32K positions and GQA 1 / 4 / 8 (32, 8, 4
KV heads): the median over 50 repetitions of eight calls (one per layer, one graph), divided by
eight, of
  sdpa_us / cuda_us         MLX's fused SDPA / kvbench's flash-decode kernel, built + evaluated
                            + synchronized (the harness's timer: what a result row measures),
  cuda_build_us             the host time to build those calls' graph alone (Python wrapper and
                            MLX's per-call work: source string, kernel object call; no eval),
  cuda_eval_us / sdpa_eval_us  eval + synchronize of a graph built beforehand (MLX's host work
                            at evaluation and the device's time, without the Python side);
at 32K GQA 4 the kernel with 1 / 16 / 64 / 128 splits forced (kernel-bound time moves with the
split count, a fixed per-call cost does not); an empty mx.fast.cuda_kernel (the launch floor);
the write stage per layer: one token's K and V encoded by the MLX ops (encode_<fmt>_ops_us) and
by the one-launch kernel (encode_<fmt>_kernel_us, kernels/attention/gpu/encode.py) for fp4,
int4, q4_0, q8_0 and fp8_e4m3, beside fp16's plain cast; a whole decode step (8 layers' write
+ attend at 32K GQA 4) with either write, for fp16, fp4, int4 and fp8_e4m3; the float32
matmul's error against float64 (TF32?), and mx.quantized_matmul's error with per-head packed
keys. Each part's JSON is printed as soon as it is measured (a run stopped by its budget keeps
what it printed).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time

import mlx.core as mx
import numpy as np

from kvbench.kernels.attention.registry import KERNELS  # noqa: E402
from kvbench.kernels.formats.registry import get_format  # noqa: E402
from kvbench.timer import run_once, warm_up  # noqa: E402

LAYERS, HQ, HKV, D, CTX = 8, 32, 8, 128, 4096
CONTEXTS, GQAS = (4096, 32768), (1, 4, 8)
BACKEND = "cuda" if mx.cuda.is_available() else "metal"


def per_call_us(fn, reps: int = 50) -> float:
    warm_up(fn, 0.5)
    return statistics.median(run_once(fn) for _ in range(reps)) * 1e3 / LAYERS


def build_us(fn, reps: int = 20) -> float:
    """Host time per call to build the graph of fn's calls (nothing evaluated)."""
    mx.eval(fn())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6 / LAYERS


def eval_us(fn, reps: int = 30) -> float:
    """eval + synchronize per call of a graph built before the clock starts."""
    warm_up(fn, 0.3)
    times = []
    for _ in range(reps):
        outs = fn()
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval(outs)
        mx.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6 / LAYERS


def caches(ctx: int, hkv: int):
    q = mx.random.normal((1, HQ, 1, D)).astype(mx.float16)
    ks = [mx.random.normal((1, hkv, ctx, D)).astype(mx.float16) for _ in range(LAYERS)]
    vs = [mx.random.normal((1, hkv, ctx, D)).astype(mx.float16) for _ in range(LAYERS)]
    mx.eval(q, *ks, *vs)
    return q, ks, vs


def fixed_cost(ctx: int, g: int) -> dict:
    """Per call at one context and GQA: the harness's time, host build, eval, sdpa beside."""
    fmt, scale = get_format("fp16", None), 1 / math.sqrt(D)
    q, ks, vs = caches(ctx, HQ // g)
    kern = KERNELS[BACKEND].fn
    run = lambda **kw: [  # noqa: E731
        kern(q, {"data": k}, {"data": v}, fmt, scale=scale, **kw) for k, v in zip(ks, vs)
    ]
    sdpa = lambda: [mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)  # noqa: E731
                    for k, v in zip(ks, vs)]  # fmt: skip
    tag = f"{ctx // 1024}k_g{g}"
    out = {f"sdpa_us_{tag}": per_call_us(sdpa), f"cuda_us_{tag}": per_call_us(run)}
    out[f"cuda_build_us_{tag}"] = build_us(run)
    out[f"cuda_eval_us_{tag}"] = eval_us(run)
    out[f"sdpa_eval_us_{tag}"] = eval_us(sdpa)
    if (ctx, g) == (32768, 4):
        for n in (1, 16, 64, 128):
            out[f"cuda_splits{n}_us_{tag}"] = per_call_us(lambda n=n: run(n_splits=n))
    return out


def empty_kernel() -> dict:
    empty = mx.fast.cuda_kernel(
        name="kvbench_empty", input_names=["x"], output_names=["y"],
        source="if (threadIdx.x == 0 && blockIdx.x == 0) { y[0] = x[0]; }",
    )  # fmt: skip
    x1 = mx.zeros((1,), dtype=mx.float32)
    mx.eval(x1)
    run_empty = lambda: [  # noqa: E731
        empty(inputs=[x1], grid=(32, 1, 1), threadgroup=(32, 1, 1),
              output_shapes=[(1,)], output_dtypes=[mx.float32])[0]
        for _ in range(LAYERS)
    ]  # fmt: skip
    return {"empty_kernel_us": per_call_us(run_empty)}


def qmm_check() -> dict:
    """Scores q @ K^T through mx.quantized_matmul with K packed per head ([B, Hkv, 1, Lk, ...]
    broadcast over the G query heads of a group), against the same product per head with 2-D
    packed K, and against the dequantized K in float32."""
    out = {}
    q = mx.random.normal((1, HKV, 4, 1, D)).astype(mx.float16)  # [B, Hkv, G, Lq, D]
    k = mx.random.normal((1, HKV, CTX, D)).astype(mx.float16)
    for mode, group in (("mxfp4", 32), ("affine", 64)):
        packed = mx.quantize(k, group_size=group, bits=4, mode=mode)
        w, s = packed[0], packed[1]
        b = packed[2] if len(packed) > 2 else None
        args = dict(group_size=group, bits=4, mode=mode)
        ex = lambda a: None if a is None else mx.expand_dims(a, 2)  # noqa: E731
        batched = mx.quantized_matmul(q, ex(w), ex(s), ex(b), transpose=True, **args)
        per_head = mx.stack(
            [mx.quantized_matmul(q[0, h], w[0, h], s[0, h], None if b is None else b[0, h],
                                 transpose=True, **args) for h in range(HKV)]
        )[None]  # fmt: skip
        kd = mx.dequantize(w, s, b, **args).astype(mx.float32)  # [B, Hkv, Lk, D]
        ref = np.array(q.astype(mx.float32) @ mx.expand_dims(kd, 2).swapaxes(-1, -2))
        for name, got in (("batched", batched), ("per_head", per_head)):
            err = np.linalg.norm(np.array(got.astype(mx.float32)) - ref) / np.linalg.norm(ref)
            out[f"qmm_{mode}_{name}_rel_err"] = float(err)
    return out


def encode_variants() -> dict:
    """One token's K and V of one layer: the MLX-ops encoders vs the one-launch kernel."""
    from kvbench.kernels.attention.gpu import encode

    out = {}
    k = mx.random.normal((1, HKV, 1, D)).astype(mx.float16)
    v = mx.random.normal((1, HKV, 1, D)).astype(mx.float16)
    mx.eval(k, v)
    f16 = get_format("fp16", None)
    out["encode_fp16_ops_us"] = per_call_us(lambda: [f16.encode(x) for x in (k, v) * LAYERS])
    for name in ("fp4", "int4", "q4_0", "q8_0", "fp8_e4m3"):
        f = get_format(name, None)
        ops = lambda f=f: [f.encode(x) for x in (k, v) * LAYERS]  # noqa: E731
        one = lambda f=f: [encode.encode_kv(BACKEND, f, f, k, v) for _ in range(LAYERS)]  # noqa: E731
        out[f"encode_{name}_ops_us"] = per_call_us(ops)
        out[f"encode_{name}_kernel_us"] = per_call_us(one)
    return out


def decode_steps(ctx: int = 32768, hkv: int = 8) -> dict:
    """One decode step, ms for all 8 layers, at 32K and GQA 4, as the cache engine runs it: per
    layer write the new token's K/V at the last position (encoding on write), then attend over
    the cache through the custom kernel, each layer's query from the previous layer's output.
    The write through the MLX-ops encoders (the harness today) and through the one-launch
    encoder; fp16 beside (its write is a cast). Issue 45's item 4 target reads off these:
    4-bit step <= 0.5x fp16's, fp8 <= 0.6x."""
    from kvbench.kernels.attention.gpu import encode
    from kvbench.kernels.stores.cache import KVCache

    out, scale, kern = {}, 1 / math.sqrt(D), KERNELS[BACKEND].fn
    q = mx.random.normal((1, HQ, 1, D)).astype(mx.float16)
    k_new, v_new = (mx.random.normal((1, hkv, 1, D)).astype(mx.float16) for _ in range(2))
    x = mx.random.normal((1, hkv, ctx - 1, D)).astype(mx.float16)  # not the whole buffer:
    mx.eval(q, k_new, v_new, x)  # a fill of every position would alias the layers (DESIGN.md)
    for name in ("fp16", "fp4", "int4", "fp8_e4m3"):
        fmt = get_format(name, None)
        cache = KVCache(fmt, LAYERS, 1, hkv, ctx, D)
        cache.fill(x, x)
        mx.eval(cache.arrays())
        at = cache.positions(ctx - 1, 1)

        def step(fused: bool, fmt=fmt, cache=cache, at=at) -> list:
            outs = []
            for layer in range(LAYERS):
                if fused:
                    cache.put_encoded(layer, at, *encode.encode_kv(BACKEND, fmt, fmt, k_new, v_new))
                else:
                    cache.write(layer, k_new, v_new, ctx - 1)
                query = outs[-1].astype(q.dtype) if outs else q
                outs.append(kern(query, *cache.view(layer, ctx), fmt, scale=scale))
            return outs + cache.arrays()

        tag = f"{ctx // 1024}k_g{HQ // hkv}"
        out[f"step_{name}_ops_ms_{tag}"] = per_call_us(lambda: step(False)) * LAYERS / 1e3
        if name != "fp16":
            out[f"step_{name}_kernel_ms_{tag}"] = per_call_us(lambda: step(True)) * LAYERS / 1e3
        del cache
    return out


def tf32_check() -> dict:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((512, 512)), rng.standard_normal((512, 512))
    got = np.array(mx.matmul(mx.array(a, dtype=mx.float32), mx.array(b, dtype=mx.float32)))
    ref = a @ b
    return {"matmul_f32_rel_err": float(np.linalg.norm(got - ref) / np.linalg.norm(ref))}


def main() -> int:
    result = {"device": mx.device_info().get("device_name", str(mx.default_device()))}
    # item 1's question first (a run stopped by its budget keeps what was printed)
    parts = [lambda c=c, g=g: fixed_cost(c, g) for c in CONTEXTS for g in GQAS]
    parts += [empty_kernel, decode_steps, encode_variants, tf32_check]
    for part in [*parts, qmm_check]:  # qmm last: its run did not finish in 60 s on an H200
        try:
            got = part()
        except Exception as e:  # noqa: BLE001  a device probe: report what failed, go on
            got = {getattr(part, "__name__", "part"): f"{type(e).__name__}: {e}"[:300]}
        print(json.dumps(got), flush=True)
        result.update(got)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
