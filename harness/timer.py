"""The one timer: warm-up by time, adaptive sampling, robust statistics.

A sample is the wall time of `fn()` followed by `mx.eval` of everything it returns and a
device synchronize, so lazy MLX work is inside the timed region and nothing else is. Warm-up
runs the same call (compilation and allocation land there, never in a sample). Sampling stops
when the median's 95% confidence interval is within `target_ci` of the median (after
`min_samples`), at `max_samples`, or when the time budget ends - but never before `min_samples`
(as pytest-benchmark's min_rounds: a slow case overruns its budget rather than reporting
statistics from one or two samples). Every raw sample is returned.
`agree` turns this process's decision to stop into the decision every process shares: ranks of
a sharded case (harness/engines/sharded_rank.py) run the same calls in lockstep, so each loop
stops where rank 0's clock says, never where each rank's own clock would.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import mlx.core as mx

from kvbench.stats import ci_rel_halfwidth


def run_once(fn: Callable[[], object], clock=time.perf_counter) -> float:
    """Milliseconds for one fn() + eval + synchronize."""
    t0 = clock()
    out = fn()
    if out is not None:
        mx.eval(out)
    mx.synchronize()
    return (clock() - t0) * 1e3


def _alone(done: bool) -> bool:
    return done


def warm_up(
    fn: Callable[[], object],
    warmup_s: float,
    clock=time.perf_counter,
    agree=_alone,
    times_ms: list | None = None,
) -> int:
    """Run fn until warmup_s has passed, at least twice (the first call compiles); each call's
    time is appended to times_ms when given (never a sample: a first look at a step's cost)."""
    start, calls = clock(), 0
    while not agree(calls >= 2 and clock() - start >= warmup_s):
        ms = run_once(fn, clock)
        if times_ms is not None:
            times_ms.append(ms)
        calls += 1
    return calls


def sample(
    fn: Callable[[], object],
    *,
    budget_s: float,
    min_samples: int,
    max_samples: int,
    target_ci: float,
    prior_ms=(),
    clock=time.perf_counter,
    agree=_alone,
) -> list[float]:
    """Take samples of fn until, with at least min_samples (counting `prior_ms`, samples from
    earlier rounds), the CI target is met or budget_s has passed; or max_samples are taken."""
    out: list[float] = []
    start = clock()
    while True:
        out.append(run_once(fn, clock))
        if agree(
            _enough(out, prior_ms, min_samples, max_samples, target_ci, clock() - start, budget_s)
        ):
            return out


def _enough(out, prior_ms, min_samples, max_samples, target_ci, elapsed_s, budget_s) -> bool:
    if len(out) >= max_samples:
        return True
    if len(out) + len(prior_ms) < min_samples:
        return False
    return elapsed_s >= budget_s or ci_rel_halfwidth([*prior_ms, *out]) <= target_ci
