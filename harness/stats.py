"""Statistics on raw timing samples, mlx-free (compare, history and import use them too), and
the paired bootstrap of two quality configurations' per-token values (analysis/truth.py).

Timing samples are skewed and often bimodal (preemption, frequency changes), so everything
here is distribution-free: medians with binomial order-statistic CIs, the Mann-Whitney U rank
test, and a bootstrap (fixed seed, so the same files always give the same figures) of the
ratio of medians.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from math import comb

import numpy as np

BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 0


def median_ci(samples_ms, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free CI of the median: order statistics chosen by the Binomial(n, 1/2)
    quantiles (no normality assumption; timing samples are skewed). NaN below 2 samples."""
    x = np.sort(np.asarray(samples_ms, dtype=float))
    n = len(x)
    if n < 2:
        return math.nan, math.nan
    alpha = 1 - confidence
    lo = half_binomial_ppf(alpha / 2, n)  # number of samples below the lower bound
    lo = max(lo - 1, 0)
    hi = min(n - 1 - lo, n - 1)
    return float(x[lo]), float(x[hi])


@lru_cache(maxsize=4096)
def half_binomial_ppf(q: float, n: int) -> int:
    """The q-quantile of Binomial(n, 1/2): the least k with P(X <= k) >= q, in exact integer
    arithmetic (scipy.stats.binom.ppf gives the same; importing scipy.stats costs seconds in
    every process that times, the ranks of a sharded case included)."""
    total, need = 0, Fraction(q) * 2**n  # exact: n may exceed a float's range
    for k in range(n + 1):
        total += comb(n, k)
        if total >= need:
            return k
    return n


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


def mann_whitney_p(base, new) -> float:
    """Two-sided Mann-Whitney U p-value (exact for small tie-free samples, else normal
    approximation with tie correction, scipy's "auto"). NaN when either side is empty."""
    if len(base) == 0 or len(new) == 0:
        return math.nan
    from scipy.stats import mannwhitneyu  # imported where used: seconds of start-up

    return float(mannwhitneyu(new, base, alternative="two-sided").pvalue)


def min_two_sided_p(n_base: int, n_new: int) -> float:
    """The smallest two-sided p the exact U test can give with these sample counts: every new
    sample above every base sample. If it exceeds alpha, no result can be significant."""
    if n_base == 0 or n_new == 0:
        return 1.0
    # in log space: comb(n+m, n) overflows a float beyond ~515 samples a side (2/comb -> 0.0)
    log_comb = math.lgamma(n_base + n_new + 1) - math.lgamma(n_base + 1) - math.lgamma(n_new + 1)
    return min(1.0, math.exp(math.log(2.0) - log_comb))


def bootstrap_ratio_ci(
    base, new, confidence: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float]:
    """Percentile bootstrap CI of median(new) / median(base), each side resampled on its own
    with a fixed seed. NaN when a side has fewer than 2 samples."""
    b, n = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    if len(b) < 2 or len(n) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    mb = np.median(rng.choice(b, size=(resamples, len(b))), axis=1)  # [resamples]
    mn = np.median(rng.choice(n, size=(resamples, len(n))), axis=1)  # [resamples]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = mn / mb
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(ratios, [tail, 100 - tail])
    return float(lo), float(hi)


# ---- ratios of two medians, and proportions ---------------------------------------------------


def _n_samples(row) -> float:
    n = row.get("n_samples")
    return math.inf if n is None or n != n else float(n)  # no count recorded: trust the CI


def ratio_ci(a, b, min_samples: int) -> tuple[float, float, float]:
    """(median_a / median_b, conservative low, high) of two rows (median_ms, ci_low_ms,
    ci_high_ms, n_samples): the interval [low_a / high_b, high_a / low_b] built from each
    side's 95% CI of its median. NaN bounds when a side has fewer than `min_samples` samples
    (a 2-sample "CI" is the two samples: no interval)."""
    r = a["median_ms"] / b["median_ms"]
    if min(_n_samples(a), _n_samples(b)) < min_samples:
        return float(r), math.nan, math.nan
    lo = a["ci_low_ms"] / b["ci_high_ms"] if b["ci_high_ms"] > 0 else math.nan
    hi = a["ci_high_ms"] / b["ci_low_ms"] if b["ci_low_ms"] > 0 else math.nan
    return float(r), float(lo), float(hi)


def ratio_verdict(lo: float, hi: float, threshold: float) -> str:
    """Of a ratio a / b's interval: "faster" (a < b: the whole interval below 1 / threshold),
    "slower" (wholly above threshold), "same" (not wholly beyond it), or "few" (no interval)."""
    if math.isnan(lo) or math.isnan(hi):
        return "few"
    if hi < 1 / threshold:
        return "faster"
    if lo > threshold:
        return "slower"
    return "same"


Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (95% by default); (0, 1) for n = 0,
    and exact ends at k = 0 and k = n (no rounding residue)."""
    if n == 0:
        return 0.0, 1.0
    p, den = k / n, 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (0.0 if k == 0 else max(0.0, mid - half), 1.0 if k == n else min(1.0, mid + half))


# ---- per-token quality: two configurations on the same tokens --------------------------------

TOKEN_RESAMPLES = 2000
TOKEN_SEED = 0


def token_block(n: int) -> int:
    """Tokens per bootstrap block: ceil(n^(1/3)) (11 at 1,023 tokens, 16 at 4,095), the
    moving-block rule analysis/paired.py uses; adjacent tokens of one text are not independent
    (a hard passage raises the error of several tokens in a row)."""
    return max(1, math.ceil(n ** (1 / 3)))


def paired_token_ratio(
    a, b, kind: str, confidence: float = 0.95, resamples: int = TOKEN_RESAMPLES,
    seed: int = TOKEN_SEED, block: int | None = None,
) -> tuple[float, float, float]:  # fmt: skip
    """(ratio, low, high) of two per-token arrays of the same scored tokens: kind "ppl" (a, b
    are NLLs: exp(mean a) / exp(mean b)) or "kl" (mean a / mean b). The interval is the
    percentile interval of a paired moving-block bootstrap: every resample draws token positions
    (blocks of `block` consecutive tokens, default token_block(n), circular) and takes both
    arrays at the same positions, so what the two sides share (the text's hard tokens) cancels.
    NaN where undefined (fewer than 2 tokens, a mean of b not above 0 for kl)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"per-token arrays of shapes {a.shape} and {b.shape}: not one length")
    n = a.size
    stat = _PAIRED_STATS[kind]
    ratio = stat(a.mean(), b.mean())
    if n < 2 or not math.isfinite(ratio):
        return ratio, math.nan, math.nan
    idx = block_resamples(n, block or token_block(n), resamples, seed, circular=True)
    ratios = stat(a[idx].mean(axis=1), b[idx].mean(axis=1))  # [resamples]
    return ratio, *percentile_interval(ratios, confidence)


def block_resamples(n: int, block: int, resamples: int, seed: int, circular: bool) -> np.ndarray:
    """[resamples, n] positions of a moving-block bootstrap, the one both paired intervals use
    (per-token quality here, timing pairs in analysis/paired.py): blocks of `block` consecutive
    positions from random starts (circular: wrapping past the end; else starts in
    [0, n - block]), cut to n."""
    rng = np.random.default_rng(seed)
    if circular:
        starts = rng.integers(0, n, size=(resamples, math.ceil(n / block)))
        return ((starts[:, :, None] + np.arange(block)) % n).reshape(resamples, -1)[:, :n]
    starts = rng.integers(0, n - block + 1, size=(resamples, math.ceil(n / block)))
    return (starts[:, :, None] + np.arange(block)).reshape(resamples, -1)[:, :n]


def percentile_interval(values, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


def block_bootstrap_ci(
    r: np.ndarray, confidence: float, resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:  # fmt: skip
    """Percentile CI of median(r) from a moving-block bootstrap (blocks of ceil(n^(1/3)), at
    least 2; the paired gate's log-ratios of pairs taken in a row)."""
    n = len(r)
    if n < 2:
        return math.nan, math.nan
    block = max(2, math.ceil(n ** (1 / 3)))
    idx = block_resamples(n, block, resamples, seed, circular=False)
    return percentile_interval(np.median(r[idx], axis=1), confidence)  # medians [resamples]


def log_normal_ratio(a: float, se_a: float, b: float, se_b: float) -> tuple[float, float, float]:
    """(a / b, low, high): the 95% interval of a ratio of two independent means with standard
    errors se_a and se_b, log-normal (delta method on log a - log b); nan where undefined."""
    if not (a > 0 and b > 0) or any(x is None or x != x for x in (se_a, se_b)):
        return (a / b if b else math.nan), math.nan, math.nan
    r = a / b
    half = Z95 * math.hypot(se_a / a, se_b / b)
    return r, r * math.exp(-half), r * math.exp(half)


def _kl_ratio(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(b > 0, a / b, np.nan)
    return out if out.ndim else float(out)


def _ppl_ratio(a, b):
    out = np.exp(np.asarray(a, dtype=np.float64) - b)
    return out if out.ndim else float(out)


_PAIRED_STATS = {"ppl": _ppl_ratio, "kl": _kl_ratio}
