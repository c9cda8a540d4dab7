"""Which cache for this memory (analysis/findings/budget.py): per (model, context), KL and, where
retrieval rows exist, the share of answers found, against the bytes the cache holds per context
token; formats and cache policies on one axis, a colour per policy (the full cache its own),
the Pareto frontier a dotted line with its points labelled (plotly only)."""

from __future__ import annotations

import math

import pandas as pd
from plotly.subplots import make_subplots

from kvbench.analysis.findings.budget import FULL, points
from kvbench.analysis.findings.tasks import ctx_text
from kvbench.report.common import Figure, style, table
from kvbench.report.styles import ORDINAL, grid, panel_pos

Y_TITLE = {"KL": "KL (nats), lower is better", "retrieval": "answers found (share)"}
NAMES = {
    "model": "model",
    "context_len": "context",
    "metric": "metric",
    "label": "cache (format, policy)",
    "bytes_per_token": "bytes per context token",
    "value": "KL or share found",
    "n": "tokens or trials",
    "frontier": "on frontier",
}


def _colors(policies) -> dict[str, str]:
    """The full cache grey, each policy name its own colour (ratios share it)."""
    names = [p.split(" ")[0] for p in dict.fromkeys(policies) if p != FULL]
    out = {n: ORDINAL[i % len(ORDINAL)] for i, n in enumerate(dict.fromkeys(names))}
    return {FULL: "#555555", **out}


def _name(policy: str) -> str:
    return policy if policy == FULL else policy.split(" ")[0]


def _add(fig, p: pd.DataFrame, colors: dict, pos: dict, shown: set) -> None:
    for r in p.itertuples():
        name = _name(r.policy)
        fig.add_scatter(
            x=[r.bytes_per_token], y=[r.value], name=name, legendgroup=name,
            mode="markers+text" if r.frontier else "markers", text=[r.label],
            textposition="top center", textfont={"size": 10}, showlegend=name not in shown,
            marker={"color": colors[name], "size": 10, "line": {"width": 1, "color": "#222"},
                    "symbol": "circle" if name == FULL else "diamond"},
            hovertemplate=f"{r.label}<br>%{{x:,.0f}} B/token<br>%{{y:.4g}}<extra></extra>",
            **pos,
        )  # fmt: skip
        shown.add(name)


def budget(cur: pd.DataFrame) -> Figure | None:
    d = points(cur)
    if d.empty or d["policy"].eq(FULL).all():
        return None  # no policy in the run: the trade-off figure (bits per element) says it
    panels = list(dict.fromkeys(zip(d["model"], d["context_len"], d["metric"])))
    nrow, ncol = grid(len(panels), 2)
    titles = [f"{m} · ctx {ctx_text(c)}: {t} vs bytes per token" for m, c, t in panels]
    fig = make_subplots(nrow, ncol, subplot_titles=titles, horizontal_spacing=0.1,
                        vertical_spacing=min(0.14, 0.5 / max(nrow - 1, 1)))  # fmt: skip
    fig.update_annotations(font_size=12)
    colors, shown = _colors(d["policy"]), set()
    for i, (model, ctx, metric) in enumerate(panels):
        pos = panel_pos(i, ncol)
        p = d[(d["model"] == model) & (d["context_len"] == ctx) & (d["metric"] == metric)]
        _add(fig, p, colors, pos, shown)
        front = p[p["frontier"]].sort_values("bytes_per_token")
        if metric == "KL":
            front = front[front["value"] > 0]  # the float32 cache's KL 0 has no place on a log y
        fig.add_scatter(x=front["bytes_per_token"], y=front["value"], mode="lines",
                        showlegend=False, line={"color": "#444", "dash": "dot"},
                        hoverinfo="skip", **pos)  # fmt: skip
        fig.update_yaxes(type="log" if metric == "KL" else "linear", title_text=Y_TITLE[metric],
                         **pos)  # fmt: skip
        b = p["bytes_per_token"]
        span = [math.log10(b.min() / 1.3), math.log10(b.max() * 1.3)]
        fig.update_xaxes(title_text="bytes per context token (log)", type="log", range=span,
                         **pos)  # fmt: skip
    note = (
        "Each cache configuration is a point: a format stores every token in fewer bytes, a "
        "policy keeps fewer tokens (colour: the policy; circles: the full cache, every token "
        "kept), both measured as the bytes the cache holds per context token (K and V of every "
        "layer, scales and the policy's own state included). y: median KL of next-token "
        "distributions against a float32 cache (log: the float32 cache itself, KL 0, is in the "
        "table only), or the share of retrieval answers found. "
        "Dotted, with labels: the Pareto frontier; for a memory budget, the best cache is the "
        "frontier point furthest right within it. The findings list it budget by budget."
    )
    title = "Which cache for this memory: formats and policies vs bytes per context token"
    return Figure("budget", title, style(fig, 160 + 480 * nrow), table(d, NAMES), note)
