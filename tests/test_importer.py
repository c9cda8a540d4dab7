"""import: a real pytest-benchmark JSON (tests/data, made by `make bench-pytest` here)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvbench.analysis.compare import compare
from kvbench.case import Case
from kvbench.cli import main
from kvbench.errors import UserError
from kvbench.store.importer import import_file
from kvbench.store.results import load
from kvbench.store.schema import COLUMNS

FIXTURE = Path(__file__).parent / "data" / "pytest-benchmark.json"
DOC = json.loads(FIXTURE.read_text())


def test_import_maps_stats_cases_and_context(tmp_path):
    csv_path, n = import_file(FIXTURE, tmp_path)
    assert n == len(DOC["benchmarks"]) == 3
    rows = pd.read_csv(csv_path, dtype={"case_id": str, "commit": str})
    assert tuple(rows.columns) == COLUMNS
    for bench, row in zip(DOC["benchmarks"], rows.itertuples()):
        case = Case(**bench["extra_info"]["case"])
        assert row.case_id == case.case_id  # joins `kvbench run` rows of the same case
        assert row.model == case.model and row.kernel == case.kernel
        assert row.median_ms == pytest.approx(bench["stats"]["median"] * 1e3)
        assert row.n_samples == bench["stats"]["rounds"]
        assert row.bench_name == bench["fullname"]
        assert row.backend == bench["extra_info"]["backend"]
    info = DOC["commit_info"]
    assert set(rows["commit"]) == {info["id"][:12]} and set(rows["dirty"]) == {info["dirty"]}
    assert set(rows["host"]) == {DOC["machine_info"]["node"]}
    assert rows["gbps"].isna().all() and rows["peak_mem_bytes"].isna().all()  # never invented
    samples = pd.read_csv(csv_path.with_name(csv_path.stem + ".samples.csv"))
    assert len(samples) == sum(len(b["stats"]["data"]) for b in DOC["benchmarks"])


def test_imported_runs_compare(tmp_path, capsys):
    csv_path, _ = import_file(FIXTURE, tmp_path)
    cmp = compare(load(str(csv_path)), load(str(csv_path)))
    assert set(cmp.table["verdict"]) == {"unchanged"} and cmp.regressions.empty
    assert (cmp.table["base_n"] == 20).all()
    assert main(["import", str(FIXTURE), "--out", str(tmp_path / "cli")]) == 0
    assert "imported 3 benchmarks" in capsys.readouterr().out


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b["stats"].pop("data"),  # saved without --benchmark-save-data
        lambda b: b["stats"].update(data=[]),  # used to be ok rows claiming n_samples 20
        lambda b: b.pop("stats"),  # used to be ok rows with no median
    ],
    ids=["no data", "empty data", "no stats"],
)
def test_without_raw_data_the_import_is_refused(tmp_path, capsys, edit):
    doc = json.loads(FIXTURE.read_text())
    edit(doc["benchmarks"][1])
    src = tmp_path / "nodata.json"
    src.write_text(json.dumps(doc))
    assert main(["import", str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvbench: {src}: benchmarks[1].stats.data: no raw samples")
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_bad_json_is_a_user_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a benchmark file"}')
    with pytest.raises(UserError, match="not a pytest-benchmark JSON"):
        import_file(bad, tmp_path)


def _broken(edit):
    doc = json.loads(FIXTURE.read_text())
    edit(doc)
    return json.dumps(doc)


@pytest.mark.parametrize(
    "text,where",
    [
        ("this is not JSON", "cannot read JSON"),
        ("[1, 2]", "benchmarks: not a pytest-benchmark JSON"),
        ('{"benchmarks": [{"name": 1}]}', "benchmarks[0].fullname: missing"),
        ('{"benchmarks": [7]}', "benchmarks[0]: not a mapping"),
        (_broken(lambda d: d["benchmarks"][1].pop("fullname")), "benchmarks[1].fullname: missing"),
        (
            _broken(lambda d: d["benchmarks"][0]["stats"].update(median="fast", data=None)),
            "benchmarks[0].stats.median: not a number: 'fast'",
        ),
        (
            _broken(lambda d: d["benchmarks"][2]["stats"]["data"].append("x")),
            "benchmarks[2].stats.data[20]: not a number: 'x'",
        ),
        (
            _broken(lambda d: d["benchmarks"][0].update(stats=[1])),
            "benchmarks[0].stats: not a mapping",
        ),
        (_broken(lambda d: d.update(datetime="yesterday")), "datetime: not an ISO 8601 time"),
        (_broken(lambda d: d.update(datetime=5)), "datetime: not an ISO 8601 time"),
        (_broken(lambda d: d.update(commit_info="abc")), "commit_info: not a mapping"),
    ],
)
def test_malformed_json_is_one_line_exit_2(tmp_path, capsys, text, where):
    src = tmp_path / "in.json"
    src.write_text(text)
    assert main(["import", str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvbench: {src}: {where}"), err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert not (tmp_path / "out").exists()
