"""The gate behind `make compare`: what it runs and where (runs stubbed, git real)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fake_runs import draw, git, make_repo, write_run

from kvbench.analysis import gate as gate_mod
from kvbench.errors import UserError
from kvbench.store import git as store_git


@pytest.fixture
def repo(tmp_path, monkeypatch):
    shas = make_repo(tmp_path / "repo", 2)
    path = tmp_path / "repo"
    (path / "s.yaml").write_text("name: gs\n")
    # the suite file and results are not part of the measured code: ignored, as a user's
    # results/ is by the project's .gitignore (an untracked, non-ignored file makes a tree dirty)
    (path / ".git" / "info" / "exclude").write_text("s.yaml\nresults/\n")
    monkeypatch.chdir(path)
    calls = []

    def fake_run(cwd, suite, results, device):
        """Record where the suite ran; write a run stamped like that tree's HEAD."""
        sha = git(cwd, "rev-parse", "HEAD")
        dirty = store_git.is_dirty(cwd)  # as the run context stamps rows
        calls.append((cwd == path, sha, dirty))
        results.mkdir(exist_ok=True)
        i = len(calls)
        x = draw(20, 1.0, seed=i)
        return write_run(results, f"r{i}", {"c": x}, commit=sha[:12], dirty=dirty, suite="gs")

    monkeypatch.setattr(gate_mod, "run_in_tree", fake_run)
    return path, shas, calls


def test_runs_what_is_missing_then_reuses_it(repo):
    path, shas, calls = repo
    cmp = gate_mod.gate("HEAD~1", "s.yaml", "results")
    assert calls == [(True, shas[1], False), (False, shas[0], False)]  # here, then a worktree
    assert cmp.table.loc[0, "verdict"] in ("unchanged", "inconclusive")
    assert "kvbench-base" not in git(path, "worktree", "list")  # worktree removed
    gate_mod.gate("HEAD~1", "s.yaml", "results")
    assert len(calls) == 2  # both sides had clean results: nothing ran


def test_a_dirty_tree_is_always_measured_and_recorded_dirty(repo):
    path, shas, calls = repo
    gate_mod.gate("HEAD~1", "s.yaml", "results")
    (path / "f.txt").write_text("changed")
    cmp = gate_mod.gate("HEAD~1", "s.yaml", "results")
    assert calls[-1] == (True, shas[1], True)
    assert any("dirty" in w for w in cmp.warnings)


def test_an_untracked_file_is_dirty_for_the_gate_as_for_the_run_context(repo):
    # the run context stamps rows dirty when an untracked file exists; the gate must agree, or
    # it looks for a clean run of HEAD that can never exist
    path, shas, calls = repo
    (path / "new_kernel.py").write_text("x = 1\n")
    cmp = gate_mod.gate("HEAD~1", "s.yaml", "results")
    assert calls[0] == (True, shas[1], True)
    assert any("dirty" in w for w in cmp.warnings)
    assert store_git.info(path)["dirty"] is True


def test_unknown_base_is_a_user_error(repo):
    with pytest.raises(UserError, match="BASE=nope"):
        gate_mod.gate("nope", "s.yaml", "results")


def test_a_suite_without_a_name_is_gated_under_its_file_stem(repo, capsys):
    from kvbench.cli import main
    from kvbench.suite.suite import load_suite

    path, _, calls = repo
    (path / "gs.yaml").write_text("fixed: {model: tiny, context_len: 8}\n")  # no name: key
    assert gate_mod.suite_name(path / "gs.yaml") == load_suite(path / "gs.yaml").name == "gs"
    argv = ["gate", "HEAD~1", "--suite", "gs.yaml", "--results", "results", "--rounds", "1"]
    assert main(argv) in (0, 1)
    assert len(calls) == 2 and "cannot read" not in capsys.readouterr().err


def _sides(calls):
    return ["new" if here else "base" for here, _, _ in calls]


def test_round_order():
    assert gate_mod.round_order(1) == ["new", "base"]
    assert gate_mod.round_order(2) == ["new", "base", "base", "new"]
    assert gate_mod.round_order(3) == ["new", "base", "base", "new", "new", "base"]
    with pytest.raises(UserError, match="--rounds"):
        gate_mod.round_order(0)


def test_one_round_keeps_todays_order_and_reuse(repo):
    path, shas, calls = repo
    gate_mod.gate("HEAD~1", "s.yaml", "results", rounds=1)
    assert _sides(calls) == ["new", "base"]
    gate_mod.gate("HEAD~1", "s.yaml", "results", rounds=1)
    assert len(calls) == 2  # reused


def test_two_rounds_interleave_in_one_worktree_always_fresh_and_pool(repo, monkeypatch):
    path, shas, calls = repo
    gate_mod.gate("HEAD~1", "s.yaml", "results")  # results exist for both sides now
    trees = []
    real_worktree = gate_mod.worktree

    def counting_worktree(repo_path, sha):
        trees.append(sha)
        return real_worktree(repo_path, sha)

    monkeypatch.setattr(gate_mod, "worktree", counting_worktree)
    cwds = []
    real_run = gate_mod.run_in_tree

    def run(cwd, suite, results, device):
        cwds.append(cwd)
        return real_run(cwd, suite, results, device)

    monkeypatch.setattr(gate_mod, "run_in_tree", run)
    cmp = gate_mod.gate("HEAD~1", "s.yaml", "results", rounds=2)
    assert _sides(calls[2:]) == ["new", "base", "base", "new"]  # fresh despite results
    assert trees == [shas[0]] and cwds[1] == cwds[2] != path  # one BASE worktree, reused
    assert [sha for _, sha, _ in calls[2:]] == [shas[1], shas[0], shas[0], shas[1]]
    row = cmp.table.iloc[0]
    assert (row["base_n"], row["new_n"]) == (40, 40)  # 2 fresh runs of 20 a side, not 3
    assert "[pooled: 2 runs per case]" in cmp.base and "[pooled: 2 runs per case]" in cmp.new
    assert "kvbench-base" not in git(path, "worktree", "list")


def test_a_a_gate_keeps_the_sides_apart(repo):
    path, shas, calls = repo
    cmp = gate_mod.gate("HEAD", "s.yaml", "results", rounds=2)  # BASE = HEAD: same commit
    assert [sha for _, sha, _ in calls] == [shas[1]] * 4
    assert (cmp.table.loc[0, "base_n"], cmp.table.loc[0, "new_n"]) == (40, 40)


def test_paired_gate_refuses_a_commit_without_kvbench_code(repo):
    with pytest.raises(UserError, match="holds no kvbench code"):
        gate_mod.paired("HEAD~1", "s.yaml", "results")


def test_paired_gate_end_to_end_on_a_clone_of_this_repository(tmp_path, monkeypatch):
    """Two real workers (HEAD's code in a worktree and the clone's tree), one tiny case."""
    import pandas as pd

    from kvbench.analysis.paired import PAIR_COLUMNS, Budget

    root = Path(__file__).resolve().parents[1]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    suite = tmp_path / "one.yaml"
    suite.write_text(
        "name: one\nfixed: {model: tiny, context_len: 64, kv_dtype: fp32, kernel: ops}\n"
    )
    monkeypatch.chdir(clone)
    budget = Budget(warmup_s=0.02, budget_s=0.1, min_pairs=8, max_pairs=8, block=2)
    cmp = gate_mod.paired("HEAD", str(suite), str(tmp_path / "res"), budget=budget)
    row = cmp.table.iloc[0]
    assert row["base_n"] == row["new_n"] == 8 and "paired: 8 pairs" in row["note"]
    (pairs_file,) = (tmp_path / "res").glob("*.pairs.csv")
    pairs = pd.read_csv(pairs_file)
    assert tuple(pairs.columns) == PAIR_COLUMNS and len(pairs) == 8
    assert list(pairs["first"][:4]) == ["base", "new", "base", "new"]
    assert (pairs[["base_ms", "new_ms"]] > 0).all().all()


@pytest.mark.parametrize("budget", ["0", "-1", "nan", "1e9"])
def test_pair_budget_out_of_bounds_is_refused_before_anything_runs(budget, monkeypatch, capsys):
    """#44 item 9: a budget of 0 or less stopped at the first look (20 biased pairs) and called
    identical code 1.16x slower; now one line, exit 2, and the gate never starts."""
    import kvbench.analysis.gate as g
    from kvbench.cli import main

    def ran(*a, **k):
        raise AssertionError("the paired gate ran")

    monkeypatch.setattr(g, "paired", ran)
    assert main(["gate", "HEAD", "--pair-budget-s", budget]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvbench: --pair-budget-s: ") and err.count("\n") == 1
