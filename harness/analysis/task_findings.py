"""Findings in words of the model's task phases (retrieval, generate) and of quality by
position (pandas only; harness/analysis/findings.py lists them among its topics).

* retrieval: per (model, task, context): each cache configuration's answers found over every
  depth of that context, "int4 finds the needle in 12/20 trials at ctx 8192, fp16 in 20/20",
  with each count's 95% Wilson interval, and its answers equal to the float32 cache's. Two
  configurations are called different only when their intervals do not overlap; otherwise
  the line says they are not separated.
* decode-time error: per (model, context): each configuration's tokens to the first divergence
  from the float32 cache's greedy continuation, agreement, and teacher-forced KL, on how many
  positions.
* quality by position: per quality row where kl_pos* exist: KL of the first and last quarter
  of the scored half, on how many tokens each (described, not judged: no interval).
This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import math

import pandas as pd

from kvbench.analysis.findings import Finding, cache_config

Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (as kernels/model/retrieval.py,
    restated here: analysis imports no kernels/)."""
    if n == 0:
        return 0.0, 1.0
    p, den = k / n, 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (0.0 if k == 0 else max(0.0, mid - half), 1.0 if k == n else min(1.0, mid + half))


def config_label(row: dict) -> str:
    """The row's cache configuration (findings.cache_config: format, options, window), and
    where a generate row's cache turns from fp16 to its format (quantized_kv_start)."""
    start = row.get("quantized_kv_start")
    late = start is not None and start == start and int(start) > 0
    return cache_config(row) + (f", fp16 until {int(start)}" if late else "")


def task_rows(cur: pd.DataFrame, phase: str, col: str) -> pd.DataFrame:
    """The ok rows of `phase` that carry `col`, with their cache configuration label."""
    if "phase" not in cur or col not in cur:
        return cur.iloc[0:0]
    d = cur[cur["phase"].eq(phase) & cur[col].notna()]
    if "status" in d:
        d = d[d["status"].eq("ok")]
    return d.assign(config=[config_label(r) for r in d.to_dict("records")])


def retrieval_counts(cur: pd.DataFrame) -> pd.DataFrame:
    """Per (model, task, context, configuration): correct answers and trials summed over the
    depths, the float32 cache's, and the Wilson interval of each."""
    d = task_rows(cur, "retrieval", "n_correct")
    if d.empty:
        return d
    d = d.assign(ref_correct=(d["ref_accuracy"] * d["n_trials"]).round())
    keys = ["model", "task", "context_len", "config"]
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


def _ctx(n) -> str:
    n = int(n)
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def retrieval(cur: pd.DataFrame) -> list[Finding]:
    g = retrieval_counts(cur)
    out = []
    for (model, task, ctx), part in g.groupby(["model", "task", "context_len"], sort=False):
        part = part.sort_values("n_correct", ascending=True)
        counts = [
            f"{r.config} in {int(r.n_correct)}/{int(r.n_trials)} ({r.lo:.2f}-{r.hi:.2f})"
            for r in part.itertuples()
        ]
        worst, best = part.iloc[0], part.iloc[-1]
        ref = f"; the float32 cache in {int(best.ref_correct)}/{int(best.n_trials)}"
        separated = worst.hi < best.lo
        verdict = "" if separated or len(part) < 2 else " (intervals overlap: not separated)"
        same = part.sort_values("n_ref_agree")
        low, high = same.iloc[0], same.iloc[-1]
        agree = ", ".join(
            f"{r.config} {int(r.n_ref_agree)}/{int(r.n_trials)}" for r in same.itertuples()
        )
        apart = low.agree_hi < high.agree_lo
        verdict += f"; answers equal to the float32 cache's: {agree}"
        verdict += " (apart)" if apart else " (not separated)" if len(part) > 1 else ""
        separated = separated or apart
        what = "finds the key" if task == "passkey" else "finds the needle"
        if task == "vartrack":
            what = "names every variable"
        text = f"{task} at {_ctx(ctx)} ({model}): {what}: " + ", ".join(counts) + ref + verdict
        out.append(Finding("retrieval", text, "retrieval", separated))
    return out


def generate(cur: pd.DataFrame) -> list[Finding]:
    d = task_rows(cur, "generate", "gen_kl_mean")
    out = []
    for (model, ctx), part in d.groupby(["model", "context_len"], sort=False):
        for r in part.sort_values("gen_kl_mean").itertuples():
            least = int(r.gen_first_diverge_min)
            text = (
                f"{r.config} at {_ctx(ctx)} ({model}): first divergence from the float32 "
                f"cache after {r.gen_first_diverge:.3g} tokens (least {least}"
                f"), agreement {r.gen_agree:.2f}, teacher-forced KL {r.gen_kl_mean:.3g} on "
                f"{int(r.gen_tokens_scored)} positions"
            )
            out.append(Finding("decode-time error", text, "generate", True))
    return out


def by_position(cur: pd.DataFrame) -> list[Finding]:
    d = task_rows(cur, "quality", "kl_pos1")
    out = []
    for r in d.to_dict("records"):
        first, last = r["kl_pos1"], r["kl_pos4"]
        ratio = f", last / first {last / first:.3g}" if first > 0 else ""
        text = (
            f"{r['config']} at {_ctx(r['context_len'])}: KL {first:.3g} in the first quarter "
            f"of the scored half ({int(r['n_pos1'])} tokens), {last:.3g} in the last "
            f"({int(r['n_pos4'])} tokens){ratio} (no interval: a description, not a verdict)"
        )
        out.append(Finding("quality by position", text, "qualityctx", False))
    return out
