"""The gate behind `make compare`: what it runs and where (runs stubbed, git real)."""

from __future__ import annotations

import pytest
from fake_runs import draw, git, make_repo, write_run

from harness import gate as gate_mod
from harness.errors import UserError


@pytest.fixture
def repo(tmp_path, monkeypatch):
    shas = make_repo(tmp_path / "repo", 2)
    path = tmp_path / "repo"
    (path / "s.yaml").write_text("name: gs\n")
    monkeypatch.chdir(path)
    calls = []

    def fake_run(cwd, suite, results, device):
        """Record where the suite ran; write a run stamped like that tree's HEAD."""
        sha = git(cwd, "rev-parse", "HEAD")
        dirty = bool(git(cwd, "status", "--porcelain", "--untracked-files=no"))
        calls.append((cwd == path, sha, dirty))
        results.mkdir(exist_ok=True)
        i = len(calls)
        x = draw(20, 1.0, seed=i)
        return write_run(results, f"r{i}", {"c": x}, commit=sha[:12], dirty=dirty, suite="gs")

    monkeypatch.setattr(gate_mod, "run_suite", fake_run)
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


def test_unknown_base_is_a_user_error(repo):
    with pytest.raises(UserError, match="BASE=nope"):
        gate_mod.gate("nope", "s.yaml", "results")


def test_a_suite_without_a_name_is_gated_under_its_file_stem(repo, capsys):
    from harness.cli import main
    from harness.suite import load_suite

    path, _, calls = repo
    (path / "gs.yaml").write_text("fixed: {model: tiny, context_len: 8}\n")  # no name: key
    assert gate_mod.suite_name(path / "gs.yaml") == load_suite(path / "gs.yaml").name == "gs"
    assert main(["gate", "HEAD~1", "--suite", "gs.yaml", "--results", "results"]) in (0, 1)
    assert len(calls) == 2 and "cannot read" not in capsys.readouterr().err
