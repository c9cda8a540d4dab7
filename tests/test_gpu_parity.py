"""Parity of every GPU attention path, run on the GPU itself (`make gpu-verify`).

Each kernel that runs on the GPU backend at hand (MLX sdpa, ops, tiled, dequant_sdpa,
quantized_matmul and kvbench's custom kernel: `metal` on a Mac, `cuda` on NVIDIA) is checked
against the float32 reference computed on the CPU over the same stored cache, with the parity
tolerance the harness applies before timing (harness/engines/parity.py), at realistic shapes (Llama
GQA 1/4, 4K-8K), lengths that are not tile multiples, sliced (strided) cache views and tiny
shapes (fewer than 8 elements in an input: Metal's `constant` path). Marked `gpu`; skipped
without a GPU, and an error with KVBENCH_GPU=1 (what make gpu-verify sets), so a GPU run cannot
pass by skipping. The checking function itself is exercised on CPU by the last test.
"""

from __future__ import annotations

import math
import os

import mlx.core as mx
import numpy as np
import pytest

from kvbench.engines.parity import parity_gate
from kvbench.kernels.attention.gpu.launch import Problem
from kvbench.kernels.attention.registry import KERNELS, reference, unsupported_reason
from kvbench.kernels.data import make_qkv
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.stores.cache import KVCache

GPU = "metal" if mx.metal.is_available() else "cuda" if mx.cuda.is_available() else None
if GPU is None and os.environ.get("KVBENCH_GPU") == "1":
    raise RuntimeError("KVBENCH_GPU=1 but MLX has no GPU backend here (mx.metal / mx.cuda)")

# (B, Hq, Hkv, D, L, capacity): capacity > L makes the view a slice of a larger cache
REALISTIC = [(1, 32, 8, 128, 4096, 4096), (1, 32, 32, 128, 8192, 8192),
             (2, 32, 4, 128, 1000, 1000), (1, 32, 8, 128, 3000, 4096)]  # fmt: skip
TINY = [(1, 1, 1, 4, 1, 1), (1, 2, 1, 8, 3, 3), (1, 4, 1, 64, 3, 3), (1, 2, 1, 32, 3, 8)]
# FP8, iq4_nl, tq4_mse and tq2_mse (the custom kernels read them since 2026-11-27; compiled and
# decode-checked on the CPU only, never run on a GPU yet); 'name@x': get_format's fp8_scale x
FORMATS = [("fp16", None), ("bf16", None), ("fp32", None), ("fp4", None), ("int4", None),
           ("int4", 32), ("mxfp4", None), ("affine4", None), ("iq4_nl", None),
           ("fp8_e4m3", None), ("fp8_e4m3@per_head", None), ("fp8_e5m2@0.25", None),
           ("fp8_e5m2@per_head", None), ("tq4_mse", None), ("tq2_mse", None)]  # fmt: skip
# turbo_sdpa / turbo_tiled read TurboQuant in its rotated basis (MLX ops; never run on a GPU yet)
GPU_KERNELS = ["sdpa", "ops", "tiled", "dequant_sdpa", "quantized_matmul", "metal", "cuda",
               "turbo_sdpa", "turbo_tiled"]  # fmt: skip


def check_parity(device_backend: str, kernel: str, fmt, shape) -> dict | None:
    """rel_err etc. of `kernel` vs the CPU float32 reference, or None if it cannot run."""
    b, hq, hkv, d, n_kv, capacity = shape
    problem = Problem(b, hq, hkv, d, n_kv, dtype=str(fmt.compute_dtype).rsplit(".", 1)[-1],
                      kv_code=fmt.name if fmt.quantized else "dense",
                      group_size=getattr(fmt, "group_size", None))  # fmt: skip
    act = fmt.compute_dtype
    try:
        if unsupported_reason(kernel, fmt, device_backend, problem, None):
            return None
        q32, k32, v32 = make_qkv("gaussian", (b, hq, 1, d), (b, hkv, capacity, d), 0, None)
        fmt = fmt.calibrate(k32.astype(act), "k")  # FP8 per_head: one scale per KV head
        cache = KVCache(fmt, 1, b, hkv, capacity, d)
    except ValueError:  # a 4-bit format at a head_dim it cannot pack (raised by the cache's
        return None  # allocation: the H200 run of 2026-11-26 failed 27 tests here, not skipped)
    cache.fill(k32.astype(act), v32.astype(act))
    k, v = cache.view(0, n_kv)  # [B, Hkv, n_kv, ...], a slice when capacity > n_kv
    scale = 1.0 / math.sqrt(d)
    out = KERNELS[kernel].fn(q32.astype(act), k, v, fmt, mask=None, scale=scale, tile_kv=None)
    with mx.stream(mx.cpu):
        ref = reference(q32, k, v, fmt, mask=None, scale=scale)
        return parity_gate(kernel, mx.array(out), ref, act)


def parity_format(name: str, gs):
    """get_format of 'name' or 'name@fp8_scale'."""
    base, _, fp8_scale = name.partition("@")
    return get_format(base, gs, fp8_scale=fp8_scale or "one")


def _cases():
    for kernel in GPU_KERNELS:
        for name, gs in FORMATS:
            for shape in REALISTIC + TINY:
                yield pytest.param(kernel, name, gs, shape, id=f"{kernel}-{name}{gs or ''}-{shape}")


@pytest.mark.gpu
@pytest.mark.skipif(GPU is None, reason="no Metal or CUDA GPU (make gpu-verify runs these)")
@pytest.mark.parametrize("kernel,name,gs,shape", list(_cases()))
def test_gpu_kernel_matches_reference(kernel, name, gs, shape):
    try:
        fmt = parity_format(name, gs)
    except ValueError as e:
        pytest.skip(str(e))
    with mx.stream(mx.gpu):
        parity = check_parity(GPU, kernel, fmt, shape)
    if parity is None:
        pytest.skip(f"{kernel} does not run {name} at {shape} on {GPU}")


@pytest.mark.gpu
@pytest.mark.skipif(GPU is None, reason="no Metal or CUDA GPU (make gpu-verify runs these)")
def test_the_custom_kernel_ran_at_tiny_and_sliced_shapes():
    fmt = get_format("int4")
    with mx.stream(mx.gpu):
        assert check_parity(GPU, GPU, fmt, (1, 2, 1, 8, 3, 3)) is not None
        assert check_parity(GPU, GPU, get_format("fp16"), (1, 32, 8, 128, 3000, 4096))


# quantize-on-write in one kernel (kernels/attention/gpu/encode.py): NEVER RUN ON A GPU yet
ENCODE_FORMATS = [("fp4", None), ("fp4", 32), ("int4", None), ("int4", 32), ("q4_0", None),
                  ("q8_0", None), ("fp8_e4m3@0.25", None), ("fp8_e4m3@per_head", None),
                  ("fp8_e5m2", None), ("fp8_e5m2@per_head", None)]  # fmt: skip


def encode_rows(d: int, seed: int) -> mx.array:
    """float16 [2, 8, 1, D]: gaussian rows with outlier channels, a row of exact ties (absmax 7:
    int4 scale 1), one of E2M1 midpoints (absmax 6), q4_0's d = 1 row, zeros with -0.0, values
    past E4M3's range."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((16, d)) * np.where(rng.random(d) < 0.05, 20.0, 1.0)
    x[1] = np.resize(np.arange(-7.0, 7.5, 0.5), d)
    x[2] = np.resize([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0, 6.0], d)
    x[3] = np.resize(np.arange(-8.0, 8.0, 0.5), d)
    x[4] = np.where(np.arange(d) % 2, -0.0, 0.0)
    x[5] = np.clip(rng.standard_normal(d) * 3e4, -6e4, 6e4)
    return mx.array(x.astype(np.float16).reshape(2, 8, 1, d))


@pytest.mark.gpu
@pytest.mark.skipif(GPU is None, reason="no Metal or CUDA GPU (make gpu-verify runs these)")
@pytest.mark.parametrize("name,gs", ENCODE_FORMATS)
def test_encode_kernel_stores_the_mlx_ops_bytes(name, gs):
    """The one-launch encoder on the GPU stores bit for bit what fmt.encode stores on the CPU
    (the CPU test holds the shared text to the same under g++: tests/test_kv_encode.py)."""
    from kvbench.kernels.attention.gpu import encode

    k, v = encode_rows(128, 1), encode_rows(128, 2)
    fmt = parity_format(name, gs)
    k_fmt, v_fmt = fmt.calibrate(k, "k"), fmt.calibrate(v, "v")
    with mx.stream(mx.gpu):
        got_k, got_v = encode.encode_kv(GPU, k_fmt, v_fmt, k, v)
        mx.eval(got_k, got_v)
    with mx.stream(mx.cpu):
        want_k, want_v = k_fmt.encode(k), v_fmt.encode(v)
    for got, want in ((got_k, want_k), (got_v, want_v)):
        assert set(got) == set(want)
        for part in want:
            a, b = np.array(got[part]), np.array(want[part])
            assert a.tobytes() == b.tobytes(), (part, int(np.sum(a != b)), a.size)


@pytest.mark.gpu
@pytest.mark.skipif(GPU is None, reason="no Metal or CUDA GPU (make gpu-verify runs these)")
@pytest.mark.parametrize("name,gs", ENCODE_FORMATS)
def test_mlx_ops_encode_the_same_bytes_on_gpu_and_cpu(name, gs):
    """The harness encodes on the GPU through the MLX ops: do they store what the CPU stores?
    (The encode kernel is held to the CPU's bytes above; a failure here is MLX's GPU ops
    rounding differently, to be reported, not the kernel's.)"""
    k = encode_rows(128, 3)
    fmt = parity_format(name, gs).calibrate(k, "k")
    with mx.stream(mx.gpu):
        on_gpu = fmt.encode(k)
        mx.eval(on_gpu)
    with mx.stream(mx.cpu):
        on_cpu = fmt.encode(k)
    for part in on_cpu:
        a, b = np.array(on_gpu[part]), np.array(on_cpu[part])
        assert a.tobytes() == b.tobytes(), (part, int(np.sum(a != b)), a.size)


def test_check_parity_on_cpu_kernels():
    """The checking path itself, on the CPU backend (sdpa / tiled / dequant_sdpa)."""
    with mx.stream(mx.cpu):
        for kernel, name, shape in [("sdpa", "fp16", (1, 4, 2, 8, 3, 8)),
                                    ("tiled", "int4", (1, 2, 1, 8, 3, 3)),
                                    ("dequant_sdpa", "fp4", (1, 4, 1, 64, 40, 64))]:  # fmt: skip
            parity = check_parity("cpu", kernel, get_format(name), shape)
            assert parity is not None and parity["rel_err"] < 1e-2
        assert check_parity("cpu", "metal", get_format("fp16"), (1, 1, 1, 4, 1, 1)) is None
        # the new formats' parity cases run their set-up here: FP8 calibrated per head, iq4_nl
        for name in ("fp8_e4m3@per_head", "fp8_e5m2@0.25", "iq4_nl", "tq2_mse"):
            parity = check_parity("cpu", "tiled", parity_format(name, None), (1, 4, 2, 64, 40, 64))
            assert parity is not None and parity["rel_err"] < 1e-2, (name, parity)
        # formats that cannot pack a head_dim are skipped, not failed (seen first on a GPU)
        for name, shape in [("fp4", (1, 1, 1, 4, 1, 1)), ("mxfp4", (1, 2, 1, 8, 3, 3)),
                            ("affine4", (1, 2, 1, 32, 3, 8))]:  # fmt: skip
            assert check_parity("cpu", "tiled", get_format(name), shape) is None


def test_quantized_matmul_is_refused_on_cuda_with_the_reason():
    """MLX 0.32.4's CUDA quantized_matmul failed parity on an H200: a skipped row, not a time."""
    reason = unsupported_reason("quantized_matmul", get_format("mxfp4"), "cuda")
    assert reason is not None and "cuda" in reason
    assert unsupported_reason("quantized_matmul", get_format("mxfp4"), "metal") is None


def test_kvbench_turns_tf32_off_before_mlx_loads():
    """float32 stays float32 on CUDA: kvbench sets MLX_ENABLE_TF32=0 whatever the caller set."""
    import subprocess
    import sys

    code = "import os, kvbench; print(os.environ['MLX_ENABLE_TF32'])"
    env = {**os.environ, "MLX_ENABLE_TF32": "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "0", res.stderr
