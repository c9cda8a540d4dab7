"""Topic "best tile": per context, which tile is fastest in how many configurations, and in
how many of those its lead over the next tile is beyond the threshold [tiles]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import (
    CONFIG_AXES,
    THRESHOLD,
    Finding,
    keyed,
    measured,
    ratio_ci,
    varying,
    workload_axes,
)

TOPIC = "best tile"


def find(cur: pd.DataFrame) -> list[Finding]:
    d = measured(cur)
    d = d[d["tile_kv"].notna()] if "tile_kv" in d else d.iloc[0:0]
    if d.empty or d["tile_kv"].nunique() < 2:
        return []
    axes = [a for a in workload_axes(d) + varying(d, CONFIG_AXES) if a != "tile_kv"]
    out = []
    for ctx, c in keyed(d, [a for a in axes if a != "context_len"]).groupby("context_len"):
        wins = []
        for _, g in c.groupby("key"):
            g = g.sort_values("median_ms")
            if len(g) > 1:
                _, lo, _ = ratio_ci(g.iloc[1], g.iloc[0])
                wins.append((int(g.iloc[0]["tile_kv"]), bool(lo > THRESHOLD)))
        if not wins:
            continue
        w = pd.DataFrame(wins, columns=["tile", "clear"])
        t = w.groupby("tile")["clear"].agg(["size", "sum"])
        t = t.sort_values(["size", "sum"], ascending=False, kind="stable")
        parts = [f"tile {tile} in {int(r['size'])} (clear lead in {int(r['sum'])})"
                 for tile, r in t.iterrows()]  # fmt: skip
        text = f"ctx {int(ctx)}: fastest tile over {len(w)} configurations: " + "; ".join(parts)
        out.append(Finding(TOPIC, text, "tiles", bool(w["clear"].any())))
    return out
