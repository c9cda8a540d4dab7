"""Topic "trade-off": what each bit buys, per (model, context). Every cache configuration with
quality rows is a point (stored bits per element, KL against the float32 cache); with retrieval
rows, a point (bits, share of answers found). A point is on the Pareto frontier when no other
point of its panel dominates it (fewer-or-equal bits and an equal-or-better figure, one of the
two strictly: lower KL, more answers found). The finding names, per model, the configurations
on a frontier and those never on one, and each format's time per decode step with its fastest
kernel where the run timed it [tradeoff].

Decode times come from the run's timed decode rows (phase decode or model_decode): the same
model's where there are any, else every model's, on the device and at the context where the
most formats were timed (never a mix of machines); the fastest kernel of each format there.
This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import Finding, format_label, measured
from kvbench.analysis.findings.tasks import ctx_text, task_rows

TOPIC = "trade-off"
DECODE_PHASES = ("decode", "model_decode")


def on_frontier(bits: pd.Series, score: pd.Series, lower_is_better: bool = True) -> pd.Series:
    """True where no other point dominates: fewer-or-equal bits and an equal-or-better score,
    one of the two strictly (two identical points both stay)."""
    s = score if lower_is_better else -score
    out = []
    for b, v in zip(bits, s):
        beaten = ((bits <= b) & (s <= v) & ((bits < b) | (s < v))).any()
        out.append(not beaten)
    return pd.Series(out, index=bits.index)


def _per_config(rows: pd.DataFrame, **figures) -> pd.DataFrame:
    """rows grouped per (model, context, config): its format, median bits and `figures`."""
    return rows.groupby(["model", "context_len", "config"], sort=False).agg(
        kv_dtype=("kv_dtype", "first"),
        group_size=("group_size", "first"),
        bits=("bits_per_elem", "median"),
        **figures,
    )


def full_cache(cur: pd.DataFrame) -> pd.DataFrame:
    """The rows that keep every token: a cache policy's rows hold fewer tokens than their bits
    per element say, so they go on the frontier of bytes per context token (findings/budget.py),
    not this one (here they sat at their format's bits and looked dominated)."""
    if "policy" not in cur:
        return cur
    return cur[cur["policy"].isna() | cur["policy"].isin(("", "none"))]


def points(cur: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, context, metric, config): kv_dtype, bits, value (median KL, or the
    share found), tokens or trials, and whether it is on its panel's frontier (full-cache rows
    only: full_cache)."""
    cur = full_cache(cur)
    parts = []
    q = task_rows(cur, "quality", "kl_mean")
    if not q.empty and "bits_per_elem" in q:
        g = _per_config(q, value=("kl_mean", "median"), n=("n_scored", "sum"))
        parts.append(g.reset_index().assign(metric="KL"))
    r = task_rows(cur, "retrieval", "n_correct")
    if not r.empty and "bits_per_elem" in r:
        g = _per_config(r, found=("n_correct", "sum"), n=("n_trials", "sum"))
        g = g.assign(value=g["found"] / g["n"]).drop(columns="found")
        parts.append(g.reset_index().assign(metric="retrieval"))
    if not parts:
        return pd.DataFrame()
    d = pd.concat(parts, ignore_index=True)
    front = []
    for (_, _, metric), p in d.groupby(["model", "context_len", "metric"], sort=False):
        front.append(on_frontier(p["bits"], p["value"], lower_is_better=metric == "KL"))
    return d.assign(frontier=pd.concat(front).reindex(d.index))


def decode_times(cur: pd.DataFrame, model: str) -> tuple[pd.DataFrame, str]:
    """Per format: the fastest kernel's median time per decode step, and where it was timed."""
    if "phase" not in cur or "median_ms" not in cur:
        return pd.DataFrame(), ""
    d = measured(cur[cur["phase"].isin(DECODE_PHASES)])
    if d.empty:
        return pd.DataFrame(), ""
    same = d[d["model"] == model]
    d = (same if not same.empty else d).assign(device=d.get("device", "").fillna(""))
    keys = ["device", "model", "phase", "context_len"]  # one device: never a mix of machines
    counts = d.groupby(keys)["fmt"].nunique().reset_index()
    counts = counts.sort_values(["fmt", "context_len"], ascending=False)
    dev, m, phase, ctx = counts.iloc[0][keys]
    at = d[(d["device"] == dev) & (d["model"] == m) & (d["phase"] == phase)]
    at = at[at["context_len"] == ctx]
    best = at.sort_values("median_ms").groupby("fmt", sort=False).head(1)
    where = f"{phase} of {m} at ctx {ctx_text(ctx)}" + (f" on {dev}" if dev else "")
    return best[["fmt", "kernel", "median_ms"]].set_index("fmt").assign(timed_model=m), where


def table(cur: pd.DataFrame) -> pd.DataFrame:
    """points() with each configuration's decode time (its format's fastest kernel)."""
    d = points(cur)
    if d.empty:
        return d
    out = []
    for model, p in d.groupby("model", sort=False):
        times, where = decode_times(cur, model)
        fmt = [format_label(r) for r in p.to_dict("records")]
        got = times.reindex(fmt) if not times.empty else None
        p = p.assign(
            fmt=fmt,
            kernel=list(got["kernel"]) if got is not None else None,
            step_ms=list(got["median_ms"]) if got is not None else None,
            timed_at=where,
            timed_model=list(got["timed_model"]) if got is not None else None,
        )
        out.append(p)
    return pd.concat(out, ignore_index=True)


def find(cur: pd.DataFrame) -> list[Finding]:
    d = table(cur)
    if d.empty:
        return []
    out = []
    for model, p in d.groupby("model", sort=False):
        on = p[p["frontier"]].groupby("config", sort=False).size().index
        never = [c for c in dict.fromkeys(p["config"]) if c not in set(on)]
        panels = ", ".join(
            f"{m} at ctx {ctx_text(c)}"
            for c, m in dict.fromkeys(zip(p["context_len"], p["metric"]))
        )
        text = (
            f"{model} ({panels}): on a Pareto frontier of bits per element: {' | '.join(on)}; "
            f"never on one: {' | '.join(never) or 'none'}"
        )
        times = p.dropna(subset=["step_ms"]).drop_duplicates("fmt") if "step_ms" in p else p[:0]
        if not times.empty:
            each = ", ".join(
                f"{r.fmt} {r.step_ms:.3g} ms ({r.kernel})"
                for r in times.sort_values("step_ms").itertuples()
            )
            where = times["timed_at"].iloc[0]
            text += f". Time per decode step of each format's fastest kernel ({where}): {each}"
        out.append(Finding(TOPIC, text, "tradeoff", True))
    return out
