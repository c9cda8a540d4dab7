"""Bytes and FLOPs from an explicit model of one timed call (SI units: 1 GB = 1e9 B).

The byte model counts compulsory traffic, each tensor once, as a bandwidth-bound kernel at best
would move it:
  decode step, per layer: read K and V over the context (format bytes, scales included), the
  query and the new token's K/V; write the new K/V into the cache (format bytes) and the output.
  prefill, per layer: read the prompt's K/V and write them into the cache (format bytes); the
  attention reads the cache once, reads the queries and writes the output.
FLOPs count the two matmuls (QK^T and PV, 2 FLOP per multiply-add); softmax is not counted.
A decode step does 4*Hq*L*D FLOP per layer and sequence; causal prefill does 2*Hq*D*L*(L+1)
(query i attends to i+1 keys). A decode case with an attention window W and S
sinks (a sliding-window cache) reads and attends over min(W + S, L) positions instead of L.
"""

from __future__ import annotations

from kvbench.case import Case
from kvbench.kernels.stores import footprint


def attended(case: Case) -> int:
    """Positions a decode query attends over: the window and the sinks, or the whole context."""
    if case.window is None:
        return case.context_len
    return min(case.window + case.sink_tokens, case.context_len)


def traffic_bytes(case: Case, fmt) -> tuple[int, int]:
    """(bytes_read, bytes_written) of one timed call of the case, all layers."""
    b, hq, hkv, d, ctx = (
        case.n_seqs,
        case.n_q_heads,
        case.n_kv_heads,
        case.head_dim,
        case.context_len,
    )
    act = fmt.compute_dtype.size  # queries, outputs and incoming K/V travel in this dtype
    new = 1 if case.phase == "decode" else ctx  # positions written this call
    span = attended(case) if case.phase == "decode" else ctx
    one = {"n_layers": 1, "n_kv_heads": hkv, "head_dim": d}  # one layer's K and V rows
    kv_cache = footprint.row_bytes(fmt, b * span, **one)  # over the attended span, as stored
    kv_new_in = 2 * b * hkv * new * d * act
    kv_new_stored = footprint.row_bytes(fmt, b * new, **one)
    q_and_out = b * hq * new * d * act
    read = kv_cache + kv_new_in + q_and_out
    written = kv_new_stored + q_and_out
    return case.n_layers * read, case.n_layers * written


def flops(case: Case) -> int | None:
    if case.kv_edit != "none":
        return None  # a cache edit (kv_edit) does no attention matmuls
    b, hq, d, ctx = case.n_seqs, case.n_q_heads, case.head_dim, case.context_len
    per_head = 4 * d * attended(case) if case.phase == "decode" else 2 * d * ctx * (ctx + 1)
    return case.n_layers * b * hq * per_head


def kv_bytes(case: Case, fmt) -> int:
    """Exact bytes of the full cache (all layers, K and V) at the case's context length (a
    windowed cache holds only its window), each layer's per-tensor scales (FP8) included."""
    held = attended(case) if case.phase == "decode" else case.context_len
    return cache_bytes_of(case, fmt, case.n_seqs * held)


def cache_bytes_of(case: Case, fmt, cells: int) -> int:
    """Exact bytes of `cells` positions (sequences x positions) of the case's cache, all layers,
    K and V, per-tensor scales included (kernels/stores/footprint.py kv_bytes: the formula)."""
    return footprint.kv_bytes(fmt, cells, n_layers=case.n_layers, n_kv_heads=case.n_kv_heads,
                              head_dim=case.head_dim)  # fmt: skip


ONE_TOKEN = ("decode", "model_decode")  # phases whose timed call produces one token a sequence


def tokens(case: Case) -> int | None:
    """Tokens produced (decode) or processed (prefill) by one timed call (none for an edit)."""
    if case.kv_edit != "none":
        return None
    return case.n_seqs * (1 if case.phase in ONE_TOKEN else case.context_len)


def rates(
    case: Case,
    fmt,
    median_ms: float,
    peak_gbps: float | None,
    traffic: tuple[int, int] | None = None,
    step_flops: int | None = None,
) -> dict:
    """Throughput figures; `traffic` and `step_flops` override the default byte and FLOP
    models (an engine's own). Nothing without a time (a case that measures no time)."""
    if median_ms is None:
        return {}
    read, written = traffic or traffic_bytes(case, fmt)
    seconds = median_ms / 1e3
    gbps = (read + written) / seconds / 1e9
    fl = step_flops or flops(case)
    return {
        "bytes_read": read,
        "bytes_written": written,
        "gbps": gbps,
        "pct_peak_bw": 100 * gbps / peak_gbps if peak_gbps else None,
        "flops": fl,
        "tflops": None if fl is None else fl / seconds / 1e12,
        "tokens_per_s": None if tokens(case) is None else tokens(case) / seconds,
    }
