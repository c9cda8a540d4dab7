"""Issue 14, faults: the CLI as a subprocess under signals at several moments, a full and a
read-only output directory, concurrent writers into one directory; plus the memory guard and a
repository owned by another user. Each asserts the exit code, a one-line message, no traceback,
and that every row on disk has its raw samples (docs/reliability.md).

The runs start together (module fixture) so the whole module costs about one run's wall time.
A full or read-only disk needs a small tmpfs (`mount`, root only); elsewhere those tests skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = """name: faults
settings: {warmup_s: 0.3, min_samples: 3, max_samples: 20, budget_s: 0.15, rounds: 3}
fixed: {model: tiny}
sweep: {context_len: [16, 32], kernel: [sdpa, ops]}
"""


class Run:
    """`kvbench run` in a subprocess; its stderr lines collected as they come."""

    def __init__(self, suite: Path, out: Path):
        cmd = [sys.executable, "-m", "kvbench", "run", str(suite), "--out", str(out)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        self.t0 = time.monotonic()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for raw in self.proc.stderr:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def wait_for(self, text: str, timeout_s: float = 400) -> None:
        end = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, f"exited before {text!r}: {self.lines}"
            assert time.monotonic() < end, f"no {text!r} in {timeout_s} s: {self.lines}"
            time.sleep(0.01)

    def at(self, text: str, *actions) -> threading.Thread:
        """Once `text` is on stderr, call each action in turn (a watcher of its own, so every
        run gets its fault at its moment, whatever the others are doing)."""

        def watch() -> None:
            self.wait_for(text)
            for action in actions:
                action()

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        return t

    def send(self, sig: int, after_s: float = 0.0):
        return lambda: (time.sleep(after_s), self.proc.send_signal(sig))

    def finish(self, timeout_s: float = 400) -> tuple[int, str]:
        rc = self.proc.wait(timeout_s)
        self.reader.join(5)
        return rc, "\n".join(self.lines)


def whole(out: Path) -> pd.DataFrame:
    """Every run's rows in `out`, after checking each measured row has exactly its samples."""
    frames = []
    for csv in sorted(p for p in out.glob("*.csv") if not p.name.endswith(".samples.csv")):
        rows = pd.read_csv(csv, dtype={"case_id": str, "run_id": str})
        samples = pd.read_csv(csv.with_name(csv.stem + ".samples.csv"), dtype={"case_id": str})
        steps = samples[samples["stage"] == "step"].groupby("case_id").size()
        for row in rows[rows["status"].isin(["ok", "partial"])].itertuples():
            assert steps.get(row.case_id, 0) == row.n_samples, (csv.name, row.case_id)
        assert set(rows["run_id"]) <= {csv.stem}
        frames.append(rows)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["status"])


def last_line(text: str) -> str:
    assert "Traceback" not in text, text
    return [line for line in text.splitlines() if line.strip()][-1]


@pytest.fixture(scope="module")
def tmpfs(tmp_path_factory):
    """mount(size) -> a fresh tmpfs of that size, unmounted afterwards; skip where not root."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a small tmpfs needs root (mount -t tmpfs)")
    mounted = []

    def mount(size: str, *opts: str) -> Path:
        where = tmp_path_factory.mktemp("tmpfs")
        cmd = ["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *opts]), "tmpfs", where]
        if subprocess.run(cmd, capture_output=True).returncode:
            pytest.skip("mount -t tmpfs is not permitted here")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def loading_mlx(pid: int) -> bool:
    """The process has started loading MLX's library (the slow imports of `kvbench run`)."""
    try:
        return "mlx" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tmpfs):
    """The runs, started together; each fault is sent when its run reaches the moment named."""
    d = tmp_path_factory.mktemp("faults")
    suite = d / "suite.yaml"
    suite.write_text(SUITE)
    full = tmpfs("64k")
    started = {
        "term": Run(suite, d / "shared"),  # SIGTERM after round 1
        "hup": Run(suite, d / "shared"),  # same directory, same second: SIGHUP in round 3
        "int2": Run(suite, d / "int2"),  # two SIGINTs 10 ms apart after round 1
        "early": Run(suite, d / "early"),  # SIGINT while MLX is being imported
        "full": Run(suite, full),  # the disk fills up after the run started
    }

    def fill() -> None:
        with open(full / "filler", "wb", buffering=0) as f:  # every byte left
            try:
                while True:
                    f.write(b"\0" * 1024)
            except OSError:
                pass

    watchers = [
        started["full"].at("[1/12]", fill),  # rows come in round 3: the disk is full by then
        started["term"].at("round 2/3", started["term"].send(signal.SIGTERM)),
        started["int2"].at(
            "round 2/3",
            started["int2"].send(signal.SIGINT),
            started["int2"].send(signal.SIGINT, after_s=0.01),
        ),
        started["hup"].at("[11/12]", started["hup"].send(signal.SIGHUP)),  # 2 cases complete
    ]
    early = started["early"].proc
    while not loading_mlx(early.pid) and early.poll() is None:
        time.sleep(0.002)
    early.send_signal(signal.SIGINT)
    for w in watchers:
        w.join(400)
    done = {name: r.finish() for name, r in started.items()}
    return d, full, done


def test_sigterm_keeps_completed_rounds_as_partial_rows(runs):
    d, _, done = runs
    rc, err = done["term"]
    assert rc == 128 + signal.SIGTERM and "interrupted (SIGTERM)" in last_line(err), err
    assert "kept 4 partial rows (partial: 1 of 3 rounds) in " in last_line(err), err
    rows = whole(d / "shared")
    term = rows[rows.groupby("run_id")["status"].transform(lambda s: "ok" not in set(s))]
    assert len(term) == 4 and set(term["status"]) == {"partial"}
    assert term["error"].str.contains("of 3 rounds").all()


def test_sighup_keeps_complete_rows_and_partial_ones(runs):
    d, _, done = runs
    rc, err = done["hup"]
    assert rc == 128 + signal.SIGHUP and "interrupted (SIGHUP)" in last_line(err), err
    assert "kept 2 ok, 2 partial rows (partial: 2 of 3 rounds) in " in last_line(err), err
    rows = whole(d / "shared")
    hup = rows[rows.groupby("run_id")["status"].transform(lambda s: "ok" in set(s))]
    assert hup["status"].value_counts().to_dict() == {"ok": 2, "partial": 2}


def test_concurrent_runs_into_one_directory_keep_their_own_rows(runs):
    d, _, _ = runs
    rows = whole(d / "shared")
    assert rows["run_id"].nunique() == 2 and len(rows) == 8  # nothing lost, nothing merged
    assert (rows.groupby("run_id").size() == 4).all()


def test_a_double_ctrl_c_keeps_every_finished_round(runs):
    d, _, done = runs
    rc, err = done["int2"]
    # issue 27: the second signal, 10 ms after the first, used to cut the writing of the
    # partial rows short and leave the directory empty; it now waits for them (a third would not)
    rows = whole(d / "int2")  # every row written has its samples
    assert len(rows) == 4 and set(rows["status"]) == {"partial"}, err
    assert rows["error"].str.contains("after 1 of 3 rounds").all()
    line = last_line(err)
    assert "interrupted (SIGINT): kept 4 partial rows (partial: 1 of 3 rounds)" in line, err
    assert rc == 130, err


def test_ctrl_c_during_start_up_is_a_clean_exit(runs):
    d, _, done = runs
    rc, err = done["early"]
    assert rc == 130 and "interrupted (SIGINT)" in last_line(err), err
    # stopped before any row: nothing left behind (the claimed files of a run with no row go)
    assert not (d / "early").exists() or not any((d / "early").iterdir())


def test_a_disk_filling_mid_run_is_a_one_line_error_and_the_files_stay_whole(runs):
    _, full, done = runs
    rc, err = done["full"]
    line = last_line(err)
    assert rc == 2 and line.startswith("kvbench: ") and "No space left" in line, err
    (full / "filler").unlink()
    whole(full)  # readable, and no row without its samples


def test_too_small_and_read_only_outputs_are_refused_before_measuring(tmp_path, tmpfs):
    tiny_disk, ro = tmpfs("64k"), tmpfs("64k", "ro")
    suite = tmp_path / "mid.yaml"
    suite.write_text(SUITE.replace("max_samples: 20", "max_samples: 5000"))
    for out, reason in ((tiny_disk, "bytes free"), (ro, "not writable"), (ro / "x", "Read-only")):
        t0 = time.monotonic()
        rc, err = Run(suite, out).finish()
        assert rc == 2 and reason in last_line(err) and str(out) in last_line(err), err
        assert not any(tiny_disk.iterdir())
        assert time.monotonic() - t0 < 300  # refused up front, nothing measured


def test_compare_of_a_malformed_samples_file_as_a_subprocess(tmp_path):
    from fake_runs import draw, write_run

    write_run(tmp_path, "run", {"c1": draw(8)})
    (tmp_path / "run.samples.csv").write_text("a,b\n1,2\n")
    cmd = [sys.executable, "-m", "kvbench", "compare", str(tmp_path), str(tmp_path)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "run.samples.csv" in last_line(out.stderr)


# ---- the memory guard ---------------------------------------------------------------------------


def test_a_case_too_big_for_memory_is_a_skipped_row_with_the_figures(tmp_path, write_suite, quiet):
    from kvbench.run import memory
    from kvbench.run.session import run_suite
    from kvbench.suite.suite import expand, load_suite

    text = SUITE.replace(
        "context_len: [16, 32], kernel: [sdpa, ops]", "context_len: [16, 100000000]"
    )
    suite = load_suite(write_suite(text.replace("rounds: 3", "rounds: 2")))
    writer = run_suite(suite, expand(suite), tmp_path / "out", quiet)
    rows = pd.read_csv(writer.csv_path).set_index("context_len")
    assert rows.loc[16, "status"] == "ok"
    assert rows.loc[100000000, "status"] == "skipped"
    plan = memory.case_plan(expand(suite)[1])
    # tiny: 2 layers x K,V x 2 kv heads x 1e8 positions x 64 x 2 B (fp16)
    assert plan["cache"] == 2 * 2 * 2 * 10**8 * 64 * 2
    assert f"{plan['total']:,} B" in rows.loc[100000000, "error"]


def test_planned_bytes_against_a_hand_count():
    from kvbench.kernels.formats.registry import get_format
    from kvbench.kernels.stores.footprint import LayoutArgs
    from kvbench.run import memory
    from kvbench.suite import resolved

    # fp16, 1 seq, 2 kv heads, 8 q heads, ctx 16, D 64, 2 layers, decode
    layer = 1 * 2 * 16 * 64
    fp16 = get_format("fp16")
    dims = {"n_seqs": 1, "context_len": 16, "n_layers": 2, "n_q_heads": 8, "n_kv_heads": 2}
    res = resolved.of_shape(fp16, fp16, "per-stream", LayoutArgs(), head_dim=64, **dims)
    plan = res.planned
    assert plan == {
        "cache": 16384,
        "source": 2 * layer * 6,
        "transient": 2 * 8192 * 4 + 2 * 128 * 4,
        "total": 16384 + 2 * layer * 6 + 2 * 8192 * 4 + 2 * 128 * 4,
    }
    assert memory.refusal_for_plan(plan, (plan["total"] - 1, "test")) is not None
    assert memory.refusal_for_plan(plan, (plan["total"], "test")) is None


def test_meminfo_is_read(tmp_path):
    from kvbench.run import memory

    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemAvailable:   2048 kB\n")
    assert memory.meminfo_available(tmp_path / "meminfo")[0] == 2048 * 1024
    assert memory.meminfo_available(tmp_path / "nope") is None


# ---- git refusing a repository owned by another user ---------------------------------------------


def test_a_checkout_owned_by_another_user_still_gives_its_commit(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    from kvbench.store import git

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["chown", "-R", "nobody", str(clone)], check=True)
    plain = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True)
    if plain.returncode == 0:
        pytest.skip("this git does not check ownership")
    assert b"dubious ownership" in plain.stderr  # the fault is real here
    sha = git.resolve_ref("HEAD", clone)
    assert sha and git.info(clone)["commit"] == sha[:12]


def test_plan_prints_the_numbers_the_guard_checks(capsys):
    import json

    from kvbench.case import Case
    from kvbench.cli import main
    from kvbench.run import memory

    assert main(["plan", "--model", "tiny", "--context", "100000000", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    case = Case(model="tiny", n_layers=2, n_q_heads=8, n_kv_heads=2, head_dim=64,
                context_len=100_000_000)  # fmt: skip
    assert plan["run_bytes"] == memory.case_plan(case)
    assert plan["run_bytes"]["cache"] == plan["model_bytes"]["total"]


def test_import_and_report_on_read_only_and_full_disks(tmp_path, tmpfs, capsys):
    from fake_runs import draw, write_run

    from kvbench.cli import main

    ro, full = tmpfs("64k", "ro"), tmpfs("64k")
    fixture = ROOT / "tests" / "data" / "pytest-benchmark.json"
    write_run(tmp_path, "run", {"c1": draw(8)})
    with open(full / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 1024)
        except OSError:
            pass
    for argv, where in (
        (["import", fixture, "--out", ro], ro),
        (["report", tmp_path, "-o", ro / "r.html"], ro),
        (["report", tmp_path, "-o", full / "r.html"], full),
        (["compare", tmp_path, tmp_path, "-o", full / "c.txt"], full),
    ):
        assert main([str(a) for a in argv]) == 2
        line = last_line(capsys.readouterr().err)
        assert line.startswith(f"kvbench: {where}") and "Traceback" not in line, line
        assert sorted(p.name for p in where.iterdir()) == ([] if where == ro else ["filler"])


LATE_SIGNAL = """
import atexit, os, signal, time
from kvbench.run import interrupt
# registered first, so it runs last: what a signal landing after the interpreter's own
# finalization (which puts Python-level handlers back to the default) would meet
ignored = lambda: [signal.getsignal(s) is signal.SIG_IGN for s in interrupt.SIGNALS]
atexit.register(lambda: print("at exit", *ignored()))
try:
    with interrupt.handling():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises here
except interrupt.Interrupted:
    pass
os.kill(os.getpid(), signal.SIGINT)  # the second: counted, nothing raised
time.sleep(0.05)
print("counted", interrupt.received())
try:
    os.kill(os.getpid(), signal.SIGINT)  # the third stops at once
    time.sleep(5)
except interrupt.Interrupted:
    print("third stops")
"""


def test_a_signal_after_an_interrupted_run_is_only_counted():
    # the double Ctrl-C's second signal can land after the run's handling() block, while the CLI
    # reports what it kept: there the restored default handler used to kill the process by
    # SIGINT (exit -2, not 130); it is counted now, and only a third stops at once. One landing
    # while the interpreter shuts down (~0.1 s after the first, here) met the default handler
    # CPython's finalization restores, until the process ignored its signals at exit (CI failed so)
    res = subprocess.run([sys.executable, "-c", LATE_SIGNAL], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    from kvbench.run.interrupt import SIGNALS

    ignored = ["True"] * len(SIGNALS)
    said = res.stdout.split()
    assert said == ["counted", "2", "third", "stops", "at", "exit", *ignored], res.stdout
