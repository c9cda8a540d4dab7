"""One layer's TurboQuant decode attention, each kernel, timed on a loaded machine by the least
wall time and the median CPU time of many interleaved calls (a side check beside kvbench's
timer, whose medians the other sessions' load widens: docs/formats.md).

The calls are one decode step of one layer: q [1, Hq, 1, D], K and V of `--context` positions
stored in the format (gaussian rows), through dequant_sdpa and tiled (every row rotated back),
turbo_sdpa and turbo_tiled (the query rotated once, kernels/attention/turbo.py), and the parts
of a read: unpacking the codes, centroid rows, rows in the rotated basis, rows decoded.
CPU time is the process's (all threads): what the work costs, whoever else holds the cores.

    python scripts/turbo_decode_parts.py --format tq3_mse --head-dim 64 --q-heads 9 --kv-heads 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import kvbench  # noqa: F401  (loads the BLAS kvbench runs on before mlx.core)

# isort: split
import mlx.core as mx
import numpy as np

from kvbench.kernels.attention.registry import KERNELS
from kvbench.kernels.formats import turbo
from kvbench.kernels.formats.registry import get_format

KERNEL_NAMES = ("dequant_sdpa", "tiled", "turbo_sdpa", "turbo_tiled")


def calls(name: str, d: int, hq: int, hkv: int, ctx: int) -> dict:
    """The timed calls, by label: each returns the arrays to evaluate."""
    fmt = get_format(name)
    rng = np.random.default_rng(0)
    q = mx.array(rng.standard_normal((1, hq, 1, d)).astype(np.float16))
    k, v = (fmt.encode(mx.array(rng.standard_normal((1, hkv, ctx, d)), mx.float32)) for _ in "kv")
    mx.eval(q, k, v)
    out = {
        kern: (lambda kern=kern: KERNELS[kern].fn(q, k, v, fmt, scale=d**-0.5))
        for kern in KERNEL_NAMES
    }
    out["K: unpack codes"] = lambda: turbo.unpack_bits(k["codes"], fmt.mse_bits)
    out["K: centroid rows"] = lambda: fmt.centroid_rows(k)
    out["K: basis_rows (no rotation)"] = lambda: fmt.basis_rows(k)
    out["K: decode (rows rotated back)"] = lambda: fmt.decode(k)
    return out


def measure(fns: dict, reps: int) -> dict:
    """label -> (least wall ms, median CPU ms) over `reps` interleaved rounds (one warm-up)."""
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for r in range(reps + 1):
        for label, fn in fns.items():
            w, c = time.perf_counter(), time.process_time()
            mx.eval(fn())
            if r:  # round 0 warms up
                wall[label].append(time.perf_counter() - w)
                cpu[label].append(time.process_time() - c)
    return {k: (1e3 * min(wall[k]), 1e3 * statistics.median(cpu[k])) for k in fns}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="tq3_mse", choices=turbo.NAMES)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--q-heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    got = measure(calls(a.format, a.head_dim, a.q_heads, a.kv_heads, a.context), a.reps)
    print(f"{a.format} D={a.head_dim} Hq={a.q_heads} Hkv={a.kv_heads} context={a.context}, "
          f"{a.reps} rounds")  # fmt: skip
    for label, (w, c) in got.items():
        print(f"  {label:<32} least wall {w:8.2f} ms   median CPU {c:8.2f} ms")


if __name__ == "__main__":
    main()
