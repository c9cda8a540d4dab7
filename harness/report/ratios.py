"""Figures whose question is a ratio or a roof: format / fp16 against context, unified /
per-stream against the shared-prefix fraction, the roofline, and the quality per format.

Ratios join each row to its baseline row (same case but the one axis compared) with
harness/analysis/findings.py's `baseline`, so the figure shows exactly the numbers the findings
state; error bars are the conservative interval low_a / high_b .. high_a / low_b of the two
medians' 95% CIs. Roofline: arithmetic intensity = flops / (bytes read + written) of the byte
model; achieved GB/s and GFLOP/s = those / median time; the roof is the bandwidth kvbench
measured in the same run (peak_gbps) times the intensity.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvbench.analysis.findings import baseline, format_pairs
from kvbench.report.common import Figure, log_ticks, measured, style, table
from kvbench.report.styles import (
    ORDINAL,
    axis_titles,
    context_ticks,
    format_color,
    grid,
    lines,
    panel_pos,
    subplots,
)

RATIO_TABLE = {
    "label": "case",
    "context_len": "context (tokens)",
    "median_ms": "median (ms)",
    "median_ms_b": "baseline median (ms)",
    "label_b": "baseline",
    "ratio": "ratio",
    "lo": "ratio low",
    "hi": "ratio high",
    "verdict": "verdict",
}


def _err(m: pd.DataFrame) -> pd.DataFrame:
    return m.assign(err_plus=m["hi"] - m["ratio"], err_minus=m["ratio"] - m["lo"])


def formats(cur: pd.DataFrame) -> Figure | None:
    m = format_pairs(cur)
    if m.empty or m["context_len"].isna().all():
        return None
    m = _err(m)
    fig, titles, nrow = lines(m, "context_len", "ratio", err=("err_plus", "err_minus"))
    context_ticks(fig, m["context_len"])
    fig.update_yaxes(type="log", **log_ticks(m[["lo", "hi"]].stack()))
    fig.add_hline(y=1.0, line_dash="dash", line_color="#444", row="all", col="all")
    axis_titles(fig, nrow, "context length (tokens)", "time / fp16 time")
    title = "Each format's time over fp16's, against context (below 1: faster than fp16)"
    note = (
        "Each row's median over the fp16 row of the same case (same kernel when fp16 ran with "
        "it, else the fastest fp16 kernel); bars: the conservative interval from both medians' "
        "95% CIs. Dashed line: as fast as fp16. The findings call a format faster or slower "
        "only where the whole interval is beyond 1.1×."
    )
    tab = table(m.sort_values(["fmt", "kernel", "context_len"]), RATIO_TABLE)
    return Figure("formats", title, style(fig, 120 + 300 * nrow), tab, note)


def _layout_pairs(cur: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    d = measured(cur)
    if "layout" not in d or not {"unified", "per-stream"} <= set(d["layout"].dropna()):
        return d.iloc[0:0], ""
    mem = "bytes_alloc" if d["bytes_alloc"].notna().any() else "kv_bytes"
    d = d.assign(mem_b=d[mem], prefix_frac=d["prefix_frac"].fillna(0.0))
    m = baseline(d[d["layout"] == "unified"], d[d["layout"] == "per-stream"], "layout")
    if m.empty:
        return m, mem
    return _err(m.assign(mem_ratio=m["mem_b"] / m["mem_b_b"])), mem


def layouts(cur: pd.DataFrame) -> Figure | None:
    """Unified / per-stream latency and memory against the shared-prefix fraction: one line
    per sequence count, one panel column per context."""
    m, mem = _layout_pairs(cur)
    if m.empty:
        return None
    ctxs = sorted(m["context_len"].unique())
    titles = [f"{q} · ctx {int(c)}" for q in ("latency", "memory") for c in ctxs]
    fig = subplots(titles, ncol_max=len(ctxs), shared_y=False)
    seqs = sorted(m["n_seqs"].unique())
    for row, (y, err) in enumerate((("ratio", True), ("mem_ratio", False))):
        for j, c in enumerate(ctxs):
            for k, n in enumerate(seqs):
                s = m[(m["context_len"] == c) & (m["n_seqs"] == n)].sort_values("prefix_frac")
                error = {"type": "data", "symmetric": False, "array": s["err_plus"],
                         "arrayminus": s["err_minus"]} if err else None  # fmt: skip
                fig.add_scatter(
                    x=s["prefix_frac"], y=s[y], mode="lines+markers", name=f"seqs {int(n)}",
                    legendgroup=f"seqs {int(n)}", showlegend=row == 0 and j == 0,
                    error_y=error, hovertext=s["label"], line={"color": ORDINAL[k % 8]},
                    marker={"color": ORDINAL[k % 8], "size": 8}, row=row + 1, col=j + 1,
                )  # fmt: skip
    fig.add_hline(y=1.0, line_dash="dash", line_color="#444", row="all", col="all")
    fig.update_yaxes(type="log", row=1, **log_ticks(m[["lo", "hi", "ratio"]].stack()))
    fig.update_xaxes(title_text="shared-prefix fraction", row=2)
    fig.update_yaxes(title_text="unified / per-stream time", row=1, col=1)
    fig.update_yaxes(title_text="unified / per-stream memory", row=2, col=1)
    for r in (1, 2):  # one y scale per row (time and memory), shared along it
        fig.update_yaxes(matches=f"y{(r - 1) * len(ctxs) + 1 if r > 1 else ''}", row=r)
    fig.layout.yaxis.matches = None
    fig.layout[f"yaxis{len(ctxs) + 1}"].matches = None
    title = "Unified over per-stream: latency and memory against the shared-prefix fraction"
    note = (
        f"Each unified case over the per-stream case with the same sequences, context and "
        f"prefix. Memory: {mem} (cells allocated for unified, the per-stream buffers "
        "otherwise). Latency bars: the conservative interval from both medians' 95% CIs. "
        "Below 1: unified is smaller or faster."
    )
    cols = {**RATIO_TABLE, "n_seqs": "seqs", "prefix_frac": "prefix", "mem_ratio": "memory ratio"}
    tab = table(m.sort_values(["context_len", "n_seqs", "prefix_frac"]), cols)
    return Figure("layouts", title, style(fig, 620), tab, note)


def roofline(cur: pd.DataFrame) -> Figure | None:
    d = measured(cur)
    d = d[d["flops"].notna() & d["bytes_read"].notna()]
    if d.empty:
        return None
    d = d.assign(ai=d["flops"] / (d["bytes_read"] + d["bytes_written"].fillna(0)))
    d = d.assign(gflops=d["flops"] / (d["median_ms"] / 1e3) / 1e9)
    fig = subplots(["achieved GB/s", "achieved GFLOP/s"], ncol_max=2, shared_y=False)
    kernels = sorted(d["kernel"].unique())
    for f, p in d.groupby("fmt", sort=True):
        for i, y in enumerate(("gbps", "gflops")):
            fig.add_scatter(
                x=p["ai"], y=p[y], mode="markers", name=f, legendgroup=f, showlegend=i == 0,
                hovertext=p["label"], marker={"color": format_color(f), "size": 9,
                "symbol": [["circle", "square", "diamond", "x", "cross", "star", "triangle-up",
                            "pentagon"][kernels.index(k) % 8] for k in p["kernel"]]},
                row=1, col=i + 1,
            )  # fmt: skip
    _roofs(fig, d)
    ai = [d["ai"].min() / 1.5, d["ai"].max() * 1.5]
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP / byte)", **log_ticks(ai))
    peaks = d["peak_gbps"].dropna()
    gb = pd.concat([d["gbps"], peaks])
    fig.update_yaxes(type="log", title_text="GB/s", col=1, **log_ticks(gb))
    fl = pd.concat([d["gflops"], peaks * ai[0], peaks * ai[1]])
    fig.update_yaxes(type="log", title_text="GFLOP/s", col=2, **log_ticks(fl))
    title = "Roofline: arithmetic intensity against achieved bandwidth and compute"
    note = (
        "Intensity = flops / (bytes read + written) of the byte model; achieved = each over "
        "the median time. Dashed: the read bandwidth kvbench measured in the same run "
        "(peak_gbps) and, on the right, that bandwidth × intensity (the memory roof). No "
        "compute peak is measured, so no flat compute roof is drawn. Marker: kernel "
        f"({', '.join(kernels)}); colour: format."
    )
    cols = {"label": "case", "ai": "FLOP/byte", "gbps": "GB/s", "gflops": "GFLOP/s"}
    cols.update(peak_gbps="measured peak (GB/s)", pct_peak_bw="% of peak")
    return Figure("roofline", title, style(fig, 460), table(d.sort_values("ai"), cols), note)


def _roofs(fig: go.Figure, d: pd.DataFrame) -> None:
    lo, hi = float(d["ai"].min()) / 1.5, float(d["ai"].max()) * 1.5
    for peak in d["peak_gbps"].dropna().unique():
        roof = {"mode": "lines", "meta": "ref", "line": {"dash": "dash", "color": "#444"}}
        fig.add_scatter(x=[lo, hi], y=[peak, peak], name=f"peak {peak:.3g} GB/s", **roof,
                        row=1, col=1)  # fmt: skip
        fig.add_scatter(x=[lo, hi], y=[peak * lo, peak * hi], showlegend=False, **roof,
                        hoverinfo="skip", row=1, col=2)  # fmt: skip


def quality(cur: pd.DataFrame) -> Figure | None:
    """Δ perplexity and KL divergence per format, from quality columns when a run has them."""
    cols = [c for c in ("delta_ppl", "kl_mean") if c in cur and cur[c].notna().any()]
    if not cols:
        return None
    d = cur.dropna(subset=cols, how="all").copy()
    d["fmt"] = [f"{r['kv_dtype']}" for r in d.to_dict("records")]
    g = d.groupby("fmt")[cols].median().reset_index()
    fig = subplots(cols, ncol_max=2, shared_y=False)
    for i, c in enumerate(cols):
        fig.add_bar(x=g["fmt"], y=g[c], marker_color=[format_color(f) for f in g["fmt"]],
                    showlegend=False, **panel_pos(i, grid(len(cols), 2)[1]))  # fmt: skip
    title = "Quality per format: Δ perplexity and KL divergence against a float32 cache"
    note = "Median over the quality rows of each format (lower is better)."
    return Figure("quality", title, style(fig, 420), table(g, {"fmt": "format", **{
        c: c for c in cols}}), note)  # fmt: skip
