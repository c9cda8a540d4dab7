"""Issue 14, bad inputs: every malformed suite, result file or option from a table ends in one
line `kvbench: ...` naming the file (or option) and the reason, exit code 2, no traceback.

These run the CLI's `main` in this process (an uncaught exception fails the test with its
traceback); tests/test_faults.py runs the CLI as a subprocess under signals, full and read-only
disks and concurrent writers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fake_runs import draw, write_run

from kvbench import stats
from kvbench.cli import main

FIXTURE = Path(__file__).parent / "data" / "pytest-benchmark.json"
DOC = json.loads(FIXTURE.read_text())


def one_line_error(capsys, argv, *needles, code=2) -> str:
    """Run the CLI; assert the exit code and a last stderr line naming the fault."""
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == code, err
    assert "Traceback" not in err and lines and lines[-1].startswith("kvbench: "), err
    for needle in needles:
        assert needle in lines[-1], lines[-1]
    return lines[-1]


# ---- 1: compare / history with many samples --------------------------------------------------


def test_u_test_floor_with_many_samples_is_a_number_not_an_overflow():
    # 2 / C(1200, 600) underflows to 0; the exact figure is about 1e-359, so 0.0 is correct
    assert stats.min_two_sided_p(600, 600) == 0.0
    assert stats.min_two_sided_p(20, 20) == pytest.approx(2 / 137846528820)
    assert stats.min_two_sided_p(5, 5) == pytest.approx(2 / 252)


def test_compare_and_history_with_600_samples_a_side(tmp_path, capsys):
    write_run(tmp_path, "r1", {"c1": draw(600, 1.0, seed=1)})
    assert main(["compare", str(tmp_path), str(tmp_path)]) == 0
    assert main(["history", str(tmp_path)]) == 0
    assert "unchanged" in capsys.readouterr().out


# ---- 6: suites that cannot be decoded --------------------------------------------------------

SUITE_BYTES = {
    "latin-1": (b"name: caf\xe9\nfixed: {model: tiny}\n", "not UTF-8"),
    "utf-16": ("name: x\nfixed: {model: tiny}\n".encode("utf-16"), "UTF-16"),
    "binary": (bytes(range(256)) * 4, "binary"),
    "deep": (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
}


@pytest.mark.parametrize("kind", SUITE_BYTES)
@pytest.mark.parametrize("command", ["run", "gate"])
def test_undecodable_suites_are_one_line_errors(tmp_path, capsys, kind, command):
    data, reason = SUITE_BYTES[kind]
    path = tmp_path / "x.yaml"
    path.write_bytes(data)
    argv = ["run", path, "--dry-run"] if command == "run" else ["gate", "HEAD", "--suite", path]
    one_line_error(capsys, argv, str(path), reason)


def test_dev_zero_as_a_suite_is_refused_without_reading_it_all(capsys):
    one_line_error(capsys, ["run", "/dev/zero", "--dry-run"], "/dev/zero")


# ---- 5, 10: suites accepted that should have been refused ------------------------------------

BAD_SUITES = {
    "warmup inf": ("settings: {warmup_s: .inf}", "settings.warmup_s"),
    "budget nan": ("settings: {budget_s: .nan}", "settings.budget_s"),
    "seed 1e20": ("fixed: {seed: 100000000000000000000}", "seed"),
    "group on fp16": ("fixed: {kv_dtype: fp16, group_size: 32}", "group_size"),
    "name list": ("name: [a, b]", "name"),
    "sweep product": (
        "sweep: {" + ", ".join(f"{a}: {list(range(1, 11))}" for a in (
            "context_len", "n_seqs", "seed", "n_layers", "churn", "head_dim", "tile_kv")) + "}",
        "sweep",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", BAD_SUITES)
def test_suites_that_must_be_refused(tmp_path, capsys, name):
    text, key = BAD_SUITES[name]
    path = tmp_path / "s.yaml"
    base = "" if "fixed:" in text else "fixed: {model: tiny, context_len: 16}\n"
    fixed = "fixed: {model: tiny, context_len: 16, " if "fixed:" in text else None
    path.write_text(text.replace("fixed: {", fixed) if fixed else base + text + "\n")
    one_line_error(capsys, ["run", path, "--dry-run"], f"{path}: {key}")


def test_nan_in_a_kv_file_is_refused_before_running(tmp_path, capsys):
    k = np.zeros((2, 16, 64), np.float32)
    k[0, 3, 5] = np.nan
    np.savez(tmp_path / "kv.npz", k=k, v=np.zeros_like(k))
    path = tmp_path / "s.yaml"
    path.write_text(
        f"fixed: {{model: tiny, context_len: 16, kv_data: file, kv_file: {tmp_path / 'kv.npz'}}}\n"
    )
    one_line_error(capsys, ["run", path, "--dry-run"], "kv_file", "NaN or inf")


# ---- 7, 10: malformed result files ------------------------------------------------------------


def _run_dir(tmp_path) -> Path:
    d = tmp_path / "d"
    d.mkdir()
    write_run(d, "run", {"c1": draw(8, 1.0, seed=1)})
    return d


def _edit_csv(path: Path, **changes) -> None:
    df = pd.read_csv(path, dtype=str)
    for col, value in changes.items():
        if value is None:
            df = df.drop(columns=[col])
        else:
            df[col] = value
    df.to_csv(path, index=False)


RESULT_FAULTS = {
    "samples wrong columns": (
        lambda d: (d / "run.samples.csv").write_text("a,b\n1,2\n"), "run.samples.csv"),
    "samples text ms": (
        lambda d: (d / "run.samples.csv").write_text(
            "case_id,stage,round,sample,ms\nc1,step,0,0,fast\n"), "ms"),
    "no timestamp": (lambda d: _edit_csv(d / "run.csv", timestamp=None), "timestamp"),
    "text median": (lambda d: _edit_csv(d / "run.csv", median_ms="fast"), "median_ms"),
    "binary csv": (lambda d: (d / "run.csv").write_bytes(bytes(range(256)) * 8), "/d"),
    "schema 99": (lambda d: _edit_csv(d / "run.csv", schema_version="99"), "schema_version"),
}  # fmt: skip
READERS = {
    "compare": lambda d: ["compare", d, d],
    "history": lambda d: ["history", d],
    "report": lambda d: ["report", d, "-o", d.parent / "r.html"],
}


@pytest.mark.parametrize("fault", RESULT_FAULTS)
@pytest.mark.parametrize("reader", READERS)
def test_malformed_result_files_are_one_line_errors(tmp_path, capsys, fault, reader):
    d = _run_dir(tmp_path)
    damage, needle = RESULT_FAULTS[fault]
    damage(d)
    readable = fault == "no timestamp"  # a file without the column is still readable
    if readable:
        rc = main([str(a) for a in READERS[reader](d)])
        assert rc == 0 and "Traceback" not in capsys.readouterr().err
        return
    one_line_error(capsys, READERS[reader](d), needle)


def test_missing_samples_file_is_said_not_silently_inconclusive(tmp_path, capsys):
    d = _run_dir(tmp_path)
    (d / "run.samples.csv").unlink()
    assert main(["compare", str(d), str(d)]) == 0
    captured = capsys.readouterr()
    assert "run.samples.csv" in captured.err and "missing" in captured.err
    assert "no raw samples" in captured.out


def test_min_samples_below_one_is_refused(tmp_path, capsys):
    d = _run_dir(tmp_path)
    one_line_error(capsys, ["compare", d, d, "--min-samples", "-5"], "--min-samples")


# ---- 7, 10: pytest-benchmark imports ----------------------------------------------------------


def _doc(edit) -> dict:
    doc = json.loads(json.dumps(DOC))
    edit(doc)
    return doc


def _set_stat(doc, key, value):
    doc["benchmarks"][0]["stats"][key] = value


IMPORT_FAULTS = {
    "commit id number": (lambda d: d["commit_info"].update(id=12345), "commit_info.id"),
    "context_len text": (
        lambda d: d["benchmarks"][0]["extra_info"]["case"].update(context_len="abc"),
        "context_len",
    ),
    "negative sample": (lambda d: d["benchmarks"][0]["stats"]["data"].__setitem__(0, -1.0),
                        "stats.data[0]"),
    "nan sample": (lambda d: d["benchmarks"][0]["stats"]["data"].__setitem__(1, float("nan")),
                   "stats.data[1]"),
    "negative median": (lambda d: _set_stat(d, "median", -0.5), "stats.median"),
}  # fmt: skip


@pytest.mark.parametrize("fault", IMPORT_FAULTS)
def test_bad_imports_are_one_line_errors(tmp_path, capsys, fault):
    edit, key = IMPORT_FAULTS[fault]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_doc(edit)))
    one_line_error(capsys, ["import", path, "--out", tmp_path / "out"], str(path), key)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_deeply_nested_import_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(capsys, ["import", path, "--out", tmp_path / "out"], str(path))


# ---- 3, 11: outputs -----------------------------------------------------------------------------


def test_output_options_naming_a_directory_are_refused_before_work(tmp_path, capsys):
    d = _run_dir(tmp_path)
    one_line_error(capsys, ["compare", d, d, "-o", tmp_path], "is a directory")
    # `report -o DIR` (no .html) is the results site, not an error (docs/report.md)
    assert main(["report", str(d), "-o", str(tmp_path / "site")]) == 0
    assert (tmp_path / "site" / "index.html").is_file()


def test_run_out_that_is_a_file_is_refused_before_measuring(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    suite = Path(__file__).parents[1] / "suites" / "smoke.yaml"
    one_line_error(capsys, ["run", suite, "--out", tmp_path / "f"], "--out", "not a directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only modes (chmod test)")
def test_unwritable_import_out_is_a_one_line_error(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    one_line_error(capsys, ["import", FIXTURE, "--out", ro], str(ro))


def test_results_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        main(["import", str(FIXTURE), "--out", str(tmp_path)])
        report = tmp_path / "r.html"
        main(["report", str(tmp_path), "-o", str(report)])
    finally:
        os.umask(old)
    files = [p for p in tmp_path.iterdir() if p.suffix in (".csv", ".html")]
    assert len(files) == 3 and {p.stat().st_mode & 0o777 for p in files} == {0o644}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_concurrent_reports_to_one_file_never_collide(tmp_path):
    import threading

    from kvbench.report.page import write_report

    write_run(tmp_path, "run", {"c1": draw(8)})
    out, errors = tmp_path / "same.html", []

    def report() -> None:
        try:
            write_report([tmp_path / "run.csv"], out)
        except Exception as e:  # noqa: BLE001 (collected: the test fails on any)
            errors.append(e)

    threads = [threading.Thread(target=report) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and out.read_text().startswith("<!DOCTYPE html>")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_progress_on_a_closed_terminal_does_not_end_the_run():
    from kvbench.run.progress import Progress

    class Closed:
        def isatty(self) -> bool:
            return True

        def write(self, text):
            raise OSError(5, "Input/output error")  # a tty after SIGHUP

        flush = write

    p = Progress(2, stream=Closed())
    p.start("case")  # would raise before: the run (and its partial rows) ended here
    p.done()
    p.close()
