"""The streams engine: per-sequence parity in both layouts, counts, stages, suite validation."""

from __future__ import annotations

import dataclasses
import math

import mlx.core as mx
import numpy as np
import pytest
from conftest import numpy_attention

from kvbench import engines
from kvbench.engines import metrics
from kvbench.engines.common import make_tables, workload_of
from kvbench.engines.contract import carrying
from kvbench.engines.streams import Run, build, counts, skip_reason
from kvbench.errors import SuiteError
from kvbench.kernels.attention.registry import KERNELS, Kernel, any_format, reference
from kvbench.kernels.formats.registry import get_format
from kvbench.run import runner
from kvbench.suite.resolved import of_case
from kvbench.suite.suite import Settings, expand, load_suite, resolve

TINY = {"model": "tiny", "n_seqs": 3, "context_len": 40, "kv_dtype": "fp32"}


def case(**kw):
    return resolve("test", {**TINY, **kw})


def own_oracle(c, rp, tables) -> np.ndarray:
    """[S, Hq, 1, D] float64: each sequence over exactly its own tokens' K/V (numpy)."""
    q, k_tab, v_tab = (np.array(t) for t in tables)
    outs = []
    for s, toks in enumerate(rp.seq_tokens):
        k, v = k_tab[:, :, toks], v_tab[:, :, toks]
        outs.append(numpy_attention(q[s : s + 1], k, v, 1 / math.sqrt(c.head_dim)))
    return np.concatenate(outs)


@pytest.mark.parametrize("order", ["interleaved", "sequential"])
@pytest.mark.parametrize("kernel", ["ops", "sdpa"])
def test_every_sequence_matches_its_own_reference_in_both_layouts(order, kernel):
    c = case(workload="shared-prefix", prefix_frac=0.25, churn=1, decode_order=order, kernel=kernel)
    tables = make_tables(c, workload_of(c).n_tokens)
    outs = {}
    for kind in ("per-stream", "unified"):
        run = Run(c, of_case(c).k_fmt, kind, tables, n_layers=1)
        outs[kind] = np.array(run.output(0))
        np.testing.assert_allclose(outs[kind], own_oracle(c, run.rp, tables), atol=2e-5)
    np.testing.assert_allclose(outs["per-stream"], outs["unified"], atol=2e-5)


def test_check_passes_and_stages_run():
    c = case(workload="independent", layout="unified", kv_dtype="fp16")
    state = carrying(build)(c)
    acc = state.check()
    assert acc["rel_err"] < 1e-2 and acc["cosine"] > 0.999
    assert list(state.stages) == ["step", "write", "mask", "attend"]
    for fn in state.stages.values():
        mx.eval(fn())
    read, written = state.traffic
    assert read > state.extra["bytes_touched"] and written > 0


def test_counts_for_a_hand_worked_case():
    # tiny: 2 layers, 2 KV heads, D 64, fp16 -> one cell of one layer's K = 2 x 64 x 2 = 256 B,
    # so bytes = 2 (K, V) x 2 layers x 256 B = 1024 B per cell.
    # 3 sequences, context 9, prefix 3: per-stream 27 cells used, unified 21 (see
    # test_layouts); both pad a stream to 256 cells; n_kv = max(256, pad(last + 1)) = 256.
    c = case(context_len=9, kv_dtype="fp16", workload="shared-prefix", prefix_frac=1 / 3)
    assert c.prefix_len == 3
    tables = make_tables(c, workload_of(c).n_tokens)
    per = Run(c, of_case(c).k_fmt, "per-stream", tables, c.n_layers)
    assert counts(c, per) == {
        "cells_alloc": 768,
        "cells_used": 27,
        "n_kv": 256,
        "bytes_alloc": 768 * 1024,
        "bytes_used": 27 * 1024,
        "kv_util": 27 / 768,
        "bytes_touched": 3 * 256 * 1024,  # every stream read up to n_kv
        "bytes_needed": 27 * 1024,  # each sequence's own 9 cells
    }
    got = counts(c, Run(c, of_case(c).k_fmt, "unified", tables, c.n_layers))
    assert (got["cells_alloc"], got["cells_used"], got["n_kv"]) == (256, 21, 256)
    assert got["bytes_touched"] == 3 * 256 * 1024  # n_kv cells for each of the 3 sequences
    assert got["bytes_needed"] == 27 * 1024  # the prefix counts once per sequence using it


def test_engine_choice():
    assert engines.engine_for(case()) is engines.ENGINES["cache"]
    assert engines.engine_for(case(workload="independent")) is engines.ENGINES["streams"]
    unified = engines.engine_for(case(workload="independent", layout="unified"))
    assert unified.build.__wrapped__ is build  # the engine's build, carrying the case resolved


@pytest.mark.parametrize(
    "extra,key,reason",
    [
        ("layout: unified", "layout", "needs workload"),
        ("churn: 1", "churn", "needs workload"),
        ("workload: shared-prefix, prefix_frac: 0.0", "prefix_frac", "at least 1"),
        ("workload: shared-prefix, prefix_frac: 0.01", "prefix_frac", "at least 1"),
        ("workload: independent, prefix_frac: 0.5", "prefix_frac", "share no prefix"),
        ("workload: independent, churn: 4", "churn", "more than n_seqs"),
        ("workload: independent, phase: prefill", "phase", "decode only"),
        ("workload: independent, prefix_frac: 1.5", "fixed.prefix_frac", r"\[0, 1\)"),
        ("workload: some", "fixed.workload", "unknown value"),
    ],
)
def test_suite_rejects_impossible_stream_cases(write_suite, extra, key, reason):
    path = write_suite(f"fixed: {{model: tiny, context_len: 40, n_seqs: 3, {extra}}}\n")
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    assert err.value.key == key and err.match(reason)


def test_streams_suites_load():
    for path in ("suites/streams.yaml", "suites/streams-gpu.yaml"):
        cases = expand(load_suite(path))
        assert {c.layout for c in cases} == {"per-stream", "unified"}


@pytest.mark.parametrize("kind", ["per-stream", "unified"])
def test_write_stage_stores_the_step_tokens(kind):
    c = case(workload="shared-prefix", prefix_frac=0.5, churn=2)
    tables = make_tables(c, workload_of(c).n_tokens)
    run = Run(c, of_case(c).k_fmt, kind, tables, n_layers=1)
    streams, cells, k, v = run.writes
    run.store.write(0, streams, cells, mx.zeros_like(k), mx.zeros_like(v))  # wipe them
    oracle = own_oracle(c, run.rp, tables)
    assert not np.allclose(np.array(run.output(0)), oracle, atol=1e-3)
    run.write(0)
    np.testing.assert_allclose(np.array(run.output(0)), oracle, atol=2e-5)


def test_the_case_tile_reaches_the_kernel(monkeypatch):
    """tile_kv travels from the case to every kernel call of the streams engine (review 1)."""
    seen = []

    def spy(q, k, v, fmt, *, mask=None, scale, tile_kv=None):
        seen.append(tile_kv)
        return reference(q, k, v, fmt, mask=mask, scale=scale)

    monkeypatch.setitem(KERNELS, "tiled", Kernel(spy, any_format, default_tile=256))
    for kind, order in [("per-stream", "sequential"), ("unified", "interleaved")]:
        seen.clear()
        c = case(workload="independent", layout=kind, decode_order=order, kernel="tiled", tile_kv=8)
        state = carrying(build)(c)
        mx.eval(state.stages["attend"]())
        assert seen and set(seen) == {8}


def test_skip_reason_asks_the_kernel_about_the_case_shape_and_tile(monkeypatch):
    """The GPU kernels' `fits` refusal applies to streams cases too: it gets the call's problem
    (unified interleaved: the n_seqs queries are query rows) and the case's tile."""
    asked = []

    def fits(fmt, problem, tile_kv):
        asked.append((problem, tile_kv))
        return f"refused tile {tile_kv}"

    monkeypatch.setitem(
        KERNELS, "tiled", Kernel(KERNELS["tiled"].fn, any_format, fits=fits, default_tile=256)
    )
    c = case(workload="independent", layout="unified", kernel="tiled", tile_kv=64)
    assert skip_reason(c, "cpu") == "refused tile 64"
    problem, tile = asked[-1]
    assert tile == 64 and (problem.n_q_heads, problem.n_kv_heads, problem.head_dim) == (8, 2, 64)
    assert problem.q_len == 3  # 3 sequences as the query rows of one call
    skip_reason(case(workload="independent", kernel="tiled", tile_kv=64), "cpu")
    assert asked[-1][0].q_len == 1  # per-stream: one query per stream


def test_suite_rejects_kv_file_with_a_workload(write_suite, tmp_path):
    """The streams engine needs K/V per token id, not a [n_seqs, Hkv, ctx, D] capture (review 2):
    refused when the suite loads, even with a file the cache engine could read."""
    kv = np.zeros((2, 40, 64), np.float32)  # tiny: [Hkv, L, D]
    np.savez(tmp_path / "kv.npz", k=kv, v=kv)
    fixed = "model: tiny, context_len: 40, n_seqs: 3, kv_data: file"
    with_file = f"{fixed}, kv_file: {tmp_path}/kv.npz"
    assert load_suite(write_suite(f"fixed: {{{with_file}}}\n"))  # the cache engine reads it
    for axes in (with_file, fixed):  # without kv_file: the workload is the reason, not the file
        path = write_suite(f"fixed: {{{axes}, workload: independent}}\n")
        with pytest.raises(SuiteError) as err:
            load_suite(path)
        assert err.value.key == "kv_data" and err.match("per token")


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp4", "affine4"])
@pytest.mark.parametrize("kind", ["per-stream", "unified"])
def test_alloc_bytes_is_the_stores_exact_size(kind, kv_dtype):
    """alloc_bytes measures the K/V stores only: not masks, queries or the step's writes."""
    c = case(workload="shared-prefix", prefix_frac=0.5, layout=kind, kv_dtype=kv_dtype)
    state = carrying(build)(c)
    assert state.alloc_bytes == state.extra["bytes_alloc"]


def test_kv_bytes_of_a_workload_row_is_the_occupied_cells():
    """A workload row's kv_bytes: the format bytes of the cells the workload holds, not the
    case formula n_seqs x context_len (review 10)."""
    # tiny fp16: 1024 B per cell over both layers, K and V (test_counts_for_a_hand_worked_case).
    # 3 sequences, context 9, prefix 3: per-stream 3 x 9 = 27 cells (the formula's count too);
    # unified 3 + 3 x 6 = 21 cells, where the formula would say 27.
    c = case(context_len=9, kv_dtype="fp16", workload="shared-prefix", prefix_frac=1 / 3)
    assert metrics.kv_bytes(c, get_format("fp16")) == 27 * 1024
    uni = dataclasses.replace(c, layout="unified")
    for cs, cells in ((c, 27), (uni, 21)):
        state = carrying(build)(cs)
        assert state.kv_bytes == state.extra["bytes_used"] == cells * 1024
        run = runner.CaseRun(cs, {"step": [1.0, 1.1, 0.9]}, reported=runner.reported(cs, state))
        row = runner.finish(run, Settings(), {})
        assert row.kv_bytes == cells * 1024


def test_a_workload_row_records_the_effective_tile():
    """A null tile_kv is the kernel's default (tiled: 256) in the row; sdpa has no tiles."""
    for kernel, tile, want in (("tiled", None, 256), ("tiled", 8, 8), ("sdpa", None, None)):
        c = case(workload="independent", kernel=kernel, tile_kv=tile)
        state = carrying(build)(c)
        run = runner.CaseRun(c, {"step": [1.0, 1.1, 0.9]}, reported=runner.reported(c, state))
        row = runner.finish(run, Settings(), {})
        assert (row.tile_kv, row.case_id) == (want, c.case_id)
        assert c.tile_kv == tile  # the case (and its case_id) keep the value as written
