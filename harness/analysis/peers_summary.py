"""Each kvbench kernel against the best peer measured in the same case group (pandas only).

A group is every row with the same shape, context, format and data (GROUP_KEYS); within it the
best peer is the peer kernel with the lowest median_ms. ratio = kernel median / best peer
median: below 1 the kvbench kernel is faster. A peer row is one whose kernel_kind is "peer"
(recorded at run time; harness/store/migrate_v1.py for older files). Only rows with status
ok take part. Pass group_keys without "kv_dtype" to compare across formats (e.g. kvbench's
fp4 against mlx-lm's quantized cache at the same context); the formats are then shown beside
the kernels.
This module imports neither mlx nor kernels/ (the report runs it on result files alone).
"""

from __future__ import annotations

import pandas as pd

from kvbench.store.migrate_v1 import with_v1_facts

GROUP_KEYS = (
    "model",
    "n_layers",
    "n_q_heads",
    "n_kv_heads",
    "head_dim",
    "context_len",
    "n_seqs",
    "phase",
    "kv_dtype",
    "group_size",
    "kv_data",
    "seed",
    "window",
)
COLUMNS = ("kernel", "median_ms", "best_peer", "best_peer_ms", "ratio")


def peer_ratios(df: pd.DataFrame, group_keys=GROUP_KEYS) -> pd.DataFrame:
    """One row per ok kvbench-kernel row that has at least one ok peer row in its group."""
    keys = [k for k in group_keys if k in df.columns]
    ok = df[df["status"] == "ok"] if "status" in df.columns else df
    shown = keys + ([] if "kv_dtype" in keys or "kv_dtype" not in df.columns else ["kv_dtype"])
    is_peer = with_v1_facts(ok)["kernel_kind"].eq("peer")
    peers, ours = ok[is_peer], ok[~is_peer]
    if peers.empty or ours.empty:
        return pd.DataFrame(columns=[*shown, *COLUMNS])
    best = peers.loc[peers.groupby(keys, dropna=False)["median_ms"].idxmin()]
    best = best[keys + ["kernel", "median_ms"] + [c for c in shown if c not in keys]]
    best = best.rename(columns={"kernel": "best_peer", "median_ms": "best_peer_ms"})
    best = best.rename(columns={c: f"best_peer_{c}" for c in shown if c not in keys})
    out = ours[[*shown, "kernel", "median_ms"]].merge(best, on=keys, how="inner")
    out["ratio"] = out["median_ms"] / out["best_peer_ms"]
    return out.sort_values([*keys, "kernel"]).reset_index(drop=True)
