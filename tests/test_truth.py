"""kvbench / llama.cpp per row (harness/analysis/truth.py): ratios and intervals by hand, the
pairing, and suites/truth.yaml pairing every kvbench row with a llama.cpp row."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvbench.analysis.truth import markdown, ratio_interval, truth_table


def test_ratio_interval_by_hand():
    # 0.11 +- 0.01 over 0.10 +- 0.01: log-ratio se = sqrt((1/11)^2 + (1/10)^2) = 0.135146,
    # x 1.959964 = 0.264881; exp(-+0.264881) = 0.767297, 1.303276; times 1.1
    r, lo, hi = ratio_interval(0.11, 0.01, 0.10, 0.01)
    assert r == pytest.approx(1.1) and lo == pytest.approx(0.844027, abs=2e-6)
    assert hi == pytest.approx(1.433604, abs=2e-6)
    r, lo, hi = ratio_interval(0.11, None, 0.10, 0.01)  # no error on one side: no interval
    assert r == pytest.approx(1.1) and math.isnan(lo) and math.isnan(hi)


def row(kernel, kv, rot, ppl, ppl_err, kl, kl_err, **kw):
    base = dict(status="ok", phase="quality", model="m", context_len=2048, chunks=1,
                text="default", kv_dtype=kv, v_dtype=None, rotate_k=rot, rotate_v=rot,
                kernel=kernel, ppl=ppl, ppl_err=ppl_err, kl_mean=kl, kl_err=kl_err,
                n_scored=1023)  # fmt: skip
    return {**base, **kw}


def test_pairs_by_type_and_rotation_and_marks_the_goal():
    df = pd.DataFrame([
        row("reference", "fp16", "none", 13.50, 0.5, 1e-6, 1e-7),
        row("llama.cpp", "fp16", "none", 13.60, 0.5, 2e-6, 1e-7),
        row("reference", "q4_0", "hadamard", 14.0, 0.5, 0.066, 0.004),
        row("llama.cpp", "q4_0", "hadamard", 14.1, 0.5, 0.073, 0.004),
        row("reference", "q4_0", "none", 15.0, 0.5, 0.18, 0.01),  # no llama.cpp row: left out
        row("llama.cpp", "q8_0", "none", 13.6, 0.5, 0.002, 0.0002, status="error"),
    ])  # fmt: skip
    t = truth_table(df).set_index(["kv_dtype", "rotate_k"])
    assert len(t) == 2
    fp16, q4 = t.loc[("fp16", "none")], t.loc[("q4_0", "hadamard")]
    assert fp16["ppl_ratio"] == pytest.approx(13.5 / 13.6) and fp16["ppl_goal"]  # -0.74%
    assert fp16["kl_goal"] is None  # unquantized: KL is rounding on both sides, no goal
    assert q4["kl_ratio"] == pytest.approx(0.066 / 0.073) and q4["kl_goal"]  # -9.6%
    assert q4["kl_lo"] < q4["kl_ratio"] < q4["kl_hi"]
    text = markdown(truth_table(df))
    assert "0.904 [" in text and "(off goal)" not in text


def test_the_truth_suite_pairs_every_kvbench_row():
    from kvbench.spec.suite import expand, load_suite

    cases = list(expand(load_suite("suites/truth.yaml")))
    key = lambda c: (c.model, c.context_len, c.chunks, c.text, c.kv_dtype, c.rotate_k)  # noqa: E731
    ours = {key(c) for c in cases if c.kernel != "llama.cpp"}
    theirs = {key(c) for c in cases if c.kernel == "llama.cpp"}
    assert ours == theirs and len(ours) == 15
    assert {(c.model, c.context_len) for c in cases} == {
        ("smollm2-135m", 2048), ("gemma3-270m", 2048), ("gemma3-270m", 8192)}  # fmt: skip
    # the emulation axes compute what llama.cpp computes: SmolLM2's keys in GGUF order, q8_0
    # queries against every quantized K
    for c in cases:
        if c.kernel != "llama.cpp":
            assert c.k_order == ("gguf" if c.model == "smollm2-135m" else "hf")
            assert c.q_quant == ("none" if c.kv_dtype == "fp16" else "q8_0")
