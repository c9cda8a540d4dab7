"""The CLI as a user meets it: one-line errors with exit code 2, list, env, dry-run, run."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from kvbench.cli import main


def kvbench(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def test_bad_suite_exits_2_with_one_line(write_suite):
    path = write_suite("fixed: {model: tiny, context_len: 8, kv_dtype: fp7}\n")
    r = kvbench("run", path)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"kvbench: {path}: fixed.kv_dtype: unknown value 'fp7'")


def test_empty_zip_group_exits_2_with_one_line(write_suite):
    path = write_suite("fixed: {model: tiny, context_len: 8}\nzip: [{}]\n")
    r = kvbench("run", path, "--dry-run")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"kvbench: {path}: zip[0]: is empty"


def test_missing_suite_and_bad_filter_exit_2(tmp_path):
    r = kvbench("run", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr
    r = kvbench("run", "suites/smoke.yaml", "--filter", "colour=red")
    assert r.returncode == 2 and "--filter" in r.stderr
    r = kvbench("run", "suites/smoke.yaml", "--filter", "context_len=3", "--out", str(tmp_path))
    assert r.returncode == 2 and "no case matches" in r.stderr


def test_gpu_on_a_cpu_only_build_exits_2():
    import mlx.core as mx

    if mx.metal.is_available() or mx.cuda.is_available():
        return  # the refusal only applies where no GPU backend exists
    r = kvbench("env", "--device", "gpu")
    assert r.returncode == 2 and "no GPU backend" in r.stderr


def test_dry_run_lists_cases():
    r = kvbench("run", "suites/smoke.yaml", "--dry-run")
    assert r.returncode == 0
    assert len([line for line in r.stdout.splitlines() if "tiny decode" in line]) == 8
    assert "8 cases" in r.stdout


def test_list_and_env():
    r = kvbench("list")
    assert r.returncode == 0 and "llama-3-8b" in r.stdout and "sdpa" in r.stdout
    r = kvbench("env")
    assert r.returncode == 0 and "peak_read_gbps" in r.stdout and "mlx_version" in r.stdout
    from kvbench import blas

    blas_line = next(line for line in r.stdout.splitlines() if line.startswith("blas "))
    assert blas_line.split(None, 1)[1] == blas.chosen()["blas"]
    gflops = next(line for line in r.stdout.splitlines() if line.startswith("blas_gflops "))
    assert float(gflops.split()[1]) > 0


def test_run_filtered_case_end_to_end(tmp_path):
    r = kvbench(
        "run",
        "suites/smoke.yaml",
        "--filter",
        "context_len=64",
        "--filter",
        "kernel=ops",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    (csv,) = [p for p in tmp_path.glob("*.csv") if not p.name.endswith(".samples.csv")]
    rows = pd.read_csv(csv)
    assert len(rows) == 2 and set(rows["status"]) == {"ok"}
    assert str(csv) in r.stdout and "median_ms" in r.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--model", "llama-3-8b", "--context", "1k", "--out", ""],
        ["import", "x.json", "--out", " "],
        ["merge", "results", "-o", ""],
        ["compare", "a.csv", "b.csv", "-o", ""],
    ],
)
def test_an_empty_output_path_is_refused_not_the_current_directory(argv, tmp_path, monkeypatch,
                                                                   capsys):  # fmt: skip
    """#44 item 9: `--out ''` wrote the run's files into the current directory."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ": empty: " in err
    assert list(tmp_path.iterdir()) == []
