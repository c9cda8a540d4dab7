"""The regression gate behind `make compare BASE=<ref>`: measure what is missing, then compare.

1. The current tree: if it is clean and the results directory already holds a clean run of
   this suite at HEAD, that run is used; otherwise the suite runs now (a dirty tree is run
   every time: its code is not HEAD's, and its rows are recorded with dirty=True).
2. BASE: if the results directory has no clean run of this suite at BASE's commit, BASE is
   checked out in a temporary `git worktree` and the same suite file runs there with the same
   Python (BASE's own harness and kernels measure it; its rows carry BASE's commit), writing
   into the same results directory. The worktree is removed afterwards.
3. compare BASE -> NEW restricted to this suite's rows.
With rounds > 1 (`--rounds N`, `make compare ROUNDS=N`; plain `make compare` runs the paired
gate, `paired` below) nothing is reused: BASE's worktree is
created once and the suite runs N times on each side, interleaved in ABBA order (NEW, BASE,
BASE, NEW, NEW, BASE, ...; see `round_order`), and each side is compared with the raw samples
of its N fresh runs pooled (harness/store/results.py load_runs). Drift of the machine between runs
then hits both sides alike instead of looking like a difference of code (docs/compare.md).
Each side runs in a subprocess with the kvbench code of its own tree (`tree_command`), so this
module imports no mlx, and an installed kvbench never stands in for BASE's code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from kvbench import blas
from kvbench.analysis.compare import Comparison, compare, comparison_table
from kvbench.analysis.paired import PAIR_COLUMNS, Budget, run_pairs, table_row
from kvbench.analysis.rules import Rules, check_rules
from kvbench.errors import UserError
from kvbench.files import not_regular, read_text
from kvbench.store import git
from kvbench.store.results import (
    MEASURED,
    ResultSet,
    is_dirty,
    load,
    load_dir,
    load_runs,
)
from kvbench.store.writer import write_csv_atomic

# Runs the kvbench of the tree named by argv[1]: its harness/ as `kvbench` and its kernels/ as
# `kvbench.kernels`, registered before anything imports them, so an installed (or editable)
# kvbench of another checkout is never used; then `python -m kvbench` with the rest of argv.
BOOTSTRAP = """
import importlib.util, runpy, sys
root = sys.argv.pop(1)
for name, folder in (("kvbench", "harness"), ("kvbench.kernels", "kernels")):
    spec = importlib.util.spec_from_file_location(
        name, f"{root}/{folder}/__init__.py", submodule_search_locations=[f"{root}/{folder}"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
sys.modules["kvbench"].kernels = sys.modules["kvbench.kernels"]
runpy.run_module("kvbench", run_name="__main__", alter_sys=True)
"""


def tree_command(tree: Path) -> list[str]:
    """The command line that runs the kvbench CLI of `tree`: trees from before kvbench was
    installed under its own name (a top-level harness/cli.py importing `harness.*`) run as
    `python -m harness` from the tree; newer ones through BOOTSTRAP."""
    if not (tree / "harness").is_dir():  # not a kvbench checkout: the installed kvbench
        return [sys.executable, "-m", "kvbench"]
    if not any((tree / "harness" / r).is_dir() for r in ("suite", "spec")):  # spec/: renamed
        return [sys.executable, "-m", "harness"]
    return [sys.executable, "-c", BOOTSTRAP, str(tree)]


def suite_name(path: Path) -> str:
    """The suite's name as load_suite gives it (the file stem without a name: key), read
    without load_suite, which imports mlx; the run itself validates the suite."""
    if (why := not_regular(path)) is not None:  # a named pipe would block for ever
        raise UserError(
            f"{path}: {why if why.startswith('cannot') else why + ', not a suite file'}"
        )
    text = read_text(path)  # capped, strict UTF-8 (harness/files.py)
    try:
        raw = yaml.safe_load(text) or {}
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to be a suite") from None
    except yaml.YAMLError as e:  # one line, as load_suite says it
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "-"
        raise UserError(f"{path}: {where}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: (top level): must be a mapping, got {type(raw).__name__}")
    return str(raw.get("name", path.stem))


def has_clean_run(results: Path, sha: str, suite: str) -> bool:
    if not results.is_dir() or not any(results.glob("*.csv")):
        return False
    rows = load_dir(results).rows
    hit = rows[
        (rows["commit"] == sha[:12])
        & (rows["suite"] == suite)
        & rows["status"].isin(MEASURED)
        & ~is_dirty(rows)
    ]
    return not hit.empty


def run_in_tree(cwd: Path, suite: Path, results: Path, device: str | None) -> Path:
    """Run `suite` with the harness found in `cwd`; returns the new results CSV."""
    before = set(results.glob("*.csv")) if results.is_dir() else set()
    cmd = [*tree_command(cwd), "run", str(suite), "--out", str(results)]
    cmd += ["--device", device] if device else []
    print(f"kvbench gate: running {suite.name} in {cwd}", file=sys.stderr)
    if subprocess.run(
        cmd, cwd=cwd, stdout=sys.stderr, env=blas.child_env(ld_preload=True)
    ).returncode:
        raise UserError(f"{suite}: the run in {cwd} failed (see above)")
    new = set(results.glob("*.csv")) - before
    new = [p for p in new if not p.name.endswith((".samples.csv", ".tokens.csv"))]
    if len(new) != 1:
        raise UserError(f"{results}: expected one new results file, found {len(new)}")
    return new[0]


@contextmanager
def worktree(repo: Path, sha: str) -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="kvbench-base-"))
    try:
        with git.worktree(repo, sha, tmp / "tree") as tree:
            yield tree
    finally:
        tmp.rmdir()


def only_suite(rs: ResultSet, suite: str) -> ResultSet:
    rows = rs.rows[rs.rows["suite"] == suite]
    if rows.empty:
        raise UserError(f"{rs.source}: no rows of suite {suite}")
    return ResultSet(rs.source, rows, rs.samples, rs.prefer_clean, rs.pool)


def round_order(rounds: int) -> list[str]:
    """Which side runs when: ABBA blocks, NEW BASE BASE NEW NEW BASE ... (2 * rounds runs).
    For even rounds every side's mean run position is the same, so a drift linear in time
    adds the same to both pooled sides; plain alternation (NEW BASE NEW BASE) would leave
    BASE one run later on average."""
    if rounds < 1:
        raise UserError(f"--rounds: {rounds}: must be at least 1")
    return [s for i in range(rounds) for s in (("new", "base") if i % 2 == 0 else ("base", "new"))]


def interleaved(
    repo: Path, base_sha: str, suite: Path, results: Path, device: str | None, rounds: int
) -> tuple[list[Path], list[Path]]:
    """Run the suite 2 * rounds times in round_order: here for NEW, in one BASE worktree
    (created once, removed at the end) for BASE. Returns (base runs, new runs)."""
    runs: dict[str, list[Path]] = {"base": [], "new": []}
    order = round_order(rounds)
    with worktree(repo, base_sha) as tree:
        for i, side in enumerate(order, 1):
            print(f"kvbench gate: round {i}/{len(order)}: {side}", file=sys.stderr)
            runs[side].append(run_in_tree(repo if side == "new" else tree, suite, results, device))
    return runs["base"], runs["new"]


def gate(
    base: str,
    suite: str,
    results: str,
    metric: str = "median_ms",
    rules: Rules | None = None,
    device: str | None = None,
    rounds: int = 1,
) -> Comparison:
    repo = Path(git.must(Path.cwd(), "rev-parse", "--show-toplevel"))
    suite_path, results_dir = Path(suite).resolve(), Path(results).resolve()
    name = suite_name(suite_path)
    base_sha = git.resolve_ref(base, repo)
    if base_sha is None:
        raise UserError(f"BASE={base}: not a git ref in {repo}")
    head_sha = git.must(repo, "rev-parse", "HEAD")
    dirty = bool(git.is_dirty(repo))  # the run context's meaning: untracked files count
    round_order(rounds)  # validates rounds and the rules before anything runs
    rules = rules or Rules()
    check_rules(metric, rules)
    if rounds > 1:
        base_runs, new_runs = interleaved(repo, base_sha, suite_path, results_dir, device, rounds)
        old = load_runs(base_runs, f"{base} ({base_sha[:12]})")
        new = load_runs(new_runs, f"HEAD ({head_sha[:12]}{'+' if dirty else ''})")
        return compare(only_suite(old, name), only_suite(new, name), metric, rules)
    if dirty or not has_clean_run(results_dir, head_sha, name):
        new_spec = str(run_in_tree(repo, suite_path, results_dir, device))
    else:
        new_spec = head_sha
    if not has_clean_run(results_dir, base_sha, name):
        with worktree(repo, base_sha) as tree:
            run_in_tree(tree, suite_path, results_dir, device)
    old = load(base_sha, results_dir, repo)
    new = load(new_spec, results_dir, repo)
    return compare(only_suite(old, name), only_suite(new, name), metric, rules)


def paired(
    base: str,
    suite: str,
    results: str,
    rules: Rules | None = None,
    device: str | None = None,
    budget: Budget | None = None,
) -> Comparison:
    """The paired gate (harness/analysis/paired.py): BASE in a worktree and NEW here, each in
    one long-lived worker, sampled in ABBA pairs per case; the pairs file lands in `results`."""
    rules, budget = rules or Rules(), budget or Budget()
    check_rules("median_ms", rules)
    repo = Path(git.must(Path.cwd(), "rev-parse", "--show-toplevel"))
    suite_path, results_dir = Path(suite).resolve(), Path(results).resolve()
    suite_name(suite_path)  # a suite that cannot be read fails here, in one line
    base_sha = git.resolve_ref(base, repo)
    if base_sha is None:
        raise UserError(f"BASE={base}: not a git ref in {repo}")
    head_sha, dirty = git.must(repo, "rev-parse", "HEAD"), bool(git.is_dirty(repo))
    say = lambda text: print(text, file=sys.stderr)  # noqa: E731
    with worktree(repo, base_sha) as tree:
        trees = {"base": tree, "new": repo}
        labels, pairs, status = run_pairs(trees, suite_path, device, budget, rules, say)
    by_case: dict[str, list] = {cid: [] for cid in labels}
    for p in pairs:
        by_case[p[0]].append(p)
    rows = [table_row(c, labels[c], *status[c], by_case[c], rules) for c in labels]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = f"{stamp}-gate-{base_sha[:12]}-{head_sha[:12]}-{os.getpid()}.pairs.csv"
    write_csv_atomic(results_dir / name, PAIR_COLUMNS, pairs)
    say(f"kvbench gate: pairs: {results_dir / name}")
    warnings = ["new is a dirty tree (uncommitted changes)"] if dirty else []
    return Comparison(
        f"{base} ({base_sha[:12]})",
        f"HEAD ({head_sha[:12]}{'+' if dirty else ''}) [paired]",
        "median_ms",
        rules,
        comparison_table(rows),
        warnings,
    )
