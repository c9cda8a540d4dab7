"""Cross-check: kvbench's median for one decode case vs a plain standalone timing loop.

The standalone loop uses only mlx and kernels/ (no harness timer, no runner): build the same
cache, then time `for layer: write + sdpa (query = previous layer's output); mx.eval;
mx.synchronize` with time.perf_counter.
Run: .venv/bin/python scripts/crosscheck_timer.py [context_len]
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import time

import mlx.core as mx
import pandas as pd

from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.stores.cache import KVCache
from kvbench.run.session import run_suite
from kvbench.suite.suite import expand, load_suite

SUITE = """
name: crosscheck
settings: {{warmup_s: 0.2, min_samples: 20, max_samples: 60, budget_s: 6.0, rounds: 2,
           stages: false}}
fixed: {{model: qwen2-0.5b, context_len: {ctx}, kv_dtype: fp32, kernel: sdpa}}
"""


def standalone_ms(ctx: int, n: int = 40) -> float:
    L, H, Q, D = 24, 2, 14, 64  # Qwen2-0.5B: 24 layers, 2 kv heads, 14 q heads, head_dim 64
    fmt = get_format("fp32")
    cache = KVCache(fmt, L, 1, H, ctx, D)
    k = mx.random.normal((1, H, ctx, D), key=mx.random.key(1))
    v = mx.random.normal((1, H, ctx, D), key=mx.random.key(2))
    q = mx.random.normal((1, Q, 1, D), key=mx.random.key(3))
    cache.fill(k[:, :, : ctx - 1], v[:, :, : ctx - 1])
    k_new, v_new = k[:, :, ctx - 1 :], v[:, :, ctx - 1 :]
    mx.eval(k_new, v_new, q)
    times = []
    for i in range(n + 5):
        t0 = time.perf_counter()
        outs, query = [], q
        for layer in range(L):
            cache.write(layer, k_new, v_new, ctx - 1)
            kd, vd = cache.keys[layer]["data"], cache.values[layer]["data"]
            query = mx.fast.scaled_dot_product_attention(query, kd, vd, scale=1 / math.sqrt(D))
            outs.append(query)  # the next layer's query is this layer's output, as in kvbench
        mx.eval(outs + cache.arrays())
        mx.synchronize()
        if i >= 5:  # first 5 are warm-up
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kvbench_ms(ctx: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/s.yaml"
        open(path, "w").write(SUITE.format(ctx=ctx))
        suite = load_suite(path)
        writer = run_suite(suite, expand(suite), d)
        return float(pd.read_csv(writer.csv_path)["median_ms"].iloc[0])


if __name__ == "__main__":
    ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    for _ in range(2):  # alternate, so drift affects both
        print(
            f"context {ctx}: kvbench median {kvbench_ms(ctx):.3f} ms, "
            f"standalone loop median {standalone_ms(ctx):.3f} ms",
            flush=True,
        )
