"""Topic "where formats pay off": where each format becomes faster than fp16: latency fitted
a + b * context per format and kernel (analysis/crossover.py), over kvbench's own decode rows
[formats]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.crossover import payoff_lines
from kvbench.analysis.findings.common import (
    CONFIG_AXES,
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
    # configuration axes besides format and kernel that vary: tile_kv, layout, a rotation, ...
    choices = [a for a in varying(d, CONFIG_AXES) if a not in ("kv_dtype", "group_size", "kernel")]
    shown = [*workload, *[c for c in choices if c != "tile_kv"]]  # tile_kv: in the line itself
    lines = payoff_lines(d, workload, choices, lambda r: where(r, shown))
    return [Finding(TOPIC, t, "formats", True) for t in lines]
