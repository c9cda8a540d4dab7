"""Peak read bandwidth measured on the device in use, in the same run as the cases.

A streaming read: `mx.sum` over a float32 buffer far larger than the last-level cache, timed
with the same timer as the cases (eval + synchronize). GB/s = buffer bytes / median time. Every
row records this figure and how it was obtained, so "% of peak" is always against a number
measured on the same machine, not a spec sheet.
"""

from __future__ import annotations

from functools import lru_cache, partial

import mlx.core as mx

from harness.timer import run_once, sample, summarize

DEFAULT_BYTES = {"cpu": 256 * 2**20, "metal": 1024 * 2**20, "cuda": 2048 * 2**20}


@lru_cache(maxsize=4)
def peak_read_bandwidth(backend: str, nbytes: int | None = None) -> dict:
    nbytes = nbytes or DEFAULT_BYTES.get(backend, DEFAULT_BYTES["cpu"])
    x = mx.ones((nbytes // 4,), dtype=mx.float32)
    mx.eval(x)
    fn = partial(mx.sum, x)
    for _ in range(3):
        run_once(fn)
    stats = summarize(sample(fn, budget_s=1.0, min_samples=10, max_samples=30, target_ci=0.01))
    gbps = nbytes / (stats["median_ms"] / 1e3) / 1e9
    method = (
        f"mx.sum over {nbytes / 2**20:.0f} MiB float32, median of {stats['n_samples']} "
        f"({stats['median_ms']:.2f} ms)"
    )
    return {"peak_gbps": gbps, "peak_method": method}
