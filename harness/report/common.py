"""Shared pieces of the report's figures: the Figure record, series names, number formats."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from kvbench.axes import TABLE, Axis
from kvbench.store.results import format_label, measured  # noqa: F401 (figures read it here)
from kvbench.store.status import MEASURED  # noqa: F401 (statuses whose rows carry times)

MIB = 2**20

# fmt names the format with its group size, gqa_ratio the head counts: those axes are covered
_COVERED = ("group_size", "n_q_heads", "n_kv_heads")


def series_axes(table: tuple[Axis, ...] = TABLE) -> tuple[str, ...]:
    """Axes that tell two cases apart, in the order a series name lists them: the device, then
    the axis table's order, kv_dtype shown as fmt."""
    axes = ["fmt" if a.name == "kv_dtype" else a.name for a in table if a.name not in _COVERED]
    return ("device", *axes)


SERIES_AXES = series_axes()
SERIES_PART = {a.name: a.series for a in TABLE}  # e.g. context_len -> "ctx {}"


@dataclass
class Figure:
    key: str  # stable id: the figure's section id in the page
    title: str
    fig: go.Figure
    table: pd.DataFrame  # the figure's numbers, shown beneath it
    note: str = ""  # how it is computed, in a sentence or two


def with_fmt(df: pd.DataFrame) -> pd.DataFrame:
    d = df.copy()
    d["fmt"] = [format_label(r) for r in d.to_dict("records")] if len(d) else []
    return d


def varying(df: pd.DataFrame, axes=SERIES_AXES, exclude=()) -> list[str]:
    """Axes (among `axes`, minus `exclude`) holding more than one distinct value in df."""
    return [a for a in axes if a not in exclude and a in df and df[a].nunique(dropna=True) > 1]


def _show(axis: str, v) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return SERIES_PART.get(axis, "{}").format(v)


def _implied_by_model(df: pd.DataFrame, axis: str) -> bool:
    """A shape axis that the model preset already names (one value per model)."""
    if axis not in ("n_layers", "head_dim") or "model" not in df or df["model"].isna().any():
        return False
    return bool((df.groupby("model")[axis].nunique() <= 1).all())


def add_series(df: pd.DataFrame, exclude=(), always=("fmt",)) -> pd.DataFrame:
    """A `series` column naming each line by the axes that vary (besides x and facets)."""
    axes = [a for a in SERIES_AXES if a in always or a in varying(df, exclude=exclude)]
    axes = [a for a in axes if a not in exclude and not _implied_by_model(df, a)] or ["fmt"]
    d = df.copy()
    d["series"] = [
        " · ".join(_show(a, r[a]) for a in axes if pd.notna(r[a])) for r in d.to_dict("records")
    ]
    return d


def colors(n: int) -> list[str]:
    return px.colors.qualitative.Plotly if n <= 10 else px.colors.qualitative.Dark24


def gqa_facet(d: pd.DataFrame) -> pd.Series:
    return d["gqa_ratio"].map(lambda g: f"GQA {int(g)}" if pd.notna(g) else "GQA ?")


PAGE_PLOT_PX = 1300  # a plot's width on the page (body max-width 1400 px less margins)
TITLE_CHAR_PX = 7.0  # a subplot title's character at font size 12, generously
LEGEND_PX = 220  # a legend at the plot's right
TITLE_LINE_PX = 16
TICKS_PX = 34  # an x axis's tick labels below a panel, and a little air


def fit_titles(fig: go.Figure, height: int) -> int:
    """Subplot titles wrapped to their panel's width, and the height at which no title meets
    the panel (or tick labels) above it: plotly places a title just over its panel's domain,
    and rows gaps are a fraction of the height, so many rows in a short figure overlap."""
    titles = [a for a in fig.layout.annotations if a.yanchor == "bottom" and a.yref == "paper"
              and a.showarrow is False and a.text]  # fmt: skip
    domains = sorted({tuple(fig.layout[k].domain) for k in fig.layout if k.startswith("yaxis")
                      and fig.layout[k].domain}, reverse=True)  # fmt: skip
    if not titles or not domains:
        return height
    ncol = max(1, len({round(a.x, 3) for a in titles}))
    # the legend takes the plot's right side (LEGEND_PX); titles at one size, 12 px
    chars = max(12, int((PAGE_PLOT_PX - LEGEND_PX) / ncol * 0.9 / TITLE_CHAR_PX))
    lines = 1
    for a in titles:
        wrapped = wrap_title(a.text, chars)
        a.text, lines = wrapped, max(lines, wrapped.count("<br>") + 1)
        a.font.size = 12
    gaps = [up[0] - low[1] for up, low in zip(domains, domains[1:]) if up[0] > low[1]]
    need_px = lines * TITLE_LINE_PX + TICKS_PX
    fig.update_layout(margin={"t": max(40, lines * TITLE_LINE_PX + 16)})
    if gaps:
        height = max(height, int(need_px / min(gaps)) + 120)
    return height


def wrap_title(text: str, chars: int) -> str:
    """Words (split at ' · ' first, then spaces) on lines of at most `chars` characters."""
    words = text.replace(" · ", " ·\u2009").split(" ")
    lines, cur = [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > chars:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    return "<br>".join([*lines, cur]).replace("\u2009", " ")


def style(fig: go.Figure, height: int = 460) -> go.Figure:
    height = fit_titles(fig, height)
    fig.update_layout(
        title=None,  # the section's <h2> above the plot carries the title
        height=height,
        template="plotly_white",
        legend={"title": {"text": ""}},
        margin={"l": 70, "r": 30, "b": 60, "t": fig.layout.margin.t or 40},
        hoverlabel={"align": "left"},
    )
    return fig


def table(df: pd.DataFrame, columns: dict) -> pd.DataFrame:
    """The columns of df named in `columns` (old -> shown name), present ones only."""
    cols = [c for c in columns if c in df]
    return df[cols].rename(columns=columns).reset_index(drop=True)


def pareto(d: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The points no other point beats on both x and y (fewer-or-equal bits, lower error)."""
    d = d.sort_values([x, y])
    keep, best = [], float("inf")
    for i, r in d.iterrows():
        if r[y] < best:
            keep.append(i)
            best = r[y]
    return d.loc[keep]


def log_ticks(values) -> dict:
    """Tick values and full-number labels for a log axis over `values` (1-2-5 steps, finer under
    a decade, powers of ten over four); {} leaves it to plotly (a range under 2x). Plotly's own
    minor labels print 0.2 as "2", which reads wrong on a ratio or sub-millisecond axis."""
    import math

    v = pd.Series(values, dtype=float)
    v = v[v > 0]
    if v.empty or v.max() / v.min() < 2:
        return {}
    lo, hi = float(v.min()) / 1.3, float(v.max()) * 1.3
    span = hi / lo
    steps = (1,) if span >= 1e4 else (1, 2, 5) if span >= 10 else (1, 1.5, 2, 3, 5, 7)
    ticks = [
        m * 10.0**k
        for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
        for m in steps
        if lo <= m * 10.0**k <= hi
    ]
    return {"tickvals": ticks, "ticktext": [f"{t:g}" for t in ticks]}


def row_spacing(nrow: int, wanted: float) -> float:
    """Vertical gap between subplot rows: `wanted`, shrunk so many rows still fit (plotly
    refuses a gap above 1 / (rows - 1))."""
    return wanted if nrow < 2 else min(wanted, 0.5 / (nrow - 1))
