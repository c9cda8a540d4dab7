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


# ---- 2: broken result files are refused (a named file) or skipped with a word (a directory) ----

READERS = {
    "compare": lambda d, out: ["compare", d, d],
    "history": lambda d, out: ["history", d],
    "report": lambda d, out: ["report", d, "-o", out / "r.html"],
    "merge": lambda d, out: ["merge", d, "-o", out / "merged"],
}


def _edit_cell(path: Path, col: str, value: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(",")
    cells = lines[1].rstrip("\n").split(",")
    cells[header.index(col)] = value
    lines[1] = ",".join(cells) + "\n"
    path.write_text("".join(lines))


BROKEN = {
    "negative median": (lambda p: _edit_cell(p, "median_ms", "-5"), "median_ms"),
    "inf median": (lambda p: _edit_cell(p, "median_ms", "inf"), "median_ms"),
    "1e308 median": (lambda p: _edit_cell(p, "median_ms", "1e308"), "median_ms"),
    "nan median": (lambda p: _edit_cell(p, "median_ms", "nan"), "median_ms"),
    "n_samples off": (lambda p: _edit_cell(p, "n_samples", "25"), "n_samples"),
    "last row cut": (lambda p: p.write_bytes(p.read_bytes()[:-40]), "last row"),
    "samples cut": (
        lambda p: (s := p.with_suffix(".samples.csv")).write_bytes(s.read_bytes()[:-3]),
        "last row",
    ),
}


@pytest.mark.parametrize("fault", BROKEN)
@pytest.mark.parametrize("reader", READERS)
def test_broken_result_files_are_refused(tmp_path, capsys, fault, reader):
    d = tmp_path / "d"
    d.mkdir()
    write_run(d, "r0", {"c0": draw(20, 2.0, seed=3)})
    run = write_run(d, "r1", {"c1": draw(20, 1.0, seed=1), "c2": draw(20, 1.5, seed=2)})
    damage, needle = BROKEN[fault]
    damage(run)
    one_line_error(capsys, READERS[reader](d, tmp_path), needle)  # the report reads samples too
    if reader in ("compare", "report"):  # a file named on its own
        one_line_error(capsys, READERS[reader](run, tmp_path), str(run)[: -len(".csv")], needle)


JUNK = {"0 bytes": b"", "binary": bytes(range(256)) * 4, "latin-1": b"caf\xe9,x\n1,2\n"}


@pytest.mark.parametrize("junk", JUNK)
@pytest.mark.parametrize("reader", READERS)
def test_junk_csv_in_a_results_directory_is_skipped_with_one_line(tmp_path, capsys, junk, reader):
    d = tmp_path / "d"
    d.mkdir()
    write_run(d, "r1", {"c1": draw(20, 1.0, seed=1)})
    (d / "junk.csv").write_bytes(JUNK[junk])
    assert main([str(a) for a in READERS[reader](d, tmp_path)]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "junk.csv" in line]
    assert (
        len(warned) == 1 and warned[0].startswith("kvbench: warning: ") and "skipped" in warned[0]
    )
    assert "Traceback" not in err


def test_a_saved_compare_table_beside_the_runs_is_skipped_without_a_word(tmp_path, capsys):
    write_run(tmp_path, "r1", {"c1": draw(20, 1.0, seed=1)})
    assert main(["compare", str(tmp_path), str(tmp_path), "--format", "csv"]) == 0
    (tmp_path / "cmp.csv").write_text(capsys.readouterr().out)
    assert main(["history", str(tmp_path)]) == 0
    assert "cmp.csv" not in capsys.readouterr().err


# ---- 4: runs that cannot finish are refused before they start -----------------------------------

NEVER_ENDS = {
    "rounds 1e9": ("{rounds: 1000000000}", "settings.rounds"),
    "min_samples 1e6": ("{min_samples: 1000000, max_samples: 1000000, budget_s: 0.01}",
                        "settings.m"),
    "warmup_s 1e9": ("{warmup_s: 1000000000}", "settings.warmup_s"),
    "max_samples 1e9": ("{max_samples: 1000000000, budget_s: 1000000000}", "settings."),
    "floor over max_hours": ("{warmup_s: 3600, rounds: 1000}", "settings: the run needs at least"),
    "a raised max_hours too": ("{max_hours: 100000}", "settings.max_hours"),
}  # fmt: skip


@pytest.mark.parametrize("name", NEVER_ENDS)
def test_settings_that_never_finish_are_refused_at_load(tmp_path, capsys, name):
    settings, key = NEVER_ENDS[name]
    path = tmp_path / "s.yaml"
    path.write_text(f"settings: {settings}\nfixed: {{model: tiny, context_len: 16}}\n")
    one_line_error(capsys, ["run", path, "--dry-run"], f"{path}: {key}")


def test_a_named_pipe_as_the_suite_is_refused_not_waited_on(tmp_path):
    import os
    import subprocess
    import sys

    fifo = tmp_path / "suite.yaml"
    os.mkfifo(fifo)
    cmd = [sys.executable, "-m", "kvbench", "run", str(fifo), "--dry-run"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"kvbench: {fifo}: ") and "named pipe" in done.stderr


def test_the_dry_run_gives_the_time_floor(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(
        "settings: {warmup_s: 0.5, budget_s: 2, rounds: 3}\n"
        "fixed: {model: tiny}\nsweep: {context_len: [16, 32]}\n"
    )
    assert main(["run", str(path), "--dry-run"]) == 0
    assert "at least 7.0 s in all" in capsys.readouterr().out  # 2 x (3 x 0.5 + 2)


def test_a_case_whose_steps_cannot_meet_its_budget_is_flagged():
    from kvbench.run.floor import check_floors
    from kvbench.suite.suite import Settings, resolve

    case = resolve("s.yaml", {"model": "llama-3-8b", "context_len": 8192, "kv_dtype": "fp16"})
    settings = Settings(min_samples=5, rounds=1, budget_s=0.5)
    # the cache: 2 (K, V) x 32 layers x 8 heads x 128 x 2 B x 8192 = 1,073,741,824 B; at 10 GB/s
    # a step reads it in >= 0.107 s; 5 samples + 2 warm-up calls >= 0.752 s > 0.5 s
    (line,) = check_floors([case], settings, 10.0, "s.yaml")
    assert "1.07 GB" in line and "at least 0.752 s" in line and "budget of 0.5 s" in line
    assert check_floors([case], settings, 1000.0, "s.yaml") == []  # 7 x 1.07 ms: in budget
    with pytest.raises(Exception, match="settings.max_hours: the run needs at least"):
        check_floors([case], Settings(min_samples=100_000, max_samples=100_000), 0.1, "s.yaml")


def test_an_interrupted_run_says_so_in_its_files_and_its_report(tmp_path):
    from kvbench.report.page import build
    from kvbench.run import runner, session
    from kvbench.store.writer import ResultsWriter
    from kvbench.suite.suite import Settings, resolve

    cases = [resolve("s.yaml", {"model": "tiny", "context_len": c}) for c in (16, 32, 64)]
    runs = {c.case_id: runner.CaseRun(c) for c in cases}
    first = runs[cases[0].case_id]
    first.samples, first.rounds_done = {"step": [1.0, 1.1, 0.9]}, 1
    first.sample_rows = [(cases[0].case_id, "step", 0, i, v) for i, v in enumerate([1.0, 1.1, 0.9])]
    writer = ResultsWriter.claim(tmp_path, "r1")
    common = {"run_id": "r1", "suite": "s", "timestamp": "2026-01-01T00:00:00+00:00"}
    session._keep_partial(runs, Settings(rounds=2), common, writer, "SIGINT")
    text = session.kept_text(writer, 2)
    want = "kept 1 partial rows (partial: 1 of 2 rounds); 2 cases not measured (skipped rows"
    assert text == f"{want} say so) in {writer.csv_path}"
    html = build([str(tmp_path)])
    assert "Interrupted run: 1 cases measured in only some of their rounds" in html
    assert "2 cases not measured at all" in html


# ---- 5: real-model inputs checked before the first case -----------------------------------------

MODEL_SUITE = "fixed: {{model: smollm2-135m, phase: quality, context_len: 16, chunks: 2{text}}}\n"
MODEL_SUITE += "sweep: {{kv_dtype: [fp16, int8]}}\n"


def test_an_empty_model_cache_is_one_refusal_before_any_case(tmp_path, capsys, monkeypatch):
    import subprocess

    from kvbench.kernels.model import fetch

    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "empty-cache"))
    offline = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution\n")
    monkeypatch.setattr(fetch.subprocess, "run", lambda cmd, **kw: offline)
    suite = tmp_path / "model.yaml"
    suite.write_text(MODEL_SUITE.format(text=""))
    out = tmp_path / "out"
    # used to be one error row per case (ModelFetchError ... run kvbench model fetch), exit 0
    one_line_error(
        capsys, ["run", suite, "--out", out], "model smollm2-135m", "kvbench model fetch"
    )
    assert not out.exists() or not list(out.iterdir())


TEXTS = {
    "empty": (lambda p: p.write_text("  \n"), "empty"),
    "binary": (lambda p: p.write_bytes(bytes(range(256)) * 8), "binary"),
    "latin-1": (lambda p: p.write_bytes(b"caf\xe9 " * 100), "not UTF-8"),
    "too short": (lambda p: p.write_text("a few words"), "needs context_len x chunks = 32"),
    "a directory": (lambda p: p.mkdir(), "a directory"),
}


@pytest.mark.parametrize("name", TEXTS)
def test_bad_texts_are_refused_at_validation_with_the_reason(tmp_path, capsys, name):
    make, reason = TEXTS[name]
    text = tmp_path / "text.txt"
    make(text)
    suite = tmp_path / "s.yaml"
    suite.write_text(MODEL_SUITE.format(text=f", text: {text}"))
    one_line_error(capsys, ["run", suite, "--dry-run"], f"{suite}: text: {text}", reason)


def test_dev_zero_as_the_text_is_a_device_not_no_such_file(tmp_path, capsys):
    suite = tmp_path / "s.yaml"
    suite.write_text(MODEL_SUITE.format(text=", text: /dev/zero"))
    one_line_error(capsys, ["run", suite, "--dry-run"], "text: /dev/zero: a device")


def test_a_text_long_enough_passes(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("word " * 8)  # 40 bytes: may hold 32 tokens
    suite = tmp_path / "s.yaml"
    suite.write_text(MODEL_SUITE.format(text=f", text: {text}"))
    assert main(["run", str(suite), "--dry-run"]) == 0


# ---- 7 (met on the way): refusals on one line, quiet on a closed pipe --------------------------


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["compare"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("kvbench compare: ") and "base, new" in err and "-h" in err


def test_a_broken_suite_through_gate_is_one_line(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nfixed: {model: tiny\n")
    one_line_error(capsys, ["gate", "HEAD", "--suite", path], f"{path}: line 3: invalid YAML")


def test_model_fetch_of_an_unknown_name_quotes_no_repr(capsys):
    line = one_line_error(capsys, ["model", "fetch", "HuggingFaceTB/SmolLM2-135M"])
    assert "unknown model 'HuggingFaceTB/SmolLM2-135M'; known: smollm2-135m" in line
    assert '"' not in line


@pytest.mark.parametrize(
    "text,needle",
    [
        ("# only comments\n", "fixed: the suite names no axes"),
        ("fixed: {model: tiny, context_lne: 16}\n", "did you mean 'context_len'?"),
    ],
)
def test_suite_messages_name_the_real_problem(tmp_path, capsys, text, needle):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    one_line_error(capsys, ["run", path, "--dry-run"], needle)


def test_a_number_written_1e_3_is_a_number(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("settings: {budget_s: 1e-3}\nfixed: {model: tiny, context_len: 16}\n")
    assert main(["run", str(path), "--dry-run"]) == 0
    assert "budget 0.001 s per case" in capsys.readouterr().out


def test_compare_into_a_closed_pipe_is_quiet(tmp_path):
    import subprocess
    import sys

    run = write_run(tmp_path, "r1", {f"c{i}": draw(20, 1.0, seed=i) for i in range(400)})
    cmd = f"'{sys.executable}' -m kvbench compare '{run}' '{run}' | head -1"
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert done.stdout.count("\n") == 1 and done.stderr == "", done.stderr


def test_import_never_overwrites_a_run(tmp_path, capsys):
    from test_fault_inputs import FIXTURE

    assert main(["import", str(FIXTURE), "--out", str(tmp_path)]) == 0
    assert len(list(tmp_path.glob("*.csv"))) == 2  # the run and its samples
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    one_line_error(capsys, ["import", FIXTURE, "--out", tmp_path], "exists and is not overwritten")
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_case_whose_first_steps_show_it_overruns_is_said_at_once(tmp_path):
    from kvbench.run import runner
    from kvbench.suite.suite import Settings, resolve

    case = resolve("s.yaml", {"model": "tiny", "context_len": 16})
    # 3.0 s a step x 5 samples = 15 s: over a 0.5 s budget (the 8K Llama case on a CPU)
    note = runner.overrun_note(case, Settings(min_samples=5, budget_s=0.5), 3000.0)
    assert "a step took 3 s" in note and "5 samples need about 15 s" in note
    assert runner.overrun_note(case, Settings(min_samples=5, budget_s=0.5), 50.0) is None
    said = []  # a real round: no step of this case is faster than 1 us, 50 of them > 1e-6 s
    settings = Settings(warmup_s=0, min_samples=50, max_samples=50, budget_s=1e-6, rounds=1)
    runner.measure_round(runner.CaseRun(case), settings, 0, say=said.append)
    assert len(said) == 1 and "over its budget of 1e-06 s" in said[0]
    runner.measure_round(runner.CaseRun(case), settings, 1, say=said.append)  # first round only
    assert len(said) == 1
