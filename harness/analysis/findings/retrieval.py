"""Topic "retrieval": per (model, task, context), each cache configuration's answers found
over every depth of that context, "int4 finds the needle in 12/20 trials at ctx 8192, fp16 in
20/20", with each count's 95% Wilson interval (stats.wilson), and its answers equal to the
float32 cache's; one line per engine and arithmetic where they vary (findings/tasks.py). Two
configurations are called different only when their intervals do not overlap; otherwise the
line says they are not separated [retrieval]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import (
    KEPT_APART,
    WORKLOAD_AXES,
    Finding,
    group_axes,
    with_role,
)
from kvbench.analysis.findings.tasks import ctx_text, task_rows
from kvbench.stats import wilson

TOPIC = "retrieval"


def retrieval_counts(cur: pd.DataFrame) -> pd.DataFrame:
    """Per (model, task, context, configuration): correct answers and trials summed over the
    depths, the float32 cache's, and the Wilson interval of each."""
    d = task_rows(cur, "retrieval", "n_correct")
    if d.empty:
        return d
    d = d.assign(ref_correct=(d["ref_accuracy"] * d["n_trials"]).round())
    # common.group_axes: model and context apart, the depths (and any other workload axis but
    # the task) pooled, each configuration its own count
    pooled = [a for a in WORKLOAD_AXES if a not in (*KEPT_APART, "task")]
    apart = group_axes(d, compared=with_role("choice"), pooled=pooled)
    keys = list(dict.fromkeys(["model", "task", "context_len", "engine", *apart, "config"]))
    keys.append("cache")  # config's first part: the same groups
    cols = ["n_correct", "n_trials", "ref_correct", "n_ref_agree"]
    g = d.groupby(keys, sort=False)[cols].sum().reset_index()
    ci = [wilson(int(k), int(n)) for k, n in zip(g["n_correct"], g["n_trials"])]
    agree = [wilson(int(k), int(n)) for k, n in zip(g["n_ref_agree"], g["n_trials"])]
    return g.assign(
        lo=[c[0] for c in ci],
        hi=[c[1] for c in ci],
        agree_lo=[c[0] for c in agree],
        agree_hi=[c[1] for c in agree],
    )


def find(cur: pd.DataFrame) -> list[Finding]:
    g = retrieval_counts(cur)
    out = []
    by = ["model", "task", "context_len", "engine"]
    for (model, task, ctx, engine), part in g.groupby(by, sort=False):
        part = part.sort_values("n_correct", ascending=True)
        counts = [
            f"{r.cache} in {int(r.n_correct)}/{int(r.n_trials)} ({r.lo:.2f}-{r.hi:.2f})"
            for r in part.itertuples()
        ]
        worst, best = part.iloc[0], part.iloc[-1]
        ref = f"; the float32 cache in {int(best.ref_correct)}/{int(best.n_trials)}"
        separated = worst.hi < best.lo
        verdict = "" if separated or len(part) < 2 else " (intervals overlap: not separated)"
        same = part.sort_values("n_ref_agree")
        low, high = same.iloc[0], same.iloc[-1]
        agree = ", ".join(
            f"{r.cache} {int(r.n_ref_agree)}/{int(r.n_trials)}" for r in same.itertuples()
        )
        apart = low.agree_hi < high.agree_lo
        verdict += f"; answers equal to the float32 cache's: {agree}"
        verdict += " (apart)" if apart else " (not separated)" if len(part) > 1 else ""
        separated = separated or apart
        what = "finds the key" if task == "passkey" else "finds the needle"
        if task == "vartrack":
            what = "names every variable"
        who = f", {engine}" if engine else ""  # the engine and arithmetic, where they vary
        text = f"{task} at {ctx_text(ctx)} ({model}{who}): {what}: " + ", ".join(counts)
        text += ref + verdict
        out.append(Finding(TOPIC, text, "retrieval", separated))
    return out
