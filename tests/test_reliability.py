"""Issue 27, reliability: never destroy what was written, never believe a broken file, never
start what cannot finish. One test per class of failure the probe found, each failing before
its fix; the CLI's `main` runs in this process (an uncaught exception fails the test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_runs import draw, write_run
from test_fault_inputs import one_line_error

from kvbench.cli import main

# ---- 1: outputs never overwrite inputs or results ---------------------------------------------


def _two_runs(tmp_path) -> tuple[Path, Path]:
    base = write_run(tmp_path, "r1", {"c1": draw(20, 1.0, seed=1)})
    new = write_run(tmp_path, "r2", {"c1": draw(20, 1.0, seed=2)})
    return base, new


def _outputs(tmp_path, base, new, other):
    d = str(tmp_path)
    return {
        "compare -o BASE": ["compare", base, new, "-o", base],
        "compare -o NEW": ["compare", base, new, "-o", new],
        "compare -o NEW's samples": ["compare", base, new, "-o", new.with_suffix(".samples.csv")],
        "compare -o another results CSV": ["compare", base, new, "-o", other],
        "compare DIR -o a run in DIR": ["compare", d, d, "-o", base, "--format", "csv"],
        "history -o a samples file": ["history", d, "-o", tmp_path / "r1.samples.csv"],
        "history -o a run CSV": ["history", d, "-o", base, "--format", "csv"],
    }


CASES = list(_outputs(Path("x"), Path("a"), Path("b"), Path("c")))


@pytest.mark.parametrize("case", CASES)
def test_outputs_never_overwrite_inputs_or_results(tmp_path, capsys, case):
    base, new = _two_runs(tmp_path / "runs")
    other = write_run(tmp_path / "elsewhere", "r9", {"c9": draw(20, 1.0, seed=9)})
    argv = _outputs(tmp_path / "runs", base, new, other)[case]
    before = {p: p.read_bytes() for p in [*tmp_path.rglob("*.csv")]}
    target = Path(argv[argv.index("-o") + 1])
    one_line_error(capsys, argv, str(target), "-o")
    assert {p: p.read_bytes() for p in [*tmp_path.rglob("*.csv")]} == before


def test_a_compare_table_may_still_be_saved_beside_the_runs(tmp_path, capsys):
    base, new = _two_runs(tmp_path)
    assert main([str(a) for a in ("compare", base, new, "-o", tmp_path / "cmp.txt")]) == 0
    assert (tmp_path / "cmp.txt").read_text() == capsys.readouterr().out
    assert main(["history", str(tmp_path), "-o", str(tmp_path / "cmp.txt")]) == 0  # its own file


def test_merge_never_overwrites_a_run_already_in_its_output(tmp_path, capsys):
    write_run(tmp_path / "a", "r1", {"c1": draw(20, 1.0, seed=1)})
    theirs = write_run(tmp_path / "b", "r1", {"c2": draw(20, 2.0, seed=2)})
    before = theirs.read_bytes()
    one_line_error(capsys, ["merge", tmp_path / "a", "-o", tmp_path / "b"], str(theirs), "-o")
    assert theirs.read_bytes() == before
