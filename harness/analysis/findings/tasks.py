"""What the task-phase topics (retrieval, decode-time error, quality by position) and the
report's task figures share: a task row's cache configuration and the ok rows of a phase.
This module imports neither mlx nor kernels/."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import cache_config


def config_label(row: dict) -> str:
    """The row's cache configuration (common.cache_config: format, options, window), and
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


def ctx_text(n) -> str:
    """A context length as a finding says it: 8K for 8192, else the number."""
    n = int(n)
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)
