"""history: commit order, one value per code state, step changes."""

from __future__ import annotations

import json

from fake_runs import draw, make_repo, write_run

from kvbench.analysis.compare import Rules
from kvbench.analysis.history import history
from kvbench.cli import main


def test_history_in_git_order_finds_the_planted_step(tmp_path, capsys, monkeypatch):
    repo = tmp_path / "repo"
    shas = make_repo(repo, 4)
    res = tmp_path / "results"
    res.mkdir()
    medians = [1.0, 1.0, 1.5, 1.5]  # a step at the third commit
    for i, sha in enumerate(shas):
        stamp = f"2026-01-0{9 - i}T00:00:00+00:00"  # timestamps run backwards: git order wins
        cases = {"c1": draw(30, medians[i], seed=i), "c2": draw(30, 2.0, seed=10 + i)}
        write_run(res, f"r{i}", cases, commit=sha[:12], timestamp=stamp)
    write_run(res, "r3-dirty", {"c1": draw(30, 1.5, seed=7)}, commit=shas[3][:12], dirty=True)
    h = history(res, rules=Rules(), repo=repo)
    assert h.order == "git"
    assert h.points == [s[:12] for s in shas] + [shas[3][:12] + "+"]
    c1 = h.table[h.table["case_id"] == "c1"]
    assert list(c1["step"]) == ["", "", "slower", "", ""]
    assert (h.table[h.table["case_id"] == "c2"]["step"] == "").all()
    monkeypatch.chdir(repo)  # the CLI orders by the git repository it runs in
    assert main(["history", str(res), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in rows if r["case_id"] == "c1"][2] == "slower"
    assert main(["history", str(res)]) == 0
    assert f"1.499x slower at {shas[2][:12]}" in capsys.readouterr().out


def test_commits_outside_the_repo_fall_back_to_timestamps(tmp_path):
    res = tmp_path / "results"
    res.mkdir()
    write_run(
        res,
        "late",
        {"c1": draw(20, 2.0)},
        commit="bbbbbbbbbbbb",
        timestamp="2026-02-01T00:00:00+00:00",
    )
    write_run(
        res,
        "early",
        {"c1": draw(20, 1.0)},
        commit="aaaaaaaaaaaa",
        timestamp="2026-01-01T00:00:00+00:00",
    )
    h = history(res, repo=tmp_path)  # not a git repository
    assert h.order == "timestamp" and h.points == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
    assert list(h.table["step"]) == ["", "slower"]


def test_one_series_per_device_never_a_mixed_timeline(tmp_path, capsys, monkeypatch):
    repo = tmp_path / "repo"
    a, b = (s[:12] for s in make_repo(repo, 2))
    res = tmp_path / "results"
    res.mkdir()
    cpu = {"device": "Intel Xeon (cpu)", "backend": "cpu"}
    gpu = {"device": "NVIDIA H100 (cuda)", "backend": "cuda"}
    # commit a on the CPU only, commit b on the GPU (3x faster) and on the CPU (unchanged)
    write_run(res, "a-cpu", {"c1": draw(30, 3.0, seed=1)}, commit=a, **cpu)
    write_run(res, "b-gpu", {"c1": draw(30, 1.0, seed=2)}, commit=b, **gpu)
    h = history(res, rules=Rules(), repo=repo)
    assert (h.table["step"] == "").all()  # a change of machine is not a step of the code
    assert list(h.table["device"]) == [cpu["device"], gpu["device"]]
    assert list(h.table["backend"]) == ["cpu", "cuda"]
    write_run(res, "b-cpu", {"c1": draw(30, 6.0, seed=3)}, commit=b, **cpu)
    h = history(res, rules=Rules(), repo=repo)
    on_cpu = h.table[h.table["device"] == cpu["device"]]
    assert list(on_cpu["point"]) == [a, b] and list(on_cpu["step"]) == ["", "slower"]
    on_gpu = h.table[h.table["device"] == gpu["device"]]
    assert list(on_gpu["point"]) == [b] and list(on_gpu["step"]) == [""]
    monkeypatch.chdir(repo)
    assert main(["history", str(res), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["device"], r["step"]) for r in rows} == {
        (cpu["device"], ""), (cpu["device"], "slower"), (gpu["device"], "")
    }  # fmt: skip
    assert main(["history", str(res), "--format", "csv"]) == 0
    assert "device,backend" in capsys.readouterr().out.splitlines()[0]
    assert main(["history", str(res)]) == 0
    out = capsys.readouterr().out
    assert cpu["device"] in out and gpu["device"] in out
    assert f"on {cpu['device']} [cpu]: " in out and f"x slower at {b}" in out
    assert "1 step change(s)" in out
    assert "1 case(s) ran on several devices or backends: one series each" in out
