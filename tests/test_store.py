"""The results store: one reader and one picking rule for compare, history, gate and report,
and results written before the restructure (schema v1) still load and compare."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kvbench import SCHEMA_VERSION
from kvbench.analysis.compare import compare
from kvbench.errors import UserError
from kvbench.report import page
from kvbench.store import results
from kvbench.store.schema import COLUMNS

# `kvbench run suites/smoke.yaml` written by main at 58f4e51 (before the restructure), kept as
# the migration fixture: today's reader must load it and join its cases with a new run.
V1 = Path(__file__).parent / "data" / "results-v1"


def test_v1_columns_all_still_exist_with_the_same_names():
    (csv,) = [p for p in V1.glob("*.csv") if not p.name.endswith(".samples.csv")]
    v1_columns = set(pd.read_csv(csv, nrows=0).columns)
    assert v1_columns <= set(COLUMNS), v1_columns - set(COLUMNS)


def test_v1_results_compare_against_themselves():
    cmp = compare(results.load(str(V1)), results.load(str(V1)))
    assert len(cmp.table) == 8
    assert set(cmp.table["verdict"]) <= {"unchanged", "inconclusive"}
    assert not cmp.table["regression"].any()
    assert (cmp.table["ratio"] == 1.0).all()


def test_v1_results_join_a_new_run_case_by_case(tmp_path):
    out = tmp_path / "new"
    cmd = [sys.executable, "-m", "kvbench", "run", "suites/smoke.yaml", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, cwd=Path(__file__).parents[1])
    cmp = compare(results.load(str(V1)), results.load(str(out)))
    # the same 8 cases on both sides: case ids survived the restructure
    assert len(cmp.table) == 8
    assert not cmp.table["verdict"].isin(["base_only", "new_only"]).any()
    rows, _ = page.load([V1, out])
    # the fixture was taken on another CPU: as if on this one, the same cases give one row each
    old = rows["run_id"].isin(results.load(str(V1)).rows["run_id"])
    rows.loc[old, ["device", "backend"]] = rows.loc[~old, ["device", "backend"]].iloc[0].values
    assert len(page.current(rows)) == 8


def test_a_newer_schema_is_refused_by_name(tmp_path):
    (csv,) = [p for p in V1.glob("*.csv") if not p.name.endswith(".samples.csv")]
    df = pd.read_csv(csv)
    df["schema_version"] = SCHEMA_VERSION + 1
    df.to_csv(tmp_path / "future.csv", index=False)
    with pytest.raises(UserError, match="future.csv: schema_version: .* newer"):
        results.read_rows(tmp_path / "future.csv")


def _rows(**overrides) -> pd.DataFrame:
    base = {c: None for c in COLUMNS}
    base.update(case_id="c1", device="cpu0", backend="cpu", suite="s")
    return pd.DataFrame([{**base, **o} for o in overrides["rows"]])


def test_one_picking_rule_a_rerun_that_errors_never_hides_a_good_row():
    rows = _rows(
        rows=[
            dict(run_id="r1", status="ok", timestamp="2026-01-01T00:00:00", median_ms=1.0),
            dict(run_id="r2", status="error", timestamp="2026-01-02T00:00:00"),
        ]
    )
    assert results.pick_rows(rows)["run_id"].tolist() == ["r1"]
    assert page.current(page.normalize(rows))["run_id"].tolist() == ["r1"]  # the report too


def test_the_same_case_on_two_machines_is_two_rows_and_compare_refuses_the_mix():
    rows = _rows(
        rows=[
            dict(run_id="r1", status="ok", timestamp="t1", device="m1", median_ms=1.0),
            dict(run_id="r2", status="ok", timestamp="t2", device="m2", median_ms=2.0),
        ]
    )
    assert sorted(results.pick_rows(rows)["device"]) == ["m1", "m2"]
    side = results.ResultSet("mixed", rows, pd.DataFrame())
    with pytest.raises(UserError, match="several machines"):
        compare(side, side)
