"""The one timer: warm-up by time, adaptive sampling, robust statistics.

A sample is the wall time of `fn()` followed by `mx.eval` of everything it returns and a
device synchronize, so lazy MLX work is inside the timed region and nothing else is. Warm-up
runs the same call (compilation and allocation land there, never in a sample). Sampling stops
when the median's 95% confidence interval is within `target_ci` of the median (after
`min_samples`), at `max_samples`, or when the time budget ends. Every raw sample is returned.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import mlx.core as mx
import numpy as np
from scipy.stats import binom


def run_once(fn: Callable[[], object], clock=time.perf_counter) -> float:
    """Milliseconds for one fn() + eval + synchronize."""
    t0 = clock()
    out = fn()
    if out is not None:
        mx.eval(out)
    mx.synchronize()
    return (clock() - t0) * 1e3


def median_ci(samples_ms, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free CI of the median: order statistics chosen by the Binomial(n, 1/2)
    quantiles (no normality assumption; timing samples are skewed). NaN below 2 samples."""
    x = np.sort(np.asarray(samples_ms, dtype=float))
    n = len(x)
    if n < 2:
        return math.nan, math.nan
    alpha = 1 - confidence
    lo = int(binom.ppf(alpha / 2, n, 0.5))  # number of samples below the lower bound
    lo = max(lo - 1, 0)
    hi = min(n - 1 - lo, n - 1)
    return float(x[lo]), float(x[hi])


def ci_rel_halfwidth(samples_ms) -> float:
    lo, hi = median_ci(samples_ms)
    med = float(np.median(samples_ms))
    return (hi - lo) / (2 * med) if med > 0 and not math.isnan(lo) else math.inf


def summarize(samples_ms, cv_warn: float = 0.10) -> dict:
    """median, p10, p90, IQR, CV, 95% CI of the median, n, unstable flag."""
    x = np.asarray(samples_ms, dtype=float)
    if len(x) == 0:
        return {"n_samples": 0}
    q10, q25, med, q75, q90 = np.percentile(x, [10, 25, 50, 75, 90])
    mean = float(x.mean())
    cv = float(x.std(ddof=1) / mean) if len(x) > 1 and mean > 0 else math.nan
    lo, hi = median_ci(x)
    return {
        "median_ms": float(med),
        "p10_ms": float(q10),
        "p90_ms": float(q90),
        "iqr_ms": float(q75 - q25),
        "cv": cv,
        "ci_low_ms": lo,
        "ci_high_ms": hi,
        "n_samples": int(len(x)),
        "unstable": bool(not math.isnan(cv) and cv > cv_warn),
    }


def warm_up(fn: Callable[[], object], warmup_s: float, clock=time.perf_counter) -> int:
    """Run fn until warmup_s has passed, at least twice (the first call compiles)."""
    start, calls = clock(), 0
    while calls < 2 or clock() - start < warmup_s:
        run_once(fn, clock)
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
) -> list[float]:
    """Take samples of fn until the CI target (judged with `prior_ms`, samples from earlier
    rounds, included) is met after min_samples, max_samples are taken, or budget_s ends."""
    out: list[float] = []
    start = clock()
    while len(out) < max_samples:
        out.append(run_once(fn, clock))
        taken = len(out) + len(prior_ms)
        if taken >= min_samples and ci_rel_halfwidth([*prior_ms, *out]) <= target_ci:
            break
        if clock() - start >= budget_s and len(out) >= 1:
            break
    return out
