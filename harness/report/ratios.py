"""Figures whose question is a ratio or a roof: format / fp16 against context, unified /
per-stream against the shared-prefix fraction, the roofline, and the quality per format.

Ratios join each row to its baseline row (same case but the one axis compared) with
harness/analysis/findings/common.py's `baseline`, so the figure shows exactly the numbers the
findings state; error bars are the conservative interval low_a / high_b .. high_a / low_b of the two
medians' 95% CIs. Roofline: arithmetic intensity = flops / (bytes read + written) of the byte
model; achieved GB/s and GFLOP/s = those / median time; the roof is the bandwidth kvbench
measured in the same run (peak_gbps) times the intensity.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvbench.analysis.findings.common import baseline, cache_config, source_of
from kvbench.analysis.findings.formats import format_pairs
from kvbench.report.common import Figure, log_ticks, measured, pareto, style, table
from kvbench.report.styles import (
    MAX_SERIES,
    ORDINAL,
    axis_titles,
    context_ticks,
    format_color,
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
    # more formats than a legend can hold: one series per code width, the format in the hover
    by_width = d["fmt"].nunique() > MAX_SERIES
    key = d["data_bits"].map(lambda b: f"{b:g}-bit codes") if by_width else d["fmt"]
    widths = sorted(key.unique(), key=lambda k: -float(k.split("-")[0]) if by_width else 0)
    for f in widths if by_width else sorted(key.unique()):
        p = d[key == f]
        color = ORDINAL[widths.index(f) % len(ORDINAL)] if by_width else format_color(f)
        for i, y in enumerate(("gbps", "gflops")):
            fig.add_scatter(
                x=p["ai"], y=p[y], mode="markers", name=f, legendgroup=f, showlegend=i == 0,
                hovertext=p["label"], marker={"color": color, "size": 9,
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
        f"({', '.join(kernels)}); colour: format"
        + (
            f" (over {MAX_SERIES} formats: code width; the format is in the hover)."
            if by_width
            else "."
        )
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


SOURCE_COLOR = {"kvbench": "#1f77b4", "llama.cpp": "#d62728"}


def quality_points(cur: pd.DataFrame) -> pd.DataFrame:
    """One point per (source, cache configuration): median quality, bits, decode tokens/s."""
    q = cur[cur["status"].eq("ok") & cur["kl_mean"].notna()] if "kl_mean" in cur else cur[:0]
    if q.empty:
        return q
    rows = q.to_dict("records")
    q = q.assign(config=[cache_config(r) for r in rows], source=[source_of(r) for r in rows])
    g = q.groupby(["source", "config"], sort=False)
    cols = [c for c in ("bits_per_elem", "kl_mean", "delta_ppl") if c in q]
    out = g[cols].median().reset_index()
    dec = cur[cur["phase"].eq("model_decode") & cur["tokens_per_s"].notna()]
    if not dec.empty:
        recs = dec.to_dict("records")
        dec = dec.assign(
            config=[cache_config(r) for r in recs], source=[source_of(r) for r in recs]
        )
        tps = dec.groupby(["source", "config"])["tokens_per_s"].max().rename("tokens_per_s")
        out = out.join(tps, on=["source", "config"])
    return out


def label_positions(part: pd.DataFrame, y: str) -> list[str]:
    """Text beside each point, alternating above and below among points at the same bits (a
    format and its rotated twin) so that their names do not sit on each other."""
    seen: dict = {}
    out = []
    for x in part["bits_per_elem"]:
        k = seen.get(x, 0)
        seen[x] = k + 1
        out.append(("top right", "bottom right", "middle right")[k % 3])
    return out


def quality(cur: pd.DataFrame) -> Figure | None:
    """Quality cost against stored bits per element (KL log scale, and Δppl), kvbench's model
    engine and llama.cpp side by side, the Pareto frontier of each, and decode tokens/s."""
    d = quality_points(cur)
    if d.empty:
        return None
    # the decode panel only where a model_decode row gives it figures (it was an empty panel
    # without a word in quality-only runs: issue 44)
    speed = "tokens_per_s" in d and d["tokens_per_s"].notna().any()
    panels = ["KL divergence vs bits/elem", "Δ perplexity vs bits/elem"]
    panels += ["decode tokens/s"] if speed else []
    n = len(panels)
    fig = subplots(panels, ncol_max=n, shared_y=False)
    sources = list(dict.fromkeys(d["source"]))
    for src, g in d.groupby("source", sort=False):
        color = SOURCE_COLOR[src]
        kl = g[g["kl_mean"] > 0]
        for i, (y, part) in enumerate((("kl_mean", kl), ("delta_ppl", g))):
            # each point named on the plot: q4_0 and q4_0 + rotation sit at the same bits
            fig.add_scatter(
                x=part["bits_per_elem"], y=part[y], mode="markers+text", name=src,
                legendgroup=src, textposition=label_positions(part, y), textfont={"size": 10},
                marker={"color": color, "size": 9}, text=part["config"], showlegend=i == 0
                and len(sources) > 1,
                hovertemplate="%{text}<br>%{x:.3g} bits<br>%{y:.3g}<extra>" + src + "</extra>",
                **panel_pos(i, n),
            )  # fmt: skip
            front = pareto(part, "bits_per_elem", y)
            fig.add_scatter(
                x=front["bits_per_elem"], y=front[y], mode="lines", legendgroup=src,
                line={"color": color, "dash": "dot"}, showlegend=False, hoverinfo="skip",
                **panel_pos(i, n),
            )  # fmt: skip
        if speed and g["tokens_per_s"].notna().any():
            t = g.dropna(subset=["tokens_per_s"])
            fig.add_bar(x=t["config"], y=t["tokens_per_s"], name=src, legendgroup=src,
                        marker_color=color, showlegend=False, **panel_pos(2, n))  # fmt: skip
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_xaxes(title_text="stored bits per K/V element", row=1, col=1)
    fig.update_xaxes(title_text="stored bits per K/V element", row=1, col=2)
    title = (f"Quality cost against bits per element ({' and '.join(sources)})"
             + (", and decode speed" if speed else ""))  # fmt: skip
    refs = {"kvbench": "float32 for kvbench", "llama.cpp": "f16 for llama.cpp"}
    note = (
        "Each point: one cache configuration's median over its quality rows (KL divergence of "
        "next-token distributions and Δ perplexity against the source's own reference cache: "
        f"{', '.join(refs[s] for s in sources)}), named beside it. Dotted: the Pareto frontier "
        "(no other point has fewer-or-equal bits and lower cost). "
        + ("Right: the best decode tokens/s of the same configuration's model_decode rows."
           if speed else "No decode-speed panel: these rows hold no model_decode row.")
    )  # fmt: skip
    cols = {"source": "source", "config": "cache", "bits_per_elem": "bits/elem",
            "kl_mean": "KL", "delta_ppl": "Δppl", "tokens_per_s": "tokens/s"}  # fmt: skip
    return Figure("quality", title, style(fig, 460), table(d, cols), note)
