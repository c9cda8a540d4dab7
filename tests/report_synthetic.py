"""Synthetic result rows for the report tests: every axis a figure needs, no mlx.

The numbers are invented (a linear latency model, the exact byte formula) and never reported as
measurements; they exist so each figure's presence and structure can be tested.
"""

from __future__ import annotations

import itertools

import pandas as pd

from kvbench.store.record import COLUMNS

# name -> (stored bits per element with scales, data bits)
FORMATS = {"fp32": 32.0, "fp16": 16.0, "int4": 4.5}
LAYOUT_COLUMNS = ("bytes_alloc", "bytes_used")  # issue 4 adds them to Record
ERRORS = {"fp32": 0.0, "fp16": 5e-4, "int4": 0.08}


def _row(run: int, i: int, **case) -> dict:
    ctx, dtype, gqa = case["context_len"], case["kv_dtype"], case["gqa_ratio"]
    n_kv = 8 // gqa
    kv_bytes = int(2 * 2 * n_kv * ctx * 64 * FORMATS[dtype] / 8)
    median = 0.05 + kv_bytes / 2e6 * (1.0 + 0.1 * run) * (0.8 if case["kernel"] == "sdpa" else 1)
    row = dict.fromkeys(COLUMNS)
    row.update(
        run_id=f"2026112{run}T120000Z-abc{run}",
        suite="synthetic",
        case_id=f"c{i:04d}",
        status="ok",
        model="tiny",
        n_layers=2,
        n_q_heads=8,
        n_kv_heads=n_kv,
        head_dim=64,
        n_seqs=1,
        phase="decode",
        kv_data="gaussian",
        layout="per-stream",
        seed=0,
        median_ms=median,
        p10_ms=median * 0.9,
        p90_ms=median * 1.2,
        ci_low_ms=median * 0.95,
        ci_high_ms=median * 1.05,
        n_samples=20,
        cv=0.05,
        unstable=False,
        bytes_read=kv_bytes,
        bytes_written=1024,
        gbps=kv_bytes / median / 1e6,
        peak_gbps=20.0,
        peak_method="synthetic",
        kv_bytes=kv_bytes,
        bits_per_elem=FORMATS[dtype],
        alloc_bytes=kv_bytes,
        peak_mem_bytes=int(kv_bytes * 1.5),
        rel_err=ERRORS[dtype],
        max_abs_err=ERRORS[dtype] * 3,
        cosine=1 - ERRORS[dtype] ** 2,
        commit=f"{run:x}" * 12,  # run 0: "000000000000", a commit that looks like a number
        dirty=run == 1,
        branch="main",
        timestamp=f"2026-11-2{run}T12:00:00+00:00",
        host="synthetic",
        device="synthetic cpu",
        backend="cpu",
        mlx_version="0.0",
        kvbench_version="0.1.0",
        schema_version=1,
    )
    row.update(case)
    if dtype == "int4":
        row["group_size"] = 32
    return row


def rows(run: int = 0) -> pd.DataFrame:
    """One run: 3 formats x 3 contexts x 2 GQA x 2 kernels, plus tile, layout, failed rows."""
    out, i = [], 0
    axes = itertools.product(FORMATS, (64, 256, 1024), (1, 4), ("sdpa", "ops"))
    for dtype, ctx, gqa, kernel in axes:
        out.append(_row(run, i, kv_dtype=dtype, context_len=ctx, gqa_ratio=gqa, kernel=kernel))
        i += 1
    for ctx, tile in itertools.product((256, 1024), (32, 64, 128)):
        case = dict(kv_dtype="fp16", context_len=ctx, gqa_ratio=4, kernel="tiled", tile_kv=tile)
        out.append(_row(run, i, **case))
        i += 1
    for ctx in (256, 1024):
        case = dict(kv_dtype="fp16", context_len=ctx, gqa_ratio=4, kernel="sdpa", n_seqs=4)
        for layout in ("per-stream", "unified"):
            row = _row(run, i, layout=layout, **case)
            share = 1.0 if layout == "per-stream" else 0.7  # issue 4's cell accounting
            row.update(bytes_alloc=int(row["kv_bytes"] * share), bytes_used=row["kv_bytes"] // 2)
            out.append(row)
            i += 1
    bad = _row(run, i, kv_dtype="fp16", context_len=64, gqa_ratio=1, kernel="metal")
    bad.update(status="skipped", error="kernel metal needs the Metal backend", median_ms=None)
    err = _row(run, i + 1, kv_dtype="int4", context_len=64, gqa_ratio=1, kernel="tiled")
    err.update(status="error", error="ParityError: max abs err 0.5 > 0.01", median_ms=None)
    extra = tuple(c for c in LAYOUT_COLUMNS if c not in COLUMNS)
    return pd.DataFrame(out + [bad, err], columns=COLUMNS + extra)


def compare_rows() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "case_id": ["c0000", "c0001", "c0002"],
            "label": ["tiny ctx64 fp32 sdpa", "tiny ctx64 fp32 ops", "tiny ctx256 fp32 sdpa"],
            "metric": ["median_ms"] * 3,
            "base": [1.0, 2.0, 3.0],
            "new": [0.8, 2.0, 3.6],
            "ratio": [0.8, 1.0, 1.2],
            "ratio_ci_low": [0.75, 0.9, 1.15],
            "ratio_ci_high": [0.85, 1.1, 1.25],
            "p_value": [1e-4, 0.5, 1e-4],
            "verdict": ["faster", "unchanged", "slower"],
            "base_n": [20, 20, 20],
            "new_n": [20, 20, 20],
        }
    )


def write(tmp_path, runs: int = 2, compare: bool = True) -> list:
    """Write `runs` result CSVs (and a compare CSV) under tmp_path; return the paths."""
    paths = []
    for r in range(runs):
        p = tmp_path / f"run{r}.csv"
        rows(r).to_csv(p, index=False)
        paths.append(p)
    if compare:
        p = tmp_path / "compare.csv"
        compare_rows().to_csv(p, index=False)
        paths.append(p)
    return paths
