"""Topic "memory budget": which cache for this memory, formats and cache policies on one
frontier (issue 42 item 5). Per (model, context), every cache configuration with quality or
retrieval rows is a point: bytes its cache holds per context token against KL of next-token
distributions (lower is better) or the share of retrieval answers found (higher is better).
A format stores every token in fewer bits; a policy (snapkv, window, ...) keeps fewer tokens;
both land on the same axis, bytes per context token.

Bytes per context token: a policy row's `kept_bytes_per_token` (format bytes of the kept cells
plus what the policy itself stores, over the context's tokens: store/schema.py) plus its
sliding-window rings' bytes (`kept_ring_bytes`, fixed) over its context_len, else the exact
`kv_bytes` of the full cache over its `context_len`. The frontier is the Pareto frontier of its
panel (fewer-or-equal bytes and an equal-or-better figure, one strictly). Read along the bytes,
each frontier point is the configuration closest to the full cache for every budget from its
bytes up to the next frontier point's: the finding names them, budget by budget, and names
the policies none of whose configurations is on any frontier of the model [budget].
This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import Finding
from kvbench.analysis.findings.tasks import ctx_text, task_rows
from kvbench.analysis.findings.tradeoff import on_frontier

TOPIC = "memory budget"
FULL = "full cache"  # the policy label of a row that keeps every token


def bytes_per_token(d: pd.DataFrame) -> pd.Series:
    """Bytes the cache holds per context token (see module); NaN where a row says neither."""
    per = d["kv_bytes"] / d["context_len"] if "kv_bytes" in d else pd.Series(float("nan"), d.index)
    if "kept_bytes_per_token" in d:
        policy = d["kept_bytes_per_token"]
        if "kept_ring_bytes" in d:  # a window ring holds its cells whatever the context
            policy = policy + d["kept_ring_bytes"].fillna(0) / d["context_len"]
        per = policy.where(d["kept_bytes_per_token"].notna(), per)
    return per.astype(float)


def policy_of(r: dict) -> str:
    """The row's policy as the finding names it: "snapkv 0.5" (its compression ratio), "window
    512" (a token budget), FULL without one."""
    name = r.get("policy")
    if name is None or pd.isna(name) or name in ("", "none", "full"):
        return FULL
    for col in ("kv_budget", "compression_ratio"):  # a token budget, where set, overrides
        v = r.get(col)
        if v is not None and not pd.isna(v):
            return f"{name} {float(v):g}"
    return str(name)


def _label(r: dict) -> str:
    """The configuration with its policy (once: an axis label may already name it)."""
    pol = policy_of(r)
    if pol == FULL or pol.split(" ")[0] in r["config"]:  # the policy axis names it
        return r["config"]
    return f"{r['config']} {pol}"


def _rows(cur: pd.DataFrame, phase: str, col: str) -> pd.DataFrame:
    d = task_rows(cur, phase, col)
    if d.empty:
        return d
    recs = d.to_dict("records")
    d = d.assign(policy_label=[policy_of(r) for r in recs], label=[_label(r) for r in recs],
                 bytes_per_token=bytes_per_token(d))  # fmt: skip
    return d.dropna(subset=["bytes_per_token"])


def points(cur: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, context, metric, label): policy, bytes per token, value (median KL,
    or the share found), n (scored tokens or trials), and whether it is on the frontier."""
    parts = []
    keys = ["model", "context_len", "label"]
    q = _rows(cur, "quality", "kl_mean")
    if not q.empty:
        g = q.groupby(keys, sort=False).agg(
            policy=("policy_label", "first"), bytes_per_token=("bytes_per_token", "median"),
            value=("kl_mean", "median"), n=("n_scored", "sum"))  # fmt: skip
        parts.append(g.reset_index().assign(metric="KL"))
    r = _rows(cur, "retrieval", "n_correct")
    if not r.empty:
        g = r.groupby(keys, sort=False).agg(
            policy=("policy_label", "first"), bytes_per_token=("bytes_per_token", "median"),
            found=("n_correct", "sum"), n=("n_trials", "sum"))  # fmt: skip
        g = g.assign(value=g["found"] / g["n"]).drop(columns="found")
        parts.append(g.reset_index().assign(metric="retrieval"))
    if not parts:
        return pd.DataFrame()
    d = pd.concat(parts, ignore_index=True)
    front = [
        on_frontier(p["bytes_per_token"], p["value"], lower_is_better=m == "KL")
        for (_, _, m), p in d.groupby(["model", "context_len", "metric"], sort=False)
    ]
    return d.assign(frontier=pd.concat(front).reindex(d.index))


def _value(metric: str, v: float, n) -> str:
    if metric == "KL":
        return f"KL {v:.3g} ({int(n)} tokens)"
    return f"{v:.0%} found ({int(n)} trials)"


def ladder(p: pd.DataFrame) -> str:
    """The frontier read along the bytes: from each point's bytes up, the best configuration."""
    front = p[p["frontier"]].sort_values("bytes_per_token")
    return "; ".join(
        f">= {r.bytes_per_token:,.0f} B/token: {r.label}, {_value(r.metric, r.value, r.n)}"
        for r in front.itertuples()
    )


def find(cur: pd.DataFrame) -> list[Finding]:
    d = points(cur)
    if d.empty or d["policy"].eq(FULL).all():
        return []  # no policy in the run: the trade-off topic (bits per element) says it all
    out = []
    for (model, ctx, metric), p in d.groupby(["model", "context_len", "metric"], sort=False):
        what = "KL" if metric == "KL" else "retrieval"
        text = f"{model} at ctx {ctx_text(ctx)}, {what}, the cache closest to the full one per "
        out.append(Finding(TOPIC, text + f"memory budget: {ladder(p)}", "budget", True))
    for model, p in d.groupby("model", sort=False):
        names = p["policy"].map(lambda s: s if s == FULL else s.split(" ")[0])
        on = set(names[p["frontier"]])
        never = [n for n in dict.fromkeys(names) if n not in on]
        text = f"{model}: policies never on a frontier of bytes per context token: "
        out.append(Finding(TOPIC, text + (", ".join(never) or "none"), "budget", True))
    return out
