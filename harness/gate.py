"""The regression gate behind `make compare BASE=<ref>`: measure what is missing, then compare.

1. The current tree: if it is clean and the results directory already holds a clean run of
   this suite at HEAD, that run is used; otherwise the suite runs now (a dirty tree is run
   every time: its code is not HEAD's, and its rows are recorded with dirty=True).
2. BASE: if the results directory has no clean run of this suite at BASE's commit, BASE is
   checked out in a temporary `git worktree` and the same suite file runs there with the same
   Python (BASE's own harness and kernels measure it; its rows carry BASE's commit), writing
   into the same results directory. The worktree is removed afterwards.
3. compare BASE -> NEW restricted to this suite's rows.
Runs go through `python -m harness run` in a subprocess, so this module imports no mlx.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from harness.compare import Comparison, Rules, compare
from harness.errors import UserError
from harness.results import MEASURED, ResultSet, load, load_dir, resolve_ref


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if out.returncode:
        raise UserError(f"git {' '.join(args)}: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout.strip()


def suite_name(path: Path) -> str:
    """The suite's name as load_suite gives it (the file stem without a name: key), read
    without load_suite, which imports mlx; the run itself validates the suite."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"{path}: name: cannot read the suite's name ({e})") from None
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
        & ~rows["dirty"].astype(str).eq("True")
    ]
    return not hit.empty


def run_suite(cwd: Path, suite: Path, results: Path, device: str | None) -> Path:
    """Run `suite` with the harness found in `cwd`; returns the new results CSV."""
    before = set(results.glob("*.csv")) if results.is_dir() else set()
    cmd = [sys.executable, "-m", "harness", "run", str(suite), "--out", str(results)]
    cmd += ["--device", device] if device else []
    print(f"kvbench gate: running {suite.name} in {cwd}", file=sys.stderr)
    if subprocess.run(cmd, cwd=cwd, stdout=sys.stderr).returncode:
        raise UserError(f"{suite}: the run in {cwd} failed (see above)")
    new = set(results.glob("*.csv")) - before
    new = [p for p in new if not p.name.endswith(".samples.csv")]
    if len(new) != 1:
        raise UserError(f"{results}: expected one new results file, found {len(new)}")
    return new[0]


@contextmanager
def worktree(repo: Path, sha: str) -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="kvbench-base-")) / "tree"
    _git(repo, "worktree", "add", "--detach", str(tmp), sha)
    try:
        yield tmp
    finally:
        _git(repo, "worktree", "remove", "--force", str(tmp))
        tmp.parent.rmdir()


def only_suite(rs: ResultSet, suite: str) -> ResultSet:
    rows = rs.rows[rs.rows["suite"] == suite]
    if rows.empty:
        raise UserError(f"{rs.source}: no rows of suite {suite}")
    return ResultSet(rs.source, rows, rs.samples, rs.prefer_clean)


def gate(
    base: str,
    suite: str,
    results: str,
    metric: str = "median_ms",
    rules: Rules | None = None,
    device: str | None = None,
) -> Comparison:
    repo = Path(_git(Path.cwd(), "rev-parse", "--show-toplevel"))
    suite_path, results_dir = Path(suite).resolve(), Path(results).resolve()
    name = suite_name(suite_path)
    base_sha = resolve_ref(base, repo)
    if base_sha is None:
        raise UserError(f"BASE={base}: not a git ref in {repo}")
    head_sha = _git(repo, "rev-parse", "HEAD")
    dirty = bool(_git(repo, "status", "--porcelain", "--untracked-files=no"))
    if dirty or not has_clean_run(results_dir, head_sha, name):
        new_spec = str(run_suite(repo, suite_path, results_dir, device))
    else:
        new_spec = head_sha
    if not has_clean_run(results_dir, base_sha, name):
        with worktree(repo, base_sha) as tree:
            run_suite(tree, suite_path, results_dir, device)
    old = load(base_sha, results_dir, repo)
    new = load(new_spec, results_dir, repo)
    return compare(only_suite(old, name), only_suite(new, name), metric, rules or Rules())
