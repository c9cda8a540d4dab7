"""The suite's answers, computed from result rows (pandas only; the report renders them).

Each finding is one line with its numbers and the figure that shows them. A difference is
stated only when the statistics support it: the ratio of two medians carries the conservative
interval [low_a / high_b, high_a / low_b] built from each side's 95% CI of the median
(ci_low_ms / ci_high_ms, distribution-free order statistics of the raw samples,
harness/stats.py), and a verdict needs that whole interval beyond the threshold
factor (Rules().threshold, 1.1: asv's factor, the one compare uses). Otherwise the line says
"no difference measured". Byte counts are exact formulas and need no interval.

Topics (figure anchors in brackets): fastest configuration per workload [latency]; each
format against fp16 by context, with the context where the verdict crosses [formats]; unified
against per-stream by shared-prefix fraction [layouts]; best tile per context [tiles];
kvbench's kernels against the best peer [peers]; accuracy per format [accuracy]; quality per
format (ppl, delta_ppl, kl_mean, when those columns exist) [quality]; exact, resident and peak
memory per layout (analysis/memory.py) [residency].
This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from kvbench.analysis.crossover import payoff_lines
from kvbench.analysis.memory import memory_lines
from kvbench.analysis.rules import Rules
from kvbench.store.results import format_label

THRESHOLD = Rules().threshold
MIN_SAMPLES = Rules().min_samples  # fewer raw samples on a side: no interval, no verdict
MEASURED = ("ok", "partial")
# Axes that pick an implementation (what a user chooses); every other case axis is workload.
CHOICE_AXES = ("kv_dtype", "group_size", "kernel", "tile_kv", "layout")
WORKLOAD_AXES = (
    "model", "n_layers", "n_q_heads", "n_kv_heads", "head_dim", "phase", "context_len",
    "n_seqs", "workload", "prefix_frac", "decode_order", "churn", "kv_data", "seed", "kv_file",
    "window",
)  # fmt: skip
SHOWN = {"phase": "{}", "context_len": "ctx {}", "gqa_ratio": "GQA {}", "n_seqs": "seqs {}",
         "prefix_frac": "prefix {}", "kv_data": "{} data", "window": "window {}",
         "model": "{}", "workload": "{}"}  # fmt: skip
QUALITY = ("delta_ppl", "kl_mean", "ppl")


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
    """Short text of a row's choice axes (those in `axes` that are set)."""
    parts = []
    for a in axes:
        if a == "kv_dtype":
            parts.append(format_label(r))
        elif a == "tile_kv" and pd.notna(r.get(a)):
            parts.append(f"tile {int(r[a])}")
        elif a not in ("group_size", "tile_kv") and pd.notna(r.get(a)):
            parts.append(str(r[a]))
    return " ".join(parts)


def ratio_ci(a, b) -> tuple[float, float, float]:
    """(median_a / median_b, conservative low, high) from each side's CI of its median."""
    r = a["median_ms"] / b["median_ms"]
    if min(_n(a), _n(b)) < MIN_SAMPLES:  # a 2-sample "CI" is the two samples: no interval
        return float(r), math.nan, math.nan
    lo = a["ci_low_ms"] / b["ci_high_ms"] if b["ci_high_ms"] > 0 else math.nan
    hi = a["ci_high_ms"] / b["ci_low_ms"] if b["ci_low_ms"] > 0 else math.nan
    return float(r), float(lo), float(hi)


def _n(r) -> float:
    n = r.get("n_samples")
    return math.inf if n is None or pd.isna(n) else float(n)  # no count recorded: trust the CI


def interval(lo: float, hi: float) -> str:
    if math.isnan(lo) or math.isnan(hi):
        return f"[no interval: fewer than {MIN_SAMPLES} samples]"
    return f"[{lo:.2f}–{hi:.2f}]"


def verdict(lo: float, hi: float, threshold: float = THRESHOLD) -> str:
    """ "faster" (a < b), "slower", "same" (interval not wholly beyond the threshold), or "few"
    (no interval: too few samples on a side)."""
    if math.isnan(lo) or math.isnan(hi):
        return "few"
    if hi < 1 / threshold:
        return "faster"
    if lo > threshold:
        return "slower"
    return "same"


def measured(df: pd.DataFrame) -> pd.DataFrame:
    d = df[df["status"].isin(MEASURED) & df["median_ms"].notna()].copy()
    d["fmt"] = [format_label(r) for r in d.to_dict("records")] if len(d) else []
    return d


def varying(df: pd.DataFrame, axes) -> list[str]:
    return [a for a in axes if a in df and df[a].nunique(dropna=True) > 1]


def where(r, axes) -> str:
    return " · ".join(SHOWN.get(a, "{}").format(_num(r[a])) for a in axes if pd.notna(r.get(a)))


def _keyed(d: pd.DataFrame, axes) -> pd.DataFrame:
    """d with a `key` column: the values of `axes` as one hashable string (NaN-safe)."""
    d = d.copy()
    keys = d[list(axes)].astype(object).where(d[list(axes)].notna(), "-")
    d["key"] = ["|".join(map(str, t)) for t in keys.itertuples(index=False)] if axes else ""
    return d


def _span(values) -> str:
    v = sorted(values)
    return (
        f"×{v[0]:.2g}"
        if len(v) == 1 or f"{v[0]:.2g}" == f"{v[-1]:.2g}"
        else (f"×{v[0]:.2g}–{v[-1]:.2g}")
    )


def _tally(verdicts) -> str:
    s = pd.Series(list(verdicts)).value_counts()
    names = {"faster": "faster", "slower": "slower", "same": "no difference measured",
             "few": "too few samples to judge"}  # fmt: skip
    return ", ".join(f"{names[k]} in {int(s[k])}" for k in names if k in s)


def _workload_axes(d: pd.DataFrame) -> list[str]:
    axes = [a for a in WORKLOAD_AXES if a not in ("n_q_heads", "n_kv_heads")] + ["gqa_ratio"]
    return varying(d, axes)


def fastest(cur: pd.DataFrame) -> list[Finding]:
    """Per workload (context, GQA, ... as they vary): the fastest configuration and its lead
    over the next one."""
    d = measured(cur)
    choices = varying(d, CHOICE_AXES)
    if d.empty or not choices or choices == ["layout"]:  # layout alone: the layouts topic
        return []
    group = ["phase", "context_len", *[a for a in _workload_axes(d) if a != "context_len"]]
    group = list(dict.fromkeys(a for a in group if a in d and d[a].notna().any()))
    out = []
    d = d.sort_values(group)
    for _, g in _keyed(d, group).groupby("key", sort=False):
        if len(g) < 2:
            continue
        g = g.sort_values("median_ms")
        out.append(_lead(g.iloc[0], g.iloc[1], group, varying(g, CHOICE_AXES) or choices))
    return out


def _lead(best, nxt, group: list, choices: list) -> Finding:
    """The fastest configuration of a group and its lead over the next one."""
    r, lo, hi = ratio_ci(nxt, best)
    clear = verdict(lo, hi) == "slower"  # the next one is slower beyond the threshold
    head = f"{where(best, group)}: {config_of(best, choices)}"
    if clear:
        text = (f"{head} is fastest, {best['median_ms']:.3g} ms; {r:.2f}× "
                f"{interval(lo, hi)} ahead of {config_of(nxt, choices)}")  # fmt: skip
    else:
        why = "too few samples to judge" if math.isnan(lo) else "no difference measured"
        text = (f"{head} ({best['median_ms']:.3g} ms) and {config_of(nxt, choices)} "
                f"({nxt['median_ms']:.3g} ms) lead: {why} "
                f"(×{r:.2f} {interval(lo, hi)})")  # fmt: skip
    return Finding("fastest", text, "latency", clear)


def _against(d: pd.DataFrame, base: pd.DataFrame, by: str, keep: tuple) -> pd.DataFrame:
    """Rows of d joined to the baseline row with the same values of every varying case axis
    except `by` (and the axes in `keep` that the baseline may differ in); one baseline row per
    key: the fastest."""
    axes = [a for a in _workload_axes(pd.concat([d, base])) if a not in keep]
    axes += [a for a in varying(pd.concat([d, base]), CHOICE_AXES) if a not in (by, *keep)]
    d, base = _keyed(d, axes), _keyed(base, axes)
    base = base.sort_values("median_ms").drop_duplicates("key")
    cols = ["key", "median_ms", "ci_low_ms", "ci_high_ms", "n_samples", "kv_bytes", "mem_b"]
    cols.append("kernel")
    cols.append("label_b")
    base = base.assign(label_b=[config_of(r, CHOICE_AXES) for r in base.to_dict("records")])
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


def crossing(per_ctx: pd.Series) -> str:
    """From a context -> verdict series (sorted): where the verdict turns for good, e.g.
    "faster from ctx 4096"; "" when it never turns or never settles."""
    v = list(per_ctx.items())
    for i in range(1, len(v)):
        tail = {x for _, x in v[i:]}
        if len(tail) == 1 and v[i - 1][1] != v[i][1] and v[i][1] in ("faster", "slower"):
            return f"{v[i][1]} from ctx {int(v[i][0])}"
    return ""


def _ctx_verdict(g: pd.DataFrame) -> pd.Series:
    """One verdict per context: the common one, or "same" when cases there disagree."""
    one = g.groupby("context_len")["verdict"].agg(lambda s: s.iloc[0] if s.nunique() == 1 else "")
    return one.replace("", "same").sort_index()


def is_peer(d: pd.DataFrame):
    """Rows of a peer kernel (kernel_kind, filled for rows older than it by the v1 table)."""
    from kvbench.store.migrate_v1 import with_v1_facts

    return with_v1_facts(d)["kernel_kind"].eq("peer").to_numpy()


def source_of(row: dict) -> str:
    """Whose cache a real-model row measured: llama.cpp's tools, or kvbench's model engine
    (their references differ: an f16 cache for llama.cpp, float32 for kvbench)."""
    return "llama.cpp" if row.get("kernel") == "llama.cpp" else "kvbench"


def format_pairs(cur: pd.DataFrame) -> pd.DataFrame:
    """kvbench's rows of formats other than fp16 joined to the fp16 row of the same case (same
    kernel when fp16 ran with it, else the fastest fp16 kernel); peers' rows are left out (the
    peers topic compares them)."""
    d = measured(cur)
    if d.empty:
        return d
    d = d[~is_peer(d)]
    base, rest = d[d["kv_dtype"] == "fp16"], d[d["kv_dtype"] != "fp16"]
    if base.empty or rest.empty:
        return d.iloc[0:0]
    return baseline(rest, base, "kv_dtype", loose=("kernel", "group_size", "tile_kv"))


def formats(cur: pd.DataFrame) -> list[Finding]:
    """Each format (per kernel) against fp16 in the same workload: time ratio, KV bytes ratio,
    the context where the verdict turns."""
    m = format_pairs(cur)
    out = []
    for (fmt, kernel), g in m.groupby(["fmt", "kernel"], sort=True):
        mem = (g["kv_bytes"] / g["kv_bytes_b"]).median() if "kv_bytes_b" in g else math.nan
        cross = crossing(_ctx_verdict(g)) if g["context_len"].nunique() > 1 else ""
        by_ctx = g.groupby("context_len")["ratio"].median()  # over GQA, data, ...
        times = ", ".join(f"ctx {int(c)} ×{v:.2g}" for c, v in by_ctx.items())
        text = (
            f"{fmt} {kernel} time / fp16's: {times} ({_tally(g['verdict'])} of {len(g)} cases)"
            + (f"; KV bytes ×{mem:.2g}" if pd.notna(mem) else "")
            + (f"; {cross}" if cross else "")
        )
        out.append(Finding("formats vs fp16", text, "formats", stated(g)))
    return out


def stated(g: pd.DataFrame) -> bool:
    """Whether any of the group's cases has a stated difference (faster or slower)."""
    return bool(g["verdict"].isin(("faster", "slower")).any())


def layouts(cur: pd.DataFrame) -> list[Finding]:
    """Unified against per-stream, same everything else, one line per shared-prefix fraction."""
    d = measured(cur)
    if "layout" not in d or not {"unified", "per-stream"} <= set(d["layout"].dropna()):
        return []
    mem = "bytes_alloc" if d.get("bytes_alloc", pd.Series()).notna().any() else "kv_bytes"
    d = d.assign(mem_b=d[mem])
    m = baseline(d[d["layout"] == "unified"], d[d["layout"] == "per-stream"], "layout")
    if m.empty:
        return []
    out = []
    for frac, g in m.groupby(m["prefix_frac"].fillna(0.0), sort=True):
        saved = g["mem_b"] / g["mem_b_b"]
        text = (
            f"shared prefix {frac:g}: unified holds {_span(saved)} the KV memory of per-stream "
            f"({mem}); latency {_span(g['ratio'])} ({_tally(g['verdict'])} of {len(g)} "
            f"pairs over seqs × ctx)"
        )
        out.append(
            Finding(
                "unified vs per-stream",
                text,
                "layouts",
                g["verdict"].isin(("faster", "slower")).any(),
            )
        )
    return out


def tiles(cur: pd.DataFrame) -> list[Finding]:
    """Per context: which tile is fastest in how many configurations, and in how many of those
    its lead over the next tile is beyond the threshold."""
    d = measured(cur)
    d = d[d["tile_kv"].notna()] if "tile_kv" in d else d.iloc[0:0]
    if d.empty or d["tile_kv"].nunique() < 2:
        return []
    axes = [a for a in _workload_axes(d) + varying(d, CHOICE_AXES) if a != "tile_kv"]
    out = []
    for ctx, c in _keyed(d, [a for a in axes if a != "context_len"]).groupby("context_len"):
        wins = []
        for _, g in c.groupby("key"):
            g = g.sort_values("median_ms")
            if len(g) > 1:
                _, lo, _ = ratio_ci(g.iloc[1], g.iloc[0])
                wins.append((int(g.iloc[0]["tile_kv"]), bool(lo > THRESHOLD)))
        if not wins:
            continue
        w = pd.DataFrame(wins, columns=["tile", "clear"])
        t = w.groupby("tile")["clear"].agg(["size", "sum"])
        t = t.sort_values(["size", "sum"], ascending=False, kind="stable")
        parts = [f"tile {tile} in {int(r['size'])} (clear lead in {int(r['sum'])})"
                 for tile, r in t.iterrows()]  # fmt: skip
        text = f"ctx {int(ctx)}: fastest tile over {len(w)} configurations: " + "; ".join(parts)
        out.append(Finding("best tile", text, "tiles", bool(w["clear"].any())))
    return out


def peers(cur: pd.DataFrame) -> list[Finding]:
    """Each kvbench kernel against the fastest peer kernel of the same case."""
    d = measured(cur)
    if d.empty:
        return []
    peer = is_peer(d)
    if not peer.any() or peer.all():
        return []
    m = baseline(d[~peer], d[peer], "kernel")
    out = []
    for kernel, g in m.groupby("kernel", sort=True):
        best = ", ".join(f"{k} ({n})" for k, n in g["kernel_b"].value_counts().items())
        text = (
            f"{kernel}: {_span(g['ratio'])} the best peer's time ({_tally(g['verdict'])} of "
            f"{len(g)} cases; best peer: {best})"
        )
        out.append(Finding("kvbench vs peers", text, "peers", stated(g)))
    return out


def accuracy(cur: pd.DataFrame) -> list[Finding]:
    """Per format: median relative error of the attention output against float32."""
    d = measured(cur)
    d = d[d["rel_err"].notna()] if "rel_err" in d else d.iloc[0:0]
    if d["fmt"].nunique() < 2:
        return []
    g = d.groupby("fmt").agg(err=("rel_err", "median"), bits=("bits_per_elem", "first"),
                             n=("rel_err", "size")).sort_values("bits")  # fmt: skip
    line = "{}: attention rel. error {:.2g} (median of {} cases) at {:.3g} bits/elem"
    return [
        Finding("accuracy", line.format(f, r.err, int(r.n), r.bits), "accuracy", True)
        for f, r in g.iterrows()
    ]


def cache_config(row: dict) -> str:
    """A quality row's cache configuration: the format, and V's format, per-channel keys,
    fp16 sinks and residual window when set (the model engine's options), and a sliding
    attention window with its sinks."""
    parts = [format_label(row)]
    extra = (("v_dtype", "V {}"), ("k_axis", "{} keys"), ("sink_tokens", "{} sinks"),
             ("recent_tokens", "fp16 residual {}"))  # fmt: skip
    defaults = {"k_axis": "token", "sink_tokens": 0, "recent_tokens": 0}
    w = row.get("window")
    windowed = w is not None and w == w and w != ""
    for col, text in extra:
        v = row.get(col)
        if windowed and col == "sink_tokens":
            continue  # a sliding window's sinks: named with it below
        if v is not None and v == v and v != "" and v != defaults.get(col):
            parts.append(text.format(int(v) if isinstance(v, float) else v))
    if windowed:
        sinks = int(row.get("sink_tokens") or 0)
        parts.append(f"sliding window {int(w)}" + (f" + {sinks} sinks" if sinks else ""))
    return ", ".join(parts)


def quality(cur: pd.DataFrame) -> list[Finding]:
    """Per format: the quality columns a model-quality run records (absent: no finding)."""
    cols = [c for c in QUALITY if c in cur and cur[c].notna().any()]
    if not cols:
        return []
    d = cur[cur["status"] == "ok"] if "status" in cur else cur
    d = d.dropna(subset=cols, how="all")  # quality rows carry no time: not `measured`
    # llama.cpp's rows (kernel llama.cpp) stand apart: their reference is its own f16 cache
    d = d.assign(
        fmt=[
            cache_config(r) + (" (llama.cpp)" if source_of(r) == "llama.cpp" else "")
            for r in d.to_dict("records")
        ]
    )
    g = d.groupby("fmt", sort=False)[cols].median()
    names = {"delta_ppl": "Δppl {:+.3g}", "kl_mean": "KL {:.3g}", "ppl": "ppl {:.4g}"}
    out = []
    for f, r in g.iterrows():
        text = f"{f}: " + ", ".join(names[c].format(r[c]) for c in cols if pd.notna(r[c]))
        out.append(Finding("quality", text, "quality", True))
    return out


def _tasks(name: str):
    """A topic of harness/analysis/task_findings.py (imported when run: it imports this)."""

    def topic(cur: pd.DataFrame) -> list[Finding]:
        from kvbench.analysis import task_findings

        return getattr(task_findings, name)(cur)

    return topic


def payoff(cur: pd.DataFrame) -> list[Finding]:
    """Where each format becomes faster than fp16: latency fitted a + b * context per format
    and kernel (analysis/crossover.py), over kvbench's own decode rows."""
    d = measured(cur)
    if d.empty:
        return []
    d = d[~is_peer(d)]
    workload = [a for a in _workload_axes(d) if a not in ("context_len", "phase")]
    choices = varying(d, ("tile_kv", "layout"))
    shown = [*workload, *[c for c in choices if c == "layout"]]  # tile_kv: in the line itself
    lines = payoff_lines(d, workload, choices, lambda r: where(r, shown))
    return [Finding("where formats pay off", t, "formats", True) for t in lines]


def memory(cur: pd.DataFrame) -> list[Finding]:
    """Per layout: exact, resident and peak bytes side by side (analysis/memory.py)."""
    return [Finding("memory", line, "residency", True) for line in memory_lines(cur)]


TOPICS = {
    "fastest": fastest,
    "formats vs fp16": formats,
    "where formats pay off": payoff,
    "unified vs per-stream": layouts,
    "best tile": tiles,
    "kvbench vs peers": peers,
    "quality": quality,
    "accuracy": accuracy,
    "retrieval": _tasks("retrieval"),
    "decode-time error": _tasks("generate"),
    "quality by position": _tasks("by_position"),
    "memory": memory,
}


def findings(cur: pd.DataFrame) -> list[Finding]:
    """Every topic's findings, in TOPICS order."""
    return [f for topic in TOPICS.values() for f in topic(cur)]
