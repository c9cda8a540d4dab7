"""Synthetic result rows for the report tests: every axis a figure needs, no mlx.

The numbers are invented (a linear latency model, the exact byte formula) and never reported as
measurements; they exist so each figure's presence and structure can be tested.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import pandas as pd

from kvbench.store.schema import COLUMNS
from kvbench.suite.cache_spec import format_of

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
        flops=4 * 64 * ctx * 2 * 8,
        gbps=kv_bytes / median / 1e6,
        peak_gbps=20.0,
        peak_method="synthetic",
        kv_bytes=kv_bytes,
        bits_per_elem=FORMATS[dtype],
        alloc_bytes=kv_bytes,
        peak_mem_bytes=int(kv_bytes * 1.5),
        cache_bytes=kv_bytes,
        resident_bytes=kv_bytes,
        resident_end_bytes=kv_bytes,
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
            # the cache's arrays are the cells allocated; the step keeps 64 KiB beside them
            row.update(cache_bytes=row["bytes_alloc"], resident_bytes=row["bytes_alloc"] + 65536)
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


# Suite-shaped rows: the cases a shipped suite expands to, with invented numbers (a byte-model
# latency, made-up errors) so the report of each suite can be checked in a browser without
# running it. Never reported as measurements.
SUITES = ("default", "quant", "streams", "tiles", "peers")
KERNEL_COST = {"sdpa": 1.0, "ops": 1.6, "tiled": 1.3, "dequant_sdpa": 1.8,
               "quantized_matmul": 9, "mlx_lm": 1.1, "mlx_lm_rotating": 1.2, "torch_sdpa": 0.7,
               "numpy_ref": 0.8}  # fmt: skip
PEERS = ("mlx_lm", "mlx_lm_rotating", "torch_sdpa", "numpy_ref")
GPU_ONLY = ("metal", "cuda")


def _suite_row(case, run_id: str, suite: str) -> dict:
    c = {f.name: getattr(case, f.name) for f in dataclasses.fields(case)}
    fmt = format_of(case)  # bits as the format registry counts them
    bits, data_bits = fmt.bits_per_elem(case.head_dim), fmt.data_bits
    ctx = case.window or case.context_len
    held = ctx * case.n_seqs * (1 - 0.8 * case.prefix_frac * (case.layout == "unified"))
    kv = int(2 * case.n_layers * case.n_kv_heads * held * case.head_dim * bits / 8)
    tile = 1 + 0.15 * abs(math.log2(case.tile_kv / 128)) if case.tile_kv else 1
    med = 0.05 + kv / 3e6 * KERNEL_COST.get(case.kernel, 1) * tile
    med *= 1 + 0.1 * case.prefix_frac if case.layout == "unified" else 1
    med *= ctx / 8 if case.phase == "prefill" else 1
    flops = 4 * case.head_dim * ctx * case.n_layers * case.n_q_heads * case.n_seqs
    row = _row(0, 0, kv_dtype="fp16", context_len=64, gqa_ratio=1, kernel="sdpa")
    row.update(c, gqa_ratio=case.gqa_ratio, case_id=case.case_id, run_id=run_id, suite=suite,
               median_ms=med, p10_ms=med * 0.93, p90_ms=med * 1.1, ci_low_ms=med * 0.97,
               ci_high_ms=med * 1.03, kv_bytes=kv, bits_per_elem=bits, data_bits=data_bits,
               alloc_bytes=kv, peak_mem_bytes=int(kv * 1.3), bytes_read=kv, gbps=kv / med / 1e6,
               flops=flops, tflops=flops / med / 1e9, bytes_alloc=kv, bytes_used=kv,
               rel_err=0.0 if bits == 32 else 2.0 ** -data_bits, cosine=1.0,
               kernel_kind="peer" if case.kernel in PEERS else "kvbench",
               schema_version=2)  # fmt: skip
    if case.kernel in GPU_ONLY:
        row.update(status="skipped", error=f"kernel {case.kernel} needs its GPU backend",
                   median_ms=None)  # fmt: skip
    return row


def suite_rows(name: str) -> pd.DataFrame:
    """Rows shaped like suites/<name>.yaml: every case it expands to, invented numbers."""
    from kvbench.suite.suite import expand, load_suite

    suite = load_suite(Path(__file__).resolve().parents[1] / "suites" / f"{name}.yaml")
    run_id = f"20261123T120000Z-{name}"
    out = [_suite_row(case, run_id, name) for case in expand(suite)]
    return pd.DataFrame(out, columns=COLUMNS)
