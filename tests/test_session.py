"""End to end: a real suite on the CPU backend, error rows, skipped rows, Ctrl-C."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvbench import SCHEMA_VERSION
from kvbench.kernels.attention import registry as attention
from kvbench.run import runner
from kvbench.run.session import run_suite
from kvbench.store.checks import dir_files
from kvbench.suite.suite import expand, load_suite

SUITE = """
name: t
settings: {warmup_s: 0.0, min_samples: 3, max_samples: 4, budget_s: 0.05, rounds: 2}
fixed: {model: tiny}
sweep: {context_len: [16, 40], kernel: [sdpa, ops]}
"""


def _run(write_suite, tmp_path, quiet, text=SUITE):
    suite = load_suite(write_suite(text))
    writer = run_suite(suite, expand(suite), tmp_path / "out", quiet)
    return pd.read_csv(writer.csv_path), pd.read_csv(writer.samples_path)


def test_suite_writes_ok_rows_with_finite_figures(write_suite, tmp_path, quiet):
    rows, samples = _run(write_suite, tmp_path, quiet)
    assert len(rows) == 4 and set(rows["status"]) == {"ok"}
    for col in (
        "median_ms",
        "gbps",
        "pct_peak_bw",
        "peak_gbps",
        "write_ms",
        "attend_ms",
        "kv_bytes",
        "alloc_bytes",
        "peak_mem_bytes",
        "rel_err",
        "tokens_per_s",
    ):
        assert rows[col].map(math.isfinite).all() and (rows[col] >= 0).all(), col
    assert (rows["n_samples"] >= 3).all()
    # the allocation measured from active memory covers the formula's bytes
    assert (rows["alloc_bytes"] >= rows["kv_bytes"]).all()
    # every row's sample count matches the raw samples kept for its step stage
    steps = samples[samples["stage"] == "step"].groupby("case_id").size()
    assert rows.set_index("case_id")["n_samples"].sort_index().equals(steps.sort_index())
    assert set(samples["round"]) == {0, 1}  # interleaved in two rounds
    assert rows["backend"].eq("cpu").all() and rows["schema_version"].eq(SCHEMA_VERSION).all()
    assert rows["data_bits"].eq(16).all() and rows["kernel_kind"].eq("kvbench").all()  # fp16
    # the BLAS this process runs on (kvbench.blas), on every row, with its measured speed
    from kvbench import blas

    assert rows["blas"].eq(blas.chosen()["blas"]).all()
    assert rows["blas_source"].eq(blas.chosen()["blas_source"]).all()
    assert rows["blas_gflops"].nunique() == 1 and (rows["blas_gflops"] > 0).all()


def test_a_failing_case_becomes_an_error_row(write_suite, tmp_path, monkeypatch, quiet):
    def broken(q, k, v, fmt, **kw):
        raise ValueError("kernel exploded")

    monkeypatch.setitem(attention.KERNELS, "ops", attention.Kernel(broken, attention.dense_only))
    rows, _ = _run(write_suite, tmp_path, quiet)
    bad = rows[rows["kernel"] == "ops"]
    assert set(bad["status"]) == {"error"}
    assert bad["error"].str.contains("kernel exploded").all()
    assert bad["median_ms"].isna().all()
    assert set(rows[rows["kernel"] == "sdpa"]["status"]) == {"ok"}


def test_a_wrong_kernel_fails_the_parity_gate_and_gets_no_time(
    write_suite, tmp_path, monkeypatch, quiet
):
    def wrong(q, k, v, fmt, **kw):
        return attention.sdpa(q, k, v, fmt, **kw) * 1.05  # 5% off

    monkeypatch.setitem(attention.KERNELS, "ops", attention.Kernel(wrong, attention.dense_only))
    rows, samples = _run(write_suite, tmp_path, quiet)
    bad = rows[rows["kernel"] == "ops"]
    assert set(bad["status"]) == {"error"} and bad["error"].str.contains("ParityError").all()
    assert bad["median_ms"].isna().all()
    assert not samples["case_id"].isin(bad["case_id"]).any()


def test_unsupported_backend_gives_a_skipped_row(write_suite, tmp_path, monkeypatch, quiet):
    gpu_only = attention.Kernel(attention.ops, attention.dense_only, backends=("metal",))
    monkeypatch.setitem(attention.KERNELS, "ops", gpu_only)
    rows, _ = _run(write_suite, tmp_path, quiet)
    skipped = rows[rows["kernel"] == "ops"]
    assert set(skipped["status"]) == {"skipped"}
    assert skipped["error"].str.contains("not cpu").all()


def test_ctrl_c_keeps_completed_rows(write_suite, tmp_path, monkeypatch, quiet):
    calls = {"n": 0}
    real = runner.measure_round

    def interrupt_late(run, settings, round_no, **kw):
        calls["n"] += 1
        if calls["n"] == 7:  # round 2, third case: two cases are complete by then
            raise KeyboardInterrupt
        real(run, settings, round_no, **kw)

    monkeypatch.setattr(runner, "measure_round", interrupt_late)
    suite = load_suite(write_suite(SUITE))
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite, expand(suite), out, quiet)
    (csv,) = dir_files(out)
    rows = pd.read_csv(csv)
    assert rows["status"].tolist() == ["ok", "ok", "partial", "partial"]
    assert rows.loc[rows.status == "partial", "error"].str.contains("1 of 2 rounds").all()
    assert rows["median_ms"].notna().all()


def test_run_ids_never_overwrite_an_earlier_run(tmp_path):
    from kvbench.store.writer import ResultsWriter

    assert ResultsWriter.claim(tmp_path, "r").run_id == "r"  # claims r.csv and r.samples.csv
    (tmp_path / "r-2.samples.csv").write_text("x")  # a stray samples file holds r-2 too
    assert ResultsWriter.claim(tmp_path, "r").run_id == "r-3"
    assert (tmp_path / "r.csv").read_text().startswith("run_id,")


def test_peak_memory_is_the_case_not_the_parity_check(write_suite, tmp_path, quiet):
    # tiny, fp32, ctx 1024: the cache is 2 layers x (K+V) x 2 heads x 1024 x 64 x 4 B = 2 MiB.
    # A decode step adds only per-layer score rows. The parity check's float32 reference
    # repeats K/V over the 4 query heads per KV head (another 4 MiB): it must not count.
    text = SUITE.replace(
        "sweep: {context_len: [16, 40], kernel: [sdpa, ops]}",
        "sweep: {context_len: [1024], kv_dtype: [fp32]}",
    )
    rows, _ = _run(write_suite, tmp_path, quiet, text)
    (row,) = rows.itertuples()
    assert row.kv_bytes == 2 * 2 * 2 * 1024 * 64 * 4
    assert row.kv_bytes <= row.peak_mem_bytes < 1.25 * row.kv_bytes


def test_stage_shares_split_the_budget():
    shares = runner.stage_shares(["step", "write", "attend"], True)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["step"] == pytest.approx(4 * shares["write"]) and shares["step"] == 2 / 3
    assert runner.stage_shares(["step", "write", "attend"], False) == {"step": 1.0}


def test_per_token_lines_go_to_their_own_file_before_the_row(tmp_path):
    from kvbench.store.schema import make_record
    from kvbench.store.tokens import read_tokens, token_rows
    from kvbench.store.writer import ResultsWriter

    w = ResultsWriter.claim(tmp_path, "r")
    w.add(make_record(run_id="r", case_id="x", status="ok"), [("x", "step", 0, 0, 1.5)])
    assert not w.tokens_path.exists()  # no row kept per-token values: no file
    arrays = dict(chunk=[0, 0], position=[8, 9], token=[5, 6], nll=[2.0, 1.0], kl=[0.1, -1e-5])
    w.add(make_record(run_id="r", case_id="y", status="ok"), [], token_rows("y", arrays))
    got = read_tokens(w.csv_path)
    assert got.to_dict("list") == dict(case_id=["y", "y"], chunk=[0, 0], position=[8, 9],
                                       token=[5, 6], nll=[2.0, 1.0], kl=[0.1, -1e-5])  # fmt: skip
    with pytest.raises(ValueError, match="kl is not finite at token 1"):
        token_rows("y", {**arrays, "kl": [0.1, float("nan")]})
    (tmp_path / "s-2.tokens.csv").write_text("x")  # a stray per-token file holds s-2
    assert ResultsWriter.claim(tmp_path, "s").run_id == "s"
    assert ResultsWriter.claim(tmp_path, "s").run_id == "s-3"
