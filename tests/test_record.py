"""The CSV schema: Record fields are the header; rows and samples round-trip through pandas."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvbench.store.schema import COLUMNS, SAMPLE_COLUMNS, Record, make_record
from kvbench.store.writer import ResultsWriter


def test_round_trip(tmp_path):
    w = ResultsWriter(tmp_path, "run1")
    ok = make_record(
        run_id="run1",
        case_id="abc",
        status="ok",
        median_ms=1.25,
        n_samples=7,
        unstable=False,
        peak_method="mx.sum",
        bytes_read=10**12,
    )
    err = make_record(run_id="run1", case_id="def", status="error", error="ValueError: x, y")
    w.add(ok, [("abc", "step", 0, 0, 1.25), ("abc", "step", 0, 1, 1.5)])
    w.add(err)
    df = pd.read_csv(w.csv_path)
    assert tuple(df.columns) == COLUMNS
    assert df.loc[0, "median_ms"] == 1.25 and df.loc[0, "bytes_read"] == 10**12
    assert df.loc[1, "error"] == "ValueError: x, y"  # commas survive quoting
    assert math.isnan(df.loc[1, "median_ms"])  # never invented: empty cell
    samples = pd.read_csv(w.samples_path)
    assert tuple(samples.columns) == SAMPLE_COLUMNS and samples["ms"].tolist() == [1.25, 1.5]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_required_columns_present():
    required = """run_id suite case_id status error model n_layers n_q_heads n_kv_heads gqa_ratio
    head_dim context_len n_seqs phase kv_dtype layout kernel tile_kv median_ms p10_ms p90_ms
    iqr_ms cv ci_low_ms ci_high_ms n_samples bytes_read bytes_written gbps peak_gbps pct_peak_bw
    flops tflops tokens_per_s kv_bytes alloc_bytes peak_mem_bytes max_abs_err rel_err commit
    dirty branch timestamp host os device backend mlx_version kvbench_version
    schema_version""".split()
    assert set(required) <= set(COLUMNS)
    assert len(COLUMNS) == len(set(COLUMNS)) == len(Record.__dataclass_fields__)


def test_make_record_refuses_keys_that_are_not_columns():
    # a silently dropped key would be a column missing from the CSV
    with pytest.raises(TypeError, match="not Record columns: ignored_key, other_key"):
        make_record(run_id="run1", ignored_key=1, other_key=2)
