"""Run time estimates (harness/run/estimate.py) and the ETA they give the progress line from
the first case (harness/run/progress.py): figures by hand (issue 44 item 6)."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest

from kvbench.run.estimate import estimate, pass_seconds
from kvbench.run.progress import Progress
from kvbench.suite.cli_axes import given_axes, merge
from kvbench.suite.suite import Settings, expand, suite_from_raw


def earlier_run(tmp_path, rows):
    base = {"status": "ok", "chunks": 1, "trials": 1, "gen_tokens": 32, "kernel": "reference"}
    pd.DataFrame([{**base, **r} for r in rows]).to_csv(tmp_path / "r1.csv", index=False)


def test_seconds_per_pass_from_the_newest_rows_of_the_model(tmp_path):
    earlier_run(tmp_path, [
        # 2048 tokens in pieces of 512: 4 passes each
        {"model": "m", "phase": "quality", "context_len": 2048, "wall_s": 40.0},
        {"model": "m", "phase": "quality", "context_len": 2048, "wall_s": 48.0},
        {"model": "m", "phase": "quality", "context_len": 2048, "wall_s": 999.0,
         "kernel": "llama.cpp"},  # another program's time: left out
        {"model": "other", "phase": "quality", "context_len": 512, "wall_s": 1.0},
    ])  # fmt: skip
    assert pass_seconds(tmp_path, "m") == (pytest.approx(88.0 / 8), str(tmp_path / "r1.csv"))
    assert pass_seconds(tmp_path, "nobody") is None


def cases_of(*argv):
    import argparse

    from kvbench.suite.cli_axes import add_axis_options

    p = argparse.ArgumentParser()
    add_axis_options(p)
    raw = merge(None, given_axes(p.parse_args(list(argv))))
    return expand(suite_from_raw("command line", raw))


def test_model_phases_at_the_last_runs_speed_with_the_reference_once(tmp_path):
    earlier_run(tmp_path, [{"model": "smollm2-135m", "phase": "quality", "context_len": 1024,
                            "wall_s": 20.0}])  # 2 passes: 10 s each  # fmt: skip
    cases = cases_of("--model", "smollm2-135m", "--phase", "quality", "--kv-dtype", "q8_0,q4_0",
                     "--context", "2k")  # fmt: skip
    total, notes = estimate(cases, Settings(rounds=1), tmp_path)
    assert total == pytest.approx(10.0 * (4 + 4 + 4))  # two cases and one reference, 4 passes
    assert f"10.00 s per forward pass, from {tmp_path / 'r1.csv'}" in notes[0]


def test_unknown_speed_is_said_never_guessed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./results either
    cases = cases_of("--model", "smollm2-135m", "--phase", "quality", "--context", "1k")
    total, notes = estimate(cases, Settings(rounds=1), tmp_path)
    assert total is None and "no earlier run" in notes[0]


def test_timed_cases_at_their_floor(tmp_path):
    cases = cases_of("--model", "tiny", "--kv-dtype", "fp16,fp32", "--context", "64")
    total, _ = estimate(cases, Settings(rounds=2, warmup_s=0.5, budget_s=3.0), tmp_path)
    assert total == pytest.approx(2 * (2 * 0.5 + 3.0))


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_eta_is_shown_from_the_first_case_and_weighted_by_cost():
    clock, out = Clock(), io.StringIO()
    p = Progress(3, stream=out, clock=clock, weights=[100.0, 1.0, 1.0], estimate_s=102.0)
    clock.t = 2.0
    p.start("a")
    assert "ETA ~1:40" in out.getvalue()  # the estimate less the 2 s gone
    clock.t = 50.0
    p.done()
    assert p.eta_s() == pytest.approx(50.0 / 100 * 2)  # the slow case is done: 1 s left
    plain = Progress(2, stream=io.StringIO(), clock=clock)
    assert plain.eta_s() is None  # no estimate: the first case sets it


def test_without_a_speed_the_first_quality_case_carries_the_reference():
    from kvbench.run.estimate import relative_costs

    cases = cases_of("--model", "smollm2-135m", "--phase", "quality", "--kv-dtype",
                     "fp16,q8_0,q4_0", "--context", "2k")  # fmt: skip
    assert relative_costs(cases) == [8.0, 4.0, 4.0]  # 4 passes each, the reference's 4 first
    assert relative_costs(cases_of("--model", "tiny", "--context", "64")) is None  # timed


def test_a_new_out_dir_falls_back_to_the_default_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    earlier_run(tmp_path / "results", [{"model": "m", "phase": "quality", "context_len": 512,
                                        "wall_s": 3.0}])  # fmt: skip
    (tmp_path / "new").mkdir()
    assert pass_seconds(tmp_path / "new", "m") == (3.0, str(Path("results") / "r1.csv"))
