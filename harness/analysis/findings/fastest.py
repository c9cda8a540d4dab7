"""Topic "fastest": per workload (context, GQA, ... as they vary), the fastest configuration and
its lead over the next one [latency]."""

from __future__ import annotations

import math

import pandas as pd

from kvbench.analysis.findings.common import (
    CONFIG_AXES,
    Finding,
    config_of,
    interval,
    keyed,
    measured,
    ratio_ci,
    varying,
    verdict,
    where,
    workload_axes,
)

TOPIC = "fastest"


def find(cur: pd.DataFrame) -> list[Finding]:
    d = measured(cur)
    choices = varying(d, CONFIG_AXES)
    if d.empty or not choices or choices == ["layout"]:  # layout alone: the layouts topic
        return []
    group = ["phase", "context_len", *[a for a in workload_axes(d) if a != "context_len"]]
    group = list(dict.fromkeys(a for a in group if a in d and d[a].notna().any()))
    out = []
    d = d.sort_values(group)
    for _, g in keyed(d, group).groupby("key", sort=False):
        if len(g) < 2:
            continue
        g = g.sort_values("median_ms")
        out.append(_lead(g.iloc[0], g.iloc[1], group, varying(g, CONFIG_AXES) or choices))
    return out


def _lead(best, nxt, group: list, choices: list) -> Finding:
    """The fastest configuration of a group and its lead over the next one."""
    r, lo, hi = ratio_ci(nxt, best)
    clear = verdict(lo, hi) == "slower"  # the next one is slower beyond the threshold
    head = f"{where(best, group)}: {config_of(best, choices)}"
    if clear:
        text = (f"{head} is fastest, {best['median_ms']:.3g} ms; {r:.2f}× "
                f"{interval(lo, hi)} ahead of {config_of(nxt, choices)}")  # fmt: skip
    else:
        why = "too few samples to judge" if math.isnan(lo) else "no difference measured"
        text = (f"{head} ({best['median_ms']:.3g} ms) and {config_of(nxt, choices)} "
                f"({nxt['median_ms']:.3g} ms) lead: {why} "
                f"(×{r:.2f} {interval(lo, hi)})")  # fmt: skip
    return Finding(TOPIC, text, "latency", clear)
