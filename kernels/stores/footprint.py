"""The byte model of every layout, in one registry: what a layout holds for a shape.

Each entry calls the function its layout's module owns (the structure and its count live
together); `kvbench plan`, the memory guard and the engines' exact bytes all come through here,
so the guard refuses exactly what the planner says will not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.kernels.stores.layouts import per_stream_cells, unified_cells
from kvbench.kernels.stores.paged import paged_counts
from kvbench.kernels.stores.window import window_cells


@dataclass(frozen=True)
class LayoutArgs:
    page_size: int | None = None  # paged: slots per page
    window: int | None = None  # window: positions attended (the latest)
    sinks: int = 0  # window: first positions always kept
    prefix: int = 0  # unified, paged: tokens of one prompt every sequence shares


FOOTPRINTS = {
    "per-stream": lambda n, ctx, la: {"cells": per_stream_cells(n, ctx)},
    "unified": lambda n, ctx, la: {"cells": unified_cells(n, ctx, la.prefix)},
    "window": lambda n, ctx, la: {"cells": window_cells(n, la.window, la.sinks)},
    "paged": lambda n, ctx, la: paged_counts(n, ctx, la.page_size, la.prefix),
}


def layout_counts(layout: str, n_seqs: int, ctx: int, la: LayoutArgs) -> dict:
    """cells (positions of one layer's K per K/V head), and for paged: pages and block-table
    bytes, of n_seqs sequences of ctx tokens."""
    return FOOTPRINTS[layout](n_seqs, ctx, la)


def cache_bytes(fmt, layout: str, n_seqs: int, ctx: int, la: LayoutArgs, *, n_layers: int,
                n_kv_heads: int, head_dim: int) -> int:  # fmt: skip
    """Exact bytes of the whole cache (K and V, every layer with its per-tensor scales (FP8),
    plus a block table)."""
    counts = layout_counts(layout, n_seqs, ctx, la)
    rows = fmt.nbytes(counts["cells"] * n_kv_heads, head_dim)
    kv = 2 * n_layers * (rows + fmt.tensor_bytes(n_kv_heads))
    return kv + counts.get("block_table_bytes", 0)
