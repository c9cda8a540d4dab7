"""Run context stamped on every row: code version, machine, device and backend."""

from __future__ import annotations

import datetime as dt
import platform
import socket
import time
from functools import lru_cache
from pathlib import Path

import mlx.core as mx

from kvbench import SCHEMA_VERSION, __version__, blas
from kvbench.store import git

REPO = Path(__file__).resolve().parents[2]  # the checkout holding harness/ (and kernels/)


def backend_name() -> str:
    """cpu, metal or cuda: what the default device actually runs on."""
    if mx.default_device().type == mx.DeviceType.cpu:
        return "cpu"
    if mx.metal.is_available():
        return "metal"
    return "cuda"


def gpu_available() -> bool:
    return mx.metal.is_available() or (hasattr(mx, "cuda") and mx.cuda.is_available())


def set_device(name: str | None) -> None:
    """Select cpu or gpu as MLX's default device (None keeps MLX's own default)."""
    if name is None:
        return
    if name == "gpu" and not gpu_available():
        from kvbench.errors import UserError

        raise UserError("--device: gpu: this MLX build has no GPU backend (Metal or CUDA)")
    mx.set_default_device(mx.gpu if name == "gpu" else mx.cpu)


def device_name() -> str:
    try:
        info = mx.device_info()
        name = info.get("device_name") or info.get("architecture")
    except Exception:  # older MLX: no device_info for this backend
        name = None
    return f"{name or platform.processor() or platform.machine()} ({backend_name()})"


@lru_cache(maxsize=1)
def _static() -> dict:
    return {
        **git.info(REPO),
        "host": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "mlx_version": mx.__version__,
        "kvbench_version": __version__,
        "schema_version": SCHEMA_VERSION,
        **blas.chosen(),
        "blas_gflops": blas_gflops(),
    }


# fp32 [256x576]x[576x1536] (a SmolLM2 MLP matmul of 256 tokens): 0.45 GFLOP, ~0.3 s with the
# reference BLAS of MLX's Linux wheel, ~10 ms with OpenBLAS on the 2-core development machine
BLAS_PROBE_MKN = (256, 576, 1536)


def blas_gflops(repeats: int = 3) -> float:
    """fp32 matmul GFLOP/s on MLX's CPU stream (the BLAS kvbench.blas put under it), best of
    `repeats` after one warm-up: what a row's CPU matmuls could reach in this process."""
    m, k, n = BLAS_PROBE_MKN
    a = mx.random.normal((m, k), key=mx.random.key(0), stream=mx.cpu)
    b = mx.random.normal((k, n), key=mx.random.key(1), stream=mx.cpu)
    mx.eval(a, b)
    best = float("inf")
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        mx.eval(mx.matmul(a, b, stream=mx.cpu))
        if i:  # the first call is the warm-up
            best = min(best, time.perf_counter() - t0)
    return round(2 * m * k * n / best / 1e9, 2)


def run_context() -> dict:
    """Everything but the device is fixed per process; the device follows set_device."""
    return {
        **_static(),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name(),
        "backend": backend_name(),
    }


def run_id(commit: str | None) -> str:
    """Unique per run: UTC time to the second plus the short commit."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{(commit or 'nogit')[:8]}"
