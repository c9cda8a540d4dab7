"""history: every case's metric across commits, in commit order, with the step changes.

A series is one case on one machine: (case_id, device, backend). A case's history is per
machine, so a case with rows from several devices or backends has one series each, never one
timeline that mixes them (a change of machine is not a change of code).

A point is one code state: a commit, or a commit plus uncommitted changes (dirty), shown as
`<sha>+`. Within a point, each case uses its latest measured row (harness/store/results.py). Points
are in git order (`git rev-list --topo-order --all`) when every commit is in this repository's
history, else in the order of their first timestamp. A step is a pair of adjacent points of a
case that compare would call slower or faster (or worse / better for metrics without raw
samples): the same test, threshold and alpha as `kvbench compare`, within one series.
This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvbench.analysis.compare import judge, judge_value, value_ratio
from kvbench.analysis.rules import TESTED, Rules, check_rules
from kvbench.store import git
from kvbench.store.results import MEASURED, ResultSet, is_dirty, label, load_dir, pick_rows

COLUMNS = (
    "case_id", "label", "device", "backend", "metric", "point", "commit", "dirty", "timestamp",
    "run_id", "value", "n", "ratio", "p_value", "step",
)  # fmt: skip
STEPS = ("slower", "faster", "worse", "better")
SERIES = ("case_id", "device", "backend")  # one timeline each


@dataclass
class History:
    metric: str
    rules: Rules
    points: list[str]  # point names in order
    order: str  # "git" or "timestamp"
    table: pd.DataFrame  # COLUMNS, one row per case and point


def git_order(repo: str | Path = ".") -> dict[str, int]:
    """Short sha (12) -> position in a topological order of every commit in the repository."""
    return {sha[:12]: i for i, sha in enumerate(git.topo_order(repo))}


def _points(rows: pd.DataFrame, repo) -> tuple[pd.DataFrame, str]:
    rows = rows.copy()
    rows["commit"] = rows["commit"].fillna("nogit")
    for key in SERIES[1:]:  # unknown (e.g. imported without it): its own series, shown empty
        rows[key] = rows[key].astype(object).fillna("").astype(str) if key in rows else ""
    rows["dirty"] = is_dirty(rows)
    rows["point"] = rows["commit"].str[:12] + rows["dirty"].map({True: "+", False: ""})
    first = rows.groupby("point")["timestamp"].min()
    order = git_order(repo)
    if all(c in order for c in rows["commit"].unique()):
        key = {p: (order[p.rstrip("+")], p.endswith("+"), first[p]) for p in first.index}
        return rows, "git", sorted(first.index, key=key.get)
    return rows, "timestamp", sorted(first.index, key=lambda p: (str(first[p]), p))


def _step(prev: dict, cur: dict, rs: ResultSet, metric: str, rules: Rules) -> dict:
    if metric in TESTED:
        j = judge(rs.samples_of(prev["_row"], metric), rs.samples_of(cur["_row"], metric), rules)
    else:
        j = judge_value(prev["value"], cur["value"], metric, rules)
    step = j["verdict"] if j["verdict"] in STEPS else ""
    return {
        "ratio": value_ratio(prev["value"], cur["value"]),
        "p_value": j.get("p_value"),
        "step": step,
    }


def history(
    results_dir, metric: str = "median_ms", rules: Rules | None = None, repo="."
) -> History:
    rules = rules or Rules()
    check_rules(metric, rules)
    rs = load_dir(results_dir)
    rows, how, points = _points(rs.rows, repo)
    out = []
    for (case_id, device, backend), case_rows in rows.groupby(list(SERIES), sort=False):
        prev = None
        for point in points:
            picked = pick_rows(case_rows[case_rows["point"] == point])
            if picked.empty or picked.iloc[0]["status"] not in MEASURED:
                continue
            row = picked.iloc[0]
            value = row.get(metric)
            n = len(rs.samples_of(row, metric)) if metric in TESTED else None
            cur = {
                "case_id": case_id, "label": label(row), "device": device, "backend": backend,
                "metric": metric, "point": point,
                "commit": row["commit"], "dirty": row["dirty"], "timestamp": row["timestamp"],
                "run_id": row["run_id"], "value": value, "n": n, "_row": row,
            }  # fmt: skip
            if pd.isna(value):
                continue
            cur.update(_step(prev, cur, rs, metric, rules) if prev else {"step": ""})
            out.append(cur)
            prev = cur
    table = pd.DataFrame(out).reindex(columns=COLUMNS)
    return History(metric, rules, points, how, table)
