"""The report's comparison figures: tile-size heatmap, unified vs per-stream, history, compare.

Tile heatmap colour = median time / the best tile's median time at the same context (1.0 = the
fastest tile there), so the winning tile per context reads at a glance; the cell text is the
median in ms. History: one line per case, one point per run that measured it, runs ordered by
their timestamp. Compare: the ratio new/base per case with its confidence interval
(docs/compare.md).
"""

from __future__ import annotations

import pandas as pd
import plotly.express as px
from plotly.subplots import make_subplots

from kvbench.analysis.memory import LLAMACPP_SOURCE, memory_rows
from kvbench.report.common import (
    MIB,
    Figure,
    add_series,
    colors,
    log_ticks,
    measured,
    row_spacing,
    style,
    table,
)
from kvbench.report.styles import MAX_SERIES, axis_titles, kernel_color

VERDICT_COLORS = {
    "faster": "#2ca02c",
    "better": "#2ca02c",
    "slower": "#d62728",
    "worse": "#d62728",
    "unchanged": "#7f7f7f",
    "inconclusive": "#ff7f0e",
}


def _cat(v) -> list[str]:
    return [str(int(x)) for x in v]


def tiles(cur: pd.DataFrame) -> Figure | None:
    d = measured(cur)
    d = d[d["tile_kv"].notna() & d["context_len"].notna()]
    if d.empty or d["tile_kv"].nunique() < 2:
        return None
    d = add_series(d, exclude=("tile_kv", "context_len", "n_kv_heads"), always=("fmt", "kernel"))
    best = d.groupby(["series", "context_len"])["median_ms"].transform("min")
    d["rel"] = d["median_ms"] / best
    panels = sorted(d["series"].unique())
    ncol = min(len(panels), 2)
    nrow = -(-len(panels) // ncol)
    fig = make_subplots(nrow, ncol, subplot_titles=panels, vertical_spacing=row_spacing(nrow, 0.2))
    for i, panel in enumerate(panels):
        p = d[d["series"] == panel]
        rel = p.pivot_table(index="tile_kv", columns="context_len", values="rel")
        ms = p.pivot_table(index="tile_kv", columns="context_len", values="median_ms")
        fig.add_heatmap(
            x=_cat(rel.columns), y=_cat(rel.index), z=rel.values, text=ms.map(lambda v: f"{v:.3g}"),
            texttemplate="%{text}", coloraxis="coloraxis", name=panel,
            hovertemplate=panel + "<br>context %{x}, tile %{y}<br>%{text} ms, ×%{z:.2f} of best"
            "<extra></extra>", row=i // ncol + 1, col=i % ncol + 1,
        )  # fmt: skip
    fig.update_layout(
        coloraxis={
            "colorscale": "Viridis_r",
            "cmin": 1.0,
            "cmax": max(float(d["rel"].max()), 1.1),
            "colorbar": {"title": {"text": "× best"}},
        }
    )
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    fig.update_annotations(font_size=12)
    axis_titles(fig, nrow, "context length (tokens)", "tile_kv")
    title = "Tile size × context: time relative to the best tile at each context (text: ms)"
    note = (
        "Colour: median latency divided by the fastest tile's median at the same context and "
        "configuration (1.0 = best). Cell text: median latency in ms."
    )
    d = d.assign(best=d["rel"] == 1.0).sort_values(["series", "context_len", "tile_kv"])
    cols = {
        "series": "configuration",
        "context_len": "context (tokens)",
        "tile_kv": "tile_kv",
        "median_ms": "median (ms)",
        "rel": "× best",
        "best": "best tile",
    }
    return Figure("tiles", title, style(fig, 180 + 320 * nrow), table(d, cols), note)


def _run_names(d: pd.DataFrame, order: list) -> dict:
    names = {}
    for run in order:
        r = d[d["run_id"] == run]
        if r.empty:
            continue
        r = r.iloc[0]
        commit = str(r["commit"])[:8] + ("+dirty" if r["dirty"] is True else "")
        name = f"{commit}<br>{str(r['timestamp'])[:16].replace('T', ' ')}"
        names[run] = name if name not in names.values() else f"{name} ({run})"
    return names


def history_fig(history: pd.DataFrame, order: list) -> Figure | None:
    d = measured(history)
    if d.empty or d["run_id"].nunique() < 2:
        return None
    runs_per_case = d.groupby("case_id")["run_id"].nunique()
    d = d[d["case_id"].isin(runs_per_case[runs_per_case > 1].index)]
    if d.empty:
        return None
    if d["device"].nunique() > 1:  # a case's history is per machine: never one mixed line
        d = d.assign(label=d["label"] + " @ " + d["device"].astype(str))
    names = _run_names(d, order)
    d = d.assign(
        run=d["run_id"].map(names), pos=d["run_id"].map({r: i for i, r in enumerate(order)})
    )
    g = d.groupby(["label", "run", "pos"], as_index=False).agg(
        median_ms=("median_ms", "median"),
        ci_low_ms=("ci_low_ms", "median"),
        ci_high_ms=("ci_high_ms", "median"),
    )
    g = g.sort_values(["label", "pos"])
    labels = list(dict.fromkeys(g["label"]))  # at most MAX_SERIES cases per panel
    g["panel"] = g["label"].map({c: f"cases {i // MAX_SERIES * MAX_SERIES + 1}–"
                                 f"{min(len(labels), (i // MAX_SERIES + 1) * MAX_SERIES)}"
                                 for i, c in enumerate(labels)})  # fmt: skip
    n_panels = g["panel"].nunique()
    fig = px.line(
        g, x="run", y="median_ms", color="label", markers=True, log_y=True, hover_name="label",
        facet_row="panel" if n_panels > 1 else None,
        error_y=g["ci_high_ms"] - g["median_ms"], error_y_minus=g["median_ms"] - g["ci_low_ms"],
        category_orders={"run": [names[r] for r in order if r in names]},
        labels={"run": "run (commit, date; oldest left)", "median_ms": "latency (ms)"},
        color_discrete_sequence=colors(g["label"].nunique()),
    )  # fmt: skip
    fig.update_yaxes(**log_ticks(g[["ci_low_ms", "ci_high_ms", "median_ms"]].stack()))
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))
    title = "History across commits: median latency per case (bars: 95% CI; log y)"
    note = (
        "One point per run that measured the case, runs ordered by timestamp; with results "
        "from several devices, one line per case and device."
    )
    wide = g.pivot_table(index="label", columns="pos", values="median_ms")
    wide.columns = [names[order[int(p)]].replace("<br>", " ") + " (ms)" for p in wide.columns]
    wide = wide.reset_index().rename(columns={"label": "case"})
    wide["last / first"] = wide.iloc[:, -1] / wide.iloc[:, 1]
    return Figure("history", title, style(fig, 200 + 320 * n_panels), wide, note)


def compare(cmp: pd.DataFrame | None) -> Figure | None:
    if cmp is None or cmp.empty:
        return None
    d = cmp.copy()
    if "metric" not in d:
        d["metric"] = "median_ms"
    if "verdict" not in d:
        d["verdict"] = "unknown"
    d["verdict"] = d["verdict"].fillna("unknown").astype(str)
    d = d.sort_values(["metric", "ratio"])
    plotted = d[pd.to_numeric(d["ratio"], errors="coerce").gt(0)]  # base_only, error: no ratio
    if plotted.empty:
        return None
    fig = px.scatter(
        plotted, x="ratio", y="label", color="verdict", facet_col="metric", log_x=True,
        error_x=plotted["ratio_ci_high"] - plotted["ratio"],
        error_x_minus=plotted["ratio"] - plotted["ratio_ci_low"],
        hover_name="label", hover_data={c: True for c in ("base", "new", "p_value") if c in d},
        color_discrete_map=VERDICT_COLORS,
        labels={"ratio": "ratio new / base (log; < 1: new is smaller)", "label": "case"},
    )  # fmt: skip
    fig.update_xaxes(**log_ticks(plotted[["ratio", "ratio_ci_low", "ratio_ci_high"]].stack()))
    fig.add_vline(x=1.0, line_dash="dash", line_color="#444")
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))
    fig.update_yaxes(automargin=True)
    title = "Compare: ratio of medians (new / base) with its confidence interval"
    note = (
        "From a compare CSV (kvbench compare): each row's ratio new / base of the metric with "
        "its confidence interval, coloured by the verdict. Dashed line: no change. "
        f"Rows without a ratio (one side only, errors): {len(d) - len(plotted)}, in the table."
    )
    cols = {c: c for c in ("label", "metric", "base", "new", "ratio", "ratio_ci_low")}
    cols.update({c: c for c in ("ratio_ci_high", "p_value", "verdict", "base_n", "new_n")})
    cols["note"] = "note"
    height = 200 + 24 * plotted["label"].nunique()
    return Figure("compare", title, style(fig, max(height, 360)), table(d, cols), note)


def blas_note(cur: pd.DataFrame) -> str:
    """Which BLAS MLX's CPU matmuls ran on in these rows (docs/blas.md): on MLX's Linux wheel
    the reference BLAS is ~30x slower than OpenBLAS on fp32, so a ratio depends on it."""
    if "blas" not in cur or cur["blas"].dropna().empty:
        return ""
    runs = cur.dropna(subset=["blas"]).groupby("blas")["blas_gflops"].median()
    said = ", ".join(f"{name} ({gf:.3g} GFLOP/s fp32)" for name, gf in runs.items())
    return f" MLX's CPU matmuls ran on: {said}."


def peers(cur: pd.DataFrame) -> Figure | None:
    """Each kvbench kernel's median over the fastest peer's in the same case group."""
    from kvbench.analysis.peers_summary import peer_ratios

    r = peer_ratios(measured(cur))
    if r.empty:
        return None
    r["case"] = [
        f"ctx {int(c)} {f}" + (f" win {int(w)}" if pd.notna(w) else "")
        for c, f, w in zip(r["context_len"], r["kv_dtype"], r["window"])
    ]
    fig = px.bar(
        r, x="ratio", y="case", color="kernel", barmode="group", orientation="h", log_x=True,
        color_discrete_map={k: kernel_color(k) for k in r["kernel"].unique()},
        hover_data={"median_ms": ":.4g", "best_peer": True, "best_peer_ms": ":.4g"},
        labels={"ratio": "kvbench median / best peer median (log; < 1: kvbench faster)"},
    )  # fmt: skip
    fig.update_xaxes(**log_ticks(r["ratio"]))
    fig.add_vline(x=1.0, line_dash="dash", line_color="#444")
    fig.update_yaxes(automargin=True)
    title = "kvbench's kernels against the best peer (mlx-lm, torch, numpy) in the same case"
    note = (
        "For each case group (same shape, context, format and data), the fastest peer row's "
        "median is the yardstick; a bar is a kvbench kernel's median divided by it "
        "(harness/analysis/peers_summary.py). Dashed line: as fast as the best peer."
        + blas_note(cur)
    )
    cols = {"case": "case", "kernel": "kernel", "median_ms": "median (ms)"}
    cols.update(best_peer="best peer", best_peer_ms="best peer (ms)", ratio="ratio")
    height = 200 + 28 * len(r)
    return Figure("peers", title, style(fig, max(height, 360)), table(r, cols), note)


RESIDENCY_CASE_PX = 36  # three bars and their gap per case in the residency figure
MEMORY_BARS = (
    ("exact_b", "exact (kv_bytes)", "#1f77b4"),
    ("resident_b", "resident after the fill", "#2ca02c"),
    ("peak_b", "peak in the timed stages", "#d62728"),
)


def residency(cur: pd.DataFrame) -> Figure | None:
    """Exact, resident and peak memory side by side, one panel per layout, at each panel's
    largest context (analysis/memory.py shapes the rows; every context is in the table)."""
    d = memory_rows(cur)
    if d.empty:
        return None
    d = add_series(d, exclude=("layout", "context_len"), always=("fmt", "kernel"))
    # one panel per layout and model (different models' caches are not one scale of cases)
    d["panel"] = d["layout"].astype(str) + " · " + d["model"].astype(str)
    panels = sorted(d["panel"].unique())
    largest = {p: int(d.loc[d["panel"] == p, "context_len"].max()) for p in panels}
    shown = {p: d[(d["panel"] == p) & (d["context_len"] == largest[p])] for p in panels}
    # horizontal bars, one panel per row, each as tall as its cases: long case names stay
    # readable at any count (tick labels on a shared x axis overlapped beyond a few cases)
    heights_px = [60 + RESIDENCY_CASE_PX * shown[p]["series"].nunique() for p in panels]
    spacing_px = 70
    total_px = sum(heights_px) + spacing_px * (len(panels) - 1)
    fig = make_subplots(
        len(panels), 1, subplot_titles=[f"{p} · ctx {largest[p]}" for p in panels],
        row_heights=[h / sum(heights_px) for h in heights_px],
        vertical_spacing=spacing_px / total_px if len(panels) > 1 else 0,
    )  # fmt: skip
    for i, panel in enumerate(panels):
        # short bar labels: the axes that vary within the panel, format and kernel always
        p = add_series(shown[panel], exclude=("layout", "context_len"), always=("fmt", "kernel"))
        p = p.sort_values("series", ascending=False)  # plotly draws the first category lowest
        y, pos = p["series"], {"row": i + 1, "col": 1}
        for col, name, color in MEMORY_BARS:
            fig.add_bar(
                y=y, x=p[col] / MIB, orientation="h", name=name, marker_color=color,
                legendgroup=name, showlegend=i == 0, **pos,
            )  # fmt: skip
        fig.add_scatter(
            y=y, x=p["declared_b"] / MIB, mode="markers", name="declared (cache_bytes)",
            marker={"symbol": "line-ns-open", "size": 16, "color": "black", "line": {"width": 3}},
            legendgroup="declared", showlegend=i == 0, **pos,
        )  # fmt: skip
    fig.update_yaxes(automargin=True)
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="memory (MiB)", row=len(panels))
    title = "Memory truth: exact, resident and peak bytes per layout (MiB, 1 MiB = 2^20 B)"
    note = (
        "exact: kv_bytes, the format's formula for the K/V the case holds. resident: active "
        "memory above the case's pre-cache baseline after the fill, before anything reads or "
        "writes the cache (the residency gate fails a case below its cache's declared bytes). "
        "peak: the peak above the same baseline during the timed stages. Marker: the bytes the "
        f"cache's arrays declare (capacity, padding, free cells). Rows marked {LLAMACPP_SOURCE}: "
        "the KV buffer and the context's buffers llama.cpp reports in its log. One panel per "
        "layout and model, at its largest context; the table has every case."
    )
    d = d.assign(
        exact_mib=d["exact_b"] / MIB, declared_mib=d["declared_b"] / MIB,
        resident_mib=d["resident_b"] / MIB, end_mib=d["end_b"] / MIB, peak_mib=d["peak_b"] / MIB,
    ).sort_values(["layout", "series", "context_len"])  # fmt: skip
    cols = {
        "series": "case", "layout": "layout", "context_len": "context (tokens)",
        "exact_mib": "exact (MiB)", "declared_mib": "declared (MiB)",
        "resident_mib": "resident (MiB)", "end_mib": "resident after stages (MiB)",
        "peak_mib": "peak (MiB)", "resident_x": "resident / exact", "peak_x": "peak / resident",
        "source": "figures by",
    }  # fmt: skip
    return Figure("residency", title, style(fig, 160 + total_px), table(d, cols), note)
