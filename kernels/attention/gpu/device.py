"""The GPU's core / SM count, for the split planner (kernels/attention/gpu/launch.py::plan_splits).

MLX's device_info gives no core count, so it is read from the platform: on CUDA through the
runtime (cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount) from libcudart, which MLX's
CUDA wheel depends on), on Apple silicon from the IORegistry (`ioreg`, key gpu-core-count).
KVBENCH_GPU_CORES overrides both. When nothing answers, the backend's documented default
(launch.LIMITS[backend].default_cores) is used and the source says "default": the row records
which, so a split count planned from a guess is visible.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
from functools import cache

from kvbench.kernels.attention.gpu.launch import LIMITS

CUDA_DEV_ATTR_MULTIPROCESSOR_COUNT = 16  # cudaDevAttrMultiProcessorCount (driver_types.h)
IOREG_CORES = re.compile(r'"gpu-core-count"\s*=\s*(\d+)')


def parse_ioreg(text: str) -> int | None:
    """gpu-core-count from `ioreg -rc AGXAccelerator -d1` output, or None."""
    found = IOREG_CORES.search(text)
    return int(found.group(1)) if found else None


def _metal_cores() -> int | None:
    try:
        cmd = ["ioreg", "-rc", "AGXAccelerator", "-d1"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_ioreg(out)


def _cuda_cores() -> int | None:
    # once MLX's CUDA backend is loaded, dlopen of the soname returns the runtime it loaded
    for soname in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            lib = ctypes.CDLL(soname)
        except OSError:
            continue
        value = ctypes.c_int(0)
        attr = CUDA_DEV_ATTR_MULTIPROCESSOR_COUNT
        if lib.cudaDeviceGetAttribute(ctypes.byref(value), attr, 0) == 0 and value.value > 0:
            return value.value
    return None


PROBES = {"metal": _metal_cores, "cuda": _cuda_cores}


@cache
def _probe(backend: str, probe) -> int | None:
    # asked once per process (keyed by the probe, so a test's stand-in is asked afresh): the
    # planner runs on every kernel call, and a dlopen (CUDA) or an `ioreg` process (Metal) per
    # call was host time inside every timed step (docs/kernels.md, "fixed cost per call")
    return probe()


def core_count(backend: str) -> tuple[int, str]:
    """(cores, source) for `backend`; source is env, cudart, ioreg or default."""
    env = os.environ.get("KVBENCH_GPU_CORES")
    if env and env.isdigit() and int(env) > 0:
        return int(env), "env"
    found = _probe(backend, PROBES[backend])
    if found:
        return found, "cudart" if backend == "cuda" else "ioreg"
    return LIMITS[backend].default_cores, "default"
