"""The peers engine: the caches and attention people would otherwise use
(harness/peers/registry.py),
driven through the same case as kvbench's own kernels.

* Same data: kernels/data.py make_qkv with the case's seed, converted once into the peer's
  framework and dtype while building (untimed).
* Same decode loop: L-1 positions prefilled and one priming step taken while building; each
  timed step writes the L-th token into every layer and attends over the cache (over the window
  for a windowed cache). The write and attend stages are timed on their own beside it.
* Same timer (harness/timer.py): MLX peers return their outputs and cache arrays for eval +
  synchronize; torch peers finish their work inside the call (torch.cuda.synchronize on CUDA).
* Same byte model (harness/engines/metrics.py) from the case's format, so GB/s and % of peak compare
  like for like. Memory: alloc_bytes is the bytes of the peer's cache buffers (capacity, padding
  included); peak memory is MLX's and is recorded for MLX peers only.
* Same parity gate: layer 0's output against the float32 reference over the same stored cache
  (dequantized), then accuracy against the float32 reference over the un-quantized K/V of the
  attended positions.
"""

from __future__ import annotations

import dataclasses
import math

import mlx.core as mx

from kvbench.case import Case
from kvbench.engines import metrics
from kvbench.engines.contract import State, memory_baseline, window_reason
from kvbench.engines.parity import compare_outputs, parity_gate, recon_err
from kvbench.kernels.attention.registry import reference
from kvbench.kernels.data import make_qkv
from kvbench.kernels.formats.registry import get_format
from kvbench.peers.base import DecodeData
from kvbench.peers.registry import PEERS, peer_unsupported_reason, version
from kvbench.suite import resolved
from kvbench.suite.resolved import Resolved


def _torch_cuda_reason() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "this torch build has no CUDA device"


def claims(case: Case) -> bool:
    return case.kernel in PEERS


def skip_reason(case: Case, backend: str) -> str | None:
    peer = PEERS[case.kernel]
    if case.phase != "decode":
        return f"kernel {case.kernel} runs the decode phase only"
    layouts = ("per-stream", "window") if peer.windowed else ("per-stream",)
    if case.layout not in layouts or case.workload != "none":
        return (
            f"kernel {case.kernel} runs one plain decode case ({', '.join(layouts)}, no workload)"
        )
    if not peer.windowed and window_reason(case):
        return window_reason(case)
    try:
        resolved.of_case(case)
    except (KeyError, ValueError) as e:
        return str(e).strip("'\"")
    reason = peer_unsupported_reason(case.kernel, case.kv_dtype, backend)
    if reason is None and case.kernel == "torch_sdpa" and backend == "cuda":
        reason = _torch_cuda_reason()
    return reason


def build(case: Case, r: Resolved) -> State:
    """Build the peer for `case`: convert the data, allocate, prefill and prime (untimed)."""
    fmt = r.k_fmt
    peer = PEERS[case.kernel]
    q32, k32, v32 = make_qkv(
        case.kv_data,
        (case.n_seqs, case.n_q_heads, 1, case.head_dim),
        (case.n_seqs, case.n_kv_heads, case.context_len, case.head_dim),
        case.seed,
        case.kv_file,
    )
    mx.eval(q32, k32, v32)
    scale = 1.0 / math.sqrt(case.head_dim)
    device = "cuda" if mx.default_device().type == mx.DeviceType.gpu else "cpu"
    data = DecodeData(
        q32, k32, v32, case.n_layers, case.kv_dtype, scale, case.group_size, case.window, device
    )
    data = dataclasses.replace(data, sinks=case.sink_tokens)
    baseline = memory_baseline() if peer.uses_mlx else None
    impl = peer.make(data)

    def check() -> dict:
        mx.eval(impl.step())
        out = impl.output(0)
        k, v = impl.stored(0)  # as stored, dequantized: [B, Hkv, span, D] float32
        dense = get_format("fp32")
        ref = reference(q32, {"data": k}, {"data": v}, dense, scale=scale)
        parity_gate(case.kernel, out, ref, fmt.compute_dtype)
        # the attended positions of the original data: the sinks, then the most recent ones
        sinks = min(case.sink_tokens, impl.span)
        idx = [*range(sinks), *range(case.context_len - impl.span + sinks, case.context_len)]
        k0, v0 = (mx.take(x, mx.array(idx), axis=2) for x in (k32, v32))
        exact = reference(q32, {"data": k0}, {"data": v0}, dense, scale=scale)
        return {**compare_outputs(out, exact), "kv_recon_err": recon_err((k, v), (k0, v0))}

    return State(
        impl.stages(),
        check,
        traffic=metrics.traffic_bytes(case, fmt),  # the case's format: like for like
        kv_bytes=metrics.kv_bytes(case, fmt),
        alloc_bytes=impl.nbytes,
        baseline_bytes=baseline,
        cache=impl.arrays if peer.uses_mlx else None,
        extra={"peer_version": version(case.kernel)},
    )
