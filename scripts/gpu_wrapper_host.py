"""Host time per call of the flash-decode wrapper's Python side, on any machine (no GPU): the
`cuda` kernel as the harness calls it (Llama-3-8B's shape: 32 q heads, 8 KV heads, D=128, a 4K
fp16 cache), with mx.fast.cuda_kernel replaced by a stand-in that returns zero arrays of the
planned shapes, so what is timed is the wrapper (planning, inputs, kernel objects) plus the
stand-in (printed apart). MLX's own per-call work and the device are not in it: on a GPU,
scripts/gpu_overhead.py's cuda_build_us / cuda_eval_us measure those (docs/kernels.md, "fixed
cost per call").

    python scripts/gpu_wrapper_host.py [ok|fail]

`ok` stands the core-count probe in for a CUDA runtime that answers (one dlopen of a loaded
library and one call, as on a GPU machine); `fail` leaves the real probe, which on a machine
without libcudart tries three sonames. Prints five repetitions of 1000 calls, microseconds.
"""

from __future__ import annotations

import ctypes
import sys
import time

import mlx.core as mx

from kvbench.kernels.attention.gpu import device as gpu_device  # noqa: E402
from kvbench.kernels.attention.gpu import kernels as gpu_kernels  # noqa: E402
from kvbench.kernels.formats.registry import get_format  # noqa: E402
from kvbench.kernels.stores.cache import KVCache  # noqa: E402


def stand_in(**_):
    def call(*, output_shapes, output_dtypes, **__):
        return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]

    return call


def one_dlopen() -> int:
    lib = ctypes.CDLL("libc.so.6")  # already loaded, as libcudart is once MLX runs on CUDA
    lib.abs(-1)
    return 132


def main(mode: str = "ok") -> int:
    if mode == "ok":
        gpu_device.PROBES["cuda"] = one_dlopen
    mx.fast.cuda_kernel = stand_in
    gpu_kernels.compiled.cache_clear()
    fmt = get_format("fp16", None)
    q = mx.zeros((1, 32, 1, 128), dtype=mx.float16)
    k, v = KVCache(fmt, 1, 1, 8, 4096, 128).view(0, 4096)
    reps = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(1000):
            gpu_kernels.cuda(q, k, v, fmt, scale=0.1)
        reps.append((time.perf_counter() - t0) * 1e3)  # us per call over 1000 calls
    fake = stand_in()
    t0 = time.perf_counter()
    for _ in range(1000):
        fake(output_shapes=[(32, 16, 128), (32, 16), (32, 16)], output_dtypes=[mx.float32] * 3)
        fake(output_shapes=[(32, 128)], output_dtypes=[mx.float16])
    alone = (time.perf_counter() - t0) * 1e3
    print(f"{mode}: wrapper us per call:", " ".join(f"{x:.0f}" for x in reps),
          f"| the stand-in alone: {alone:.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
