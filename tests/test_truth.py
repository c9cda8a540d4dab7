"""kvbench / llama.cpp per row (harness/analysis/truth.py): ratios and intervals by hand, the
pairing, and suites/truth.yaml pairing every kvbench row with a llama.cpp row."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kvbench.analysis.truth import (
    INDEPENDENT,
    PAIRED,
    main,
    markdown,
    truth_table,
)
from kvbench.stats import log_normal_ratio as ratio_interval
from kvbench.store import tokens


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
    from kvbench.suite.suite import expand, load_suite

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


# ---- the paired bootstrap over scored tokens ----------------------------------------------------


def test_paired_bootstrap_by_hand():
    from kvbench.stats import paired_token_ratio

    rng = np.random.default_rng(3)
    kl = rng.exponential(0.1, 1023)
    nll = rng.exponential(2.5, 1023)
    # identical arrays: ratio 1 and every resample 1
    assert paired_token_ratio(kl, kl, "kl") == (1.0, 1.0, 1.0)
    assert paired_token_ratio(nll, nll, "ppl") == (1.0, 1.0, 1.0)
    # a known shift: every token's nll 0.01 nats higher is ppl x e^0.01 in every resample; every
    # token's KL 1.2 times is a KL ratio of 1.2 in every resample
    r, lo, hi = paired_token_ratio(nll + 0.01, nll, "ppl")
    assert r == pytest.approx(math.exp(0.01), rel=1e-12)
    assert (lo, hi) == pytest.approx((math.exp(0.01),) * 2, rel=1e-12)
    assert paired_token_ratio(1.2 * kl, kl, "kl") == pytest.approx((1.2, 1.2, 1.2), rel=1e-12)


def test_paired_bootstrap_interval_is_the_paired_standard_error():
    # a = 1.1 b + noise, tokens independent (block 1): the 95% interval of mean a / mean b is
    # about r * exp(+-1.96 se) with se the delta method's on the paired differences
    # d_i = a_i / mean a - b_i / mean b (sd(d) / sqrt(n)); far narrower than the independent one
    from kvbench.stats import paired_token_ratio

    rng = np.random.default_rng(4)
    b = rng.exponential(0.1, 4000)
    a = 1.1 * b + rng.normal(0, 0.01, b.size)
    r, lo, hi = paired_token_ratio(a, b, "kl", block=1)
    d = a / a.mean() - b / b.mean()
    se = d.std(ddof=1) / math.sqrt(b.size)
    assert r == pytest.approx(a.mean() / b.mean())
    assert math.log(hi / lo) / 2 == pytest.approx(1.959964 * se, rel=0.15)
    sem = lambda x: x.std(ddof=1) / math.sqrt(x.size)  # noqa: E731
    _, ilo, ihi = ratio_interval(a.mean(), sem(a), b.mean(), sem(b))
    assert hi - lo < (ihi - ilo) / 10
    # blocks: the same seed and count, another interval, still about the same for independent
    # tokens; the resample count and seed make it reproducible
    assert paired_token_ratio(a, b, "kl") == paired_token_ratio(a, b, "kl")
    _, blo, bhi = paired_token_ratio(a, b, "kl")
    assert math.log(bhi / blo) == pytest.approx(math.log(hi / lo), rel=0.2)


def tokens_of(run_id, case_id, nll, kl, tokens=None, chunk=0):
    n = len(nll)
    token = np.arange(n) if tokens is None else tokens
    return pd.DataFrame(dict(run_id=run_id, case_id=case_id, chunk=chunk, token=token,
                             position=np.arange(1024, 1024 + n), nll=nll, kl=kl))  # fmt: skip


def test_pairs_on_the_same_tokens_use_the_paired_bootstrap_else_say_why():
    rng = np.random.default_rng(5)
    nll, kl = rng.exponential(2.6, 1023), rng.exponential(0.07, 1023)
    df = pd.DataFrame([
        row("reference", "q4_0", "hadamard", 0, 0, 0, 0, run_id="a", case_id="k"),
        row("llama.cpp", "q4_0", "hadamard", 0, 0, 0, 0, run_id="b", case_id="l"),
        row("reference", "q4_0", "none", 15.0, 0.5, 0.18, 0.01, run_id="a", case_id="m"),
        row("llama.cpp", "q4_0", "none", 15.1, 0.5, 0.19, 0.01, run_id="b", case_id="n"),
        row("reference", "q8_0", "none", 15.0, 0.5, 0.01, 0.001, run_id="a", case_id="o"),
        row("llama.cpp", "q8_0", "none", 15.1, 0.5, 0.011, 0.001, run_id="b", case_id="p"),
    ])  # fmt: skip
    df.loc[0, ["ppl", "kl_mean"]] = np.exp((nll + 0.02).mean()), (1.05 * kl).mean()
    df.loc[1, ["ppl", "kl_mean"]] = np.exp(nll.mean()), kl.mean()
    other = np.arange(1023)
    other[600] = 7
    toks = pd.concat([
        tokens_of("a", "k", nll + 0.02, 1.05 * kl), tokens_of("b", "l", nll, kl),
        tokens_of("a", "m", nll, kl), tokens_of("b", "n", nll, kl, tokens=other),
    ])  # fmt: skip
    t = truth_table(df, toks).set_index(["kv_dtype", "rotate_k"])
    rot, plain, q8 = t.loc[("q4_0", "hadamard")], t.loc[("q4_0", "none")], t.loc[("q8_0", "none")]
    assert rot["interval"] == PAIRED
    assert (rot["ppl_lo"], rot["ppl_ratio"], rot["ppl_hi"]) == pytest.approx((math.exp(0.02),) * 3)
    assert (rot["kl_lo"], rot["kl_ratio"], rot["kl_hi"]) == pytest.approx((1.05,) * 3)
    # another token at one position: refused, the reason named, the rows' ratio without interval
    assert plain["interval"].startswith("refused: the tokens differ from chunk 0 position 1624")
    assert "llama.cpp 7" in plain["interval"] and "1 of 1023 differ" in plain["interval"]
    assert plain["kl_ratio"] == pytest.approx(0.18 / 0.19) and math.isnan(plain["kl_lo"])
    assert q8["interval"] == INDEPENDENT and q8["kl_lo"] < q8["kl_ratio"] < q8["kl_hi"]
    # llama.cpp's f16 row is its base pass: KL 0 on every token, no ratio (shown as -)
    rows = pd.DataFrame([
        row("reference", "fp16", "none", np.exp(nll.mean()), 0, 1e-6, 0, run_id="a", case_id="f"),
        row("llama.cpp", "fp16", "none", np.exp(nll.mean()), 0, 0.0, 0, run_id="b", case_id="g"),
    ])  # fmt: skip
    zero = pd.concat([tokens_of("a", "f", nll, kl * 1e-5), tokens_of("b", "g", nll, 0 * kl)])
    f16 = truth_table(rows, zero)
    assert f16["interval"][0] == PAIRED and f16["ppl_ratio"][0] == 1.0
    assert math.isnan(f16["kl_ratio"][0]) and f16["kl_goal"][0] is None
    assert "| 1.0000 [1.0000, 1.0000] | 1e-06 | 0 | - |" in markdown(f16)
    text = markdown(truth_table(df, toks))
    assert "paired bootstrap over scored tokens" in text and "2000 resamples, seed 0" in text
    assert "blocks of ceil(n^(1/3)) tokens: 11 at 1023" in text and "refused: the tokens" in text
    # a different count of tokens is refused too
    short = pd.concat([tokens_of("a", "k", nll[:-1], kl[:-1]), tokens_of("b", "l", nll, kl)])
    got = truth_table(df, short).set_index(["kv_dtype", "rotate_k"]).loc[("q4_0", "hadamard")]
    assert got["interval"] == "refused: kvbench kept 1022 scored tokens, llama.cpp 1023"


def test_the_command_reads_the_per_token_files_beside_the_runs(tmp_path, capsys):
    # two runs written by the writer, each row's tokens before it; the command pairs them
    from kvbench.store.schema import make_record
    from kvbench.store.tokens import read_tokens, tokens_path
    from kvbench.store.writer import ResultsWriter

    rng = np.random.default_rng(6)
    nll, kl = rng.exponential(2.6, 63), rng.exponential(0.07, 63)
    arrays = dict(chunk=np.zeros(63), position=np.arange(64, 127), token=np.arange(63))
    for run_id, kernel, f in (("a", "reference", 1.1), ("b", "llama.cpp", 1.0)):
        w = ResultsWriter.claim(tmp_path, run_id)
        fields = row(kernel, "q4_0", "none", float(np.exp(nll.mean())), 0.1,
                     float(f * kl.mean()), 0.01, n_scored=63)  # fmt: skip
        rec = make_record(run_id=run_id, case_id=run_id + "1", **fields)
        lines = tokens.token_rows(rec.case_id, {**arrays, "nll": nll, "kl": f * kl})
        w.add(rec, [], lines)
        assert len(read_tokens(w.csv_path)) == 63
    assert not tokens_path(tmp_path / "c.csv").exists()
    assert main([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]) == 0
    out = capsys.readouterr().out
    assert "| 1.0000 [1.0000, 1.0000] |" in out and "| 1.100 [1.100, 1.100] |" in out
    assert "paired bootstrap over scored tokens" in out
    # a directory, or a shell glob that also names the samples and tokens files: the same table
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == out
    assert main(sorted(str(p) for p in tmp_path.glob("*.csv"))) == 0
    assert capsys.readouterr().out == out
    # only side files: one line naming them, exit 2, no traceback
    side = [str(p) for p in tmp_path.glob("*.samples.csv")]
    assert main(side) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no results CSV" in err and side[0] in err
