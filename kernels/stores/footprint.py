"""The byte model of every layout, in one registry: what a layout holds for a shape.

Each entry calls the function its layout's module owns (the structure and its count live
together). The byte formula of K and V rows, 2 * L * fmt.nbytes(cells * Hkv, D), is `row_bytes`
here and nowhere else: `kvbench plan`, the memory guard (both through harness/suite/resolve.py)
and every engine's byte counts (harness/engines/metrics.py cache_bytes_of) call it.
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


# the layouts' own table: its keys are the layout names everywhere (suite checks, `kvbench plan`,
# `kvbench list`), so a layout is named once, here
FOOTPRINTS = {
    "per-stream": lambda n, ctx, la: {"cells": per_stream_cells(n, ctx)},
    "unified": lambda n, ctx, la: {"cells": unified_cells(n, ctx, la.prefix)},
    "paged": lambda n, ctx, la: paged_counts(n, ctx, la.page_size, la.prefix),
    "window": lambda n, ctx, la: {"cells": window_cells(n, la.window, la.sinks)},
}
LAYOUTS = tuple(FOOTPRINTS)


def layout_counts(layout: str, n_seqs: int, ctx: int, la: LayoutArgs) -> dict:
    """cells (positions of one layer's K per K/V head), and for paged: pages and block-table
    bytes, of n_seqs sequences of ctx tokens."""
    return FOOTPRINTS[layout](n_seqs, ctx, la)


def row_bytes(fmt, cells: int, *, n_layers: int, n_kv_heads: int, head_dim: int) -> int:
    """2 * L * fmt.nbytes(cells * Hkv, D): K and V rows of `cells` positions of every KV head,
    every layer, as the format stores them (data, scales, biases). The byte formula, once."""
    return 2 * n_layers * fmt.nbytes(cells * n_kv_heads, head_dim)


def kv_bytes(fmt, cells: int, *, n_layers: int, n_kv_heads: int, head_dim: int) -> int:
    """Exact bytes of a cache of `cells` positions: row_bytes plus each layer's per-tensor
    scales of K and of V (FP8's; 0 for every other format)."""
    return n_layers * layer_kv_bytes(fmt, fmt, cells, n_kv_heads=n_kv_heads, head_dim=head_dim)


def layer_cells(ctx: int, windows: tuple, n_layers: int, max_step: int | None = None) -> list[int]:
    """Cells of each layer of a model after ctx tokens, the one count of them: a layer that keeps
    its whole context holds ctx; a sliding-window layer (window, sinks: kernels/model/cache.py
    WindowCache, mlx-lm's RotatingKVCache) holds min(ctx, window + sinks) positions
    (max_step None), and allocates its ring, sinks + window + max_step - 1 cells, when written
    at most max_step tokens at a time (kernels/stores/window.py). `windows`: per layer None or
    (window, sinks); empty: every layer keeps its whole context."""
    if windows and len(windows) != n_layers:
        raise ValueError(f"{len(windows)} layer windows for {n_layers} layers")

    def one(w) -> int:
        if w is None:
            return ctx
        return min(ctx, w[0] + w[1]) if max_step is None else w[1] + w[0] + max_step - 1

    return [one(w) for w in windows or (None,) * n_layers]


def layer_kv_bytes(k_fmt, v_fmt, cells: int, *, n_kv_heads: int, head_dim: int) -> int:
    """Exact bytes of one layer's K (in k_fmt) and V (in v_fmt) over `cells` positions of every
    KV head, with each one's per-tensor scale (FP8; 0 for every other format)."""
    return sum(f.nbytes(cells * n_kv_heads, head_dim) + f.tensor_bytes(n_kv_heads)
               for f in (k_fmt, v_fmt))  # fmt: skip


def cache_bytes(
    k_fmt, v_fmt, layout: str, n_seqs: int, ctx: int, la: LayoutArgs, *, n_layers: int,
    n_kv_heads: int, head_dim: int, windows: tuple = (),
) -> int:  # fmt: skip
    """Exact bytes of the whole cache (K and V, every layer with its per-tensor scales (FP8),
    plus a block table): the one cache total, for `kvbench plan` and the resolved case alike.
    `windows` (per-stream only): a model's sliding-window layers, each counted at its own
    positions."""
    counts = layout_counts(layout, n_seqs, ctx, la)
    cells = [counts["cells"]] * n_layers
    if windows and layout == "per-stream":
        cells = [n_seqs * p for p in layer_cells(ctx, windows, n_layers)]
    one = {"n_kv_heads": n_kv_heads, "head_dim": head_dim}
    kv = sum(layer_kv_bytes(k_fmt, v_fmt, c, **one) for c in cells)
    return kv + counts.get("block_table_bytes", 0)
