"""The answer block of quality rows (harness/analysis/answer.py) and the terminal table's
invariant columns (analysis/summary.py): figures by hand on made-up rows (issue 44 item 2)."""

from __future__ import annotations

import math

import pandas as pd

from kvbench.analysis.answer import answer, fp16_bytes, frontier, overlap_warnings
from kvbench.analysis.summary import split_invariant

SHAPE = dict(model="m", phase="quality", status="ok", n_layers=2, n_q_heads=4, n_kv_heads=2,
             head_dim=64, context_len=1024, n_seqs=1, chunks=2, n_scored=1000, ppl_ref=10.0,
             ppl_ref_err=0.5, kernel="reference")  # fmt: skip
FP16 = 2 * 2 * 2 * 64 * 1024 * 2  # K and V x layers x kv heads x head_dim x positions x 2 B


def row(kv, rot, kv_bytes, dppl, dppl_err, kl, kl_err, top1=0.9):
    return {**SHAPE, "kv_dtype": kv, "rotate_k": rot, "rotate_v": rot, "kv_bytes": kv_bytes,
            "ppl": 10.0 + dppl, "delta_ppl": dppl, "delta_ppl_err": dppl_err, "kl_mean": kl,
            "kl_err": kl_err, "top1_agree": top1}  # fmt: skip


ROWS = pd.DataFrame([
    row("fp16", "none", FP16, 0.0, 0.001, 1e-6, 1e-7, 1.0),
    row("q8_0", "none", FP16 * 17 // 32, 0.05, 0.02, 8e-4, 5e-5),
    row("q8_0", "hadamard", FP16 * 17 // 32, -0.01, 0.02, 3e-4, 2e-5),
    row("q4_0", "none", FP16 * 9 // 32, 2.9, 0.3, 0.16, 0.007),
    row("q4_0", "hadamard", FP16 * 9 // 32, 1.0, 0.1, 0.054, 0.0023),
])  # fmt: skip


def test_fp16_bytes_from_its_row_or_the_formula():
    assert fp16_bytes(ROWS) == (FP16, "its row")
    assert fp16_bytes(ROWS[ROWS["kv_dtype"] != "fp16"]) == (FP16, "by formula")


def test_pick_is_the_smallest_cache_within_the_tolerance_at_95pct():
    text = answer(ROWS)  # 1% of ppl 10 = 0.1: q8_0's upper bound 0.05 + 1.96 x 0.02 = 0.089 fits
    pick = next(line for line in text.splitlines() if line.startswith("pick"))
    assert ": q8_0 rot:hadamard," in pick and "53.1% of fp16's" in pick
    assert f"saves {(FP16 - FP16 * 17 // 32) / 2**20:,.1f} MiB" in pick
    # a tolerance of 0.5%: 0.05; q8_0's bounds are 0.089 and 0.029: hadamard only
    assert "q8_0 rot:hadamard" in answer(ROWS, tolerance_pct=0.5).split("pick")[1]
    tight = answer(ROWS, tolerance_pct=0.01)  # 0.001: nothing's upper bound is under it
    assert "none of these" in tight


def test_baseline_and_rows_carry_their_errors():
    text = answer(ROWS)
    assert "ppl 10.000 ± 0.500" in text and "1,000 tokens scored" in text
    line = next(x for x in text.splitlines() if x.startswith("q4_0 rot:"))
    assert "+1.000 ± 0.100" in line and "5.40e-02 ± 2.30e-03" in line and "28.1%" in line


def test_frontier_keeps_what_nothing_beats_in_bytes_and_kl():
    t = pd.DataFrame({"configuration": list("abcd"), "bytes": [4, 2, 2, 1],
                      "kl": [0.0, 0.1, 0.2, 0.5]})  # fmt: skip
    assert frontier(t) == ["d", "b", "a"]  # c: as small as b, higher KL


def test_overlapping_error_bars_warn_with_the_chunks_that_would_separate_them():
    t = pd.DataFrame({"configuration": ["x", "y"], "dppl": [0.05, 0.0], "dppl_err": [0.02, 0.02],
                      "kl": [1.0, 2.0], "kl_err": [0.01, 0.01]})  # fmt: skip
    warns = overlap_warnings(t, chunks=2)
    assert len(warns) == 1 and "by Δppl" in warns[0]  # KL 1 vs 2 is far apart
    need = math.ceil(2 * (1.96 * math.hypot(0.02, 0.02) / 0.05) ** 2)  # 2 x 1.229 -> 3
    assert need == 3
    assert f"~{need:,} chunks (now 2)" in warns[0]


def test_no_quality_rows_no_answer():
    assert answer(ROWS.assign(phase="decode")) == ""


def test_invariant_axis_columns_are_said_once():
    df = pd.DataFrame({"model": ["m", "m"], "kv_dtype": ["fp16", "q8_0"], "status": ["ok", "ok"],
                       "median_ms": [1.0, 1.0]})  # fmt: skip
    cols, same = split_invariant(df, ["model", "kv_dtype", "status", "median_ms"])
    assert cols == ["kv_dtype", "median_ms"]  # a measured column stays even when equal
    assert same == {"model": "m", "status": "ok"}
    assert split_invariant(df.iloc[:1], ["model"]) == (["model"], {})


def test_noise_line_when_most_timed_rows_are_unstable():
    from kvbench.analysis.summary import noise_line

    df = pd.DataFrame({"cv": [0.3, 0.5, 0.05, None], "unstable": [True, "True", False, None]})
    line = noise_line(df, 2.5)
    assert line.startswith("noise: 2 of 3 timed rows are unstable") and "load average 2.5" in line
    assert "kvbench calibrate" in line and "rounds" in line
    assert noise_line(df.assign(unstable=[True, False, False, None]), 2.5) == ""  # 1 of 3
    assert noise_line(pd.DataFrame({"ppl": [1.0]}), 1.0) == ""  # quality rows: no times


def test_a_policy_rows_share_is_per_context_token():
    """A policy row's kv_bytes hold the compressed context only (half a quality chunk): its
    share of fp16's comes from kept_bytes_per_token x context_len. snapkv at ratio 0.5 over
    fp16 cells keeps half of fp16's bytes per token: 50.0%, not the 25.0% that kv_bytes (512
    positions' cells kept of a 1,024-token chunk's fp16 row) would say."""
    kept = FP16 // 4  # half of the 512 context positions' fp16 cells
    policy = {**row("fp16", "none", kept, 1.0, 0.2, 0.05, 0.004), "policy": "snapkv",
              "compression_ratio": 0.5, "kept_bytes_per_token": kept / 512}  # fmt: skip
    text = answer(pd.concat([ROWS, pd.DataFrame([policy])], ignore_index=True))
    line = next(x for x in text.splitlines() if "+1.000 ± 0.200" in x)
    assert "50.0%" in line and f"{FP16 / 2 / 2**20:,.1f}" in line


def test_a_policy_row_says_its_policy_and_the_table_its_per_token_bytes():
    """A lone policy row is labelled with its policy and ratio ("fp16" alone read as the full
    cache), and the terminal table's KV MiB is the answer block's figure (kept bytes per context
    token x context_len), not kv_bytes of the compressed half-chunk (0.06 here, half of it)."""
    from kvbench.analysis.summary import table

    kept = FP16 // 4
    policy = pd.DataFrame([{**row("fp16", "none", kept, 1.0, 0.2, 0.05, 0.004),
                            "policy": "snapkv", "compression_ratio": 0.5,
                            "kept_bytes_per_token": kept / 512, "peak_mem_bytes": None,
                            "alloc_bytes": None, "cv": None, "unstable": None,
                            "ci_low_ms": None, "ci_high_ms": None}])  # fmt: skip
    line = next(x for x in answer(policy).splitlines() if "+1.000 ± 0.200" in x)
    assert line.split()[:3] == ["fp16", "snapkv", "cr0.5"]
    mib = f"{FP16 / 2 / 2**20:g}"  # 0.125: half of fp16's 0.25 MiB at 1,024 positions
    assert mib in table(policy).splitlines()[1].split()


def test_the_retrieval_column_counts_the_rows_run_as_the_quality_row_ran():
    """fp16's quality row is kvbench's (kernel reference): its retrieval column counts
    kvbench's retrieval rows (1 of 1), not llama-passkey's beside them (0 of 1)."""
    fetch = dict(SHAPE, phase="retrieval", kv_dtype="fp16", rotate_k="none", rotate_v="none",
                 n_trials=1)  # fmt: skip
    found = [{**fetch, "n_correct": 1}, {**fetch, "n_correct": 0, "kernel": "llama.cpp"}]
    rows = pd.concat([ROWS, pd.DataFrame(found)])
    line = next(x for x in answer(rows).splitlines() if x.startswith("fp16 "))
    assert " 1/1 " in line and "/2" not in line
