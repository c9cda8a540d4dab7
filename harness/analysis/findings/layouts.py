"""Topic "unified vs per-stream": unified against per-stream, same everything else, one line
per shared-prefix fraction [layouts]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import Finding, baseline, measured, span, tally

TOPIC = "unified vs per-stream"


def find(cur: pd.DataFrame) -> list[Finding]:
    d = measured(cur)
    if "layout" not in d or not {"unified", "per-stream"} <= set(d["layout"].dropna()):
        return []
    mem = "bytes_alloc" if d.get("bytes_alloc", pd.Series()).notna().any() else "kv_bytes"
    d = d.assign(mem_b=d[mem])
    m = baseline(d[d["layout"] == "unified"], d[d["layout"] == "per-stream"], "layout")
    if m.empty:
        return []
    out = []
    for frac, g in m.groupby(m["prefix_frac"].fillna(0.0), sort=True):
        saved = g["mem_b"] / g["mem_b_b"]
        text = (
            f"shared prefix {frac:g}: unified holds {span(saved)} the KV memory of per-stream "
            f"({mem}); latency {span(g['ratio'])} ({tally(g['verdict'])} of {len(g)} "
            f"pairs over seqs × ctx)"
        )
        out.append(Finding(TOPIC, text, "layouts", g["verdict"].isin(("faster", "slower")).any()))
    return out
