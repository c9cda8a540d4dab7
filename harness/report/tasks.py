"""Figures of a real model's quality at context and its task phases (pandas and plotly only):

* qualityctx: KL against stored bits per element, one panel per (model, context), the
  Pareto frontier of each panel dotted; beside it, KL by position in the scored half (4 runs).
* retrieval: one heatmap per (model, task, cache configuration): depth (rows) x context
  (columns), colour = accuracy, cell text = correct / trials.
* generate: per (model, context) bars of teacher-forced KL and of tokens to the first
  divergence from the float32 cache's greedy continuation.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvbench.analysis.findings.tasks import task_rows
from kvbench.report.common import Figure, pareto, style, table
from kvbench.report.styles import format_color, grid, panel_pos, subplots

# what a row's evidence cost (kernels/model/meter.py), shown in each figure's table
COST = {
    "wall_s": "wall s",
    "ref_wall_s": "f32 ref s",
    "prefill_tokens_per_s": "prefill tok/s",
    "decode_tokens_per_s": "decode tok/s",
}


def cost_columns(d: pd.DataFrame) -> list[str]:
    """The cost columns some row of d holds (older results have none)."""
    return [c for c in COST if c in d and d[c].notna().any()]


SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x", "cross")


def _symbol(config: str) -> str:
    """A marker per cache option beyond the format (sliding window, per-channel keys, a V
    format, an fp16 residual window, fp16 sinks); a circle for none."""
    for i, key in enumerate(("sliding window", "channel keys", "V ", "residual", "sinks")):
        if key in config:
            return SYMBOLS[i + 1]
    return SYMBOLS[0]


def quality_context(cur: pd.DataFrame) -> Figure | None:
    """KL vs bits per element per (model, context) with each panel's Pareto frontier, and KL
    by position (kl_pos1..4) per configuration."""
    d = task_rows(cur, "quality", "kl_mean")
    d = d[d["kl_mean"] > 0] if not d.empty else d
    if d.empty or "bits_per_elem" not in d:
        return None
    keys = ["model", "context_len", "config", "kv_dtype"]
    cols = ["bits_per_elem", "kl_mean", "n_scored"]
    cols += [c for c in (f"kl_pos{i}" for i in range(1, 5)) if c in d]
    cols += cost_columns(d)
    g = d.groupby(keys, sort=False)[cols].median().reset_index()
    panels = list(dict.fromkeys(zip(g["model"], g["context_len"])))
    has_pos = "kl_pos1" in g and g["kl_pos1"].notna().any()
    titles = []
    for m, c in panels:
        titles += [f"{m} · ctx {int(c)}: KL vs bits"]
        titles += [f"{m} · ctx {int(c)}: KL by position"] if has_pos else []
    ncol = 2 if has_pos else min(3, len(titles))
    nrow = grid(len(titles), ncol)[0]
    fig = make_subplots(
        nrow,
        ncol,
        subplot_titles=titles,
        horizontal_spacing=0.08,
        vertical_spacing=min(0.12, 0.5 / max(nrow - 1, 1)),
    )
    fig.update_annotations(font_size=12)
    shown = set()
    for i, (m, c) in enumerate(panels):
        p = g[(g["model"] == m) & (g["context_len"] == c)]
        pos = panel_pos(2 * i if has_pos else i, ncol)
        for r in p.itertuples():
            fig.add_scatter(
                x=[r.bits_per_elem],
                y=[r.kl_mean],
                mode="markers",
                name=r.config,
                legendgroup=r.config,
                showlegend=r.config not in shown,
                marker={"color": format_color(r.kv_dtype), "size": 10, "symbol": _symbol(r.config)},
                hovertemplate=f"{r.config}<br>%{{x:.3g}} bits<br>KL %{{y:.3g}}"
                f"<br>{int(r.n_scored)} tokens<extra></extra>",
                **pos,
            )
            shown.add(r.config)
        front = pareto(p, "bits_per_elem", "kl_mean")
        fig.add_scatter(
            x=front["bits_per_elem"],
            y=front["kl_mean"],
            mode="lines",
            line={"color": "#444", "dash": "dot"},
            showlegend=False,
            hoverinfo="skip",
            **pos,
        )
        fig.update_yaxes(type="log", title_text="KL (nats)", **pos)
        fig.update_xaxes(title_text="stored bits per K/V element", **pos)
        if has_pos:
            pos2 = panel_pos(2 * i + 1, ncol)
            for r in p.itertuples():
                ys = [getattr(r, f"kl_pos{k}") for k in range(1, 5)]
                fig.add_scatter(
                    x=[1, 2, 3, 4],
                    y=ys,
                    mode="lines+markers",
                    name=r.config,
                    legendgroup=r.config,
                    showlegend=False,
                    line={"color": format_color(r.kv_dtype)},
                    **pos2,
                )
            fig.update_yaxes(type="log", title_text="KL (nats)", **pos2)
            fig.update_xaxes(
                title_text="quarter of the scored half (1 = earliest)",
                tickvals=[1, 2, 3, 4],
                **pos2,
            )
    note = (
        "Left: each cache configuration's median KL divergence of next-token distributions "
        "against a float32 cache, over its quality rows, against stored bits per element "
        "(scales, fp16 sinks and residual included), one panel per model and context; dotted: "
        "the Pareto frontier (no other point has fewer-or-equal bits and lower KL). Right: KL "
        "in each quarter of the scored half of every chunk (kl_pos1..4), pooled over chunks; "
        "each quarter rests on a quarter of the scored tokens (n_scored in the table)."
    )
    names = {
        "model": "model",
        "context_len": "context",
        "config": "cache",
        "bits_per_elem": "bits/elem",
        "kl_mean": "KL",
        "n_scored": "tokens",
        "kl_pos1": "KL q1",
        "kl_pos2": "KL q2",
        "kl_pos3": "KL q3",
        "kl_pos4": "KL q4",
        **COST,
    }
    title = "Quality against bits per element, per model and context, and by position"
    return Figure("qualityctx", title, style(fig, 140 + 340 * nrow), table(g, names), note)


def retrieval(cur: pd.DataFrame) -> Figure | None:
    """Depth x context heatmaps of accuracy, one per (model, task, configuration)."""
    d = task_rows(cur, "retrieval", "n_correct")
    if d.empty:
        return None
    keys = ["model", "task", "config"]
    by = d.groupby([*keys, "depth", "context_len"], sort=False)
    g = by[["n_correct", "n_trials"]].sum()
    cost = cost_columns(d)
    g = g.join(by[cost].median()).reset_index() if cost else g.reset_index()
    panels = list(dict.fromkeys(zip(g["model"], g["task"], g["config"])))
    nrow, ncol = grid(len(panels), 3)
    fig = make_subplots(
        nrow,
        ncol,
        subplot_titles=[f"{t} · {c}" for _, t, c in panels],
        vertical_spacing=min(0.12, 0.5 / max(nrow - 1, 1)),
        horizontal_spacing=0.08,
    )
    ctxs = sorted(g["context_len"].unique())
    depths = sorted(g["depth"].unique())
    for i, (m, t, c) in enumerate(panels):
        p = g[(g["model"] == m) & (g["task"] == t) & (g["config"] == c)]
        z = [[None] * len(ctxs) for _ in depths]
        text = [[""] * len(ctxs) for _ in depths]
        for r in p.itertuples():
            yi, xi = depths.index(r.depth), ctxs.index(r.context_len)
            z[yi][xi] = r.n_correct / r.n_trials
            text[yi][xi] = f"{int(r.n_correct)}/{int(r.n_trials)}"
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[str(int(x)) for x in ctxs],
                y=[f"{y:.0%}" for y in depths],
                text=text,
                texttemplate="%{text}",
                zmin=0,
                zmax=1,
                colorscale="RdYlGn",
                showscale=i == 0,
                colorbar={"title": "accuracy"},
                hovertemplate="ctx %{x}<br>depth %{y}<br>%{text}<extra>" + c + "</extra>",
            ),
            **panel_pos(i, ncol),
        )
    fig.update_xaxes(title_text="context (tokens)", type="category")
    fig.update_yaxes(title_text="needle depth", type="category")
    note = (
        "One heatmap per task and cache configuration: rows = where the needle sits in the "
        "haystack (0% = its start), columns = context length in tokens; colour = accuracy "
        "(exact match of the greedily generated answer against the truth), text = correct / "
        "trials. A cell rests on its trials alone: 2 of 2 and 0 of 2 are not told apart "
        "by a 95% Wilson interval (the findings give it)."
    )
    names = {
        "model": "model",
        "task": "task",
        "config": "cache",
        "context_len": "context",
        "depth": "depth",
        "n_correct": "correct",
        "n_trials": "trials",
        **COST,
    }
    return Figure(
        "retrieval",
        "Retrieval: depth x context per cache configuration",
        style(fig, 140 + 300 * nrow),
        table(g, names),
        note,
    )


def generate(cur: pd.DataFrame) -> Figure | None:
    """Per (model, context): teacher-forced KL and tokens to the first divergence."""
    d = task_rows(cur, "generate", "gen_kl_mean")
    if d.empty:
        return None
    panels = list(dict.fromkeys(zip(d["model"], d["context_len"])))
    titles = []
    for m, c in panels:
        titles += [f"{m} · ctx {int(c)}: teacher-forced KL", f"{m} · ctx {int(c)}: first diverge"]
    fig = subplots(titles, ncol_max=2, shared_y=False)
    for i, (m, c) in enumerate(panels):
        p = d[(d["model"] == m) & (d["context_len"] == c)].sort_values("gen_kl_mean")
        colors = [format_color(f) for f in p["kv_dtype"]]
        for j, col in enumerate(("gen_kl_mean", "gen_first_diverge")):  # left, right panel
            pos = panel_pos(2 * i + j, 2)
            fig.add_bar(x=p["config"], y=p[col], marker_color=colors, showlegend=False, **pos)
        fig.update_yaxes(type="log", title_text="KL (nats)", **panel_pos(2 * i, 2))
        fig.update_yaxes(title_text="tokens", **panel_pos(2 * i + 1, 2))
    note = (
        "After each prompt the model generates greedily with the cache in the configuration's "
        "format, each new K/V written in it. Left: KL divergence against the float32 cache "
        "along the float32 cache's own continuation (the format's cache fed the same tokens), "
        "mean over gen_tokens_scored positions. Right: tokens generated before the first one "
        "that differs from the float32 cache's (mean over prompts)."
    )
    names = {
        "config": "cache",
        "context_len": "context",
        "gen_kl_mean": "KL",
        "gen_kl_max": "KL max",
        "gen_first_diverge": "first diverge",
        "gen_first_diverge_min": "least",
        "gen_agree": "agreement",
        "gen_tokens_scored": "positions",
        "quantized_kv_start": "qstart",
        **{c: COST[c] for c in cost_columns(d)},
    }
    nrow = grid(len(titles), 2)[0]
    return Figure(
        "generate",
        "Decode-time error against the float32 cache",
        style(fig, 140 + 320 * nrow),
        table(d, names),
        note,
    )
