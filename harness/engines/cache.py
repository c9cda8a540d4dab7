"""The cache engine: kvbench's full KV cache (kernels/stores/cache.py) with a kernel from KERNELS.

* decode: the cache holds context_len - 1 prefilled positions; one timed step writes the new
  token's K/V into every layer (encoding on write) and attends over all context_len positions.
  Every sample rewrites the same position, so every sample is the same context_len-th step.
* prefill: one timed call writes the whole prompt's K/V into every layer and attends causally.
* stages: beside the step, the write stage and the attend stage are timed alone.
* check: layer 0's output against the float32 reference over the same stored cache (parity),
  then accuracy against the float32 reference over the un-quantized K/V, and kv_recon_err.
* memory: alloc_bytes is the active-memory growth when the (zeroed) cache is allocated;
  fill_peak_bytes the peak above the same baseline while it is allocated and prefilled
  (quantize on write); the runner's peak_mem_bytes covers the timed stages.
"""

from __future__ import annotations

import math

import mlx.core as mx

from kvbench.case import Case
from kvbench.engines import common, metrics
from kvbench.engines.contract import State, allocated
from kvbench.engines.parity import compare_outputs, parity_gate, recon_err
from kvbench.kernels.attention.gpu import device as gpu_device
from kvbench.kernels.attention.gpu import launch
from kvbench.kernels.attention.gpu.traffic import traffic_bytes
from kvbench.kernels.attention.registry import (
    KERNELS,
    reference,
    rotated,
)
from kvbench.kernels.data import make_qkv
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.formats.rotation import rotate
from kvbench.kernels.stores.cache import KVCache
from kvbench.suite import resolved
from kvbench.suite.cache_spec import rotation_blocks
from kvbench.suite.resolved import Resolved

GPU_KERNELS = ("metal", "cuda")


def claims(case: Case) -> bool:
    """The fallback engine: every case no engine before it in ENGINES claimed."""
    return True


def skip_reason(case: Case, backend: str) -> str | None:
    fmt = resolved.of_case(case).k_fmt
    return common.kernel_reason(case, backend, common.problem_of(case, fmt))


def gpu_fields(case: Case, fmt) -> dict:
    """The launch a custom GPU kernel (metal, cuda) makes for the case, as planned (tile,
    threads, splits, vector width, the core count it planned for), and its traffic model per
    step (kernels/attention/gpu/traffic.py, every layer): bytes it reads and writes against the
    minimum, the
    threadgroup-memory traffic, and the excess over moving each byte once. {} for others."""
    if case.kernel not in GPU_KERNELS:
        return {}
    problem = common.problem_of(case, fmt)
    plan = launch.plan(
        problem,
        case.tile_kv or launch.DEFAULT_TILE_KV,
        launch.DEFAULT_THREADS,
        launch.LIMITS[case.kernel],
        n_cores=gpu_device.core_count(case.kernel)[0],
    )
    cfg, t, n = plan.config(), traffic_bytes(problem, plan), case.n_layers
    return {
        "gpu_threads": cfg["threads"],
        "gpu_splits": cfg["n_splits"],
        "gpu_vec_bytes": cfg["vec_bytes"],
        "gpu_cores": cfg["n_cores"],
        "kernel_read_bytes": n * t["global_read_bytes"],
        "kernel_write_bytes": n * t["global_write_bytes"],
        "kernel_min_bytes": n * t["min_bytes"],
        "kernel_shared_bytes": n * t["shared_bytes"],
        "traffic_excess": t["request_excess"],
    }


def build(case: Case, r: Resolved) -> State:
    """Allocate and fill the cache for `case` (untimed) and return its stages."""
    fmt = r.k_fmt
    lq = 1 if case.phase == "decode" else case.context_len
    q32, k32, v32 = make_qkv(
        case.kv_data,
        (case.n_seqs, case.n_q_heads, lq, case.head_dim),
        (case.n_seqs, case.n_kv_heads, case.context_len, case.head_dim),
        case.seed,
        case.kv_file,
    )
    act = fmt.compute_dtype
    q, k_act, v_act = q32.astype(act), k32.astype(act), v32.astype(act)
    mx.eval(q32, k32, v32, q, k_act, v_act)
    shape = (case.n_layers, case.n_seqs, case.n_kv_heads, case.context_len, case.head_dim)
    cache, baseline, alloc = allocated(lambda: KVCache(fmt, *shape))
    pos = case.context_len - lq  # decode: L-1 prefilled positions; prefill: none
    rk, rv = case.rotate_k, case.rotate_v
    bk, bv = rotation_blocks(case)
    if pos:  # stored rotated (after RoPE) when the case asks
        cache.fill(rotate(k_act[:, :, :pos], rk, bk), rotate(v_act[:, :, :pos], rv, bv))
    mx.synchronize()
    fill_peak = mx.get_peak_memory() - baseline  # allocation + prefill writes (quantize)
    k_new, v_new = k_act[:, :, pos:], v_act[:, :, pos:]
    mask = "causal" if case.phase == "prefill" else None
    scale = 1.0 / math.sqrt(case.head_dim)
    kernel = rotated(KERNELS[case.kernel].fn, rk, rv, bk, bv)  # q in, output out: once

    def attend(layer: int, query: mx.array = q) -> mx.array:
        k, v = cache.view(layer, case.context_len)
        return kernel(query, k, v, fmt, mask=mask, scale=scale, tile_kv=case.tile_kv)

    def chained(outs: list[mx.array], layer: int) -> mx.array:
        # as in a model, layer l+1's query depends on layer l's output, so a backend cannot
        # overlap the layers' attention (independent layers would flatter a GPU's step time)
        return attend(layer, outs[-1].astype(q.dtype) if outs else q)

    def put(layer: int) -> None:  # the new token's K/V, rotated as stored, then encoded
        cache.write(layer, rotate(k_new, rk, bk), rotate(v_new, rv, bv), pos)

    def write() -> list[mx.array]:
        for layer in range(cache.n_layers):
            put(layer)
        return cache.arrays()

    def attend_all() -> list[mx.array]:
        outs: list[mx.array] = []
        for layer in range(cache.n_layers):
            outs.append(chained(outs, layer))
        return outs

    def step() -> list[mx.array]:
        outs: list[mx.array] = []
        for layer in range(cache.n_layers):
            put(layer)
            outs.append(chained(outs, layer))
        return outs + cache.arrays()

    def check() -> dict:
        mx.eval(step())
        out = attend(0)
        k, v = cache.view(0, case.context_len)
        want = rotated(reference, rk, rv, bk, bv)(q32, k, v, fmt, mask=mask, scale=scale)
        parity_gate(case.kernel, out, want, act)
        exact = reference(
            q32, {"data": k32}, {"data": v32}, get_format("fp32"), mask=mask, scale=scale
        )
        pairs = ((k, rk, bk), (v, rv, bv))
        back = tuple(rotate(fmt.decode(x, mx.float32), r, b) for x, r, b in pairs)
        acc = {**compare_outputs(out, exact), "kv_recon_err": recon_err(back, (k32, v32))}
        return acc | common.saturated(fmt, rotate(k_act, rk, bk), rotate(v_act, rv, bv))

    return State(
        {"step": step, "write": write, "attend": attend_all},
        check,
        traffic=metrics.traffic_bytes(case, fmt),
        kv_bytes=metrics.kv_bytes(case, fmt),
        alloc_bytes=alloc,
        baseline_bytes=baseline,
        cache=cache.arrays,
        effective=common.effective(case),
        extra={"fill_peak_bytes": fill_peak, **gpu_fields(case, fmt)},
    )
