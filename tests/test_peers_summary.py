"""peer_ratios: each kvbench kernel's median over the best peer's, per case group."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvbench.analysis.peers_summary import COLUMNS, peer_ratios


def rows(*specs) -> pd.DataFrame:
    base = dict(model="qwen2-0.5b", n_layers=24, phase="decode", window=math.nan, status="ok")
    return pd.DataFrame(
        [dict(base, context_len=c, kv_dtype=d, kernel=k, median_ms=m) for c, d, k, m in specs]
    )


def test_ratio_is_against_the_fastest_peer_of_the_same_group():
    df = rows(
        (1024, "fp16", "sdpa", 4.0),
        (1024, "fp16", "ops", 6.0),
        (1024, "fp16", "mlx_lm", 5.0),
        (1024, "fp16", "torch_sdpa", 2.0),
        (1024, "fp32", "sdpa", 3.0),
        (1024, "fp32", "numpy_ref", 1.5),
        (4096, "fp16", "sdpa", 8.0),  # no peer in its group: no row
    )
    out = peer_ratios(df)
    assert list(out.columns[-len(COLUMNS) :]) == list(COLUMNS)
    got = {(r.kv_dtype, r.kernel): (r.best_peer, r.ratio) for r in out.itertuples()}
    assert got == {
        ("fp16", "ops"): ("torch_sdpa", 3.0),
        ("fp16", "sdpa"): ("torch_sdpa", 2.0),
        ("fp32", "sdpa"): ("numpy_ref", 2.0),
    }


def test_failed_rows_take_no_part_and_formats_can_be_crossed():
    df = rows(
        (1024, "fp4", "sdpa", 2.0),
        (1024, "affine4", "mlx_lm_quant", 4.0),
        (1024, "fp16", "torch_sdpa", 1.0),
    )
    df.loc[2, "status"] = "error"
    assert peer_ratios(df).empty
    keys = ("model", "n_layers", "phase", "context_len", "window")
    out = peer_ratios(df, group_keys=keys)
    assert out.loc[0, "best_peer"] == "mlx_lm_quant"
    assert out.loc[0, "best_peer_kv_dtype"] == "affine4" and out.loc[0, "kv_dtype"] == "fp4"
    assert out.loc[0, "ratio"] == pytest.approx(0.5)


def test_no_peers_gives_an_empty_frame():
    assert peer_ratios(rows((1024, "fp16", "sdpa", 1.0))).empty


def test_recorded_kernel_kind_decides_what_is_a_peer():
    df = rows((1024, "fp16", "sdpa", 4.0), (1024, "fp16", "new_peer", 2.0))
    assert peer_ratios(df).empty  # older rows: new_peer is not in the frozen v1 table
    out = peer_ratios(df.assign(kernel_kind=["kvbench", "peer"]))
    assert out.loc[0, "best_peer"] == "new_peer" and out.loc[0, "ratio"] == 2.0


def test_the_peers_figure_names_the_blas_its_rows_ran_on():
    from kvbench.report.views import blas_note, peers

    df = rows((1024, "fp32", "sdpa", 3.0), (1024, "fp32", "numpy_ref", 1.5))
    df["kernel_kind"] = ["kvbench", "peer"]
    assert blas_note(df) == ""  # older rows: no blas column, nothing claimed
    df["blas"], df["blas_gflops"] = "openblas 0.3.21 SkylakeX", [40.0, 44.0]
    assert "MLX's CPU matmuls ran on: openblas 0.3.21 SkylakeX (42 GFLOP/s fp32)." in peers(df).note
