"""The answer of a run's quality rows, in words a person reads first (issue 44 item 2).

Per workload (model, context, text, chunks, ...): the baseline (the float32 cache's perplexity
± its standard error, and the tokens scored), then each configuration against it: Δppl ± its
paired error (kernels/model/quality.py: delta_ppl_err), KL ± err, top-1 agreement, retrieval
where the run measured it on the same configuration, the cache's bytes and their share of
fp16's. Below: the pick, the smallest cache whose Δppl is within a stated tolerance at 95%
(upper bound Δppl + 1.96 err <= tolerance x baseline ppl), the Pareto frontier of bytes and KL,
and a warning for each two configurations whose error bars overlap (with the chunks that would
separate a difference that size: errors shrink as 1/sqrt(tokens)). Pandas only; no mlx.
"""

from __future__ import annotations

import math

import pandas as pd

from kvbench.axes import TABLE, with_role

Z = 1.96  # two-sided 95% normal quantile
TOLERANCE_PCT = 1.0  # default: Δppl within 1% of the baseline's perplexity
MAX_WARNINGS = 3  # overlap warnings an answer block lists by name
LABELLED = [a for a in TABLE if a.role in ("choice", "detail") and a.label]
GROUP = [a for a in with_role("workload") if a not in ("phase", "task", "depth", "trials")]


def _given(v) -> bool:
    return v is not None and v == v and v != ""


# a row that keeps a part of its context always says which policy and how much, varying or not
POLICY_AXES = ("policy", "compression_ratio", "kv_budget")


def config_label(row: pd.Series, varying: set[str]) -> str:
    """The format, then every other cache axis that varies in the group and is off default
    (and a policy's name and budget on its rows: "fp16" alone would read as the full cache)."""
    parts = [str(row["kv_dtype"])]
    shown = varying | (set(POLICY_AXES) if not _full(row.get("policy")) else set())
    for a in LABELLED:
        v = row.get(a.name)
        if a.name != "kv_dtype" and a.name in shown and _given(v) and v != a.default:
            parts.append(a.label.format(int(v) if a.is_int and float(v).is_integer() else v))
    return " ".join(parts)


def _full(policy) -> bool:
    """A row that keeps every position: no cache policy named."""
    return not _given(policy) or policy == "none"


def fp16_bytes(g: pd.DataFrame) -> tuple[float, str]:
    """fp16's cache bytes at the group's shape: its own row where the run has one, else
    2 bytes x K and V x layers x KV heads x head_dim x positions x sequences."""
    full = g["policy"].map(_full) if "policy" in g else True  # a policy row keeps a part
    plain = g[(g["kv_dtype"] == "fp16") & g["kv_bytes"].notna() & full]
    if len(plain):
        return float(plain["kv_bytes"].min()), "its row"
    r = g.iloc[0]
    n = 2 * 2 * r["n_layers"] * r["n_kv_heads"] * r["head_dim"] * r["context_len"] * r["n_seqs"]
    return float(n), "by formula"


def context_bytes(g: pd.DataFrame) -> pd.Series:
    """Each row's cache bytes for its whole context_len: kv_bytes, except a cache policy's row,
    whose kv_bytes hold only the context it compressed (half a quality chunk; a retrieval
    prompt's haystack; a model_decode step's kept cells): its kept_bytes_per_token x
    context_len, so its share of fp16's is per context token."""
    from kvbench.analysis.findings.budget import bytes_per_token  # the one definition

    if "context_len" not in g:
        return g["kv_bytes"].astype(float)
    return (bytes_per_token(g) * g["context_len"]).astype(float)


def _pm(v, e, fmt: str) -> str:
    if not _given(v):
        return ""
    return format(v, fmt) + (f" ± {format(e, fmt.lstrip('+'))}" if _given(e) else "")


def _retrieval(df: pd.DataFrame, row: pd.Series) -> str:
    """correct/trials of the run's retrieval rows with this row's model, context and cache, run
    the way this row ran (its kernel, key order, query rounding: llama-passkey's rows beside
    kvbench's are another engine's count, never pooled into this one)."""
    if "phase" not in df or "n_correct" not in df:
        return ""
    r = df[(df["phase"] == "retrieval") & (df["status"] == "ok")]
    for a in ["model", "context_len", *(a.name for a in LABELLED if a.role == "choice")]:
        if a in r and a in row:
            r = r[r[a].map(str) == str(row[a])]
    for a in (a for a in LABELLED if a.role == "detail"):
        if a.name in r and a.name in row:

            def norm(v, default=a.default) -> str:  # an empty cell: the axis' default
                return str(v if _given(v) else default)

            r = r[r[a.name].map(norm) == norm(row[a.name])]
    if not len(r):
        return ""
    return f"{int(r['n_correct'].sum())}/{int(r['n_trials'].sum())}"


def _varying(g: pd.DataFrame) -> set[str]:
    """The labelled axes whose values differ in the group; a rotation block only where the
    rotated rows differ in it (an unrotated row's empty block is no choice)."""
    cols = [a.name for a in LABELLED if a.name in g]
    varying = {c for c in cols if g[c].map(str).nunique() > 1}
    for side in ("k", "v"):
        rot, block = f"rotate_{side}", f"rot_block_{side}"
        if rot in g and block in varying:
            turned = g[g[rot].map(str) != "none"]
            if turned[block].map(str).nunique() <= 1:
                varying.discard(block)
    return varying


def short_label(label: str) -> str:
    """'rotK:hadamard rotV:hadamard' said once as 'rot:hadamard' (K and V alike), and so a
    pair of rotation blocks."""
    parts = label.split(" ")
    for k, v, both in (("rotK:", "rotV:", "rot:"), ("rotKb", "rotVb", "rotb")):
        ks = [p for p in parts if p.startswith(k)]
        vs = [p for p in parts if p.startswith(v)]
        if len(ks) == len(vs) == 1 and ks[0][len(k) :] == vs[0][len(v) :]:
            parts[parts.index(ks[0])] = both + ks[0][len(k) :]
            parts.remove(vs[0])
    return " ".join(parts)


def _rows(g: pd.DataFrame, df: pd.DataFrame, base_bytes: float) -> pd.DataFrame:
    varying = _varying(g)
    out = pd.DataFrame({
        "configuration": [short_label(config_label(r, varying)) for _, r in g.iterrows()],
        "dppl": g["delta_ppl"].values,
        "dppl_err": g.get("delta_ppl_err", pd.Series([None] * len(g))).values,
        "kl": g["kl_mean"].values,
        "kl_err": g.get("kl_err", pd.Series([None] * len(g))).values,
        "top1": g["top1_agree"].values,
        "retrieval": [_retrieval(df, r) for _, r in g.iterrows()],
        "bytes": context_bytes(g).values,
    })  # fmt: skip
    out["share"] = out["bytes"] / base_bytes
    return out.sort_values(["bytes", "kl"], ascending=[False, True]).reset_index(drop=True)


def render_rows(t: pd.DataFrame) -> str:
    show = pd.DataFrame({
        "configuration": t["configuration"],
        "Δppl ± err": [_pm(v, e, "+.3f") for v, e in zip(t["dppl"], t["dppl_err"])],
        "KL ± err": [_pm(v, e, ".2e") for v, e in zip(t["kl"], t["kl_err"])],
        "top-1": [f"{100 * v:.1f}%" if _given(v) else "" for v in t["top1"]],
        "retrieval": t["retrieval"],
        "KV MiB": [f"{b / 2**20:,.1f}" for b in t["bytes"]],
        "% fp16": [f"{100 * s:.1f}%" for s in t["share"]],
    })  # fmt: skip
    if not show["retrieval"].astype(bool).any():
        show = show.drop(columns="retrieval")
    return aligned([list(show.columns), *show.values.tolist()])


def aligned(rows: list[list]) -> str:
    """Columns two spaces apart: the first left-aligned (names), the others right (figures)."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        )
        for r in rows
    ).rstrip()


def pick_line(t: pd.DataFrame, ppl_ref: float, tol_pct: float, base_bytes: float) -> str:
    limit = tol_pct / 100 * ppl_ref
    err = t["dppl_err"].where(t["dppl_err"].notna(), 0.0).astype(float)
    upper = t["dppl"].astype(float) + Z * err
    ok = t[upper <= limit]
    rule = (f"  (the smallest cache whose Δppl is within +{tol_pct:g}% of the baseline's ppl, "
            f"+{limit:.3g}, at 95%: Δppl + 1.96 err)")  # fmt: skip
    if not len(ok):
        least = t.loc[t["dppl"].idxmin(), "configuration"]
        return f"pick: none of these; the least Δppl is {least}\n{rule}"
    best = ok.sort_values(["bytes", "kl"]).iloc[0]
    saved = (base_bytes - best["bytes"]) / 2**20
    quality = f"Δppl {_pm(best['dppl'], best['dppl_err'], '+.3f')}, KL {best['kl']:.2e}"
    return (f"pick: {best['configuration']}, {best['bytes'] / 2**20:,.1f} MiB = "
            f"{100 * best['share']:.1f}% of fp16's (saves {saved:,.1f} MiB); {quality}"
            f"\n{rule}")  # fmt: skip


def frontier(t: pd.DataFrame) -> list[str]:
    """Configurations no other beats in both bytes and KL (the Pareto frontier), smallest first."""
    keep = []
    for _, r in t.iterrows():
        beaten = ((t["bytes"] <= r["bytes"]) & (t["kl"] < r["kl"])) | (
            (t["bytes"] < r["bytes"]) & (t["kl"] <= r["kl"])
        )
        if not beaten.any():
            keep.append((r["bytes"], r["configuration"]))
    return [name for _, name in sorted(keep)]


def overlap_warnings(t: pd.DataFrame, chunks: int) -> list[str]:
    """Two configurations next to each other in Δppl (or KL) whose 95% error bars overlap (errors
    taken as independent: conservative), with the chunks that would separate that difference."""
    out = []
    for col, err, fmt, name in (
        ("dppl", "dppl_err", "+.3f", "Δppl"),
        ("kl", "kl_err", ".2e", "KL"),
    ):
        s = t[t[col].notna() & t[err].notna()].sort_values(col)
        for (_, a), (_, b) in zip(s.iloc[:-1].iterrows(), s.iloc[1:].iterrows()):
            se, diff = math.hypot(a[err], b[err]), abs(b[col] - a[col])
            if se > 0 and diff < Z * se:
                need = (
                    f"~{math.ceil(chunks * (Z * se / diff) ** 2):,} chunks (now {chunks}) would"
                    if diff
                    else "no chunk count would"
                )  # noqa: E501
                out.append(f"warning: {a['configuration']} and {b['configuration']} cannot be "
                           f"told apart by {name} ({_pm(a[col], a[err], fmt)} vs "
                           f"{_pm(b[col], b[err], fmt)}); {need} separate them")  # fmt: skip
    return out


def answer(df: pd.DataFrame, tolerance_pct: float = TOLERANCE_PCT) -> str:
    """The answer block of every workload with quality rows; '' when there are none."""
    if "phase" not in df or "ppl" not in df:
        return ""
    q = df[(df["phase"] == "quality") & (df["status"] == "ok") & df["ppl"].notna()]
    if not len(q):
        return ""
    keys = [c for c in GROUP if c in q]
    # one key per workload, in run order (str of each cell: pandas' astype(str) keeps NaN)
    workload = pd.Series(["|".join(map(str, t)) for t in q[keys].itertuples(index=False)], q.index)
    blocks = [_block(q[workload == w], df, tolerance_pct) for w in dict.fromkeys(workload)]
    return "\n\n".join(blocks)


def _block(g: pd.DataFrame, df: pd.DataFrame, tol_pct: float) -> str:
    r = g.iloc[0]
    base_bytes, how = fp16_bytes(g)
    chunks = int(r.get("chunks", 1)) if _given(r.get("chunks")) else 1
    ref_err = r.get("ppl_ref_err")
    head = (f"answer: {r['model']} at context {int(r['context_len']):,}, {chunks} chunk(s), "
            f"{int(r['n_scored']):,} tokens scored per row. Baseline (float32 cache): ppl "
            f"{_pm(r['ppl_ref'], ref_err, '.3f')}; fp16's cache {base_bytes / 2**20:,.1f} MiB "
            f"({how})")  # fmt: skip
    t = _rows(g, df, base_bytes)
    lines = [head, render_rows(t), pick_line(t, r["ppl_ref"], tol_pct, base_bytes)]
    lines.append("frontier (no other is both smaller and lower in KL): " + ", ".join(frontier(t)))
    if t["dppl_err"].isna().all():
        lines.append("note: these rows carry no paired Δppl error (older rows): Δppl alone")
    warns = overlap_warnings(t, chunks)
    lines += warns[:MAX_WARNINGS]
    if len(warns) > MAX_WARNINGS:  # a grid of many rows: the answer stays readable
        more = len(warns) - MAX_WARNINGS
        lines.append(f"warning: {more} more neighbouring pairs cannot be told apart at "
                     f"{chunks} chunk(s) (each error bar is in the rows above)")  # fmt: skip
    return "\n".join(lines)
