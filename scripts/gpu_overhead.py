"""Where a custom-kernel decode step's time goes on a GPU, measured in one process on one device
(issue #37; docs/kernels.md): per attention call at Llama-3-8B's shape (32 q heads, 8 KV heads,
D=128, one sequence) and a 4K fp16 cache, the median time of eight calls (one per layer, one
graph, eval + synchronize, the harness's timer) divided by eight, for
  sdpa            MLX's fused scaled_dot_product_attention,
  cuda            kvbench's flash-decode kernel as the harness launches it,
  cuda_graph      the host time to build those eight calls' graph (no eval),
  cuda_splitsN    the kernel with N splits forced (kernel-bound time moves with N, a fixed
                  per-call cost does not),
  empty_kernel    a mx.fast.cuda_kernel that writes one float (the launch floor),
  encode_fp4/int4 quantizing one token's K into fp4 / int4 (the write stage's encode),
the float32 matmul's error against float64 (is float32 computed in TF32?), and
mx.quantized_matmul's error for scores q @ K^T with per-head (batched) packed keys, as kvbench's
quantized_matmul kernel and mlx-lm call it, against one 2-D call per head. Prints JSON.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvbench.kernels.attention.registry import KERNELS  # noqa: E402
from kvbench.kernels.formats.registry import get_format  # noqa: E402
from kvbench.timer import run_once, warm_up  # noqa: E402

LAYERS, HQ, HKV, D, CTX = 8, 32, 8, 128, 4096


def per_call_us(fn, reps: int = 50) -> float:
    warm_up(fn, 0.5)
    return statistics.median(run_once(fn) for _ in range(reps)) * 1e3 / LAYERS


def attention_variants() -> dict:
    fmt = get_format("fp16", None)
    q = mx.random.normal((1, HQ, 1, D)).astype(mx.float16)
    ks = [mx.random.normal((1, HKV, CTX, D)).astype(mx.float16) for _ in range(LAYERS)]
    vs = [mx.random.normal((1, HKV, CTX, D)).astype(mx.float16) for _ in range(LAYERS)]
    mx.eval(q, *ks, *vs)
    scale = 1 / math.sqrt(D)
    cuda = KERNELS["cuda"].fn
    sdpa = mx.fast.scaled_dot_product_attention

    def run_cuda(n_splits=None):
        return [
            cuda(q, {"data": k}, {"data": v}, fmt, scale=scale, tile_kv=32, n_splits=n_splits)
            for k, v in zip(ks, vs)
        ]

    def graph_us() -> float:
        run_cuda()
        t0 = time.perf_counter()
        for _ in range(20):
            run_cuda()
        return (time.perf_counter() - t0) * 1e6 / (20 * LAYERS)

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
    return {
        "sdpa_us": per_call_us(lambda: [sdpa(q, k, v, scale=scale) for k, v in zip(ks, vs)]),
        "cuda_us": per_call_us(run_cuda),
        "cuda_graph_us": graph_us(),
        **{f"cuda_splits{n}_us": per_call_us(lambda n=n: run_cuda(n)) for n in (1, 4, 16, 64)},
        "empty_kernel_us": per_call_us(run_empty),
    }


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
    out = {}
    x = mx.random.normal((1, HKV, 1, D)).astype(mx.float16)
    mx.eval(x)
    for name in ("fp4", "int4", "fp16"):
        fmt = get_format(name, None)
        out[f"encode_{name}_us"] = per_call_us(lambda f=fmt: [f.encode(x) for _ in range(LAYERS)])
    return out


def tf32_check() -> dict:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((512, 512)), rng.standard_normal((512, 512))
    got = np.array(mx.matmul(mx.array(a, dtype=mx.float32), mx.array(b, dtype=mx.float32)))
    ref = a @ b
    return {"matmul_f32_rel_err": float(np.linalg.norm(got - ref) / np.linalg.norm(ref))}


def main() -> int:
    result = {"device": mx.device_info().get("device_name", str(mx.default_device()))}
    result.update(tf32_check())
    for part in (qmm_check, attention_variants):
        try:
            result.update(part())
        except Exception as e:  # noqa: BLE001  a device probe: report what failed, go on
            result[part.__name__] = f"{type(e).__name__}: {e}"[:300]
    result.update(encode_variants())
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
