"""Terminal summaries of result rows (pandas only; no mlx)."""

from __future__ import annotations

import pandas as pd

SHOW = {
    "model": "model",
    "phase": "phase",
    "context_len": "ctx",
    "gqa_ratio": "gqa",
    "n_seqs": "seqs",
    "layout": "layout",
    "workload": "workload",
    "prefix_frac": "prefix",
    "decode_order": "order",
    "churn": "churn",
    "kv_dtype": "dtype",
    "group_size": "G",
    "kv_data": "data",
    "kernel": "kernel",
    "tile_kv": "tile",
    "window": "win",
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
    "kv_recon_err": "kv_err",
}


# columns left out when every row has this value (the plain single-cache case)
HIDE_IF_ALL = {
    "layout": "per-stream",
    "workload": "none",
    "prefix_frac": 0,
    "decode_order": "interleaved",
    "churn": 0,
}


def table(df: pd.DataFrame) -> str:
    """A compact, aligned table of the rows a person reads first."""
    df = df.copy()
    df["ci"] = [
        f"{lo:.3g}-{hi:.3g}" if pd.notna(lo) else ""
        for lo, hi in zip(df.get("ci_low_ms", []), df.get("ci_high_ms", []))
    ]
    df["kv_mib"] = df["kv_bytes"] / 2**20
    df["peak_mib"] = df["peak_mem_bytes"] / 2**20
    df["alloc_mib"] = df["alloc_bytes"] / 2**20
    if "fill_peak_bytes" in df:
        df["fill_peak_mib"] = df["fill_peak_bytes"] / 2**20
    if df["cv"].notna().any():
        df["cv"] = [
            f"{c:.2f}{'!' if u is True or u == 'True' else ''}" if pd.notna(c) else ""
            for c, u in zip(df["cv"], df["unstable"])
        ]
    if "kv_data" in df and (df["kv_data"] == "gaussian").all():
        df = df.drop(columns="kv_data")  # the default: shown only when a run varies it
    cols = [c for c in SHOW if c in df and df[c].notna().any() and (df[c] != "").any()]
    cols = [c for c in cols if not (c in HIDE_IF_ALL and (df[c] == HIDE_IF_ALL[c]).all())]
    out = df[cols].rename(columns=SHOW)
    text = out.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="")
    notes = [
        f"  {r.case_id} {r.status}: {r.error}"
        for r in df.itertuples()
        if r.status != "ok" and isinstance(r.error, str)
    ]
    return text + ("\n" + "\n".join(notes) if notes else "")


def tile_heatmap(df: pd.DataFrame, value: str = "median_ms") -> pd.DataFrame:
    """Measured rows pivoted for a tile x context heatmap: one row per (kernel, dtype, GQA,
    context), one column per tile_kv, cells = `value` (e.g. median_ms, gbps)."""
    ok = df[(df["status"] == "ok") & df["tile_kv"].notna()].copy()
    ok["tile_kv"] = ok["tile_kv"].astype(int)
    keys = ["kernel", "kv_dtype", "gqa_ratio", "context_len"]
    return ok.pivot_table(index=keys, columns="tile_kv", values=value, aggfunc="median")
