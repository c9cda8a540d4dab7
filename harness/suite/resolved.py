"""One resolved case: a case's formats, layout, cells and bytes, worked out once.

`of_case(case)` turns a Case into a frozen Resolved: its K and V formats, its layout's
arguments, the cells its layout allocates (kernels/stores/footprint.py), the exact bytes of its
cache (K and V, every layer, per-tensor scales, a paged cache's block tables) and its planned
peak (the cache, the source K/V, the kernel's transients). The memory guard
(harness/run/memory.py), the engines (on their State), the runner's row and `kvbench plan`
(harness/suite/plan.py, through `of_shape`, the same function on a shape without a Case)
all read it, so the guard refuses exactly what the plan says will not fit. A model-phase case
plans its own parts (harness/suite/model_plan.py).

Planned bytes (an estimate of the case's peak, from the shape alone):
  * cache: the exact bytes above;
  * source: the K/V the engine fills the cache from: one layer's K and V in float32 plus a copy
    in the compute dtype (kernels/data.py make_qkv, then astype), over the layout's cells;
  * transient: dequantize-then-attend and the float32 reference of the parity check materialise
    one layer's K and V in float32, repeated over the query heads of each K/V head (an upper
    bound for a kernel that dequantizes to fp16 without repeating), and the attention scores and
    probabilities (float32, n_seqs x n_q_heads x query length x context).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from kvbench.case import Case
from kvbench.kernels.stores.footprint import (
    LayoutArgs,
    cache_bytes,
    layer_cells,
    layout_counts,
)
from kvbench.suite.cache_spec import MODEL_PHASES, format_of, spec_of, v_format_of
from kvbench.suite.model_plan import model_cells, model_plan


@dataclass(frozen=True)
class Resolved:
    k_fmt: object  # the K format (kernels/formats/protocol.py Format)
    v_fmt: object  # the V format (K's unless the case sets v_dtype)
    layout: str
    layout_args: LayoutArgs
    cells: int  # positions x sequences of one layer's K, as the layout allocates them
    pages: int | None  # paged: pages in the pool
    block_table_bytes: int  # paged: int32 block tables, once for all layers
    # exact bytes the layout allocates: K and V, all layers, per-tensor scales, block tables
    # (capacity and padding included; an engine's kv_bytes counts the cells the case holds)
    cache_bytes: int
    planned: dict  # the planned peak: cache, source, transient, total (bytes)
    # per layer, where a model's window layers hold fewer (per-stream with windows), or a model
    # phase's cache as allocated (every layer's cells, a window layer's ring)
    layer_cells: tuple | None = None
    spec: object | None = None  # a model phase's cache (kernels/model/spec.py CacheSpec)


def layout_args(case: Case) -> LayoutArgs:
    """The case's layout arguments (none for per-stream)."""
    if case.layout == "per-stream":
        return LayoutArgs()
    return LayoutArgs(case.page_size, case.window, case.sink_tokens, case.prefix_len)


def of_shape(
    k_fmt,
    v_fmt,
    layout: str,
    la: LayoutArgs,
    *,
    n_seqs: int,
    context_len: int,
    n_layers: int,
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
    query_len: int = 1,
    windows: tuple = (),
) -> Resolved:
    """The Resolved of a shape (a Case's, or `kvbench plan`'s): query_len 1 for a decode step,
    the context for prefill; `windows` (per-stream): a model's sliding-window layers, each
    layer counted at its own positions (kernels/stores/footprint.py layer_cells)."""
    counts = layout_counts(layout, n_seqs, context_len, la)
    cells, table = counts["cells"], counts.get("block_table_bytes", 0)
    per_layer = None
    if windows and layout == "per-stream":
        per_layer = tuple(n_seqs * p for p in layer_cells(context_len, windows, n_layers))
    shape = {"n_layers": n_layers, "n_kv_heads": n_kv_heads, "head_dim": head_dim}
    total = cache_bytes(k_fmt, v_fmt, layout, n_seqs, context_len, la, windows=windows, **shape)
    layer_elems = cells * n_kv_heads * head_dim  # K (or V) elements of one layer
    ref_elems = n_seqs * n_q_heads * context_len * head_dim
    score_elems = n_seqs * n_q_heads * query_len * context_len
    parts = {
        "cache": total,
        "source": 2 * layer_elems * (4 + k_fmt.compute_dtype.size),
        "transient": 2 * ref_elems * 4 + 2 * score_elems * 4,
    }
    return Resolved(
        k_fmt=k_fmt,
        v_fmt=v_fmt,
        layout=layout,
        layout_args=la,
        cells=cells,
        pages=counts.get("pages"),
        block_table_bytes=table,
        cache_bytes=total,
        planned={**parts, "total": sum(parts.values())},
        layer_cells=per_layer,
    )


@lru_cache(maxsize=4096)
def of_case(case: Case) -> Resolved:
    """The case resolved (once per case: a Case is frozen and hashable). A model phase's cache
    and planned peak are its own (suite/model_plan.py: the model's cache at its capacity, the
    float32 reference, scores, kept logits; the model's vocabulary read from its metadata)."""
    r = of_shape(
        format_of(case),
        v_format_of(case),
        case.layout,
        layout_args(case),
        n_seqs=case.n_seqs,
        context_len=case.context_len,
        n_layers=case.n_layers,
        n_q_heads=case.n_q_heads,
        n_kv_heads=case.n_kv_heads,
        head_dim=case.head_dim,
        query_len=1 if case.phase == "decode" else case.context_len,
    )
    if case.phase not in MODEL_PHASES:
        return r
    from kvbench.kernels.model.source import model_shape

    shape = model_shape(case.model)  # its vocabulary (none: no logits) and window layers
    spec = spec_of(case)
    planned = model_plan(case, spec, shape.vocab or 0, shape.windows)
    cells = tuple(model_cells(case, shape.windows))  # window layers: their rings
    return dataclasses.replace(r, cache_bytes=planned["cache"], planned=planned, spec=spec,
                               layer_cells=cells)  # fmt: skip
