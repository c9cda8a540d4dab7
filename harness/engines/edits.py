"""The edits engine: llama.cpp's cache edits on a unified layout (axis kv_edit), each timed as
the case's step (kernels/stores/edits.py).

Build (untimed): the case's workload replayed into a unified layout (kernels/stores/workloads.py, as
the streams engine does); every cell's key stored rotated by RoPE at its position (rope_theta),
its value as is. Then the edit's metadata is applied on the host (untimed):
* shift: every sequence evicts n = (L - keep) // 2 positions after keep = prefix_len (llama.cpp's
  server: n_keep = the prompt, n_discard = n_left / 2); later positions move back by n;
* self-extend: every sequence's positions [keep, keep + w) are divided by g = 4 (w the largest
  multiple of 4 <= (L - keep) / 2), later ones move back by w - w / 4 (seq_div, seq_add);
* defrag: the occupied cells move to the front (n_kv shrinks to the used cells).
Stages: step = the edit's K/V work on every layer (shift, self-extend: re-rotate the moved keys
through the format; defrag: copy the moved cells' K and V), the same cells every sample;
attend = every sequence's attention after the edit (its query rotated at its new last
position, one call with the sequences as query rows, over the new n_kv).
check: layer 0's attention after the edit against the float32 reference over the same stored
cache (parity), and for a float32 cache against a freshly built one (each sequence's tokens'
keys rotated at their new positions); accuracy columns against the fresh float32 cache.
edit_units: keys re-rotated or cells moved (ms per unit = median_ms / edit_units).
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from kvbench.case import Case
from kvbench.engines import common, metrics
from kvbench.engines.contract import State, allocated
from kvbench.engines.parity import compare_outputs, parity_gate
from kvbench.kernels.attention.registry import KERNELS, reference
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.stores.cache import ALL
from kvbench.kernels.stores.edits import (
    move_cells,
    plan_defrag,
    plan_self_extend,
    plan_shift,
    rerotate,
    rope,
)
from kvbench.kernels.stores.footprint import row_bytes
from kvbench.kernels.stores.layouts import KV_PAD, LayoutStore, cells_from_tokens
from kvbench.kernels.stores.workloads import build_layout
from kvbench.suite.resolved import Resolved

GROUP = 4  # self-extend's group factor (llama.cpp's ga_n)


def claims(case: Case) -> bool:
    return case.kv_edit != "none"


def skip_reason(case: Case, backend: str) -> str | None:
    return common.workload_skip_reason(case, backend)


def plan_edit(case: Case, cells) -> tuple[str, np.ndarray, np.ndarray]:
    """Apply the edit's metadata to every sequence; (kind, cells, deltas or destinations)."""
    keep, n_left = case.prefix_len, case.context_len - case.prefix_len
    if case.kv_edit == "defrag":
        src, dst = plan_defrag(cells)
        return "move", src, dst
    moved, delta = [], []
    for s in range(case.n_seqs):
        if case.kv_edit == "shift":
            m, d = plan_shift(cells, s, keep, n_left // 2)
        else:
            w = (n_left // 2) // GROUP * GROUP
            m, d = plan_self_extend(cells, s, keep, keep + w, GROUP)
        moved.append(m)
        delta.append(d)
    return "rotate", np.concatenate(moved), np.concatenate(delta)


class Run:
    def __init__(self, case: Case, fmt, tables, n_layers: int):
        self.case, self.fmt = case, fmt
        q32, k_tab, v_tab = tables
        self.layout, _ = build_layout(common.workload_of(case), "unified", KV_PAD)
        self.cells = self.layout.streams[0]
        shape = (n_layers, case.n_kv_heads, case.head_dim)
        made = allocated(lambda: LayoutStore(self.layout, self.fmt, *shape))
        self.store, self.baseline, self.alloc_bytes = made
        act, tok = self.fmt.compute_dtype, self.cells.token[None]  # [1, size]
        k = rope(cells_from_tokens(tok, k_tab), np.maximum(self.cells.pos, 0), case.rope_theta)
        self.store.put_every_layer((ALL, ALL, ALL), k.astype(act), cells_from_tokens(tok, v_tab))
        self.kind, self.a, self.b = plan_edit(case, self.cells)
        self.units = len(self.a)
        mx.eval(self.edit())  # the cache after the edit; samples repeat the same K/V work
        self.n_kv = self.layout.n_kv()
        seqs = list(range(case.n_seqs))
        self.qpos = [int(self.cells.pos[self.cells.seq_cells(s)].max()) for s in seqs]
        q = mx.concatenate(
            [rope(q32[s : s + 1], [p], case.rope_theta) for s, p in enumerate(self.qpos)]
        )
        self.q32 = q  # [S, Hq, 1, D] float32, rotated at each sequence's new last position
        self.q_rows = q.astype(act).transpose(2, 1, 0, 3)  # [1, Hq, S, D]: sequences as rows
        self.mask = mx.array(self.layout.mask([(0, seqs, self.qpos)], self.n_kv))
        self.scale = 1.0 / math.sqrt(case.head_dim)
        mx.eval(self.q_rows, self.mask, self.q32)

    def edit(self) -> list:
        if self.kind == "move":
            return move_cells(self.store, self.a, self.b)
        return rerotate(self.store, self.a, self.b, self.case.rope_theta)

    def attend(self, layer: int) -> mx.array:
        k, v = self.store.view(layer, self.n_kv)
        fn = KERNELS[self.case.kernel].fn
        out = fn(
            self.q_rows, k, v, self.fmt, mask=self.mask, scale=self.scale, tile_kv=self.case.tile_kv
        )
        return out.transpose(2, 1, 0, 3)  # [S, Hq, 1, D]

    def fresh(self, tables, fmt, encode_from) -> mx.array:
        """[S, Hq, 1, D]: each sequence over a freshly built cache (keys rotated at the new
        positions) in fmt, from keys in the dtype `encode_from`."""
        _, k_tab, v_tab = tables
        outs = []
        for s in range(self.case.n_seqs):
            idx = self.cells.seq_cells(s)
            toks = mx.array(self.cells.token[idx])
            k = rope(mx.take(k_tab, toks, axis=2), self.cells.pos[idx], self.case.rope_theta)
            v = mx.take(v_tab, toks, axis=2)
            kk, vv = fmt.encode(k.astype(encode_from)), fmt.encode(v.astype(encode_from))
            outs.append(reference(self.q32[s : s + 1], kk, vv, fmt, scale=self.scale))
        return mx.concatenate(outs)


def traffic(case: Case, run: Run) -> tuple[int, int]:
    """(read, written) of one edit: the moved keys (rotate) or keys and values (move), format
    bytes, every layer; each read once and written once."""
    kv = row_bytes(run.fmt, run.units, n_layers=case.n_layers, n_kv_heads=case.n_kv_heads,
                   head_dim=case.head_dim)  # fmt: skip
    per = kv // 2  # the keys (or the values) alone
    moved = per if run.kind == "rotate" else 2 * per
    return moved, moved


def build(case: Case, r: Resolved) -> State:
    fmt = r.k_fmt
    tables = common.make_tables(case, common.workload_of(case).n_tokens)
    run = Run(case, fmt, tables, case.n_layers)

    def attend() -> list[mx.array]:
        return [run.attend(layer) for layer in range(run.store.n_layers)]

    def check() -> dict:
        out = run.attend(0)
        k, v = run.store.view(0, run.n_kv)
        same = reference(run.q32.transpose(2, 1, 0, 3), k, v, fmt, mask=run.mask, scale=run.scale)
        parity_gate(case.kernel, out, same.transpose(2, 1, 0, 3), fmt.compute_dtype)
        exact = run.fresh(tables, get_format("fp32"), mx.float32)
        if fmt.name == "fp32":  # the edit itself against a freshly built cache
            parity_gate(f"{case.kv_edit} (vs a fresh cache)", out, exact, mx.float32)
        return compare_outputs(out, exact)

    lay = run.layout
    row = {
        "edit_units": run.units,
        "cells_alloc": lay.cells_alloc,
        "cells_used": lay.cells_used,
        "n_kv": run.n_kv,
    }
    return State(
        {"step": run.edit, "attend": attend},
        check,
        traffic=traffic(case, run),
        kv_bytes=metrics.cache_bytes_of(case, fmt, lay.cells_used),
        alloc_bytes=run.alloc_bytes,
        baseline_bytes=run.baseline,
        cache=run.store.arrays,
        effective=common.effective(case),
        extra=row,
    )
