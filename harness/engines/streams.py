"""The streams engine: many sequences decoding over a per-stream or unified layout.

Build (untimed): replay the case's workload (kernels/stores/workloads.py) into the layout's cell
metadata, including the timed step's batch (one new token per sequence, its cell found by
find_slot), then fill every layer's K/V store from a table of per-token K/V (a token's K/V
depends on its token id, so only a true common prefix is identical across sequences).
Every layer holds the same K/V, as the cache engine does.

Stages (one timed step = one new token for every sequence):
* mask: the masks built from the cell metadata (host numpy, as llama.cpp builds its kq_mask
  on the host) and turned into MLX bool arrays;
* write: every layer writes (encoding on write) the step's K/V into the step's cells;
* attend: every layer runs the kernel over n_kv cells with the mask;
* step: mask + write + attend.
Calls per layer: interleaved = one call for all sequences (per-stream: batch of n_seqs streams,
one query each; unified: one stream, the n_seqs queries as query rows, as a llama.cpp ubatch);
sequential = one call per sequence (per-stream: its own stream and n_kv only).
check: for every sequence, layer 0's output against the float32 reference over exactly that
sequence's own K/V (stored in the format, decoded); against the same kernel over the other
layout; accuracy against the float32 reference over the un-quantized K/V.
Counting (docs/streams.md): cells per layer; bytes = 2 (K, V) x n_layers x format bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvbench.case import Case
from kvbench.engines import common, metrics
from kvbench.engines.contract import State, allocated
from kvbench.engines.parity import compare_outputs, parity_gate
from kvbench.kernels.attention.registry import KERNELS
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.stores.footprint import row_bytes
from kvbench.kernels.stores.layouts import KV_PAD, Layout, LayoutStore
from kvbench.kernels.stores.workloads import Replay, build_layout
from kvbench.suite.resolved import Resolved


def claims(case: Case) -> bool:
    """Many-sequence workloads and the unified layout."""
    return case.layout == "unified" or case.workload != "none"


skip_reason = common.workload_skip_reason


@dataclass
class Call:
    """One kernel call per layer: streams read, query rows, mask groups, extent."""

    streams: slice
    q: mx.array  # [B, Hq, Lq, D]
    groups: list  # [(stream, seq_ids, q_pos)] for Layout.mask
    n_kv: int


def plan_calls(layout: Layout, rp: Replay, q: mx.array, order: str) -> list[Call]:
    """The calls of one step; q [S, Hq, 1, D] (one query per sequence)."""
    n = len(rp.seq_tokens)
    qpos = [len(t) - 1 for t in rp.seq_tokens]
    if order == "sequential":
        calls = []
        for s in range(n):
            st = layout.stream_of(s)
            grp = [(st, [s], [qpos[s]])]
            calls.append(Call(slice(st, st + 1), q[s : s + 1], grp, layout.n_kv([st])))
        return calls
    if layout.kind == "unified":
        q_rows = q.transpose(2, 1, 0, 3)  # [S, Hq, 1, D] -> [1, Hq, S, D]: sequences as rows
        return [Call(slice(0, 1), q_rows, [(0, list(range(n)), qpos)], layout.n_kv())]
    grps = [(s, [s], [qpos[s]]) for s in range(n)]
    return [Call(slice(0, n), q, grps, layout.n_kv())]


def per_sequence(outs: list[mx.array], layout: Layout, order: str) -> mx.array:
    """Call outputs -> [S, Hq, 1, D] in sequence order."""
    if order == "interleaved" and layout.kind == "unified":
        return outs[0].transpose(2, 1, 0, 3)  # [1, Hq, S, D] -> [S, Hq, 1, D]
    return mx.concatenate(outs, axis=0)


class Run:
    """A layout filled for a case, with the functions of its stages. `baseline` is the active
    memory before the stores (harness/engines/contract.py memory_baseline), `alloc_bytes` its
    growth when the (zeroed) stores are allocated, before they are filled and before masks,
    queries and the step's writes exist (as the cache engine measures its cache)."""

    def __init__(self, case: Case, fmt, kind: str, tables, n_layers: int):
        self.case, self.fmt = case, fmt
        q32, k_tab, v_tab = tables
        self.layout, self.rp = build_layout(common.workload_of(case), kind, KV_PAD)  # host metadata
        shape = (n_layers, case.n_kv_heads, case.head_dim)
        made = allocated(lambda: LayoutStore(self.layout, self.fmt, *shape))
        self.store, self.baseline, self.alloc_bytes = made
        self.store.fill(k_tab, v_tab)
        q = q32.astype(self.fmt.compute_dtype)
        self.calls = plan_calls(self.layout, self.rp, q, case.decode_order)
        self.writes = self._plan_writes(k_tab, v_tab)
        self.scale = 1.0 / math.sqrt(case.head_dim)
        self.kernel = KERNELS[case.kernel].fn
        self.masks = self.build_masks()
        mx.eval(self.masks, self.writes, [c.q for c in self.calls])

    def _plan_writes(self, k_tab, v_tab) -> tuple:
        """(streams, cells, k, v) of the step's tokens; k, v [n, Hkv, D]."""
        act = self.fmt.compute_dtype
        toks = mx.array([t[-1] for t in self.rp.seq_tokens])
        k, v = (
            mx.take(tab, toks, axis=2)[0].transpose(1, 0, 2).astype(act) for tab in (k_tab, v_tab)
        )
        streams = mx.array([st for st, _ in self.rp.step_slots])
        return streams, mx.array([c for _, c in self.rp.step_slots]), k, v

    def build_masks(self) -> list[mx.array]:
        return [mx.array(self.layout.mask(c.groups, c.n_kv)) for c in self.calls]

    def write(self, layer: int) -> None:
        self.store.write(layer, *self.writes)

    def attend(self, layer: int, masks: list[mx.array]) -> list[mx.array]:
        outs = []
        for call, mask in zip(self.calls, masks):
            k, v = self.store.view(layer, call.n_kv, call.streams)
            outs.append(
                self.kernel(
                    call.q, k, v, self.fmt, mask=mask, scale=self.scale, tile_kv=self.case.tile_kv
                )
            )
        return outs

    def output(self, layer: int) -> mx.array:
        """Layer `layer`'s attention output per sequence, [S, Hq, 1, D]."""
        return per_sequence(self.attend(layer, self.masks), self.layout, self.case.decode_order)


def counts(case: Case, run: Run) -> dict:
    """The row's cell and byte counts (docs/streams.md)."""
    lay, fmt = run.layout, run.fmt

    def nbytes(cells: int) -> int:
        return metrics.cache_bytes_of(case, fmt, cells)

    touched = sum(c.n_kv * sum(len(g[1]) for g in c.groups) for c in run.calls)
    needed = sum(len(t) for t in run.rp.seq_tokens)
    return {
        "cells_alloc": lay.cells_alloc,
        "cells_used": lay.cells_used,
        "n_kv": max(c.n_kv for c in run.calls),
        "bytes_alloc": nbytes(lay.cells_alloc),
        "bytes_used": nbytes(lay.cells_used),
        "kv_util": lay.cells_used / lay.cells_alloc,
        "bytes_touched": nbytes(touched),
        "bytes_needed": nbytes(needed),
    }


def traffic(case: Case, run: Run, touched: int) -> tuple[int, int]:
    """(read, written) of one step: K/V over n_kv per sequence, the new K/V, q, mask, out."""
    fmt, act = run.fmt, run.fmt.compute_dtype.size
    s, hq, hkv, d = case.n_seqs, case.n_q_heads, case.n_kv_heads, case.head_dim
    mask = sum(math.prod(m.shape) for m in run.masks)  # bool: 1 byte each, read per layer
    per_layer_read = 2 * s * hkv * d * act + s * hq * d * act + mask
    per_layer_written = row_bytes(fmt, s, n_layers=1, n_kv_heads=hkv, head_dim=d) + s * hq * d * act
    return touched + case.n_layers * per_layer_read, case.n_layers * per_layer_written


def build(case: Case, r: Resolved) -> State:
    fmt = r.k_fmt
    tables = common.make_tables(case, common.workload_of(case).n_tokens)
    run = Run(case, fmt, case.layout, tables, case.n_layers)
    stages = common.layered_stages(run, run.build_masks, run.masks)

    def check() -> dict:
        mx.eval(stages["step"]())
        out = run.output(0)
        act = fmt.compute_dtype
        parity_gate(case.kernel, out, common.sequence_reference(case, run.rp, tables, fmt), act)
        other = "unified" if case.layout == "per-stream" else "per-stream"
        twin = Run(case, fmt, other, tables, 1)
        parity_gate(f"{case.kernel} ({other} layout)", out, twin.output(0), act)
        exact = common.sequence_reference(case, run.rp, tables, get_format("fp32"))
        tokens = np.stack([st.token for st in run.layout.streams])  # [n_stream, size]
        return compare_outputs(out, exact) | common.stored_saturated(fmt, tokens, tables)

    row = counts(case, run)
    traffic_bytes = traffic(case, run, row["bytes_touched"])
    return common.workload_state(run, stages, check, row, traffic_bytes, common.effective(case))
