"""compare: is NEW faster or slower than BASE, case by case, and is the difference real?

Per case (joined on case_id) and metric:
  * ratio   = new / base of the metric (for median_ms: the ratio of the two medians),
  * a 95% CI of that ratio: percentile bootstrap of the ratio of medians, each side resampled
    from its own raw samples (harness/stats.py, fixed seed: same files, same figures),
  * p_value = two-sided Mann-Whitney U test on the raw samples (no normality assumed),
  * verdict (see `judge`): slower / faster need p < alpha AND a ratio beyond the threshold.
Metrics with no raw samples behind them (GB/s, memory, errors) are compared by value alone:
verdict better / worse / unchanged by the threshold, no p-value, never a regression.
A case measured at BASE but not at NEW is a regression: verdict `error` when NEW's row is an
error, `lost` when it is skipped (or any other unmeasured status): a benchmark that silently
stops running is how regressions hide. A case BASE did not measure is `not_measured`, never a
regression; a case on one side only is `base_only` / `new_only`, never a regression.
This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvbench import stats
from kvbench.analysis.rules import (  # Rules: also for users
    HIGHER_IS_BETTER,
    TESTED,
    Rules,
    check_rules,
)
from kvbench.errors import UserError
from kvbench.store.results import MEASURED, ResultSet, is_dirty, label

COLUMNS = (
    "case_id", "label", "metric", "base", "new", "ratio", "ratio_ci_low", "ratio_ci_high",
    "p_value", "verdict", "base_n", "new_n", "note", "regression",
)  # fmt: skip
CONTEXT_KEYS = ("device", "backend", "mlx_version", "blas")


@dataclass
class Comparison:
    base: str
    new: str
    metric: str
    rules: Rules
    table: pd.DataFrame  # COLUMNS, one row per case (both sides, one side, or not measured)
    warnings: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> pd.DataFrame:
        return self.table[self.table["regression"]]


def judge(base_x, new_x, rules: Rules) -> dict:
    """Statistics and verdict for a metric with raw samples on both sides (lower is better)."""
    nb, nn = len(base_x), len(new_x)
    out = {"base_n": nb, "new_n": nn, "ratio_ci_low": math.nan, "ratio_ci_high": math.nan}
    out["p_value"] = math.nan
    if not nb or not nn:
        note = "no raw samples on a side (its .samples.csv is missing or holds none for it)"
        return {**out, "verdict": "inconclusive", "note": note}
    if nb < rules.min_samples or nn < rules.min_samples:
        return {
            **out,
            "verdict": "inconclusive",
            "note": f"too few samples (< {rules.min_samples})",
        }
    ratio = float(np.median(new_x) / np.median(base_x))
    lo, hi = stats.bootstrap_ratio_ci(base_x, new_x, rules.confidence)
    p = stats.mann_whitney_p(base_x, new_x)
    out.update(ratio=ratio, ratio_ci_low=lo, ratio_ci_high=hi, p_value=p)
    floor = stats.min_two_sided_p(nb, nn)
    if floor >= rules.alpha:
        note = f"too few samples to reach alpha (smallest possible p {floor:.2g})"
        return {**out, "verdict": "inconclusive", "note": note}
    t = rules.threshold
    if p < rules.alpha:
        if ratio > t:
            return {**out, "verdict": "slower", "note": ""}
        if ratio < 1 / t:
            return {**out, "verdict": "faster", "note": ""}
        return {**out, "verdict": "unchanged", "note": "significant but within the threshold"}
    if 1 / t <= lo and hi <= t:
        return {**out, "verdict": "unchanged", "note": ""}
    return {**out, "verdict": "inconclusive", "note": "too noisy: CI reaches beyond the threshold"}


def value_ratio(base: float, new: float) -> float:
    if base == new:
        return 1.0
    if base == 0:
        return math.inf
    return new / base


def judge_value(base: float, new: float, metric: str, rules: Rules) -> dict:
    """Verdict by value alone (no raw samples behind the metric): no test, never a regression."""
    ratio = value_ratio(base, new)
    worse = ratio if metric not in HIGHER_IS_BETTER else (math.inf if ratio == 0 else 1 / ratio)
    t = rules.threshold
    verdict = "worse" if worse > t else "better" if worse < 1 / t else "unchanged"
    return {"ratio": ratio, "verdict": verdict, "note": "no significance test (no raw samples)"}


def _value(row, metric: str, samples: np.ndarray) -> float:
    v = row.get(metric)
    if (v is None or pd.isna(v)) and len(samples):
        return float(np.median(samples))
    return float(v) if v is not None and not pd.isna(v) else math.nan


def _status_note(row) -> str:
    err = row.get("error")
    return f"{row['status']}: {err}" if isinstance(err, str) else str(row["status"])


def lost_or_error(b, n) -> dict:
    """Verdict for a case not measured on a side (see the module docstring)."""
    note = f"base {_status_note(b)}; new {_status_note(n)}"
    if b["status"] not in MEASURED:
        return {"verdict": "not_measured", "note": note, "regression": False}
    if n["status"] == "error":
        return {"verdict": "error", "note": note, "regression": True}
    note += " (measured at base, not at new: a benchmark that stops running hides regressions)"
    return {"verdict": "lost", "note": note, "regression": True}


def round_band(medians: np.ndarray) -> float:
    """Between-run noise from the rounds of a run: the spread max/min - 1 of its round medians
    (each round rebuilds the case, as a separate run would); 0 with fewer than two rounds."""
    m = medians[np.isfinite(medians) & (medians > 0)]
    return float(m.max() / m.min() - 1) if len(m) >= 2 else 0.0


def within_noise(out: dict, band: float) -> dict:
    """Two separate runs move apart as wholes (the rank test treats their samples as
    independent): a slower/faster ratio inside the between-run noise band is no verdict."""
    if band <= 0:
        return out
    note = f"unpaired: between-run noise ±{band:.0%}"
    ratio = out.get("ratio", math.nan)
    if out["verdict"] in ("slower", "faster") and 1 / (1 + band) <= ratio <= 1 + band:
        return {**out, "verdict": "inconclusive", "note": f"{note}; the ratio is inside it"}
    return {**out, "note": "; ".join(x for x in (out.get("note"), note) if x)}


def compare_row(
    b, n, base: ResultSet, new: ResultSet, metric: str, rules: Rules, noise: dict
) -> dict:
    out = {"case_id": b["case_id"], "label": label(b), "metric": metric, "regression": False}
    if b["status"] not in MEASURED or n["status"] not in MEASURED:
        return {**out, **lost_or_error(b, n)}
    bx, nx = base.samples_of(b, metric), new.samples_of(n, metric)
    out.update(base=_value(b, metric, bx), new=_value(n, metric, nx))
    if metric in TESTED:
        out = {**out, "ratio": value_ratio(out["base"], out["new"]), **judge(bx, nx, rules)}
        rounds = [round_band(rs.round_medians(row, metric)) for rs, row in ((base, b), (new, n))]
        here = b.get("host") == n.get("host") == socket.gethostname()  # calibrated here
        calibrated = noise.get(b["case_id"], 0.0) if metric == "median_ms" and here else 0.0
        band = max(*rounds, calibrated)
        out = within_noise(out, band)
        out["regression"] = out["verdict"] == "slower"
        return out
    if math.isnan(out["base"]) or math.isnan(out["new"]):
        return {**out, "verdict": "not_measured", "note": f"no {metric} on a side"}
    return {**out, **judge_value(out["base"], out["new"], metric, rules)}


def one_side(row, verdict: str, metric: str) -> dict:
    side = "base" if verdict == "base_only" else "new"
    value = row.get(metric) if row["status"] in MEASURED else None
    note = "" if row["status"] in MEASURED else _status_note(row)
    return {
        "case_id": row["case_id"], "label": label(row), "metric": metric, side: value,
        "verdict": verdict, "note": note, "regression": False,
    }  # fmt: skip


def context_warnings(b: pd.DataFrame, n: pd.DataFrame) -> list[str]:
    """Different devices, backends, mlx versions or BLAS libraries under MLX's CPU matmuls
    (docs/blas.md) make a comparison of machines, not code."""
    out = []
    for key in CONTEXT_KEYS:
        if key not in b or key not in n:
            continue
        bv, nv = set(b[key].dropna().astype(str)), set(n[key].dropna().astype(str))
        if bv and nv and bv != nv:
            out.append(f"base and new ran on different {key}: {sorted(bv)} vs {sorted(nv)}")
    for name, df in (("base", b), ("new", n)):
        if "dirty" in df and is_dirty(df).any():
            out.append(f"{name} includes results from a dirty tree (uncommitted changes)")
    return out


def comparison_table(rows: list[dict]) -> pd.DataFrame:
    """The COLUMNS table of compare-row dicts (the paired gate makes the same rows)."""
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["regression"] = table["regression"].fillna(False).astype(bool)
    table[["base_n", "new_n"]] = table[["base_n", "new_n"]].astype("Int64")
    return table


def compare(
    base: ResultSet,
    new: ResultSet,
    metric: str = "median_ms",
    rules=Rules(),  # noqa: B008 (frozen)
    noise: dict | None = None,
):
    """Join the picked rows of both sides on case_id and judge every case. `noise`: case_id ->
    between-run noise measured by `kvbench calibrate` on this host (analysis/calibrate.py)."""
    noise = noise or {}
    check_rules(metric, rules)
    b, n = base.pick(), new.pick()
    for side, rs, df in (("BASE", base, b), ("NEW", new, n)):
        if df["case_id"].duplicated().any():  # picked per (case, device, backend)
            devices = ", ".join(sorted(df["device"].dropna().astype(str).unique()))
            raise UserError(
                f"{rs.source}: {side} holds the same cases measured on several machines "
                f"({devices}); compare one machine's results per side"
            )
    b_by, n_by = b.set_index("case_id", drop=False), n.set_index("case_id", drop=False)
    rows = []
    for cid in b["case_id"]:
        if cid in n_by.index:
            rows.append(compare_row(b_by.loc[cid], n_by.loc[cid], base, new, metric, rules, noise))
        else:
            rows.append(one_side(b_by.loc[cid], "base_only", metric))
    rows += [one_side(n_by.loc[c], "new_only", metric) for c in n["case_id"] if c not in b_by.index]
    table = comparison_table(rows)
    both = b[b["case_id"].isin(n["case_id"])], n[n["case_id"].isin(b["case_id"])]
    notes = list(dict.fromkeys([*base.notes, *new.notes]))  # the reader's, once each
    warnings = context_warnings(*both) + notes
    return Comparison(base.heading(), new.heading(), metric, rules, table, warnings)
