"""Renderings of a Comparison: terminal table, markdown (a pull-request comment), CSV, JSON."""

from __future__ import annotations

import json
import math

import pandas as pd

from kvbench.analysis.compare import COLUMNS, Comparison

ORDER = {
    "slower": 0,
    "error": 1,
    "lost": 2,
    "worse": 3,
    "faster": 4,
    "better": 5,
    "inconclusive": 6,
}
PAIRED = ("slower", "faster", "unchanged", "inconclusive", "worse", "better")


def _num(v, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.{digits}g}"


def _p(p) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return ""
    return "<1e-4" if p < 1e-4 else f"{p:.2g}"


def _ci(lo, hi) -> str:
    return "" if lo is None or math.isnan(lo) else f"{lo:.3f}-{hi:.3f}"


def _n(row) -> str:
    return "" if pd.isna(row["base_n"]) else f"{int(row['base_n'])}/{int(row['new_n'])}"


def _cells(row) -> dict:
    ratio = "" if pd.isna(row["ratio"]) else f"{row['ratio']:.3f}x"
    return {
        "case": row["label"], "base": _num(row["base"]), "new": _num(row["new"]),
        "ratio": ratio, "95% CI": _ci(row["ratio_ci_low"], row["ratio_ci_high"]),
        "p": _p(row["p_value"]), "n b/n": _n(row), "verdict": row["verdict"], "note": row["note"],
    }  # fmt: skip


def summary_line(cmp: Comparison) -> str:
    counts = cmp.table["verdict"].value_counts()
    parts = [f"{counts[v]} {v}" for v in (*PAIRED, "error", "lost", "not_measured") if v in counts]
    parts += [
        f"{counts[v]} {v.replace('_', ' ')}" for v in ("base_only", "new_only") if v in counts
    ]
    gate = f"{len(cmp.regressions)} regression(s)" if len(cmp.regressions) else "no regression"
    return f"{', '.join(parts)}; {gate}"


def _paired(cmp: Comparison) -> pd.DataFrame:
    return cmp.table[~cmp.table["verdict"].isin(("base_only", "new_only"))]


def _apart(cmp: Comparison) -> list[str]:
    lines = []
    for verdict, where in (("base_only", "only in base"), ("new_only", "only in new")):
        rows = cmp.table[cmp.table["verdict"] == verdict]
        lines += [f"{where}: {r.label} ({r.case_id})" for r in rows.itertuples()]
    return lines


def terminal(cmp: Comparison) -> str:
    r = cmp.rules
    head = (
        f"compare {cmp.metric}: base {cmp.base} -> new {cmp.new}  "
        f"(ratio new/base; slower/faster need p < {r.alpha:g} and a ratio beyond {r.threshold:g}x)"
    )
    cells = pd.DataFrame([_cells(row) for _, row in _paired(cmp).iterrows()])
    body = cells.to_string(index=False) if not cells.empty else "(no case on both sides)"
    return "\n".join([head, body, *_apart(cmp), summary_line(cmp)])


def markdown(cmp: Comparison) -> str:
    r = cmp.rules
    paired = _paired(cmp)
    paired = paired.assign(_o=paired["verdict"].map(ORDER).fillna(9)).sort_values(
        "_o", kind="stable"
    )
    cells = [_cells(row) for _, row in paired.iterrows()]
    lines = [
        f"### kvbench compare: `{cmp.metric}`",
        "",
        f"base `{cmp.base}` → new `{cmp.new}`. Ratio is new/base; **slower**/**faster** need "
        f"a Mann-Whitney U p < {r.alpha:g} and a ratio beyond {r.threshold:g}×.",
        "",
        f"**{summary_line(cmp)}**",
        "",
    ]
    if cells:
        keys = list(cells[0])
        lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        for c, regression in zip(cells, paired["regression"], strict=True):
            c["verdict"] = f"**{c['verdict']}**" if regression else c["verdict"]
            lines.append("| " + " | ".join(str(c[k]).replace("|", "\\|") for k in keys) + " |")
    lines += [f"- {line}" for line in _apart(cmp)]
    lines += [f"> warning: {w}" for w in cmp.warnings]
    return "\n".join(lines)


def to_csv(cmp: Comparison) -> str:
    return cmp.table[list(COLUMNS)].to_csv(index=False)


def _json_value(v):
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v.item() if hasattr(v, "item") else v


def to_json(cmp: Comparison) -> str:
    records = [
        {k: _json_value(v) for k, v in row.items()}
        for row in cmp.table[list(COLUMNS)].astype(object).to_dict("records")
    ]
    return json.dumps(records, indent=1)


FORMATS = {"terminal": terminal, "markdown": markdown, "csv": to_csv, "json": to_json}
