"""Result sets: CSV, directory, git ref resolution, and which run a case uses."""

from __future__ import annotations

import pytest
from fake_runs import draw, make_repo, write_run

from kvbench.cli import main
from kvbench.errors import UserError
from kvbench.store.git import resolve_ref
from kvbench.store.results import load


@pytest.fixture
def repo(tmp_path):
    shas = make_repo(tmp_path / "repo", 3)
    results = tmp_path / "repo" / "results"
    results.mkdir()
    for i, sha in enumerate(shas[:2]):
        write_run(results, f"run{i}", {"c1": draw(10, 1.0 + i, seed=i)}, commit=sha[:12])
    return tmp_path / "repo", shas


def test_git_ref_selects_the_runs_of_its_commit(repo):
    path, shas = repo
    assert resolve_ref("HEAD~2", path) == shas[0]
    assert resolve_ref("no-such-ref", path) is None
    old = load("HEAD~2", path / "results", path)
    assert set(old.rows["run_id"]) == {"run0"} and shas[0][:12] in old.source
    assert load(shas[1][:7], path / "results", path).pick().iloc[0]["median_ms"] > 1.5


def test_ref_without_results_and_unknown_ref_are_user_errors(repo):
    path, shas = repo
    with pytest.raises(UserError, match=f"commit {shas[2][:12]} has no results"):
        load("HEAD", path / "results", path)
    with pytest.raises(UserError, match="not a results CSV, a results directory or a git ref"):
        load("nope", path / "results", path)


def test_cli_compares_git_refs(repo, monkeypatch, capsys):
    path, _ = repo
    monkeypatch.chdir(path)
    assert main(["compare", "HEAD~2", "HEAD~1"]) == 1  # 10 samples a side, 2x slower
    assert "slower" in capsys.readouterr().out
    assert main(["compare", "HEAD~2", "HEAD"]) == 2
    assert "has no results" in capsys.readouterr().err


def test_latest_measured_run_wins_and_ref_prefers_a_clean_tree(repo):
    path, shas = repo
    res = path / "results"
    c = shas[0][:12]
    write_run(res, "later", {"c1": draw(10, 5.0)}, commit=c, timestamp="2026-02-01T00:00:00+00:00")
    write_run(
        res,
        "latest-dirty",
        {"c1": draw(10, 9.0)},
        commit=c,
        dirty=True,
        timestamp="2026-03-01T00:00:00+00:00",
    )
    write_run(
        res,
        "latest-error",
        {"c1": {"status": "error"}},
        commit=c,
        timestamp="2026-04-01T00:00:00+00:00",
    )
    picked = load("HEAD~2", res, path).pick()
    assert list(picked["run_id"]) == ["later"]  # ok before error, clean before dirty
    assert list(load(str(res)).pick()["run_id"]) == ["latest-dirty"]  # a directory: latest ok


def test_directory_loads_every_run_and_csv_brings_its_samples(tmp_path):
    a = write_run(tmp_path, "a", {"c1": draw(7), "c2": draw(7)})
    write_run(tmp_path, "b", {"c3": draw(4)})
    (tmp_path / "compare.csv").write_text("case_id,verdict\nc1,slower\n")  # not a run: skipped
    rs = load(str(tmp_path))
    assert sorted(rs.pick()["case_id"]) == ["c1", "c2", "c3"]
    one = load(str(a))
    assert len(one.samples_of(one.pick().iloc[0])) == 7
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no kvbench results"):
        load(str(tmp_path / "empty"))


def test_pool_concatenates_every_run_and_recomputes_the_row(tmp_path):
    import numpy as np

    from kvbench import stats

    x1, x2 = draw(10, 1.0, seed=1), draw(12, 3.0, seed=2)
    write_run(tmp_path, "a", {"c1": x1}, timestamp="2026-01-01T00:00:00+00:00")
    write_run(tmp_path, "b", {"c1": x2}, timestamp="2026-01-02T00:00:00+00:00")
    write_run(tmp_path, "e", {"c1": {"status": "error"}}, timestamp="2026-01-03T00:00:00+00:00")
    latest = load(str(tmp_path))
    assert latest.pick().iloc[0]["median_ms"] == pytest.approx(np.median(x2))  # default
    pooled = load(str(tmp_path), pool=True)
    row = pooled.pick().iloc[0]
    both = np.concatenate([x1, x2])
    assert list(pooled.samples_of(row)) == list(both)  # the error run adds nothing
    assert row["median_ms"] == pytest.approx(np.median(both)) and row["n_samples"] == 22
    assert (row["ci_low_ms"], row["ci_high_ms"]) == pytest.approx(stats.median_ci(both))
    assert row["pooled_runs"] == 2 and "[pooled: 2 runs per case]" in pooled.heading()


def test_cli_compare_pool(tmp_path, capsys):
    base, new = tmp_path / "base", tmp_path / "new"
    base.mkdir(), new.mkdir()
    for i in range(2):
        write_run(base, f"b{i}", {"c1": draw(10, 1.0, seed=i)})
        write_run(new, f"n{i}", {"c1": draw(10, 1.0, seed=10 + i)})
    assert main(["compare", str(base), str(new), "--pool"]) == 0
    out = capsys.readouterr().out
    assert out.count("[pooled: 2 runs per case]") == 2 and "20/20" in out


@pytest.mark.parametrize("stamp", ["yesterday", "2026-13-01T00:00:00+00:00", "99999"])
def test_a_timestamp_that_is_not_a_time_is_refused(tmp_path, stamp):
    """#44 item 9: 'yesterday' was accepted and sorted (as text) after every real time, so
    compare and history took that row as the newest without a word."""
    write_run(tmp_path, "r1", {"c1": [1.0]}, timestamp=stamp)
    with pytest.raises(UserError, match=r"r1\.csv: timestamp: not a time .* data row 1"):
        load(str(tmp_path))


def test_real_timestamps_with_offsets_still_load(tmp_path):
    write_run(tmp_path, "r1", {"c1": [1.0]}, timestamp="2026-01-01T00:00:00+02:00")
    write_run(tmp_path, "r2", {"c1": [1.0]}, timestamp="2026-01-01T00:00:00Z")
    assert len(load(str(tmp_path)).rows) == 2
