"""What the task-phase topics (retrieval, decode-time error, quality by position) and the
report's task figures share: a task row's cache configuration and the ok rows of a phase.
Rows that ran the same cache through different engines or arithmetic (kvbench's own beside
llama.cpp's peer, queries rounded or not, the peer's weights as stored or as float32: the
"detail" axes of harness/axes.py) are never one count: where such an axis varies among a
phase's rows, each row's label names its value. This module imports neither mlx nor kernels/."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import cache_config
from kvbench.axes import TABLE, with_role

_AXIS = {a.name: a for a in TABLE}
ENGINE_AXES = with_role("detail")  # kernel or peer, k_order, q_quant, peer_weights, div_sign, ...


def config_label(row: dict, engines: tuple = ()) -> str:
    """The row's cache configuration (common.cache_config: format, options, window), where a
    generate row's cache turns from fp16 to its format (quantized_kv_start), then the row's
    value of each axis in `engines` (the kernel always, another axis where off its default)."""
    start = row.get("quantized_kv_start")
    late = start is not None and start == start and int(start) > 0
    cache = cache_config(row) + (f", fp16 until {int(start)}" if late else "")
    engine = engine_label(row, engines)
    return f"{cache}, {engine}" if engine else cache


def engine_label(row: dict, engines: tuple) -> str:
    """The row's value of each axis in `engines`: the kernel always, another where off its
    default ("llama.cpp, w:f32")."""
    parts = []
    for name in engines:
        v, axis = row.get(name), _AXIS[name]
        if v is not None and v == v and (name == "kernel" or v != axis.default):
            parts.append(axis.label.format(v))
    return ", ".join(parts)


def varied(d: pd.DataFrame) -> list[str]:
    """The ENGINE_AXES that vary among d's rows, an empty cell read as the axis' default."""
    return [a for a in ENGINE_AXES if a in d and d[a].fillna(_AXIS[a].default).nunique() > 1]


def task_rows(cur: pd.DataFrame, phase: str, col: str, engines: bool = True) -> pd.DataFrame:
    """The ok rows of `phase` that carry `col`, with their configuration label `config`: `cache`
    (the cache's alone), then (engines) `engine`, each ENGINE_AXES value that varies among
    these rows."""
    if "phase" not in cur or col not in cur:
        return cur.iloc[0:0]
    d = cur[cur["phase"].eq(phase) & cur[col].notna()]
    if "status" in d:
        d = d[d["status"].eq("ok")]
    named = tuple(varied(d)) if engines else ()
    records = d.to_dict("records")
    return d.assign(
        config=[config_label(r, named) for r in records],
        cache=[config_label(r) for r in records],
        engine=[engine_label(r, named) for r in records],
    )


def ctx_text(n) -> str:
    """A context length as a finding says it: 8K for 8192, else the number."""
    n = int(n)
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)
