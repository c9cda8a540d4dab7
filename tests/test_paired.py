"""The paired gate (harness/analysis/paired.py) and the unpaired noise band of compare.

Synthetic timings model a shared machine: a load level that drifts and bursts over time
multiplies every sample taken at that moment. Separate runs sample the load at different
times; a pair samples it twice within milliseconds.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvbench import stats
from kvbench.analysis import paired
from kvbench.analysis.compare import compare, judge
from kvbench.analysis.rules import Rules
from kvbench.errors import UserError
from kvbench.store.results import load

RULES = Rules()


def load_level(n: int, seed: int, drift: float = 0.0, burst: float = 0.0) -> np.ndarray:
    """A machine's slowdown factor at n successive moments: a linear drift by `drift`, and from
    half-way on a busy neighbour that adds +`burst`, switching on and off every 10 moments."""
    t = np.linspace(0, 1, n)
    on = (t >= 0.5) & ((np.arange(n) // 10) % 2 == 0)
    rng = np.random.default_rng(seed)
    return (1 + drift * t) * (1 + burst * on) * np.exp(rng.normal(0, 0.02, n))


def test_abba_order_gives_each_side_the_first_place_in_every_two_pairs():
    assert [paired.abba(i) for i in range(4)] == [
        ("base", "new"), ("new", "base"), ("base", "new"), ("new", "base"),
    ]  # fmt: skip


class FakeWorker:
    """Answers like harness/run/worker.py; logs the order in which it was sampled."""

    def __init__(self, name: str, log: list, ms: float = 1.0):
        self.name, self.log, self.ms = name, log, ms

    def ask(self, op: str, **req) -> dict:
        if op == "sample":
            self.log.append(self.name)
            return {"ms": [self.ms * (1 + i) for i in range(req.get("n", 1))]}
        return {"ok": True}


def test_a_side_stands_for_the_fastest_call_of_its_block():
    sides = {"base": FakeWorker("base", [], 1.0), "new": FakeWorker("new", [], 2.0)}
    budget = paired.Budget(warmup_s=0, budget_s=0, min_pairs=2, max_pairs=2, block=3)
    _, _, pairs = paired.measure_case(sides, "c1", budget)
    assert [(p[3], p[4], p[5]) for p in pairs] == [(1.0, 2.0, 3)] * 2


def test_pairs_are_taken_in_abba_order_and_stored_with_their_schema():
    log: list = []
    sides = {"base": FakeWorker("base", log, 1.0), "new": FakeWorker("new", log, 1.3)}
    budget = paired.Budget(warmup_s=0, budget_s=0, min_pairs=6, max_pairs=6, block=1)
    status, note, pairs = paired.measure_case(sides, "c1", budget)
    assert status == "ok" and note == ""
    assert log == ["base", "new", "new", "base"] * 3
    assert len(pairs) == 6 and all(len(p) == len(paired.PAIR_COLUMNS) for p in pairs)
    assert [p[2] for p in pairs[:2]] == ["base", "new"]  # who went first
    assert all((p[3], p[4]) == (1.0, 1.3) for p in pairs)


def test_a_skipped_side_makes_no_pairs():
    class Skipper(FakeWorker):
        def ask(self, op, **req):
            return {"skip": "kernel metal runs on metal"} if op == "build" else super().ask(op)

    sides = {"base": FakeWorker("base", []), "new": Skipper("new", [])}
    status, note, pairs = paired.measure_case(sides, "c1", paired.Budget())
    assert (status, pairs) == ("new_skipped", []) and "metal" in note


def test_only_what_base_measured_and_new_lost_is_a_regression():
    rules = Rules()
    assert paired.table_row("c", "c", "new_error", "new: boom", [], rules)["regression"]
    lost = paired.table_row("c", "c", "new_skipped", "new: skip", [], rules)
    assert lost["verdict"] == "lost" and lost["regression"]
    fixed = paired.table_row("c", "c", "base_error", "base: boom", [], rules)
    assert fixed["verdict"] == "not_measured" and not fixed["regression"]


def test_a_side_that_fails_while_sampling_is_an_error_row_not_a_crash():
    class Breaks(FakeWorker):
        def ask(self, op, **req):
            return {"error": "RuntimeError: boom"} if op == "sample" else super().ask(op, **req)

    sides = {"base": FakeWorker("base", []), "new": Breaks("new", [])}
    status, note, pairs = paired.measure_case(sides, "c1", paired.Budget(min_pairs=2))
    assert (status, pairs) == ("new_error", []) and "boom" in note


@pytest.mark.parametrize("drift,burst", [(0.6, 0.0), (0.0, 0.8), (0.4, 0.5)])
def test_drift_and_bursts_that_fool_the_unpaired_test_do_not_fool_the_pairs(drift, burst):
    n = 240
    load_seq = load_level(2 * n, seed=1, drift=drift, burst=burst)
    # unpaired: BASE's run takes the first n moments, NEW's run the next n (same code)
    base_run, new_run = 1.0 * load_seq[:n], 1.0 * load_seq[n:]
    fooled = judge(base_run, new_run, RULES)["verdict"] != "unchanged"
    # paired: moment 2i for one side, 2i+1 for the other (ABBA), the same load history
    noise = np.exp(np.random.default_rng(2).normal(0, 0.02, 2 * n))
    both = load_seq * noise
    base_p = np.where(np.arange(n) % 2 == 0, both[0::2], both[1::2])
    new_p = np.where(np.arange(n) % 2 == 0, both[1::2], both[0::2])
    got = paired.judge_pairs(base_p, new_p, RULES)
    assert fooled  # the planted drift or burst really misleads the unpaired test
    assert got["verdict"] == "unchanged", got
    assert 0.97 < got["ratio"] < 1.03


def test_a_planted_1_25x_slowdown_is_called_slower_under_bursts():
    n = 200
    lvl = load_level(2 * n, seed=3, drift=0.3, burst=0.8)
    base_p, new_p = lvl[0::2], 1.25 * lvl[1::2]
    got = paired.judge_pairs(base_p, new_p, RULES)
    assert got["verdict"] == "slower", got
    assert 1.2 < got["ratio"] < 1.3 and got["ratio_ci_low"] > 1.1


def test_block_bootstrap_ci_is_wider_for_autocorrelated_pairs():
    rng = np.random.default_rng(4)
    iid = rng.normal(0, 0.05, 400)
    walk = np.repeat(rng.normal(0, 0.05, 40), 10)  # blocks of 10 equal values: autocorrelated
    lo_i, hi_i = stats.block_bootstrap_ci(iid, 0.95, paired.BOOTSTRAP_RESAMPLES)
    lo_w, hi_w = stats.block_bootstrap_ci(walk, 0.95, paired.BOOTSTRAP_RESAMPLES)
    assert lo_i < 0 < hi_i and hi_w - lo_w > hi_i - lo_i


def test_too_few_pairs_is_inconclusive():
    got = paired.judge_pairs([1.0] * 4, [2.0] * 4, RULES)
    assert got["verdict"] == "inconclusive" and "too few" in got["note"]


def test_unpaired_compare_gives_no_verdict_inside_the_between_run_noise(tmp_path):
    from fake_runs import draw, write_run

    # two runs of the same code, 3 rounds each; the machine moved by ~25% between rounds
    def run(name: str, levels) -> str:
        x = np.concatenate([draw(20, lvl, seed=i) for i, lvl in enumerate(levels)])
        return str(write_run(tmp_path, name, {"c": x}, rounds=len(levels)))

    a = run("a", [1.0, 1.25, 1.05])
    b = run("b", [1.3, 1.3, 1.25])  # 1.28x the other's median: a rank test calls it slower
    cmp = compare(load(a), load(b))
    row = cmp.table.iloc[0]
    assert row["verdict"] == "inconclusive" and "between-run noise" in row["note"]
    assert not cmp.table["regression"].any()
    # without rounds (one round per run) the same ratio is judged as before: slower
    c = str(write_run(tmp_path, "c", {"c": draw(60, 1.0, seed=9)}))
    d = str(write_run(tmp_path, "d", {"c": draw(60, 1.28, seed=8)}))
    assert compare(load(c), load(d)).table.iloc[0]["verdict"] == "slower"


def test_calibrated_noise_of_the_host_widens_the_band(tmp_path):
    import socket

    from fake_runs import draw, write_run

    here = socket.gethostname()
    c = str(write_run(tmp_path, "c", {"c": draw(60, 1.0, seed=9)}, host=here))
    d = str(write_run(tmp_path, "d", {"c": draw(60, 1.28, seed=8)}, host=here))
    cmp = compare(load(c), load(d), noise={"c": 0.35})
    assert cmp.table.iloc[0]["verdict"] == "inconclusive"
    assert "±35%" in cmp.table.iloc[0]["note"]
    # another host's runs: this host's calibration says nothing about them
    e = str(write_run(tmp_path, "e", {"c": draw(60, 1.0, seed=9)}, host="elsewhere"))
    f = str(write_run(tmp_path, "f", {"c": draw(60, 1.28, seed=8)}, host="elsewhere"))
    assert compare(load(e), load(f), noise={"c": 0.35}).table.iloc[0]["verdict"] == "slower"


def test_both_workers_share_one_cpu():
    import os

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("this OS cannot pin processes to CPUs")
    allowed = sorted(os.sched_getaffinity(0))
    assert paired.pin_cpu(-1) == allowed[-1]
    assert paired.pin_cpu(allowed[0]) == allowed[0]
    assert paired.pin_cpu(None) is None
    with pytest.raises(UserError, match="--pin-cpu"):
        paired.pin_cpu(max(allowed) + 1000)
