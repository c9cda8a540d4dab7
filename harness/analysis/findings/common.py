"""What every finding topic shares: the Finding record, the rows a topic reads, the text of a
configuration and of a workload, and the join of rows to their baseline rows with the ratio's
interval and verdict (the statistics themselves: harness/stats.py).

A difference is stated only when the statistics support it: the ratio of two medians carries
the conservative interval [low_a / high_b, high_a / low_b] built from each side's 95% CI of the
median (stats.ratio_ci), and a verdict needs that whole interval beyond the threshold factor
(Rules().threshold, 1.1: asv's factor, the one compare uses). Otherwise the line says "no
difference measured". Byte counts are exact formulas and need no interval.
This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from kvbench import stats
from kvbench.analysis.rules import Rules
from kvbench.axes import TABLE, with_role
from kvbench.store.results import format_label, measured  # noqa: F401 (topics read it here)

THRESHOLD = Rules().threshold
MIN_SAMPLES = Rules().min_samples  # fewer raw samples on a side: no interval, no verdict
# From the axis table's roles: rows are compared within one workload; the axes of a
# configuration (cache choices and implementation details) tell the compared rows apart.
CONFIG_AXES = with_role("choice", "detail")
WORKLOAD_AXES = with_role("workload")
NAMED = ("kv_dtype", "group_size", "kernel", "tile_kv", "layout")  # a baseline's label names
# these always, the other configuration axes where they vary
# a workload's words ("ctx 1024"); other axes: the table's series part
SHOWN = {"phase": "{}", "context_len": "ctx {}", "gqa_ratio": "GQA {}", "n_seqs": "seqs {}",
         "prefix_frac": "prefix {}", "kv_data": "{} data", "window": "window {}",
         "model": "{}", "workload": "{}"}  # fmt: skip
_AXIS = {a.name: a for a in TABLE}


@dataclass(frozen=True)
class Finding:
    topic: str  # short heading: "fastest", "formats vs fp16", ...
    text: str  # the line, with its numbers
    figure: str  # the anchor (Figure.key) of the figure that shows it
    supported: bool  # False: the statistics did not support a difference


def _num(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def config_of(r, axes) -> str:
    """Short text of a row's configuration axes (those in `axes` that are set): the format with
    its group, "tile 64", and each other axis as its case-label part (e.g. rotK:hadamard)."""
    parts = []
    for a in axes:
        v = r.get(a)
        if a == "kv_dtype":
            parts.append(format_label(r))
        elif a == "group_size" or v is None or pd.isna(v) or v == "":
            continue
        elif a == "tile_kv":
            parts.append(f"tile {int(v)}")
        else:
            parts.append(_part(a, v, _AXIS[a].label or f"{a} {{}}"))
    return " ".join(parts)


def _part(axis: str, v, fmt: str) -> str:
    if isinstance(v, float) and v.is_integer() and _AXIS[axis].is_int:
        v = int(v)  # a CSV column with empty cells reads as float
    return fmt.format(v)


def ratio_ci(a, b) -> tuple[float, float, float]:
    """(median_a / median_b, conservative low, high) from each side's CI of its median."""
    return stats.ratio_ci(a, b, MIN_SAMPLES)


def interval(lo: float, hi: float) -> str:
    if math.isnan(lo) or math.isnan(hi):
        return f"[no interval: fewer than {MIN_SAMPLES} samples]"
    return f"[{lo:.2f}–{hi:.2f}]"


def verdict(lo: float, hi: float, threshold: float = THRESHOLD) -> str:
    """ "faster" (a < b), "slower", "same" (interval not wholly beyond the threshold), or "few"
    (no interval: too few samples on a side)."""
    return stats.ratio_verdict(lo, hi, threshold)


def varying(df: pd.DataFrame, axes) -> list[str]:
    return [a for a in axes if a in df and df[a].nunique(dropna=True) > 1]


def where(r, axes) -> str:
    """Short text of a row's workload (or other) axes: "decode · ctx 1024 · GQA 4"."""
    return " · ".join(_shown(a, r[a]) for a in axes if pd.notna(r.get(a)))


def _shown(a: str, v) -> str:
    if a in SHOWN:
        return SHOWN[a].format(_num(v))
    return _part(a, v, _AXIS[a].series) if a in _AXIS else _num(v)


def keyed(d: pd.DataFrame, axes) -> pd.DataFrame:
    """d with a `key` column: the values of `axes` as one hashable string (NaN-safe)."""
    d = d.copy()
    keys = d[list(axes)].astype(object).where(d[list(axes)].notna(), "-")
    d["key"] = ["|".join(map(str, t)) for t in keys.itertuples(index=False)] if axes else ""
    return d


def span(values) -> str:
    v = sorted(values)
    return (
        f"×{v[0]:.2g}"
        if len(v) == 1 or f"{v[0]:.2g}" == f"{v[-1]:.2g}"
        else (f"×{v[0]:.2g}–{v[-1]:.2g}")
    )


def tally(verdicts) -> str:
    s = pd.Series(list(verdicts)).value_counts()
    names = {"faster": "faster", "slower": "slower", "same": "no difference measured",
             "few": "too few samples to judge"}  # fmt: skip
    return ", ".join(f"{names[k]} in {int(s[k])}" for k in names if k in s)


def workload_axes(d: pd.DataFrame) -> list[str]:
    """The workload axes that vary in d (the head counts as gqa_ratio, named last)."""
    heads = ("n_q_heads", "n_kv_heads", "gqa_ratio")
    return varying(d, [a for a in WORKLOAD_AXES if a not in heads] + ["gqa_ratio"])


KEPT_APART = ("model", "context_len")  # never pooled: one model's figure is not another's


def group_axes(d: pd.DataFrame, compared=(), pooled=()) -> list[str]:
    """The one grouping of rows every topic uses: model and context always (where d has them),
    the other workload axes and the cache-choice axes where they vary in d, less the axes the
    topic compares across (`compared`) or pools on purpose (`pooled`; never model or context)."""
    if set(pooled) & set(KEPT_APART):
        raise ValueError(f"{KEPT_APART} are never pooled")
    always = [a for a in KEPT_APART if a in d and d[a].notna().any()]
    rest = varying(d, [a for a in (*WORKLOAD_AXES, *with_role("choice")) if a not in KEPT_APART])
    return [a for a in dict.fromkeys(always + rest) if a not in (*compared, *pooled)]


def groups(d: pd.DataFrame, axes: list[str]):
    """(the group's values of `axes`, its rows) per group, in the order rows first show them."""
    for _, g in keyed(d, axes).groupby("key", sort=False):
        yield {a: g.iloc[0][a] for a in axes}, g.drop(columns="key")


def apart_text(values: dict, d: pd.DataFrame, *first: str) -> str:
    """' (model, ctx N)': the kept-apart axes of a group, said where d holds more than one,
    after `first` (other words the line puts in the same brackets)."""
    said = [_shown(a, values[a]) for a in KEPT_APART if a in values and d[a].nunique() > 1]
    said = [*first, *said]
    return f" ({', '.join(said)})" if said else ""


def _against(d: pd.DataFrame, base: pd.DataFrame, by: str, keep: tuple) -> pd.DataFrame:
    """Rows of d joined to the baseline row with the same values of every varying case axis
    except `by` (and the axes in `keep` that the baseline may differ in); one baseline row per
    key: the fastest."""
    axes = [a for a in workload_axes(pd.concat([d, base])) if a not in keep]
    configs = varying(pd.concat([d, base]), CONFIG_AXES)
    axes += [a for a in configs if a not in (by, *keep)]
    d, base = keyed(d, axes), keyed(base, axes)
    base = base.sort_values("median_ms").drop_duplicates("key")
    cols = ["key", "median_ms", "ci_low_ms", "ci_high_ms", "n_samples", "kv_bytes", "mem_b"]
    cols.append("kernel")
    cols.append("label_b")
    named = [a for a in CONFIG_AXES if a in NAMED or a in configs]
    base = base.assign(label_b=[config_of(r, named) for r in base.to_dict("records")])
    return d.merge(base[[c for c in cols if c in base]], on="key", suffixes=("", "_b"))


def _ratios(m: pd.DataFrame) -> pd.DataFrame:
    """Ratio a / b of each joined row (b: the `_b` columns) with its interval and verdict."""
    sides = ("median_ms", "ci_low_ms", "ci_high_ms", "n_samples")
    rs = [
        ratio_ci(r, {c: r[f"{c}_b"] for c in sides})
        for r in m[[*sides, *(f"{c}_b" for c in sides)]].to_dict("records")
    ]
    m = m.assign(ratio=[r[0] for r in rs], lo=[r[1] for r in rs], hi=[r[2] for r in rs])
    return m.assign(verdict=[verdict(lo, hi) for lo, hi in zip(m["lo"], m["hi"])])


def baseline(d: pd.DataFrame, base: pd.DataFrame, by: str, loose=()) -> pd.DataFrame:
    """_against with every axis matched; rows left unmatched retry without the `loose` axes."""
    d = d.assign(_i=range(len(d)))
    strict = _against(d, base, by, keep=())
    rest = d[~d["_i"].isin(strict["_i"])]
    if loose and len(rest):
        strict = pd.concat([strict, _against(rest, base, by, keep=loose)], ignore_index=True)
    return _ratios(strict) if len(strict) else strict


def stated(g: pd.DataFrame) -> bool:
    """Whether any of the group's cases has a stated difference (faster or slower)."""
    return bool(g["verdict"].isin(("faster", "slower")).any())


def is_peer(d: pd.DataFrame):
    """Rows of a peer kernel (kernel_kind, filled for rows older than it by the v1 table)."""
    from kvbench.store.migrate_v1 import with_v1_facts

    return with_v1_facts(d)["kernel_kind"].eq("peer").to_numpy()


def source_of(row: dict) -> str:
    """Whose cache a real-model row measured: llama.cpp's tools, or kvbench's model engine
    (their references differ: an f16 cache for llama.cpp, float32 for kvbench)."""
    return "llama.cpp" if row.get("kernel") == "llama.cpp" else "kvbench"


# a cache configuration's words for a choice axis set off its default (any other choice axis:
# its series text from the axis table); the format (kv_dtype with group_size) leads, a rotation
# closes the text, and the blocks a rotation used and the tasks' fp16 start are said elsewhere
CONFIG_WORDS = {"v_dtype": "V {}", "k_axis": "{} keys", "sink_tokens": "{} sinks",
                "recent_tokens": "fp16 residual {}"}  # fmt: skip
SAID_ELSEWHERE = ("kv_dtype", "group_size", "rotate_k", "rotate_v", "rot_block_k", "rot_block_v",
                  "quantized_kv_start")  # fmt: skip
CACHE_AXES = tuple(a for a in with_role("choice") if a not in SAID_ELSEWHERE)


def _set(v) -> bool:
    return v is not None and v == v and v != ""


def cache_config(row: dict) -> str:
    """A row's cache configuration from the axis roles: the format, then every other cache
    choice set off its default (V's format, per-channel keys, fp16 sinks and residual window,
    ...), a sliding attention window with its sinks, and the rotation before quantization."""
    parts = [format_label(row)]
    windowed = _set(row.get("window"))
    for col in CACHE_AXES:
        v = row.get(col)
        if windowed and col == "sink_tokens":
            continue  # a sliding window's sinks: named with it below
        if _set(v) and v != _AXIS[col].default:
            text = CONFIG_WORDS.get(col, _AXIS[col].series)
            whole = isinstance(v, float) and v.is_integer()  # a CSV int column reads as float
            parts.append(text.format(int(v) if whole else v))
    if windowed:
        sinks = int(row.get("sink_tokens") or 0)
        parts.append(
            f"sliding window {int(row['window'])}" + (f" + {sinks} sinks" if sinks else "")
        )
    return ", ".join(parts + _rotation(row))


def _rotation(row: dict) -> list[str]:
    """Rotation before quantization, when set: "hadamard K/V", or each side on its own."""
    rk, rv = (
        row.get(c) if isinstance(row.get(c), str) else "none" for c in ("rotate_k", "rotate_v")
    )
    if rk == rv:
        return [] if rk == "none" else [f"{rk} K/V"]
    return [f"{r} {side}" for r, side in ((rk, "K"), (rv, "V")) if r != "none"]
