"""The trade-off in one view (analysis/findings/tradeoff.py): per (model, context), KL and, where
retrieval rows exist, the share of answers found, against stored bits per element, every cache
configuration of the run a point, the Pareto frontier a dotted line with its points labelled;
per model, the time per decode step of each format's fastest kernel against the same bits
(plotly only)."""

from __future__ import annotations

import math

import pandas as pd
from plotly.subplots import make_subplots

from kvbench.analysis.findings.tasks import ctx_text
from kvbench.analysis.findings.tradeoff import table as tradeoff_table
from kvbench.report.common import Figure, style, table
from kvbench.report.styles import format_color, grid, panel_pos

BITS_TICKS = [2, 3, 4, 5, 6, 8, 12, 16, 32]  # log x: the low-bit formats are not crowded by fp16
# a marker per family beyond the colour: TurboQuant mse / prod, rotated, per-channel keys
SYMBOLS = (("_mse", "diamond"), ("_prod", "triangle-up"), ("hadamard", "square"),
           ("channel keys", "cross"))  # fmt: skip
Y_TITLE = {"KL": "KL (nats), lower is better", "retrieval": "answers found (share)"}
NAMES = {
    "model": "model",
    "context_len": "context",
    "metric": "metric",
    "config": "cache",
    "bits": "bits/elem",
    "value": "KL or share found",
    "n": "tokens or trials",
    "frontier": "on frontier",
    "kernel": "fastest decode kernel",
    "step_ms": "ms per decode step",
    "timed_at": "timed at",
    "timed_model": "timed on",
}


def _panels(d: pd.DataFrame) -> list[tuple]:
    """(model, context, metric) panels, then one decode-time panel per model that has times
    (its context slot holds the model whose decode rows gave them)."""
    out = list(dict.fromkeys(zip(d["model"], d["context_len"], d["metric"])))
    timed = d.dropna(subset=["step_ms"]) if "step_ms" in d else d[:0]
    pairs = dict.fromkeys(zip(timed["model"], timed["timed_model"]))
    return out + [(m, t, "time") for m, t in pairs]


def _title(panel: tuple) -> str:
    model, ctx, metric = panel
    if metric == "time":  # ctx: the model whose decode rows were timed
        if ctx != model:
            return f"{model}: ms per step, fastest kernel ({ctx}'s decode rows)"
        return f"{model}: time per decode step (fastest kernel)"
    what = "KL" if metric == "KL" else "retrieval"
    return f"{model} · ctx {ctx_text(ctx)}: {what} vs bits"


def _symbol(config: str) -> str:
    return next((sym for key, sym in SYMBOLS if key in config), "circle")


def _add_points(fig, p: pd.DataFrame, y: str, pos: dict, shown: set) -> None:
    for r in p.itertuples():
        fig.add_scatter(
            x=[r.bits],
            y=[getattr(r, y)],
            mode="markers+text" if getattr(r, "frontier", False) else "markers",
            text=[r.config],
            textposition="top center",
            textfont={"size": 10},
            name=r.config,
            legendgroup=r.config,
            showlegend=r.config not in shown,
            marker={"color": format_color(r.kv_dtype), "size": 10, "symbol": _symbol(r.config),
                    "line": {"width": 1, "color": "#222"}},
            hovertemplate=f"{r.config}<br>%{{x:.4g}} bits<br>%{{y:.4g}}<extra></extra>",
            **pos,
        )  # fmt: skip
        shown.add(r.config)


def tradeoff(cur: pd.DataFrame) -> Figure | None:
    d = tradeoff_table(cur)
    if d.empty:
        return None
    panels = _panels(d)
    nrow, ncol = grid(len(panels), 2)
    fig = make_subplots(nrow, ncol, subplot_titles=[_title(p) for p in panels],
                        horizontal_spacing=0.1,
                        vertical_spacing=min(0.14, 0.5 / max(nrow - 1, 1)))  # fmt: skip
    fig.update_annotations(font_size=12)
    shown: set = set()
    for i, (model, ctx, metric) in enumerate(panels):
        pos = panel_pos(i, ncol)
        if metric == "time":
            p = d[d["model"] == model].dropna(subset=["step_ms"]).drop_duplicates("fmt")
            _add_points(fig, p.assign(frontier=True, config=p["fmt"]), "step_ms", pos, shown)
            fig.update_yaxes(type="log", title_text="ms per decode step", **pos)
        else:
            sel = (d["model"] == model) & (d["context_len"] == ctx) & (d["metric"] == metric)
            p = d[sel]
            _add_points(fig, p, "value", pos, shown)
            front = p[p["frontier"]].sort_values("bits")
            fig.add_scatter(x=front["bits"], y=front["value"], mode="lines", showlegend=False,
                            line={"color": "#444", "dash": "dot"}, hoverinfo="skip",
                            **pos)  # fmt: skip
            fig.update_yaxes(type="log" if metric == "KL" else "linear",
                             title_text=Y_TITLE[metric], **pos)  # fmt: skip
        bits = d.loc[d["model"] == model, "bits"]
        span = [math.log10(bits.min() / 1.12), math.log10(bits.max() * 1.12)]  # room at the ends
        fig.update_xaxes(title_text="stored bits per K/V element (log)", type="log",
                         tickvals=BITS_TICKS, range=span, **pos)  # fmt: skip
    note = (
        "Each cache configuration of the run is a point: its median KL divergence of next-token "
        "distributions against a float32 cache (or the share of retrieval answers found) "
        "against its stored bits per element (log axis), scales and norms included; marker: "
        "diamond TurboQuant mse, triangle TurboQuant prod, square rotated, cross per-channel "
        "keys. Dotted, with "
        "labels: the Pareto frontier (no other point has fewer-or-equal bits and a better "
        "figure). Last panels: each format's fastest kernel's median time per decode step in "
        "the run's timed decode rows ('timed at' in the table); a format without such rows "
        "has no time. The findings name the configurations never on a frontier."
    )
    title = "The trade-off: what each bit buys (KL, retrieval and decode time vs bits)"
    return Figure("tradeoff", title, style(fig, 160 + 480 * nrow), table(d, NAMES), note)
