"""Topic "formats vs fp16": each format (per kernel) against fp16 in the same workload: time
ratio, KV bytes ratio, the context where the verdict turns [formats]."""

from __future__ import annotations

import math

import pandas as pd

from kvbench.analysis.findings.common import (
    CONFIG_AXES,
    NAMED,
    Finding,
    baseline,
    config_of,
    is_peer,
    keyed,
    measured,
    stated,
    tally,
    varying,
)

TOPIC = "formats vs fp16"


def format_pairs(cur: pd.DataFrame) -> pd.DataFrame:
    """kvbench's rows of formats other than fp16 joined to the fp16 row of the same case (same
    kernel when fp16 ran with it, else the fastest fp16 kernel); peers' rows are left out (the
    peers topic compares them)."""
    d = measured(cur)
    if d.empty:
        return d
    d = d[~is_peer(d)]
    base, rest = d[d["kv_dtype"] == "fp16"], d[d["kv_dtype"] != "fp16"]
    if base.empty or rest.empty:
        return d.iloc[0:0]
    # unmatched rows retry against fp16 in any kernel, tile, rotation, ... (fp16 ran in fewer)
    loose = tuple(a for a in CONFIG_AXES if a not in ("kv_dtype", "layout"))
    return baseline(rest, base, "kv_dtype", loose=loose)


def crossing(per_ctx: pd.Series) -> str:
    """From a context -> verdict series (sorted): where the verdict turns for good, e.g.
    "faster from ctx 4096"; "" when it never turns or never settles."""
    v = list(per_ctx.items())
    for i in range(1, len(v)):
        tail = {x for _, x in v[i:]}
        if len(tail) == 1 and v[i - 1][1] != v[i][1] and v[i][1] in ("faster", "slower"):
            return f"{v[i][1]} from ctx {int(v[i][0])}"
    return ""


def _ctx_verdict(g: pd.DataFrame) -> pd.Series:
    """One verdict per context: the common one, or "same" when cases there disagree."""
    one = g.groupby("context_len")["verdict"].agg(lambda s: s.iloc[0] if s.nunique() == 1 else "")
    return one.replace("", "same").sort_index()


def find(cur: pd.DataFrame) -> list[Finding]:
    m = format_pairs(cur)
    if m.empty:
        return []
    # one line per format and kernel, and per value of any other configuration axis that varies
    # (a rotation, a V format, ...; tiles are pooled)
    more = [a for a in varying(m, CONFIG_AXES) if a not in NAMED]
    m = keyed(m, more)
    out = []
    for (fmt, kernel, _), g in m.groupby(["fmt", "kernel", "key"], sort=True):
        if more:
            kernel = f"{kernel} {config_of(g.iloc[0], more)}"
        mem = (g["kv_bytes"] / g["kv_bytes_b"]).median() if "kv_bytes_b" in g else math.nan
        cross = crossing(_ctx_verdict(g)) if g["context_len"].nunique() > 1 else ""
        by_ctx = g.groupby("context_len")["ratio"].median()  # over GQA, data, ...
        times = ", ".join(f"ctx {int(c)} ×{v:.2g}" for c, v in by_ctx.items())
        text = (
            f"{fmt} {kernel} time / fp16's: {times} ({tally(g['verdict'])} of {len(g)} cases)"
            + (f"; KV bytes ×{mem:.2g}" if pd.notna(mem) else "")
            + (f"; {cross}" if cross else "")
        )
        out.append(Finding(TOPIC, text, "formats", stated(g)))
    return out
