"""The paged engine: many sequences decoding over a page pool with block tables (layout: paged).

Build (untimed): replay the case's workload (kernels/stores/workloads.py) into a PagedLayout
(kernels/stores/paged.py) whose pool is the most pages the workload ever holds (a dry run),
including
the timed step's batch (one new token per sequence); fill every layer's pool from the per-token
K/V table (streams engine's make_tables: only a true common prefix has common K/V).

Reading (axis page_read):
* gather: per call the block table's pages are gathered into a dense copy
  [S, Hkv, n_blocks * page_size, D] and the case's kernel runs on it with a mask hiding the
  slots past each sequence's length (the naive baseline; works with every kernel);
* table: kernel `tiled` reads whole pages through the block table inside its tile loop
  (tile_kv // page_size pages per tile, at least one), never building the dense copy.
Calls per layer: interleaved = one call for all sequences (the block table padded to the
longest sequence's blocks); sequential = one call per sequence over its own blocks.
Stages: mask (host masks and block tables -> MLX arrays), write (the step's tokens into their
slots, every layer), attend, step = all three. check: each sequence's output against the
float32 reference over exactly its own tokens' K/V (stored in the format, decoded); accuracy
against the float32 reference over the un-quantized K/V.
Counting (docs/layouts.md): pages and slots per layer; bytes = 2 (K, V) x n_layers x format
bytes; the block table (int32) is counted apart, once for all layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx

from kvbench.case import Case
from kvbench.engines import common, metrics
from kvbench.engines.contract import State, allocated
from kvbench.engines.parity import compare_outputs, parity_gate
from kvbench.kernels.attention.registry import KERNELS
from kvbench.kernels.attention.tiled import DEFAULT_TILE_KV
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.stores.footprint import row_bytes
from kvbench.kernels.stores.paged import (
    TABLE_ENTRY_BYTES,
    PagedStore,
    blocks_for,
    gather_pages,
    paged_tiled,
    pages_per_tile,
)
from kvbench.kernels.stores.workloads import build_paged
from kvbench.suite.resolved import Resolved


def claims(case: Case) -> bool:
    return case.layout == "paged"


def skip_reason(case: Case, backend: str) -> str | None:
    """The cache engine's kernels, asked about the paged calls' shapes (the gathered copy is a
    dense cache of n_blocks * page_size positions)."""
    if case.kernel in ("metal", "cuda"):
        why = "has no block-table input yet" if case.page_read == "table" else "takes no mask"
        return f"kernel {case.kernel} {why}: paged runs with kernel sdpa or tiled"
    return common.workload_skip_reason(case, backend)


@dataclass
class Call:
    seqs: list[int]
    q: mx.array  # [S_c, Hq, 1, D]
    n_blocks: int


class Run:
    """A paged pool filled for a case, with the functions of its stages."""

    def __init__(self, case: Case, fmt, tables, n_layers: int):
        self.case, self.fmt = case, fmt
        q32, k_tab, v_tab = tables
        self.layout, self.rp = build_paged(common.workload_of(case), case.page_size)
        shape = (n_layers, case.n_kv_heads, case.head_dim)
        made = allocated(lambda: PagedStore(self.layout, self.fmt, *shape))
        self.store, self.baseline, self.alloc_bytes = made
        self.store.fill(k_tab, v_tab)
        q = q32.astype(self.fmt.compute_dtype)
        self.calls = self._plan_calls(q)
        self.writes = self._plan_writes(k_tab, v_tab)
        self.scale = 1.0 / math.sqrt(case.head_dim)
        self.tile_pages = pages_per_tile(case.tile_kv, case.page_size, DEFAULT_TILE_KV)
        self.inputs = self.build_inputs()
        mx.eval(self.inputs, self.writes, [c.q for c in self.calls])

    def _plan_calls(self, q: mx.array) -> list[Call]:
        lay, n = self.layout, self.case.n_seqs
        blocks = [blocks_for(lay.length[s], lay.page_size) for s in range(n)]
        if self.case.decode_order == "sequential":
            return [Call([s], q[s : s + 1], blocks[s]) for s in range(n)]
        return [Call(list(range(n)), q, max(blocks))]

    def _plan_writes(self, k_tab, v_tab) -> tuple:
        act, toks = self.fmt.compute_dtype, mx.array([t[-1] for t in self.rp.seq_tokens])
        k, v = (  # [n, Hkv, D] of each sequence's step token
            mx.take(tab, toks, axis=2)[0].transpose(1, 0, 2).astype(act) for tab in (k_tab, v_tab)
        )
        pages = mx.array([p for p, _ in self.rp.step_slots])
        return pages, mx.array([s for _, s in self.rp.step_slots]), k, v

    def build_inputs(self) -> list[tuple[mx.array, mx.array]]:
        """Per call (block table int32 [S_c, nb], mask bool [S_c, 1, 1, nb * page])."""
        lay = self.layout
        return [
            (mx.array(lay.block_table(c.seqs, c.n_blocks)), mx.array(lay.mask(c.seqs, c.n_blocks)))
            for c in self.calls
        ]

    def write(self, layer: int) -> None:
        self.store.write(layer, *self.writes)

    def attend(self, layer: int, inputs) -> list[mx.array]:
        pool_k, pool_v = self.store.keys[layer], self.store.values[layer]
        outs = []
        for call, (table, mask) in zip(self.calls, inputs):
            if self.case.page_read == "table":
                out = paged_tiled(
                    call.q, pool_k, pool_v, table, self.fmt,
                    mask=mask, scale=self.scale, tile_pages=self.tile_pages,
                )  # fmt: skip
            else:
                k, v = gather_pages(pool_k, table), gather_pages(pool_v, table)
                out = KERNELS[self.case.kernel].fn(
                    call.q, k, v, self.fmt, mask=mask, scale=self.scale, tile_kv=self.case.tile_kv
                )
            outs.append(out)
        return outs

    def output(self, layer: int) -> mx.array:
        """[S, Hq, 1, D] in sequence order (calls hold sequences in order)."""
        return mx.concatenate(self.attend(layer, self.inputs), axis=0)


def counts(case: Case, run: Run) -> dict:
    """The row's page, slot and byte counts (docs/layouts.md)."""
    lay, fmt, page = run.layout, run.fmt, case.page_size

    def nbytes(slots: int) -> int:
        return metrics.cache_bytes_of(case, fmt, slots)

    touched = sum(len(c.seqs) * c.n_blocks * page for c in run.calls)
    needed = sum(len(t) for t in run.rp.seq_tokens)
    max_blocks = max(blocks_for(n, page) for n in lay.length[: case.n_seqs])
    return {
        "pages_alloc": lay.n_pages,
        "pages_used": lay.pages_used,
        "pages_cow": lay.cow_pages,
        "page_frag": lay.frag_slots / (lay.pages_used * page),
        "block_table_bytes": case.n_seqs * max_blocks * TABLE_ENTRY_BYTES,
        "cells_alloc": lay.n_pages * page,
        "cells_used": lay.live_slots,
        "n_kv": max(c.n_blocks for c in run.calls) * page,
        "bytes_alloc": nbytes(lay.n_pages * page),
        "bytes_used": nbytes(lay.live_slots),
        "kv_util": lay.live_slots / (lay.n_pages * page),
        "bytes_touched": nbytes(touched),
        "bytes_needed": nbytes(needed),
    }


def traffic(case: Case, run: Run, touched: int) -> tuple[int, int]:
    """(read, written) of one step. Beside the streams engine's model (K/V over the blocks each
    sequence reads, the new K/V, q, mask, output), gather writes its dense copy and the kernel
    reads it back: + touched read and + touched written; the block table is read per layer."""
    fmt, act = run.fmt, run.fmt.compute_dtype.size
    s, hq, hkv, d = case.n_seqs, case.n_q_heads, case.n_kv_heads, case.head_dim
    table = sum(math.prod(t.shape) * TABLE_ENTRY_BYTES for t, _ in run.inputs)
    mask = sum(math.prod(m.shape) for _, m in run.inputs)
    per_layer_read = 2 * s * hkv * d * act + s * hq * d * act + mask + table
    per_layer_written = row_bytes(fmt, s, n_layers=1, n_kv_heads=hkv, head_dim=d) + s * hq * d * act
    copy = touched if case.page_read == "gather" else 0
    read = touched + copy + case.n_layers * per_layer_read
    return read, copy + case.n_layers * per_layer_written


def effective(case: Case) -> dict:
    """tile_kv as run: table reads whole pages per tile; gather runs the kernel's own tile."""
    if case.page_read == "table":
        pages = pages_per_tile(case.tile_kv, case.page_size, DEFAULT_TILE_KV)
        return {"tile_kv": pages * case.page_size}
    return common.effective(case)


def build(case: Case, r: Resolved) -> State:
    fmt = r.k_fmt
    tables = common.make_tables(case, common.workload_of(case).n_tokens)
    run = Run(case, fmt, tables, case.n_layers)
    stages = common.layered_stages(run, run.build_inputs, run.inputs)

    def check() -> dict:
        mx.eval(stages["step"]())
        out = run.output(0)
        ref = common.sequence_reference(case, run.rp, tables, fmt)
        parity_gate(f"{case.kernel} (paged, {case.page_read})", out, ref, fmt.compute_dtype)
        exact = common.sequence_reference(case, run.rp, tables, get_format("fp32"))
        sat = common.stored_saturated(fmt, run.layout.token, tables)  # [n_pages, page] ids
        return compare_outputs(out, exact) | sat

    row = counts(case, run)
    traffic_bytes = traffic(case, run, row["bytes_touched"])
    return common.workload_state(run, stages, check, row, traffic_bytes, effective(case))
