"""Topic "where formats pay off": where each format becomes faster than fp16: latency fitted
a + b * context per format and kernel (analysis/crossover.py), over kvbench's own decode rows
[formats]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.crossover import payoff_lines
from kvbench.analysis.findings.common import (
    Finding,
    is_peer,
    measured,
    varying,
    where,
    workload_axes,
)

TOPIC = "where formats pay off"


def find(cur: pd.DataFrame) -> list[Finding]:
    d = measured(cur)
    if d.empty:
        return []
    d = d[~is_peer(d)]
    workload = [a for a in workload_axes(d) if a not in ("context_len", "phase")]
    choices = varying(d, ("tile_kv", "layout"))
    shown = [*workload, *[c for c in choices if c == "layout"]]  # tile_kv: in the line itself
    lines = payoff_lines(d, workload, choices, lambda r: where(r, shown))
    return [Finding(TOPIC, t, "formats", True) for t in lines]
