"""Text, CSV and JSON renderings of a History (analysis/history.py computes it; this module
only formats it, as compare_text.py does for a Comparison)."""

from __future__ import annotations

import json
import math

import pandas as pd

from kvbench.analysis.history import SERIES, History


def _cell(value: float, step: str) -> str:
    mark = {"slower": " ^", "worse": " ^", "faster": " v", "better": " v"}.get(step, "")
    return f"{value:.4g}{mark}"


def terminal(h: History) -> str:
    head = (
        f"history of {h.metric}: {len(h.points)} code states in {h.order} order "
        f"(^ slower/worse, v faster/better than the previous state; p < {h.rules.alpha:g}, "
        f"ratio beyond {h.rules.threshold:g}x; one series per case, device and backend)"
    )
    if h.table.empty:
        return head + "\n(no measured rows)"
    t = h.table.assign(cell=[_cell(v, s) for v, s in zip(h.table["value"], h.table["step"])])
    index = ["label", "device", "backend"]
    wide = t.pivot_table(index=index, columns="point", values="cell", aggfunc="first", sort=False)
    wide = wide.reindex(columns=[p for p in h.points if p in wide.columns]).fillna("")
    lines = [head, wide.to_string()]
    steps = t[t["step"] != ""]
    for r in steps.itertuples():
        p = "" if r.p_value is None or pd.isna(r.p_value) else f", p={r.p_value:.2g}"
        where = f"{r.device} [{r.backend}]"
        lines.append(f"step: {r.label} on {where}: {r.ratio:.3f}x {r.step} at {r.point}{p}")
    lines.append(f"{len(steps)} step change(s)")
    series = t.drop_duplicates(list(SERIES)).groupby("case_id").size()
    if (series > 1).any():
        lines.append(
            f"{int((series > 1).sum())} case(s) ran on several devices or backends: one series "
            "each (compare values only within a device)"
        )
    return "\n".join(lines)


def to_csv(h: History) -> str:
    return h.table.to_csv(index=False)


def to_json(h: History) -> str:
    records = h.table.astype(object).to_dict("records")
    clean = [
        {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in r.items()}
        for r in records
    ]
    return json.dumps(clean, indent=1, default=str)


FORMATS = {"terminal": terminal, "csv": to_csv, "json": to_json}
