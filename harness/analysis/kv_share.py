"""How much of a real model's step is the KV cache (issue #36 item 2), from model_decode rows
timed with `settings.stages: true` (pandas only; no mlx).

Per row: kv_ms = write_ms + attend_ms (every layer's K/V write, quantize on write, and the
attention over the stored cache, each timed on its own: harness/engines/model_step.py), and
kv_share = kv_ms / median_ms, the KV part's share of the whole step. The two parts are separate
timings, so kv_share can pass 1 where the parts' own evaluation floors outweigh what they
share with the step; read shares near 1 as "the step is the KV part".

Per (model, cache configuration) over contexts: the context where the share passes one half.
Where two measured contexts bracket it, linearly between them ("measured"); otherwise from
straight-line fits of kv_ms and of the rest (median_ms - kv_ms) against context over every
measured context (as analysis/crossover.py fits latency), the crossing of the two lines
("extrapolated", or "never" where the KV line does not grow faster than the rest).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvbench.store.results import measured

KEYS = ("model", "config")
HALF = 0.5


def share_rows(cur: pd.DataFrame) -> pd.DataFrame:
    """The model_decode rows with both KV parts timed, with kv_ms, rest_ms and kv_share."""
    d = measured(cur)
    need = {"write_ms", "attend_ms", "median_ms", "phase"}
    if d.empty or not need <= set(d):
        return d.iloc[0:0]
    d = d[(d["phase"] == "model_decode") & d["write_ms"].notna() & d["attend_ms"].notna()]
    if d.empty:
        return d
    d = d.assign(config=d["fmt"] + " · " + d["kernel"].astype(str))  # format, group, kernel
    kv = d["write_ms"] + d["attend_ms"]
    return d.assign(kv_ms=kv, rest_ms=d["median_ms"] - kv, kv_share=kv / d["median_ms"])


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    slope, icept = np.polyfit(x, y, 1)
    return float(icept), float(slope)


def half_context(g: pd.DataFrame) -> tuple[float | None, str]:
    """(context, how) where the KV share passes one half for one configuration's rows; how is
    "measured", "extrapolated", "never", "below" (already past half at the least context) or
    "one context" (below half, no trend to read)."""
    p = g.groupby("context_len")[["kv_ms", "rest_ms", "kv_share"]].median().sort_index()
    x, s = p.index.to_numpy(dtype=float), p["kv_share"].to_numpy()
    if s[0] >= HALF:
        return float(x[0]), "below"
    for i in range(1, len(x)):
        if s[i - 1] < HALF <= s[i]:
            return float(x[i - 1] + (HALF - s[i - 1]) * (x[i] - x[i - 1]) / (s[i] - s[i - 1])), (
                "measured"
            )
    if len(x) < 2:
        return None, "one context"
    a, b = _fit(x, p["kv_ms"].to_numpy())
    c, d = _fit(x, p["rest_ms"].to_numpy())
    if b <= d:
        return None, "never"
    return (c - a) / (b - d), "extrapolated"


def half_table(cur: pd.DataFrame) -> pd.DataFrame:
    """Per (model, configuration): contexts measured, the share at the least and the largest,
    and the context where it passes one half."""
    d = share_rows(cur)
    if d.empty:
        return pd.DataFrame()
    out = []
    for (model, config), g in d.groupby(list(KEYS), sort=False):
        ctx, how = half_context(g)
        by = g.groupby("context_len")["kv_share"].median().sort_index()
        out.append({"model": model, "config": config, "kv_dtype": g["kv_dtype"].iloc[0],
                    "contexts": len(by), "ctx_min": int(by.index[0]), "share_min": by.iloc[0],
                    "ctx_max": int(by.index[-1]), "share_max": by.iloc[-1],
                    "half_ctx": ctx, "half_how": how})  # fmt: skip
    return pd.DataFrame(out)


def bytes_vs_time(cur: pd.DataFrame, base: str = "fp16") -> pd.DataFrame:
    """Per (model, context, configuration) against the `base` format's fastest KV part (its
    least kv_ms over kernels) at the same model and context: the KV bytes ratio beside the KV
    time ratio, and which base kernel that was."""
    d = share_rows(cur)
    if d.empty:
        return d
    b = d[d["kv_dtype"] == base].sort_values("kv_ms").groupby(["model", "context_len"]).first()
    b = b[["kv_bytes", "kv_ms", "kernel"]].rename(
        columns={"kv_bytes": "kv_bytes_base", "kv_ms": "kv_ms_base", "kernel": "kernel_base"}
    )
    o = d[d["kv_dtype"] != base].join(b, on=["model", "context_len"])
    o = o[o["kv_ms_base"].notna()]
    return o.assign(bytes_ratio=o["kv_bytes"] / o["kv_bytes_base"],
                    time_ratio=o["kv_ms"] / o["kv_ms_base"])  # fmt: skip
