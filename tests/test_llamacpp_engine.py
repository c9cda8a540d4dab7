"""The llama.cpp engine (harness/engines/llamacpp.py): which cases it runs or skips, and one
real decode and quality row when llama.cpp is built and the model fetched (else skipped)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvbench.case import Case
from kvbench.engines import common, engine_for
from kvbench.engines import llamacpp as engine
from kvbench.kernels.model.fetch import model_path
from kvbench.peers import llamacpp
from kvbench.run import runner
from kvbench.store.tokens import TOKEN_COLUMNS
from kvbench.suite.suite import Settings


def case(**kw) -> Case:
    base = dict(model="smollm2-135m", n_layers=30, n_q_heads=9, n_kv_heads=3, head_dim=64)
    return Case(**{**base, "context_len": 64, "kernel": "llama.cpp", **kw})


def test_the_llama_cpp_kernel_goes_to_its_engine_and_types_map():
    assert engine_for(case(phase="quality")).build.__wrapped__ is engine.build
    assert engine.types_of(case(kv_dtype="int8", group_size=32)) == ("q8_0", "q8_0")
    assert engine.types_of(case(kv_dtype="int8", v_dtype="int4", group_size=32)) == (
        "q8_0",
        "q4_0",
    )


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(phase="decode"), "runs the phases"),
        (dict(phase="quality", kv_dtype="fp4"), "no KV cache type for fp4"),
        (dict(phase="quality", kv_dtype="int4"), "needs group_size 32"),
        (dict(phase="quality", sink_tokens=4), "per-token blocks only"),
    ],
)
def test_what_llama_cpp_cannot_run_is_a_skip_with_the_reason(kw, needle):
    assert needle in engine.skip_reason(case(**kw), "cpu")


def test_a_missing_build_is_a_skip_naming_it(monkeypatch, tmp_path):
    monkeypatch.setenv("KVBENCH_LLAMACPP_BIN", str(tmp_path))
    assert "not found" in engine.skip_reason(case(phase="model_decode"), "cpu")


def _needs_real():
    if llamacpp.missing_reason("llama-bench") or llamacpp.missing_reason("llama-perplexity"):
        pytest.skip("llama.cpp not built (make llamacpp)")
    if model_path() is None:
        pytest.skip("SmolLM2 not fetched (kvbench model fetch)")


def _row(c: Case, tokens: list | None = None):
    run = runner.CaseRun(c)
    settings = Settings(warmup_s=0, min_samples=2, max_samples=2, budget_s=0.1, rounds=1)
    runner.measure_round(run, settings, 0)
    if tokens is not None:
        tokens += run.token_rows
    return runner.finish(run, settings, {})


def test_a_real_decode_row_has_one_sample_per_repetition():
    _needs_real()
    row = _row(case(phase="model_decode", kv_dtype="int8", group_size=32))
    assert row.n_samples == 2 and row.median_ms > 0 and row.kernel_kind == "peer"
    assert row.peer_kv_types == "q8_0/q8_0" and row.peer_version.startswith("llama.cpp")
    # llama.cpp's own figures (its log): its cells cover the context; q8_0 = int8/g32's bytes
    assert row.peer_kv_cells >= row.context_len
    assert row.peer_kv_bytes >= 0.99 * row.kv_bytes
    assert row.peak_mem_bytes == row.peer_kv_bytes + row.peer_compute_bytes


def test_a_real_quality_row_compares_with_the_f16_cache():
    _needs_real()
    fp16 = _row(case(phase="quality", kv_dtype="fp16", context_len=128, chunks=2))
    got: list = []
    int4 = _row(case(phase="quality", kv_dtype="int4", group_size=32, context_len=128, chunks=2),
                got)  # fmt: skip
    assert fp16.kl_mean < 1e-3 and int4.kl_mean > fp16.kl_mean
    assert int4.ppl_ref == pytest.approx(fp16.ppl_ref, rel=1e-3)  # the same saved f16 base
    assert int4.n_scored == 2 * 63  # llama-perplexity prints no KL summary for tiny runs
    # its cost (#33 item 8): the process's wall time and the pass it times itself, the first:
    # at -c 128 it runs n_seq = 2048 / 128 = 16 chunks at once, so both chunks of 128 tokens
    assert int4.wall_s > 0 and int4.ubatch == 128
    assert int4.prefill_tokens == 256 and int4.prefill_tokens_per_s > 0
    # the per-token values read from the two saved passes are llama.cpp's: their means are what
    # llama-perplexity printed (KL to within the saved log p's rounding; the nll's sum is the
    # printed ppl's once floored tokens get theirs back), on kvbench's tokens
    t = pd.DataFrame(got, columns=TOKEN_COLUMNS)
    assert len(t) == int4.n_scored and t["kl"].mean() == pytest.approx(int4.kl_mean, abs=2e-4)
    assert np.exp(t["nll"].mean()) == pytest.approx(int4.ppl, rel=1e-6)
    chunks = common.chunks_of("smollm2-135m", "default", 128, 2)
    assert t["token"].tolist() == [tok for c in chunks for tok in c[65:]]
    assert t["position"].tolist() == list(range(64, 127)) * 2
