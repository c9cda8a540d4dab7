"""The rules compare, history and gate judge by, and the metrics they know (no dependencies,
so the CLI can build its options without importing pandas or scipy)."""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import UserError
from kvbench.store.schema import METRIC_STAGE

TESTED = tuple(METRIC_STAGE)
HIGHER_IS_BETTER = ("gbps", "pct_peak_bw", "tflops", "tokens_per_s", "cosine")
LOWER_IS_BETTER = (
    *TESTED, "p10_ms", "p90_ms", "iqr_ms", "cv", "kv_bytes", "bits_per_elem", "alloc_bytes",
    "peak_mem_bytes", "max_abs_err", "rel_err", "kv_recon_err",
)  # fmt: skip
METRICS = (*LOWER_IS_BETTER, *HIGHER_IS_BETTER)


@dataclass(frozen=True)
class Rules:
    threshold: float = 1.1  # a change smaller than 10% is never a verdict (asv's factor)
    alpha: float = 0.002  # significance level of the rank test (asv's)
    min_samples: int = 5  # fewer raw samples on a side: inconclusive
    confidence: float = 0.95  # level of the ratio's bootstrap CI


def check_rules(metric: str, rules: Rules) -> None:
    if metric not in METRICS:
        raise UserError(
            f"--metric: {metric}: not a comparable metric (one of {', '.join(METRICS)})"
        )
    if not rules.threshold >= 1:
        raise UserError(f"--threshold: {rules.threshold}: must be >= 1 (a factor, e.g. 1.1)")
    if not 0 < rules.alpha < 1:
        raise UserError(f"--alpha: {rules.alpha}: must be between 0 and 1")
    if rules.min_samples < 1:
        raise UserError(f"--min-samples: {rules.min_samples}: must be at least 1")
