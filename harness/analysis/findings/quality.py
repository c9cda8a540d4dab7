"""Topic "quality": per cache configuration, the quality columns a model-quality run records
(ppl, delta_ppl, kl_mean; absent: no finding) [quality]. Rows group through common.group_axes:
each model and context apart (a median across models is no model's figure), named in the line
where the rows hold more than one; the workload's other axes (text, chunks) are pooled."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import (
    KEPT_APART,
    WORKLOAD_AXES,
    Finding,
    apart_text,
    cache_config,
    group_axes,
    groups,
    source_of,
)

TOPIC = "quality"
QUALITY = ("delta_ppl", "kl_mean", "ppl")
NAMES = {"delta_ppl": "Δppl {:+.3g}", "kl_mean": "KL {:.3g}", "ppl": "ppl {:.4g}"}


def find(cur: pd.DataFrame) -> list[Finding]:
    cols = [c for c in QUALITY if c in cur and cur[c].notna().any()]
    if not cols:
        return []
    d = cur[cur["status"] == "ok"] if "status" in cur else cur
    d = d.dropna(subset=cols, how="all")  # quality rows carry no time: not `measured`
    # llama.cpp's rows (kernel llama.cpp) stand apart: their reference is its own f16 cache
    records = d.to_dict("records")
    d = d.assign(fmt=[cache_config(r) for r in records], source=[source_of(r) for r in records])
    pooled = [a for a in WORKLOAD_AXES if a not in KEPT_APART]
    # the configuration's choices are in fmt too
    axes = [*group_axes(d, pooled=pooled), "fmt", "source"]
    out = []
    for values, g in groups(d, axes):
        r = g[cols].median()
        peer = ("llama.cpp",) if values["source"] == "llama.cpp" else ()
        text = f"{values['fmt']}{apart_text(values, d, *peer)}: " + ", ".join(
            NAMES[c].format(r[c]) for c in cols if pd.notna(r[c])
        )
        out.append(Finding(TOPIC, text + saving_text(g, d, values, axes), "quality", True))
    return out


def saving_text(g: pd.DataFrame, d: pd.DataFrame, values: dict, axes: list) -> str:
    """', 23.9 MiB = 53% of fp16's': the cache's bytes against fp16's at the same workload
    (its fp16 row where the run has one, else by formula: analysis/answer.py), issue 44; a
    cache policy's row by its kept bytes per context token (answer.context_bytes)."""
    from kvbench.analysis.answer import context_bytes, fp16_bytes

    if "kv_bytes" not in g or g["kv_bytes"].isna().all():
        return ""
    same = d
    for a in axes:
        if a not in ("fmt", "source") and a in d:
            same = same[same[a].map(str) == str(values[a])]
    base, _ = fp16_bytes(same)
    kv = float(context_bytes(g).median())  # a policy's row: per context token, as the answer
    return f", {kv / 2**20:,.3g} MiB = {100 * kv / base:.0f}% of fp16's" if base else ""
