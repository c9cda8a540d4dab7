"""Phase serve's answer (docs/serve.md): per model and prompt length, decode throughput (S_TG,
llama-batched-bench's definition) against the sequences decoding together, kvbench's cache and
llama-batched-bench's on the same axes (dashed), and beside it the K/V bytes each configuration
holds for that many sequences (a shared prompt stored once under unified)."""

from __future__ import annotations

import pandas as pd

from kvbench.report.common import Figure, style, table
from kvbench.report.styles import panel_pos, subplots

PEER = "llama.cpp"
# one colour per cache (the same cells on both engines), the engine by the dash
CACHE_COLORS = {"per-stream": "#1f77b4", "unified": "#ff7f0e", "unified + shared prompt": "#2ca02c",
                "per-stream + shared prompt": "#9467bd"}  # fmt: skip


def _cache(r) -> str:
    return r["layout"] + (" + shared prompt" if r["workload"] == "shared-prefix" else "")


def _config(r) -> str:
    return f"{r['kernel']} · {r['kv_dtype']} · {_cache(r)}"


def serve_rows(cur: pd.DataFrame) -> pd.DataFrame:
    d = cur[(cur["phase"] == "serve") & (cur["status"] == "ok") & cur["s_tg"].notna()].copy()
    if d.empty:
        return d
    d["config"] = d.apply(_config, axis=1)
    d["cache"] = d.apply(_cache, axis=1)
    d["kv_mib"] = d["kv_bytes"] / 2**20
    return d.sort_values(["model", "context_len", "config", "n_seqs"])


def serve_figure(cur: pd.DataFrame) -> Figure | None:
    if "s_tg" not in cur:
        return None
    d = serve_rows(cur)
    if d.empty:
        return None
    groups = list(d.groupby(["model", "context_len"], sort=False))
    titles = [
        t
        for (m, ctx), _ in groups
        for t in (f"{m}, prompt {ctx}: S_TG (tokens/s)", f"{m}, prompt {ctx}: K/V held (MiB)")
    ]
    fig = subplots(titles, ncol_max=2, shared_y=False)
    for i, (_, g) in enumerate(groups):
        for config, c in g.groupby("config", sort=False):
            dash = "dash" if c["kernel"].iloc[0] == PEER else "solid"
            line = {"dash": dash, "color": CACHE_COLORS.get(c["cache"].iloc[0])}
            for j, col in enumerate(("s_tg", "kv_mib")):
                fig.add_scatter(x=c["n_seqs"], y=c[col], mode="lines+markers", name=config,
                                legendgroup=config, showlegend=i == 0 and j == 0,
                                line=line, **panel_pos(2 * i + j, 2))  # fmt: skip
        fig.update_yaxes(title_text="tokens/s, all sequences", **panel_pos(2 * i, 2))
        fig.update_yaxes(title_text="MiB", **panel_pos(2 * i + 1, 2))
    fig.update_xaxes(type="log", title_text="sequences decoding together (n_seqs)")
    note = (
        "Phase serve: every sequence's prompt (or one shared prompt) prefilled, then gen_tokens "
        "decode steps of one token for every sequence. S_TG = n_seqs x gen_tokens / the decode "
        "steps' seconds (llama-batched-bench's definition); dashed: llama-batched-bench on the "
        "same GGUF, K/V types and threads. Right: the K/V bytes held after the schedule "
        "(kv_bytes: n_kv_req cells, a shared prompt once under unified). One run per row."
    )
    names = {"model": "model", "context_len": "prompt", "config": "kernel · cache",
             "n_seqs": "n_seqs", "n_kv_req": "N_KV", "s_pp": "S_PP t/s", "s_tg": "S_TG t/s",
             "tg_step_ms": "step ms", "kv_mib": "K/V MiB"}  # fmt: skip
    nrow = len(groups)
    return Figure("serve", "How many sequences, how fast: decode throughput and K/V held",
                  style(fig, 140 + 320 * nrow), table(d, names), note)  # fmt: skip
