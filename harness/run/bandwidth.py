"""Peak read bandwidth measured on the device in use, in the same run as the cases.

Streaming reads over a float32 buffer far larger than the last-level cache, timed with the same
timer as the cases (eval + synchronize): `mx.sum` on every backend, and on the CPU backend also
`numpy.sum` over the same memory system, because MLX's CPU reduction does not saturate the
memory bus (measured here: mx.sum ~8 GB/s, numpy ~20 GB/s). The peak is the fastest probe;
every row records it and `peak_method` says which probe gave what, so "% of peak" is always
against a number measured on the same machine in the same run, not a spec sheet.
"""

from __future__ import annotations

from functools import lru_cache

import mlx.core as mx
import numpy as np

from kvbench.stats import summarize
from kvbench.timer import run_once, sample

DEFAULT_BYTES = {"cpu": 256 * 2**20, "metal": 1024 * 2**20, "cuda": 2048 * 2**20}


def _mlx_sum(nbytes: int):
    x = mx.ones((nbytes // 4,), dtype=mx.float32)
    mx.eval(x)
    return lambda: mx.sum(x)


def _numpy_sum(nbytes: int):
    x = np.ones(nbytes // 4, dtype=np.float32)

    def read() -> None:
        x.sum()  # synchronous: the timer's eval/synchronize have nothing left to wait for

    return read


PROBES = {"mx.sum": _mlx_sum, "numpy.sum": _numpy_sum}
PROBES_BY_BACKEND = {"cpu": ("mx.sum", "numpy.sum")}  # GPU backends: mx.sum only


def probe_gbps(make, nbytes: int) -> tuple[float, int]:
    fn = make(nbytes)
    for _ in range(3):
        run_once(fn)
    stats = summarize(sample(fn, budget_s=1.0, min_samples=10, max_samples=30, target_ci=0.01))
    return nbytes / (stats["median_ms"] / 1e3) / 1e9, stats["n_samples"]


@lru_cache(maxsize=4)
def peak_read_bandwidth(backend: str, nbytes: int | None = None) -> dict:
    nbytes = nbytes or DEFAULT_BYTES.get(backend, DEFAULT_BYTES["cpu"])
    names = PROBES_BY_BACKEND.get(backend, ("mx.sum",))
    results = {name: probe_gbps(PROBES[name], nbytes) for name in names}
    best = max(results, key=lambda n: results[n][0])
    each = ", ".join(f"{n} {g:.1f} GB/s (median of {k})" for n, (g, k) in results.items())
    method = f"fastest streaming read over {nbytes / 2**20:.0f} MiB float32: {best}; {each}"
    return {"peak_gbps": results[best][0], "peak_method": method}
