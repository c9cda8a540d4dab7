"""Topic "quality": per cache configuration, the quality columns a model-quality run records
(ppl, delta_ppl, kl_mean; absent: no finding) [quality]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import Finding, cache_config, source_of

TOPIC = "quality"
QUALITY = ("delta_ppl", "kl_mean", "ppl")


def find(cur: pd.DataFrame) -> list[Finding]:
    cols = [c for c in QUALITY if c in cur and cur[c].notna().any()]
    if not cols:
        return []
    d = cur[cur["status"] == "ok"] if "status" in cur else cur
    d = d.dropna(subset=cols, how="all")  # quality rows carry no time: not `measured`
    # llama.cpp's rows (kernel llama.cpp) stand apart: their reference is its own f16 cache
    d = d.assign(
        fmt=[
            cache_config(r) + (" (llama.cpp)" if source_of(r) == "llama.cpp" else "")
            for r in d.to_dict("records")
        ]
    )
    g = d.groupby("fmt", sort=False)[cols].median()
    names = {"delta_ppl": "Δppl {:+.3g}", "kl_mean": "KL {:.3g}", "ppl": "ppl {:.4g}"}
    out = []
    for f, r in g.iterrows():
        text = f"{f}: " + ", ".join(names[c].format(r[c]) for c in cols if pd.notna(r[c]))
        out.append(Finding(TOPIC, text, "quality", True))
    return out
