"""Terminal summaries of result rows (pandas only; no mlx). The axis columns and their headers
come from the axis table (kvbench.axes)."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.answer import context_bytes
from kvbench.axes import TABLE, Axis

# the measured columns the summary shows (column -> header), after the axes
MEASURED_SHOW = {
    "status": "status",
    "median_ms": "median_ms",
    "ci": "95% CI ms",
    "cv": "cv",
    "write_ms": "write_ms",
    "attend_ms": "attend_ms",
    "mask_ms": "mask_ms",
    "gbps": "GB/s",
    "pct_peak_bw": "%peak",
    "kv_mib": "KV MiB",
    "alloc_mib": "alloc MiB",
    "peak_mib": "peak MiB",
    "fill_peak_mib": "fill peak MiB",
    "kv_util": "kv_util",
    "rel_err": "rel_err",
    "delta_ppl": "Δppl",
    "kl_mean": "KL",
    "top1_agree": "top1",
    "n_scored": "tokens",  # the scored tokens a quality figure rests on
    "n_correct": "correct",  # retrieval: of `trials`
    "ref_agree": "= f32",  # retrieval: answers equal to the float32 cache's
    "kv_recon_err": "kv_err",
    "wall_s": "wall s",  # model phases: what the row's evidence cost (kernels/model/meter.py)
    "prefill_tokens_per_s": "prefill tok/s",
    "decode_tokens_per_s": "decode tok/s",
    # phase serve: llama-batched-bench's figures (docs/serve.md)
    "n_kv_req": "N_KV",
    "cells_used": "cells held",
    "s_pp": "S_PP t/s",
    "s_tg": "S_TG t/s",
    "tg_step_ms": "step ms",
    "serve_max_abs_logit": "|Δlogit| alone",
}


def show_columns(table_: tuple[Axis, ...] = TABLE) -> dict:
    """Row column -> header, in the order shown: the axes that name a summary column (the axis
    table), then the status and the measurements."""
    axes = {a.name: a.column for a in table_ if a.column}
    return {**axes, **MEASURED_SHOW}


SHOW = show_columns()
# axis columns left out when every row holds the axis's default (the plain single-cache case)
HIDE_IF_ALL = {a.name: a.default for a in TABLE if a.hide_default}


def split_invariant(df: pd.DataFrame, cols: list[str]) -> tuple[list[str], dict]:
    """The columns to show, and the axis columns (and an all-ok status) that hold one value in
    every row: said once above the table instead of repeated in each line (issue 44)."""
    if len(df) < 2:
        return cols, {}
    axis_cols = {a.name for a in TABLE if a.column} | {"status"}
    same = {}
    for c in cols:
        values = df[c].map(lambda v: "" if v != v or v is None else v)
        if c in axis_cols and values.nunique() == 1:
            v = values.iloc[0]
            same[c] = int(v) if isinstance(v, float) and v.is_integer() else v
    return [c for c in cols if c not in same], same


def table(df: pd.DataFrame) -> str:
    """A compact, aligned table of the rows a person reads first."""
    df = df.copy()
    df["ci"] = [
        f"{lo:.3g}-{hi:.3g}" if pd.notna(lo) else ""
        for lo, hi in zip(df.get("ci_low_ms", []), df.get("ci_high_ms", []))
    ]
    df["kv_mib"] = context_bytes(df) / 2**20  # a policy's row: per context token, as the answer
    df["peak_mib"] = df["peak_mem_bytes"] / 2**20
    df["alloc_mib"] = df["alloc_bytes"] / 2**20
    if "fill_peak_bytes" in df:
        df["fill_peak_mib"] = df["fill_peak_bytes"] / 2**20
    if df["cv"].notna().any():
        df["cv"] = [
            f"{c:.2f}{'!' if u is True or u == 'True' else ''}" if pd.notna(c) else ""
            for c, u in zip(df["cv"], df["unstable"])
        ]
    cols = [c for c in SHOW if c in df and df[c].notna().any() and (df[c] != "").any()]
    cols = [c for c in cols if not (c in HIDE_IF_ALL and (df[c] == HIDE_IF_ALL[c]).all())]
    cols, same = split_invariant(df, cols)
    out = df[cols].rename(columns=SHOW)
    text = out.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="")
    if same:
        text = "every row: " + ", ".join(f"{SHOW[c]} {v}" for c, v in same.items()) + "\n" + text
    notes = [
        f"  {r.case_id} {r.status}: {r.error}"
        for r in df.itertuples()
        if r.status != "ok" and isinstance(r.error, str)
    ]
    return text + ("\n" + "\n".join(notes) if notes else "")


def run_summary(df: pd.DataFrame, tolerance_pct: float | None = None) -> str:
    """What `kvbench run` prints at its end: the rows, then the answer of its quality rows
    (analysis/answer.py: baseline, each configuration against it, the pick)."""
    from kvbench.analysis.answer import TOLERANCE_PCT, answer

    text = answer(df, TOLERANCE_PCT if tolerance_pct is None else tolerance_pct)
    noise = noise_line(df, _load_1min())
    return table(df) + ("\n" + noise if noise else "") + ("\n\n" + text if text else "")


def _load_1min() -> float | None:
    import os

    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # not available on this platform
        return None


def noise_line(df: pd.DataFrame, load_1min: float | None) -> str:
    """One line when most timed rows are flagged unstable (CV over the suite's cv_warn): what it
    means and what to do, with the load average the run ended under (issue 44 item 5)."""
    if "unstable" not in df or "cv" not in df:
        return ""
    timed = df[pd.to_numeric(df["cv"], errors="coerce").notna()]
    flagged = timed["unstable"].map(lambda u: u is True or u == "True" or u == 1).sum()
    if not len(timed) or flagged * 2 <= len(timed):
        return ""
    load = f" at load average {load_1min:.1f}" if load_1min is not None else ""
    return (f"noise: {flagged} of {len(timed)} timed rows are unstable (!: CV over the suite's "
            f"cv_warn){load}: their times move from sample to sample, so compare them with "
            "care. Rerun on an idle machine, with more settings.rounds or a longer budget_s, "
            "and run `kvbench calibrate SUITE` to measure this host's run-to-run noise "
            "(compare then allows for it)")  # fmt: skip
