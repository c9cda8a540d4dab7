"""The report's performance figures: latency, bandwidth vs the roofline, memory, accuracy.

Each builder takes the current rows and returns a Figure, or None when the rows lack the axes it
needs (so the report grows as result files gain columns). Memory is split exactly from the
Record's columns: kv_bytes is the format's exact formula (data + scales, K and V halves equal);
the scales' share is 1 - data_bits / bits_per_elem, where data_bits is the format's element code
width (16 for fp16, 4 for fp4/int4/mxfp4/...), recorded in each row (harness/store/migrate_v1.py
fills it for older files).
"""

from __future__ import annotations

import pandas as pd
from plotly.subplots import make_subplots

from kvbench.analysis.answer import context_bytes
from kvbench.report.common import (
    MEASURED,
    MIB,
    Figure,
    add_series,
    log_ticks,
    measured,
    pareto,
    row_spacing,
    style,
    table,
    with_fmt,
)
from kvbench.report.styles import MAX_SERIES, axis_titles, context_ticks, format_color, lines
from kvbench.store.migrate_v1 import with_v1_facts

PEAK_COLORS = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
# Axes that do not change the cache's size (memory panels ignore them).
MEM_SAME = ("context_len", "phase", "kernel", "kv_data", "seed", "tile_kv", "n_kv_heads")
# Many-sequence axes: the layouts figure shows their memory; here one value of each is kept.
MEM_ONE = ("n_seqs", "layout", "workload", "prefix_frac", "decode_order", "churn")
LAT_TABLE = {
    "label": "case",
    "context_len": "context (tokens)",
    "gqa_ratio": "GQA",
    "median_ms": "median (ms)",
    "p10_ms": "p10 (ms)",
    "p90_ms": "p90 (ms)",
    "ci_low_ms": "95% CI low (ms)",
    "ci_high_ms": "95% CI high (ms)",
    "n_samples": "samples",
    "cv": "CV",
    "unstable": "unstable",
    "status": "status",
}


def latency(cur: pd.DataFrame) -> Figure | None:
    d = measured(cur)
    if d.empty or d["context_len"].isna().all():
        return None
    d = d.assign(err_plus=d["p90_ms"] - d["median_ms"], err_minus=d["median_ms"] - d["p10_ms"])
    fig, titles, nrow = lines(d, "context_len", "median_ms", err=("err_plus", "err_minus"))
    context_ticks(fig, d["context_len"])
    fig.update_yaxes(type="log", **log_ticks(d[["p10_ms", "p90_ms"]].stack()))
    axis_titles(fig, nrow, "context length (tokens)", "latency (ms)")
    title = "Latency vs context (median; bars p10–p90 of the samples; log–log)"
    note = (
        "One timed call: a decode step over all layers (write + attend), or the whole prefill. "
        "Points are medians of every raw sample; error bars span p10 to p90. Colour: format "
        "(else the other varying axes), dash and marker: kernel (else layout), the same in every "
        "figure; axes that vary beyond "
        f"{MAX_SERIES} series are panels. Every panel shares the axes."
    )
    table_df = table(d.sort_values(["phase", "gqa_ratio", "label", "context_len"]), LAT_TABLE)
    return Figure("latency", title, style(fig, 120 + 300 * nrow), table_df, note)


def bandwidth(cur: pd.DataFrame) -> Figure | None:
    d = measured(cur)
    d = d[(d["phase"] == "decode") & d["gbps"].notna() & d["context_len"].notna()]
    if d.empty:
        return None
    fig, titles, nrow = lines(d, "context_len", "gbps", exclude=("phase",))
    context_ticks(fig, d["context_len"])
    peaks = d.dropna(subset=["peak_gbps"]).drop_duplicates(["device", "run_id"])
    for p in peaks.itertuples():  # each run measured its own peak: one line per run
        fig.add_hline(y=float(p.peak_gbps), line_dash="dash", line_color="#444", row="all",
                      col="all")  # fmt: skip
    top = max(float(d["gbps"].max()), float(peaks["peak_gbps"].max()) if len(peaks) else 0)
    fig.update_yaxes(range=[0, top * 1.15])
    axis_titles(fig, nrow, "context length (tokens)", "achieved GB/s")
    title = "Decode bandwidth vs the measured peak (GB/s, 1 GB = 1e9 B)"
    peak_text = ", ".join(f"{v:.3g}" for v in peaks["peak_gbps"].unique())
    note = (
        "Achieved GB/s = (bytes read + bytes written by the byte model, "
        "harness/engines/metrics.py) / median time. Dashed line: the streaming-read peak "
        f"kvbench measured on the same device in the same run ({peak_text or 'none'} GB/s; "
        "peak_method in the header). Decode rows only: prefill is not bandwidth-bound. % of "
        "peak is in the table. A point above the line means the traffic was served from CPU "
        "caches, or the peak measurement was disturbed."
    )
    cols = {
        "label": "case",
        "context_len": "context (tokens)",
        "median_ms": "median (ms)",
        "bytes_read": "bytes read (B)",
        "bytes_written": "bytes written (B)",
        "gbps": "achieved (GB/s)",
        "peak_gbps": "measured peak (GB/s)",
        "pct_peak_bw": "% of peak",
    }
    return Figure("bandwidth", title, style(fig, 120 + 300 * nrow), table(d, cols), note)


def split_memory(d: pd.DataFrame) -> pd.DataFrame:
    """K data, V data and scales bytes from kv_bytes and bits_per_elem (exact, see docstring)."""
    d = with_v1_facts(d)
    data_bits = d["data_bits"].astype(float)
    bpe = d["bits_per_elem"].astype(float)
    if {"kept_bytes", "kept_cells", "head_dim"} <= set(d):  # a policy row: bits per context
        # element, not per stored one; the split needs the format's own (its kept cells' bits)
        per_cell = 8 * d["kept_bytes"] / (2 * d["kept_cells"] * d["head_dim"])
        bpe = per_cell.where(d["kept_cells"].fillna(0) > 0, bpe).astype(float)
    share = (1 - data_bits / bpe).where(bpe.notna() & data_bits.notna(), 0.0).clip(lower=0)
    d["scales_bytes"] = (d["kv_bytes"].astype(float) * share).round()
    d["k_bytes"] = (d["kv_bytes"] - d["scales_bytes"]) / 2
    d["v_bytes"] = d["k_bytes"]
    d["split_known"] = data_bits.notna()
    return d


def _memory_rows(cur: pd.DataFrame) -> pd.DataFrame:
    ok = cur["status"].isin(MEASURED)
    d = with_fmt(cur[ok & cur["kv_bytes"].notna() & cur["context_len"].notna()])
    if (d["phase"] == "decode").any():
        d = d[d["phase"] == "decode"]
    # a cache policy's row: its kept bytes per context token x context_len, as the answer says
    return d.assign(kv_bytes=context_bytes(d)) if len(d) else d


def memory(cur: pd.DataFrame) -> Figure | None:
    d = _memory_rows(cur)
    if d.empty:
        return None
    kept = []
    for a in MEM_ONE:
        if a in d and d[a].nunique() > 1:
            first = sorted(d[a].dropna().unique(), key=str)[0]
            d, kept = d[d[a] == first], [*kept, f"{a} {first}"]
    d = add_series(d, exclude=MEM_SAME + MEM_ONE, always=("fmt",))
    d["panel"] = d["series"]
    d = split_memory(d)
    order = d.sort_values(["bits_per_elem", "gqa_ratio", "panel"], ascending=[False, True, True])
    panels = list(dict.fromkeys(order["panel"]))
    ncol = min(len(panels), 4)
    nrow = -(-len(panels) // ncol)
    fig = make_subplots(
        nrow,
        ncol,
        subplot_titles=panels,
        shared_yaxes=True,
        vertical_spacing=row_spacing(nrow, 0.12),
    )
    kernels = sorted(d["kernel"].dropna().unique())
    if len(kernels) > 4:  # one marker per kernel would crowd the panel: the largest peak
        d = d.assign(kernel="largest of all kernels")
        kernels = ["largest of all kernels"]
    stack = (("k_bytes", "K data", "#1f77b4"), ("v_bytes", "V data", "#ff7f0e"))
    stack += (("scales_bytes", "scales (K+V)", "#2ca02c"),)
    has_alloc, shown_alloc, shown_peaks = d["alloc_bytes"].notna().any(), False, set()
    for i, panel in enumerate(panels):
        p = d[d["panel"] == panel].sort_values("context_len")
        cache = p.drop_duplicates("context_len")
        x = cache["context_len"].astype(int).astype(str)
        pos = {"row": i // ncol + 1, "col": i % ncol + 1}
        for col, name, color in stack:
            fig.add_bar(
                x=x, y=cache[col] / MIB, name=name, marker_color=color, legendgroup=name,
                showlegend=i == 0, hovertext=panel + " · ctx " + x, **pos,
            )  # fmt: skip
        # legends only for what is drawn: quality rows measure no allocation or peak
        alloc = p.groupby("context_len")["alloc_bytes"].max().dropna()
        if has_alloc:
            fig.add_scatter(
                x=alloc.index.astype(int).astype(str), y=alloc / MIB, mode="markers",
                name="allocated", legendgroup="alloc", showlegend=not shown_alloc, **pos,
                marker={"symbol": "line-ew-open", "size": 26, "color": "black",
                        "line": {"width": 3}},
            )  # fmt: skip
            shown_alloc = shown_alloc or len(alloc) > 0
        for j, k in enumerate(kernels):
            pk = p[p["kernel"] == k].groupby("context_len")["peak_mem_bytes"].max().dropna()
            if pk.empty:
                continue
            fig.add_scatter(
                x=pk.index.astype(int).astype(str), y=pk / MIB, mode="markers",
                name=f"peak during case ({k})", legendgroup=f"peak-{k}",
                showlegend=k not in shown_peaks,
                marker={"symbol": ["diamond", "circle", "square", "x"][j % 4], "size": 9,
                        "color": PEAK_COLORS[j % len(PEAK_COLORS)]}, **pos,
            )  # fmt: skip
            shown_peaks.add(k)
    fig.update_layout(barmode="stack")
    fig.update_yaxes(matches="y")  # one scale for every panel: sizes compare across formats
    fig.layout.yaxis.matches = None  # (the first axis matching itself is a console warning)
    fig.update_xaxes(type="category")
    fig.update_xaxes(title_text="context length (tokens)", row=nrow)
    fig.update_yaxes(title_text="memory (MiB)", col=1)
    title = "KV-cache memory vs context: K, V and scales stacked (MiB, 1 MiB = 2^20 B)"
    note = (
        "Bars: kv_bytes, the format's exact byte formula for all layers at the context length, "
        "split into equal K and V halves of data (a cache policy's row: its kept bytes per "
        "context token times the context length), with the scales' share "
        "1 − data_bits / bits_per_elem stacked on top. Markers: measured growth of active memory "
        "when the cache was allocated (alloc_bytes) and the peak above the pre-cache baseline "
        "during the case (peak_mem_bytes), per kernel. "
        + ("Decode rows." if (d["phase"] == "decode").all() else "")
    )
    if kept:
        note += f" Many-sequence rows: only {', '.join(kept)} (the layouts figure has the rest)."
    unknown = sorted(set(d.loc[~d["split_known"], "fmt"]))
    if unknown:
        note += f" Scales not separated (element width unknown) for: {', '.join(unknown)}."
    cols = {
        "label": "case",
        "context_len": "context (tokens)",
        "bits_per_elem": "bits/elem",
        "kv_bytes": "kv_bytes (B)",
        "k_mib": "K data (MiB)",
        "v_mib": "V data (MiB)",
        "scales_mib": "scales (MiB)",
        "alloc_mib": "allocated (MiB)",
        "peak_mib": "peak (MiB)",
    }
    d = d.assign(
        k_mib=d["k_bytes"] / MIB,
        v_mib=d["v_bytes"] / MIB,
        scales_mib=d["scales_bytes"] / MIB,
        alloc_mib=d["alloc_bytes"] / MIB,
        peak_mib=d["peak_mem_bytes"] / MIB,
    ).sort_values(["panel", "context_len", "kernel"])
    return Figure("memory", title, style(fig, 200 + 300 * nrow), table(d, cols), note)


def frontier(points: pd.DataFrame) -> pd.DataFrame:
    """Pareto-optimal points: no other point has fewer-or-equal bits and lower error."""
    return pareto(points, "bits_per_elem", "rel_err")


def accuracy(cur: pd.DataFrame) -> Figure | None:
    ok = cur["status"].isin(MEASURED)
    d = with_fmt(cur[ok & cur["rel_err"].notna() & cur["bits_per_elem"].notna()])
    if d.empty or d["fmt"].nunique() < 2:
        return None
    keys = ["fmt", "kernel", "kv_data"]
    g = d.groupby(keys, dropna=False).agg(
        bits_per_elem=("bits_per_elem", "first"),
        rel_err=("rel_err", "median"),
        rel_err_min=("rel_err", "min"),
        rel_err_max=("rel_err", "max"),
        cosine=("cosine", "median"),
        max_abs_err=("max_abs_err", "max"),
        kv_recon_err=("kv_recon_err", "median"),
        cases=("rel_err", "size"),
    )
    g = g.reset_index()
    positive = g.loc[g["rel_err_min"] > 0, "rel_err_min"]
    floor = float(positive.min()) / 10 if len(positive) else 1e-8
    g["y"] = g["rel_err"].clip(lower=floor)
    g["name"] = g["fmt"] + " · " + g["kernel"] + " · " + g["kv_data"].astype(str)
    # formats by stored bits, in panels of at most MAX_SERIES (a legend of 15 formats is not
    # readable); the frontier over all of them is drawn in every panel
    by_bits = g.groupby("fmt")["bits_per_elem"].max().sort_values(ascending=False).index
    n_panels = -(-len(by_bits) // MAX_SERIES)
    per_panel = -(-len(by_bits) // n_panels)
    groups = [list(by_bits[i : i + per_panel]) for i in range(0, len(by_bits), per_panel)]
    fig = make_subplots(1, n_panels, shared_yaxes=True, horizontal_spacing=0.06)
    for col, fmts in enumerate(groups, start=1):
        for f, p in g[g["fmt"].isin(fmts)].groupby("fmt", sort=False):
            fig.add_scatter(
                x=p["bits_per_elem"], y=p["y"], mode="markers", name=f, hovertext=p["name"],
                error_y={"type": "data", "symmetric": False,
                         "array": p["rel_err_max"].clip(lower=floor) - p["y"],
                         "arrayminus": p["y"] - p["rel_err_min"].clip(lower=floor)},
                marker={"size": 11, "color": format_color(f),
                        "symbol": ["circle" if e > 0 else "x" for e in p["rel_err"]]},
                hovertemplate="%{hovertext}<br>%{x:.4g} bits/elem<br>rel_err %{y:.3g}"
                "<extra></extra>", row=1, col=col,
            )  # fmt: skip
        for data, p in g.groupby("kv_data", dropna=False):
            f = frontier(p.assign(rel_err=p["y"]))
            fig.add_scatter(
                x=f["bits_per_elem"], y=f["y"], mode="lines", name=f"frontier ({data})",
                meta="ref", line={"dash": "dot", "color": "#555"}, hoverinfo="skip",
                showlegend=col == 1, row=1, col=col,
            )  # fmt: skip
        bits = g.loc[g["fmt"].isin(fmts), "bits_per_elem"]
        pad = max(0.25, 0.08 * float(bits.max() - bits.min()))
        fig.update_xaxes(range=[float(bits.min()) - pad, float(bits.max()) + pad], col=col)
    # one title per panel: the long one fits two panels side by side, not three or more
    long = "stored bits per K/V element (scales included; bytes = bits / 8)"
    fig.update_xaxes(title_text=long if n_panels <= 2 else "stored bits / element (with scales)")
    fig.update_yaxes(title_text="relative error of attention output (vs fp32)", type="log", col=1)
    fig.update_yaxes(type="log", **log_ticks(g["y"]))
    title = "Accuracy vs memory per element: the trade-off frontier"
    note = (
        "One point per (format, kernel, K/V data): median relative L2 error of the attention "
        "output against the float32 reference on the same un-quantized K/V, over the cases "
        "(contexts); bars span min–max. The dotted line joins the Pareto-optimal points. "
        f"Formats are split by stored bits into panels of at most {MAX_SERIES}. "
        f"An exact result (error 0) is drawn as × at {floor:.2g} (log axis)."
    )
    cols = {
        "fmt": "format",
        "kernel": "kernel",
        "kv_data": "K/V data",
        "bits_per_elem": "bits/elem",
        "rel_err": "median rel_err",
        "rel_err_max": "max rel_err",
        "max_abs_err": "max abs err",
        "cosine": "median cosine",
        "kv_recon_err": "K/V recon err",
        "cases": "cases",
    }
    table_df = table(g.sort_values("bits_per_elem"), cols)
    return Figure("accuracy", title, style(fig), table_df, note)


def all_figures(cur, history, compare_rows, order) -> list[Figure]:
    """Every figure the data supports, in page order (the questions first)."""
    from kvbench.report.budget import budget
    from kvbench.report.kvshare import kv_share_figure
    from kvbench.report.ratios import formats, layouts, quality, roofline
    from kvbench.report.serve import serve_figure
    from kvbench.report.tasks import generate, quality_context, retrieval
    from kvbench.report.tradeoff import tradeoff
    from kvbench.report.views import compare, history_fig, peers, residency, tiles

    figs = [serve_figure(cur), latency(cur), formats(cur), kv_share_figure(cur), layouts(cur)]
    figs += [tiles(cur), peers(cur)]
    figs += [quality(cur)]
    figs += [budget(cur), tradeoff(cur), quality_context(cur), retrieval(cur), generate(cur)]
    figs += [accuracy(cur), memory(cur), residency(cur), bandwidth(cur), roofline(cur)]
    figs += [history_fig(history, order), compare(compare_rows)]
    return [f for f in figs if f is not None]
