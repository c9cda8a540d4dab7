"""The KV share of a real model's step across context (issue #36 item 2; analysis/kv_share.py):
per model, each cache configuration's KV part (write + attention over the stored cache) as a
share of the decode step against context, the half line drawn; beside it, the KV part's time
in ms, so a format whose bytes are smaller but whose KV time is not shows it."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis import kv_share
from kvbench.report.common import Figure, style, table
from kvbench.report.styles import format_color, panel_pos, subplots


def kv_share_figure(cur: pd.DataFrame) -> Figure | None:
    d = kv_share.share_rows(cur)
    if d.empty:
        return None
    keys = ["model", "config", "kv_dtype", "context_len"]
    cols = ["median_ms", "write_ms", "attend_ms", "kv_ms", "kv_share", "kv_bytes"]
    g = d.groupby(keys, sort=False)[cols].median().reset_index().sort_values(keys)
    models = list(dict.fromkeys(g["model"]))
    titles = [t for m in models for t in (f"{m}: KV share of the step", f"{m}: KV part (ms)")]
    fig = subplots(titles, ncol_max=2, shared_y=False)
    for i, m in enumerate(models):
        p = g[g["model"] == m]
        for config, c in p.groupby("config", sort=False):
            color = format_color(c["kv_dtype"].iloc[0])
            for j, (col, scale) in enumerate((("kv_share", 100), ("kv_ms", 1))):
                fig.add_scatter(x=c["context_len"], y=c[col] * scale, mode="lines+markers",
                                name=config, legendgroup=config, showlegend=i == 0 and j == 0,
                                line={"color": color}, **panel_pos(2 * i + j, 2))  # fmt: skip
        fig.add_hline(y=50, line_dash="dash", line_color="#888", **panel_pos(2 * i, 2))
        fig.update_yaxes(title_text="% of the step", **panel_pos(2 * i, 2))
        fig.update_yaxes(title_text="ms (write + attend)", type="log", **panel_pos(2 * i + 1, 2))
    fig.update_xaxes(type="log", title_text="context (tokens)")
    note = (
        "model_decode rows timed with stages: every layer's K/V write (quantize on write) and "
        "attention over the stored cache, each timed on its own (the inputs they had in the "
        "step), as a share of the whole decode step's median; dashed: one half. Parts are "
        "separate timings, each with its own evaluation floor, so a share near or over 100% "
        "means the step is the KV part. Right: the KV part's own time. The findings give the "
        "context where each configuration passes half, and each format's KV bytes beside its "
        "KV time against fp16's."
    )
    names = {"model": "model", "config": "cache · kernel", "context_len": "context",
             "median_ms": "step ms", "write_ms": "write ms", "attend_ms": "attend ms",
             "kv_ms": "KV ms", "kv_share": "KV share", "kv_bytes": "KV bytes"}  # fmt: skip
    nrow = len(models)
    return Figure("kvshare", "How much of a model's decode step is the KV cache, across context",
                  style(fig, 140 + 320 * nrow), table(g, names), note)  # fmt: skip
