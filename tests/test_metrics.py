"""The byte and FLOP model against hand calculations for real model shapes."""

from __future__ import annotations

from kvbench.case import Case
from kvbench.engines import metrics
from kvbench.kernels.formats.registry import get_format
from kvbench.suite.presets import PRESETS


def case_for(preset: str, **kw) -> Case:
    s = PRESETS[preset]
    return Case(
        model=preset,
        n_layers=s.n_layers,
        n_q_heads=s.n_q_heads,
        n_kv_heads=s.n_kv_heads,
        head_dim=s.head_dim,
        **kw,
    )


def test_kv_bytes_llama3_8b_fp16_8k():
    # 32 layers x (K+V) x 8 kv heads x 8192 positions x 128 dims x 2 bytes = 1 GiB exactly
    c = case_for("llama-3-8b", context_len=8192, kv_dtype="fp16")
    assert metrics.kv_bytes(c, get_format("fp16")) == 1024**3


def test_kv_bytes_llama2_7b_fp16_4k():
    # MHA: 32 layers x 2 x 32 heads x 4096 x 128 x 2 B = 2 GiB
    c = case_for("llama-2-7b", context_len=4096)
    assert metrics.kv_bytes(c, get_format("fp16")) == 2 * 1024**3


def test_kv_bytes_qwen2_7b_fp32_two_seqs():
    # 28 layers x 2 x 2 seqs x 4 kv heads x 1000 x 128 x 4 B
    c = case_for("qwen2-7b", context_len=1000, n_seqs=2, kv_dtype="fp32")
    assert metrics.kv_bytes(c, get_format("fp32")) == 28 * 2 * 2 * 4 * 1000 * 128 * 4


def test_decode_traffic_mistral_7b_fp16():
    c = case_for("mistral-7b", context_len=4096)
    read, written = metrics.traffic_bytes(c, get_format("fp16"))
    per_layer_read = (
        2 * 8 * 4096 * 128 * 2  # K and V cache over the context
        + 2 * 8 * 128 * 2  # the new token's K and V, as input
        + 32 * 128 * 2
    )  # the query
    per_layer_written = 2 * 8 * 128 * 2 + 32 * 128 * 2  # new K/V stored, output
    assert read == 32 * per_layer_read
    assert written == 32 * per_layer_written


def test_prefill_traffic_and_flops():
    c = Case(
        model="custom",
        n_layers=2,
        n_q_heads=4,
        n_kv_heads=2,
        head_dim=8,
        context_len=10,
        phase="prefill",
    )
    read, written = metrics.traffic_bytes(c, get_format("fp32"))
    kv = 2 * 2 * 10 * 8 * 4  # K+V, 2 heads, 10 positions, 8 dims, 4 bytes
    qo = 4 * 10 * 8 * 4
    assert read == 2 * (kv + kv + qo)  # cache read once, prompt K/V in, queries in
    assert written == 2 * (kv + qo)
    # causal: query i sees i+1 keys; 2 matmuls x 2 FLOP x D per (query, key) pair
    pairs = sum(i + 1 for i in range(10))
    assert metrics.flops(c) == 2 * 4 * 2 * 2 * 8 * pairs


def test_decode_flops_and_rates():
    c = case_for("llama-3-8b", context_len=1024)
    assert metrics.flops(c) == 32 * 32 * 4 * 128 * 1024
    r = metrics.rates(c, get_format("fp16"), median_ms=2.0, peak_gbps=100.0)
    total = r["bytes_read"] + r["bytes_written"]
    assert abs(r["gbps"] - total / 2e-3 / 1e9) < 1e-9
    assert abs(r["pct_peak_bw"] - r["gbps"]) < 1e-9  # peak 100 GB/s: % equals GB/s
    assert r["tokens_per_s"] == 500.0
