"""Where each format pays off: from a decode sweep over context, a least-squares line
latency_ms = a + b * context per (format, kernel, workload), and the context at which a format
becomes faster than fp16 on the machine at hand (a_fmt + b_fmt * c = a_fp16 + b_fp16 * c), with
the time-slope ratio b_fmt / b_fp16 beside the byte-slope ratio of the cache. The method is the
one vLLM's FP8 KV-cache write-up used (a crossover context read off per-context latency fits);
the figures here are kvbench's own rows. pandas and numpy only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MIN_CONTEXTS = 3  # a line through two points has no residual to judge it by


def _fit(g: pd.DataFrame) -> dict | None:
    """The line through a group's (context_len, median_ms) and its bytes per context."""
    per_ctx = g.groupby("context_len")[["median_ms", "kv_bytes"]].median()
    if len(per_ctx) < MIN_CONTEXTS:
        return None
    ctx = per_ctx.index.to_numpy(dtype=float)
    slope, icept = np.polyfit(ctx, per_ctx["median_ms"].to_numpy(dtype=float), 1)
    byte_slope = np.polyfit(ctx, per_ctx["kv_bytes"].to_numpy(dtype=float), 1)[0]
    return {"a_ms": icept, "b_ms": slope, "bytes_per_ctx": byte_slope,
            "ctx_lo": int(ctx.min()), "ctx_hi": int(ctx.max())}  # fmt: skip


def fits(d: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One fitted line per group of measured decode rows (keys: fmt, kernel and the axes that
    vary besides context)."""
    out = []
    for key, g in d.groupby(keys, dropna=False, sort=True):
        f = _fit(g)
        if f is not None:
            out.append(dict(zip(keys, key if isinstance(key, tuple) else (key,)), **f))
    return pd.DataFrame(out)


def crossover_ctx(f: dict, base: dict) -> float:
    """The context where f's line crosses base's: 0 when they never cross at a positive context
    (f is faster everywhere, or slower everywhere), else where f turns faster (f's slope is the
    smaller) or turns slower (f's slope is the larger)."""
    if f["b_ms"] == base["b_ms"]:
        return 0.0
    c = (f["a_ms"] - base["a_ms"]) / (base["b_ms"] - f["b_ms"])
    return max(c, 0.0)


def _when(f: dict, base: dict) -> str:
    """Where f is faster than base, in words."""
    c = crossover_ctx(f, base)
    at_1 = f["a_ms"] + f["b_ms"] <= base["a_ms"] + base["b_ms"]  # faster at the first token
    if c == 0.0:
        return (
            "faster than fp16 at every context"
            if at_1
            else "never faster than fp16 (it starts slower and its time slope is not smaller)"
        )
    side = "above" if f["b_ms"] < base["b_ms"] else "below"
    verb = "faster than fp16 beyond ctx" if side == "above" else "faster than fp16 only below ctx"
    inside = f["ctx_lo"] <= c <= f["ctx_hi"]
    return f"{verb} {c:,.0f}" + (
        "" if inside else f" (extrapolated: measured {f['ctx_lo']}-{f['ctx_hi']})"
    )


def describe(f: dict, base: dict) -> str:
    """One finding line for a format's line against fp16's."""
    t_ratio = f["b_ms"] / base["b_ms"] if base["b_ms"] > 0 else float("nan")
    b_ratio = f["bytes_per_ctx"] / base["bytes_per_ctx"] if base["bytes_per_ctx"] else float("nan")
    tile = f" tile {int(f['tile_kv'])}" if pd.notna(f.get("tile_kv")) else ""
    return (
        f"{f['fmt']} {f['kernel']}{tile}: {f['a_ms']:.3g} + {f['b_ms'] * 1e3:.3g} µs/token × ctx "
        f"(fp16 {base['kernel']}: {base['a_ms']:.3g} + {base['b_ms'] * 1e3:.3g}); "
        f"{_when(f, base)}; time slope ×{t_ratio:.2g} against bytes ×{b_ratio:.2g}"
    )


def _matches(lines: pd.DataFrame, f: dict, axes: list[str]) -> np.ndarray:
    same = np.ones(len(lines), dtype=bool)
    for a in axes:
        same &= (lines[a] == f[a]).to_numpy() | (lines[a].isna() & pd.isna(f[a])).to_numpy()
    return same


def payoff_lines(d: pd.DataFrame, workload: list[str], choices: list[str], label) -> list[str]:
    """Each non-fp16 line against the fp16 line of the same workload (and layout): the same
    kernel and tile where fp16 ran with them, else fp16's smallest slope. `choices`: the choice
    axes besides format and kernel that vary (tile_kv, layout); `label(row)`: the workload's
    words that open the line."""
    d = d[d["phase"].eq("decode")] if "phase" in d else d
    if d.empty or d["context_len"].nunique() < MIN_CONTEXTS:
        return []
    lines = fits(d, ["fmt", "kernel", *choices, *workload])
    if lines.empty:
        return []
    out = []
    match = [*workload, *[c for c in choices if c == "layout"]]
    for f in lines[lines["fmt"] != "fp16"].to_dict("records"):
        base = lines[_matches(lines, f, match) & (lines["fmt"] == "fp16").to_numpy()]
        if base.empty:
            continue
        own = base[_matches(base, f, ["kernel", *choices])]
        pick = own if len(own) else base.sort_values("b_ms")
        head = label(f)
        out.append((f"{head}: " if head else "") + describe(f, pick.iloc[0].to_dict()))
    return out
