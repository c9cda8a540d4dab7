"""The timer: statistics, the order-statistic CI, adaptive stopping, a known duration."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kvbench import stats, timer


class FakeClock:
    """A clock that only moves when the timed function `work` runs (by its next duration)."""

    def __init__(self, durations_s):
        self.t, self.durations = 0.0, list(durations_s)

    def __call__(self):
        return self.t

    def work(self):
        self.t += self.durations.pop(0)


def test_median_ci_uses_binomial_order_statistics():
    x = np.arange(100.0)
    # n=100, 95%: the classic table gives ranks 40 and 61 (1-based)
    assert stats.median_ci(x) == (39.0, 60.0)
    assert stats.median_ci(np.arange(10.0)) == (1.0, 8.0)  # ranks 2 and 9
    assert all(np.isnan(stats.median_ci([1.0])))


def test_summarize_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.lognormal(0, 0.2, 200)
    s = stats.summarize(x)
    assert s["median_ms"] == pytest.approx(np.median(x))
    assert s["p10_ms"] == pytest.approx(np.percentile(x, 10))
    assert s["p90_ms"] == pytest.approx(np.percentile(x, 90))
    assert s["iqr_ms"] == pytest.approx(np.percentile(x, 75) - np.percentile(x, 25))
    assert s["cv"] == pytest.approx(x.std(ddof=1) / x.mean())
    assert s["ci_low_ms"] <= s["median_ms"] <= s["ci_high_ms"]
    assert s["n_samples"] == 200 and s["unstable"] is True  # cv ~0.2 > 0.1


def test_sampling_stops_when_ci_is_tight():
    clock = FakeClock([0.010] * 1000)  # every call takes exactly 10 ms: CI collapses at once
    out = timer.sample(
        clock.work, budget_s=100, min_samples=5, max_samples=500, target_ci=0.01, clock=clock
    )
    assert len(out) == 5 and out == pytest.approx([10.0] * 5)


def test_sampling_stops_at_budget_when_noisy():
    rng = np.random.default_rng(1)
    clock = FakeClock(list(rng.uniform(0.001, 0.1, 1000)))  # very noisy: CI never tight
    out = timer.sample(
        clock.work, budget_s=1.0, min_samples=5, max_samples=500, target_ci=0.001, clock=clock
    )
    assert 1.0 <= sum(out) / 1e3 < 1.1  # stopped at the first call past the 1 s budget


def test_min_samples_are_taken_even_past_the_budget():
    clock = FakeClock([2.0] * 10)  # each call alone overruns the 1 s budget
    out = timer.sample(
        clock.work, budget_s=1.0, min_samples=4, max_samples=10, target_ci=0.5, clock=clock
    )
    assert len(out) == 4


def test_sampling_respects_max_samples_and_prior():
    clock = FakeClock([0.001 * (1 + i % 7) for i in range(1000)])
    out = timer.sample(
        clock.work, budget_s=100, min_samples=5, max_samples=12, target_ci=0.0, clock=clock
    )
    assert len(out) == 12
    prior = [10.0] * 50  # earlier rounds already pin the median: one more sample suffices
    clock = FakeClock([0.010] * 10)
    assert (
        len(
            timer.sample(
                clock.work,
                budget_s=100,
                min_samples=5,
                max_samples=12,
                target_ci=0.01,
                prior_ms=prior,
                clock=clock,
            )
        )
        == 1
    )


def test_warm_up_runs_at_least_twice():
    calls = []
    timer.warm_up(lambda: calls.append(1), warmup_s=0.0)
    assert len(calls) == 2


def test_known_duration():
    # time.sleep(20 ms) never returns early; the upper bound only guards against a broken
    # timer (e.g. counting warm-up), so it is generous for a shared, noisy machine.
    out = timer.sample(
        lambda: time.sleep(0.02), budget_s=0.3, min_samples=5, max_samples=5, target_ci=0.0
    )
    assert len(out) == 5
    assert 20.0 <= np.median(out) < 60.0
