"""One look for every figure: a colour per format, a dash and marker per kernel, a colour per
layout, and the rule that splits the varying axes of a figure into series and panels.

Readable by construction: a panel draws at most MAX_SERIES series; the axes that vary beyond
that become panels (facets), titled with short labels (the full case is in the hover and the
table). A format keeps its colour and a kernel its dash in every figure of every report, so a
reader learns them once.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvbench.report.common import SERIES_AXES, SERIES_PART, _implied_by_model, row_spacing

MAX_SERIES = 8
FORMAT_COLORS = {
    "fp32": "#1f77b4", "fp16": "#d62728", "bf16": "#ff7f0e", "int8": "#2ca02c",
    "affine8": "#98df8a", "fp4": "#9467bd", "int4": "#8c564b", "mxfp4": "#e377c2",
    "nvfp4": "#17becf", "affine4": "#bcbd22",
}  # fmt: skip
KERNEL_DASH = {
    "sdpa": "solid", "ops": "dash", "tiled": "dot", "dequant_sdpa": "dashdot",
    "quantized_matmul": "longdash", "metal": "longdashdot", "cuda": "longdashdot",
    "mlx_lm": "dash", "mlx_lm_rotating": "dot", "torch_sdpa": "dashdot", "numpy_ref": "longdash",
}  # fmt: skip
KERNEL_SYMBOL = {
    "sdpa": "circle", "ops": "square", "tiled": "diamond", "dequant_sdpa": "triangle-up",
    "quantized_matmul": "x", "metal": "star", "cuda": "star", "mlx_lm": "triangle-down",
    "mlx_lm_rotating": "pentagon", "torch_sdpa": "cross", "numpy_ref": "hexagon",
}  # fmt: skip
KERNEL_COLORS = {
    "sdpa": "#1f77b4", "ops": "#ff7f0e", "tiled": "#2ca02c", "dequant_sdpa": "#9467bd",
    "quantized_matmul": "#8c564b", "metal": "#7f7f7f", "cuda": "#76b900", "mlx_lm": "#e377c2",
    "mlx_lm_rotating": "#bcbd22", "torch_sdpa": "#ee4c2c", "numpy_ref": "#17becf",
}  # fmt: skip
LAYOUT_COLORS = {"per-stream": "#1f77b4", "unified": "#ff7f0e"}
ORDINAL = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
PREFERRED = ("fmt", "kernel", "layout")  # series axes first, in this order; then the table's
FACET_FIRST = ("gqa_ratio", "phase")  # axes that make good panel columns / rows


def format_color(fmt: str) -> str:
    base = str(fmt).split("/")[0]
    return FORMAT_COLORS.get(base, ORDINAL[sum(map(ord, base)) % len(ORDINAL)])


def kernel_color(kernel: str) -> str:
    return KERNEL_COLORS.get(str(kernel), ORDINAL[sum(map(ord, str(kernel))) % len(ORDINAL)])


def show(axis: str, v) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return SERIES_PART.get(axis, "{}").format(v)


def _greedy(d: pd.DataFrame, vary: list[str]) -> tuple[list[str], list[str]]:
    series, facets = [], []
    for a in vary:
        n = d.groupby(series + [a], dropna=False).ngroups if series else d[a].nunique()
        wanted = a not in FACET_FIRST or not series
        (series if n <= MAX_SERIES and wanted else facets).append(a)
    return series, facets


def split_axes(d: pd.DataFrame, exclude=(), always=("fmt",)) -> tuple[list[str], list[str]]:
    """(series axes, facet axes): the varying axes, series first while their combinations
    stay within MAX_SERIES, the rest as panels. Format first or kernel first, whichever
    leaves more series in a panel (peers: kernels are the question; quant: formats). Axes in
    `always` are series axes even with one value (they name the line and pick its colour)."""
    vary = [
        a
        for a in SERIES_AXES
        if a not in exclude and a in d and d[a].nunique() > 1 and not _implied_by_model(d, a)
    ]
    vary = sorted(vary, key=lambda a: (a not in PREFERRED, PREFERRED.index(a) if a in PREFERRED
                                       else 0, a in FACET_FIRST))  # fmt: skip
    swapped = [a for a in vary if a == "kernel"] + [a for a in vary if a != "kernel"]
    splits = [_greedy(d, vary), _greedy(d, swapped)]
    series, facets = max(splits, key=lambda sf: d.groupby(sf[0]).ngroups if sf[0] else 0)
    # a format is named (and coloured) even when it is the only one
    return [a for a in always if a in d and a not in series] + series, facets


def name_of(r, axes) -> str:
    return " · ".join(show(a, r[a]) for a in axes if pd.notna(r.get(a))) or "all"


def _roles(d: pd.DataFrame, series: list[str]) -> tuple[str | None, list[str]]:
    """(dash axis, colour axes) among the series axes that vary in d: kernel (else layout)
    draws the dash when something else can take the colour; format takes the colour first."""
    vary = [a for a in series if d[a].nunique() > 1]
    dash = next((a for a in ("kernel", "layout") if a in vary), None)
    if dash and len(vary) == 1:
        dash = None
    colour = [a for a in vary if a != dash]
    return dash, (["fmt"] if "fmt" in colour else colour)


def styler(d: pd.DataFrame, series: list[str]):
    """A function row -> {color, dash, symbol} for the series of d (fixed colours for formats,
    layouts and kernels, an ordinal palette for other axes)."""
    dash_axis, colour_axes = _roles(d, series)
    names = sorted({name_of(r, colour_axes) for r in d.to_dict("records")})
    marks = ("circle", "square", "diamond", "triangle-up", "x", "star", "cross", "pentagon")
    rest = [a for a in series if a not in colour_axes and a != dash_axis and d[a].nunique() > 1]
    others = sorted({name_of(r, rest) for r in d.to_dict("records")})

    def style_of(r) -> dict:
        if colour_axes == ["fmt"]:
            color = format_color(r["fmt"])
        elif colour_axes == ["layout"]:
            color = LAYOUT_COLORS.get(r["layout"], ORDINAL[0])
        elif colour_axes == ["kernel"]:
            color = kernel_color(r["kernel"])
        elif not colour_axes and "fmt" in series:
            color = format_color(r["fmt"])
        else:
            color = ORDINAL[names.index(name_of(r, colour_axes)) % len(ORDINAL)]
        dash, symbol = "solid", marks[others.index(name_of(r, rest)) % len(marks)]
        if dash_axis == "kernel":
            dash, symbol = KERNEL_DASH.get(r["kernel"], "solid"), KERNEL_SYMBOL.get(r["kernel"])
        elif dash_axis == "layout":
            dash, symbol = (
                ("solid", "circle") if r["layout"] == "per-stream" else ("dash", "square")
            )
        return {"color": color, "dash": dash, "symbol": symbol or "circle"}

    return style_of


def grid(n_panels: int, max_cols: int = 3) -> tuple[int, int]:
    ncol = min(n_panels, max_cols)
    return -(-n_panels // ncol), ncol


def subplots(titles: list[str], ncol_max: int = 3, shared_y: bool = True, **kw) -> go.Figure:
    nrow, ncol = grid(len(titles), ncol_max)
    fig = make_subplots(
        nrow, ncol, subplot_titles=titles, shared_xaxes="all", shared_yaxes="all" if shared_y
        else False, vertical_spacing=row_spacing(nrow, 0.14), horizontal_spacing=0.06, **kw,
    )  # fmt: skip
    fig.update_annotations(font_size=12)
    return fig


def panel_pos(i: int, ncol: int) -> dict:
    return {"row": i // ncol + 1, "col": i % ncol + 1}


def lines(d: pd.DataFrame, x: str, y: str, exclude=(), err=None, ncol_max: int = 3):
    """Line panels of y against x: series and panels by split_axes; returns (figure, panel
    titles, nrow). err: (plus column, minus column) for error bars, or None."""
    series, facets = split_axes(d, exclude=(x, *exclude))
    d = d.assign(_panel=[name_of(r, facets) for r in d.to_dict("records")])
    d = d.sort_values([*facets, *series, x]) if facets or series else d.sort_values(x)
    titles = list(dict.fromkeys(d["_panel"]))
    fig = subplots(titles if facets else [""], ncol_max)
    ncol = grid(len(titles), ncol_max)[1]
    style_of = styler(d, series)
    shown = set()
    for i, panel in enumerate(titles):
        p = d[d["_panel"] == panel]
        names = pd.Series([name_of(r, series) for r in p.to_dict("records")], index=p.index)
        for name, s in p.groupby(names, sort=False):
            st = style_of(s.iloc[0])
            error = None
            if err:
                error = {"type": "data", "symmetric": False, "array": s[err[0]],
                         "arrayminus": s[err[1]], "thickness": 1}  # fmt: skip
            fig.add_scatter(
                x=s[x], y=s[y], mode="lines+markers", name=name, legendgroup=name,
                showlegend=name not in shown, error_y=error, hovertext=s["label"],
                line={"color": st["color"], "dash": st["dash"]},
                marker={"symbol": st["symbol"], "size": 8, "color": st["color"]},
                **panel_pos(i, ncol),
            )  # fmt: skip
            shown.add(name)
    return fig, titles, grid(len(titles), ncol_max)[0]


def context_ticks(fig: go.Figure, contexts) -> None:
    """Label the measured contexts on a log x axis (not plotly's minor ticks)."""
    ctx, out = sorted(set(float(c) for c in contexts if pd.notna(c))), []
    for c in ctx:  # closer than 1.4x, tick labels would touch on a log axis
        if not out or c >= out[-1] * 1.4:
            out.append(c)
    fig.update_xaxes(type="log", tickvals=out, ticktext=[str(int(c)) for c in out])


def axis_titles(fig: go.Figure, nrow: int, x: str, y: str) -> None:
    """One x title under the bottom row, one y title beside the first column."""
    fig.update_xaxes(title_text=x, row=nrow)
    fig.update_yaxes(title_text=y, col=1, row=math.ceil(nrow / 2))
