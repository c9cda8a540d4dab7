"""The model engine (harness/engines/model.py) on the tiny GGUF model of tests/tiny_model.py:
quality rows, decode at a fixed depth, bytes against hand counts, and the suite checks."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from tiny_model import TINY, np_forward, weights, write_gguf

from kvbench.case import Case
from kvbench.engines import common, engine_for
from kvbench.engines import model as engine
from kvbench.engines.contract import carrying
from kvbench.errors import SuiteError
from kvbench.kernels.model import matvec, rope
from kvbench.kernels.model.load import load_model
from kvbench.run import runner
from kvbench.suite.cache_spec import spec_of
from kvbench.suite.suite import Settings
from kvbench.suite.validate import check_model

TOKENS = tuple(np.random.default_rng(1).integers(0, TINY["vocab"], 200).tolist())


@pytest.fixture()
def tiny(tmp_path, monkeypatch):
    model = load_model(write_gguf(tmp_path / "t.gguf", weights(seed=3)))
    monkeypatch.setattr(common, "model_of", lambda name: (model, None))
    monkeypatch.setattr(common, "tokens_of", lambda name, text: TOKENS)
    engine.reference_of.cache_clear()
    yield model
    engine.reference_of.cache_clear()


def case(**kw) -> Case:
    base = dict(model="smollm2-135m", n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=64)
    return Case(**{**base, "context_len": 32, "kernel": "reference", **kw})


def test_the_model_phases_go_to_the_model_engine():
    assert engine_for(case(phase="quality")).build.__wrapped__ is engine.build
    assert engine_for(case(phase="model_decode")).build.__wrapped__ is engine.build
    assert engine_for(case()).build.__wrapped__ is not engine.build


def test_a_quality_row_states_what_its_evidence_cost(tiny):
    """Every token of every chunk goes through the model once in micro-batches (prefill), none
    one at a time; the float32 reference's own wall time beside it."""
    row = carrying(engine.build)(case(phase="quality", kv_dtype="int8", chunks=3)).check()
    assert row["prefill_tokens"] == 3 * 32 and row["decode_tokens"] == 0
    assert row["decode_s"] is None and row["decode_tokens_per_s"] is None
    assert 0 < row["prefill_s"] <= row["wall_s"] and row["ref_wall_s"] > 0
    assert row["prefill_tokens_per_s"] == pytest.approx(96 / row["prefill_s"])


def test_quality_of_fp16_is_near_zero_and_of_int4_is_not(tiny):
    fp16 = carrying(engine.build)(case(phase="quality", kv_dtype="fp16")).check()
    int4 = carrying(engine.build)(case(phase="quality", kv_dtype="int4")).check()
    assert fp16["kl_mean"] < 1e-5 and fp16["n_scored"] == 15  # second half of 32, less one
    assert int4["kl_mean"] > 10 * fp16["kl_mean"]
    assert abs(fp16["ppl"] - fp16["ppl_ref"]) / fp16["ppl_ref"] < 0.01


@pytest.mark.parametrize(
    "opts",
    [dict(kv_dtype="fp16", kernel="sdpa"),
     dict(kv_dtype="int4", sink_tokens=4, recent_tokens=8, kernel="sdpa")],
)  # fmt: skip
def test_every_decode_sample_is_the_same_token_at_the_same_depth(tiny, opts):
    state = carrying(engine.build)(case(phase="model_decode", **opts))
    first, second = state.stages["step"](), state.stages["step"]()
    mx.eval(first, second)
    assert mx.array_equal(first[0], second[0])  # rewound: the same logits, not a deeper step


def test_a_decode_row_says_how_its_step_ran(tiny, monkeypatch):
    """matvec and rope are what one step did, counted, not a setting: on the CPU the blocked
    products and the RoPE table; with both paths swapped back, gemm and fast."""
    state = carrying(engine.build)(case(phase="model_decode", kv_dtype="fp16", kernel="sdpa"))
    assert state.extra == {"matvec": "blocked", "rope": "table"}
    for _, m in tiny.net.named_modules():
        back = {**{v: k for k, v in matvec.SWAPS.items()}, rope.TableRoPE: nn.RoPE}
        if type(m) in back:
            monkeypatch.setattr(m, "__class__", back[type(m)])
    state = carrying(engine.build)(case(phase="model_decode", kv_dtype="fp16", kernel="sdpa"))
    assert state.extra == {"matvec": "gemm", "rope": "fast"}


def test_bytes_by_hand(tiny):
    # fp16: 2 layers x 2 heads x 64 x 2 B x (K, V) = 1024 B per position; 32 positions held
    state = carrying(engine.build)(case(phase="model_decode", kv_dtype="fp16", kernel="sdpa"))
    assert state.kv_bytes == 32 * 1024
    assert state.alloc_bytes == 31 * 1024  # measured: the 31 prefilled positions
    assert state.traffic[1] == 1024  # one position written
    assert state.flops > 0


def test_a_quality_row_has_quality_and_no_time(tiny):
    run = runner.CaseRun(c := case(phase="quality", kv_dtype="int8"))
    runner.measure_round(run, Settings(warmup_s=0, min_samples=1, max_samples=1, budget_s=0), 0)
    row = runner.finish(run, Settings(), {})
    assert row.kl_mean is not None and row.top1_agree is not None and row.n_samples == 0
    assert row.median_ms is None and row.kv_bytes == common.model_kv_bytes(c, spec_of(c))
    assert row.bits_per_elem == 8.25  # int8: 8 bits + one fp16 scale per 64-element row


def test_bits_of_a_mixed_spec_count_everything_it_holds(tiny):
    # K int8 (8.25 bits) and V int4 (4.25 bits) average 6.25; 4 fp16 sinks of 32 positions
    # add (16 - 6.25) * 4 / 32
    state = carrying(engine.build)(
        case(phase="quality", kv_dtype="int8", v_dtype="int4", sink_tokens=4)
    )
    assert state.bits_per_elem == pytest.approx(6.25 + (16 - 6.25) * 4 / 32)


def test_suite_checks_of_the_model_axes():
    check_model("s.yaml", case(phase="quality", k_axis="channel", recent_tokens=16))
    with pytest.raises(SuiteError, match="k_axis"):
        check_model("s.yaml", case(phase="quality", k_axis="channel"))  # needs recent_tokens
    with pytest.raises(SuiteError, match="sink_tokens: only the model phases"):
        check_model("s.yaml", case(phase="decode", sink_tokens=4))
    with pytest.raises(SuiteError, match="model: phase quality runs a real model"):
        check_model("s.yaml", case(phase="quality", model="tiny"))


def test_kv_data_model_is_a_causal_capture_of_the_real_model():
    from kvbench.kernels.data import make_qkv
    from kvbench.kernels.model.fetch import model_path

    if model_path() is None:
        pytest.skip("SmolLM2 not fetched (kvbench model fetch)")
    _, k16, v16 = make_qkv("model", (1, 9, 1, 64), (1, 3, 16, 64), 0)
    _, k8, v8 = make_qkv("model", (1, 9, 1, 64), (2, 3, 8, 64), 0)
    assert k16.shape == (1, 3, 16, 64) and k8.shape == (2, 3, 8, 64)
    # causal attention: the first 8 positions do not depend on the tokens after them
    assert np.allclose(np.array(k16[0, :, :8]), np.array(k8[1]), atol=1e-4)
    assert np.allclose(np.array(v16[0, :, :8]), np.array(v8[0]), atol=1e-4)
    assert float(mx.abs(k16).max()) > 0


BOS = 0


def bpe_vocab(add_bos: bool) -> dict:
    """A byte-level vocabulary of 258 tokens (BOS, EOS, the 256 byte symbols) that adds BOS
    when add_bos: every character of plain ASCII text is one token."""
    from tokenizers import pre_tokenizers

    tokens = ["<s>", "</s>", *sorted(pre_tokenizers.ByteLevel.alphabet())]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.token_type": mx.array([3, 3] + [1] * 256, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": mx.array(BOS, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.add_bos_token": mx.array(add_bos),
    }


@pytest.fixture()
def bos_model(tmp_path):
    """(gguf path, text path, token stream): a tiny model whose vocabulary adds BOS."""
    gguf = write_gguf(tmp_path / "bos.gguf", weights(seed=5), metadata=bpe_vocab(True))
    text = tmp_path / "t.txt"
    text.write_text("".join(chr(97 + (i * 7) % 26) for i in range(100)))  # 100 tokens
    common.model_of.cache_clear()
    common.tokens_of.cache_clear()
    engine.reference_of.cache_clear()
    yield str(gguf), str(text), list(common.tokens_of(str(gguf), str(text)))
    common.model_of.cache_clear()
    common.tokens_of.cache_clear()
    engine.reference_of.cache_clear()


def ppl_of(model, chunks: list[list[int]]) -> float:
    """exp(mean nll) of the scored halves, computed here from each chunk's log-probabilities."""
    from kvbench.kernels.model import quality

    nll = []
    for c, lp in zip(chunks, quality.reference_run(model, chunks)):
        lp = np.array(lp)
        nll += [-lp[i, t] for i, t in enumerate(c[len(c) // 2 + 1 :])]
    return float(np.exp(np.mean(nll)))


def test_every_chunk_starts_with_bos_where_the_vocabulary_adds_one(bos_model):
    # llama-perplexity (tools/perplexity/perplexity.cpp): the text tokenized once with its BOS,
    # cut into n_ctx pieces, each piece's first token overwritten by BOS (replaced, not shifted)
    gguf, text, tokens = bos_model
    assert tokens[0] == BOS and len(tokens) == 101 and BOS not in tokens[1:]
    chunks = common.chunks_of(gguf, text, 32, 3)
    assert chunks == [[BOS, *tokens[i * 32 + 1 : (i + 1) * 32]] for i in range(3)]
    run = runner.CaseRun(c := case(phase="quality", model=gguf, text=text, chunks=3))
    runner.measure_round(run, Settings(warmup_s=0, min_samples=1, max_samples=1, budget_s=0), 0)
    row = runner.finish(run, Settings(), {})
    assert row.chunk_bos is True and row.n_scored == 3 * 15 and c.chunks == 3
    model = common.model_of(gguf)[0]
    assert row.ppl_ref == pytest.approx(ppl_of(model, chunks), rel=1e-6)
    # negative control: the plain slices (no BOS past the first chunk) score differently
    plain = [tokens[i * 32 : (i + 1) * 32] for i in range(3)]
    assert abs(ppl_of(model, plain) / row.ppl_ref - 1) > 1e-4


def test_no_bos_is_put_in_where_the_vocabulary_adds_none(tmp_path):
    gguf = write_gguf(tmp_path / "nobos.gguf", weights(seed=5), metadata=bpe_vocab(False))
    text = tmp_path / "t.txt"
    text.write_text("".join(chr(97 + (i * 7) % 26) for i in range(100)))
    common.model_of.cache_clear()
    common.tokens_of.cache_clear()
    try:
        tokens = list(common.tokens_of(str(gguf), str(text)))
        assert common.chunk_bos(str(gguf)) is None and BOS not in tokens
        assert common.chunks_of(str(gguf), str(text), 32, 3) == [tokens[:32], tokens[32:64],
                                                                 tokens[64:96]]  # fmt: skip
    finally:
        common.model_of.cache_clear()
        common.tokens_of.cache_clear()


def test_fp8_decode_rows_count_what_the_prefill_saturated(tiny):
    """model_decode with an FP8 cache: kv_saturated is what the prefill stored saturated (a
    scale of 1e-4 saturates most of it; vLLM's calibrated scale none), not the timed steps'
    rewrites; other formats have no such field."""
    tiny_scale = carrying(engine.build)(
        case(phase="model_decode", kv_dtype="fp8_e4m3", fp8_scale=1e-4)
    )
    calibrated = carrying(engine.build)(case(phase="model_decode", kv_dtype="fp8_e4m3",
                                   fp8_scale="calibrated"))  # fmt: skip
    n = tiny_scale.check()["kv_saturated"]
    mx.eval(tiny_scale.stages["step"]())  # a timed step leaves the row's count as it was
    assert tiny_scale.check()["kv_saturated"] == n > 0
    assert calibrated.check() == {"kv_saturated": 0}
    assert carrying(engine.build)(case(phase="model_decode", kv_dtype="q8_0")).check() == {}


@pytest.mark.parametrize("policy, kw", [
    ("knorm", {}), ("window", {"n_sink": 2}), ("h2o", {}), ("tova", {}),
    ("snapkv", {"obs_window": 4}), ("pyramidkv", {"obs_window": 4}),
    ("expected_attention", {}), ("adakv", {"scorer": "knorm"}),
])  # fmt: skip
def test_a_policy_row_states_what_was_kept(tiny, policy, kw):
    """Half of the 16-token context kept: 8 cells x 2 heads x 2 layers; kv_bytes the formula
    (fp16: 2 B x 64 x K and V = 256 B a cell; h2o's float32 score a cell), kept_bytes what the
    cache held, equal."""
    c = case(phase="quality", kv_dtype="fp16", policy=policy, compression_ratio=0.5, **kw)
    run = runner.CaseRun(c)
    runner.measure_round(run, Settings(warmup_s=0, min_samples=1, max_samples=1, budget_s=0), 0)
    row = runner.finish(run, Settings(), {})
    assert row.status == "ok" and row.n_scored == 15 and row.context_tokens == 16
    layers = "24/8" if policy == "pyramidkv" else "16/16"  # pyramid (window 4): 12 and 4 a head
    assert row.kept_cells == 32 and row.kept_layers == layers
    assert row.kv_bytes == row.kept_bytes == 32 * (256 + 4 * (policy == "h2o"))
    assert row.kept_bytes_per_token == row.kept_bytes / 16 and row.policy_s > 0
    if policy != "adakv":  # heads keep the same count: no per-head column
        assert row.kept_heads is None
    assert row.kl_mean > 0


@pytest.mark.parametrize("policy, kw", [("snapkv", {"obs_window": 4}), ("knorm", {})])
def test_model_decode_under_a_policy_steps_over_the_kept_cells(tiny, policy, kw):
    """context_len 32: the depth's 31 tokens compressed at ratio 0.5 keep int(31 x 0.5) = 15
    cells per KV head (2 heads, 2 layers: 60). fp16 cells: 2 B x 64 x (K, V) = 256 B each;
    the step reads those 60 cells (15,360 B) and writes one position (1,024 B), where the full
    cache reads 31 positions (31,744 B). Every sample is the same step over the same cells."""
    c = case(phase="model_decode", kv_dtype="fp16", policy=policy, compression_ratio=0.5, **kw)
    state = carrying(engine.build)(c)
    x = state.extra
    assert x["context_tokens"] == 31 and x["kept_cells"] == 60 and x["kept_layers"] == "30/30"
    assert x["kept_heads"] is None and x["kept_bytes"] == 60 * 256
    assert x["kept_bytes_per_token"] == 60 * 256 / 31 and x["policy_s"] > 0
    assert state.kv_bytes == 60 * 256 + 1024 and state.bits_per_elem == 8.0  # 16 of 32 held
    weights_b = common.weight_bytes(tiny)
    assert state.traffic == (weights_b + 60 * 256, 1024)
    full = carrying(engine.build)(case(phase="model_decode", kv_dtype="fp16"))
    assert full.traffic == (weights_b + 31 * 1024, 1024)
    attn = 4 * 4 * 64  # FLOPs per attended position per layer (4 Hq D)
    assert full.flops - state.flops == attn * 2 * (32 - 16)  # each layer: 15 kept + the new
    first, second = state.stages["step"](), state.stages["step"]()
    mx.eval(first, second)
    assert mx.array_equal(first[0], second[0])  # rewound to the kept cells, not deeper
    mx.eval(want := full.stages["step"]()[0])
    assert not mx.allclose(first[0], want, atol=1e-3)  # the kept half is not the whole context


@pytest.mark.parametrize("policy, kw", [("snapkv", {"obs_window": 4}), ("knorm", {})])
def test_a_policy_step_is_attention_over_only_the_kept_positions(tiny, policy, kw):
    """The step's logits (float32 cells, sampled twice) against the numpy float64 forward pass
    whose last token sees only the positions the cache kept, per layer and KV head, and
    itself (every earlier token saw its whole causal context: the prefill)."""
    c = case(phase="model_decode", kv_dtype="fp32", policy=policy, compression_ratio=0.5, **kw)
    state = carrying(engine.build)(c)
    mx.eval(state.stages["step"]())
    got = np.array(state.stages["step"]()[0])
    sees = []
    for pos in state.profile.cache.kept_positions():  # per layer [Hkv, 15]
        keep = np.zeros((TINY["n_kv_heads"], 32), bool)
        for h, p in enumerate(pos):
            keep[h, p[p >= 0]] = True
        keep[:, 31] = True
        assert keep[:, :31].sum(axis=1).tolist() == [15, 15]
        sees.append(keep)
    want = np_forward(weights(seed=3), list(TOKENS[:32]), sees)[-1]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    whole = np_forward(weights(seed=3), list(TOKENS[:32]))[-1]
    assert np.abs(whole - want).max() > 1e-2  # the reference's mask matters at this tolerance


def test_a_policy_cache_hands_its_kernel_a_dense_view():
    """The evicting cache decodes its kept cells to a dense array: under a policy a kernel
    that reads packed cells only is skipped with that reason (it would fail in the cache), and
    a dense-only kernel runs a quantized format it could not read from the plain cache."""
    pol = dict(policy="knorm", compression_ratio=0.5)
    packed = case(phase="model_decode", kv_dtype="int4", kernel="dequant_sdpa")
    assert common.model_skip_reason(packed, "cpu") is None
    reason = common.model_skip_reason(replace(packed, **pol), "cpu")
    assert reason == "kernel dequant_sdpa: needs a quantized cache, fp16 is dense"
    dense = case(phase="model_decode", kv_dtype="int4", kernel="sdpa")
    assert "needs a dense cache, int4 is quantized" in common.model_skip_reason(dense, "cpu")
    assert common.model_skip_reason(replace(dense, **pol), "cpu") is None


def test_a_policy_decode_row_through_the_runner(tiny):
    """The row as the runner writes it: the timed step's samples beside the kept cells, the
    policy's one-off cost and the bytes of the cells the step read (see above)."""
    c = case(phase="model_decode", kv_dtype="fp16", policy="knorm", compression_ratio=0.5)
    run = runner.CaseRun(c)
    runner.measure_round(run, Settings(warmup_s=0, min_samples=2, max_samples=2, budget_s=0), 0)
    row = runner.finish(run, Settings(), {})
    assert row.status == "ok" and row.n_samples >= 1 and row.median_ms > 0
    assert row.kept_cells == 60 and row.context_tokens == 31 and row.policy_s > 0
    assert row.kv_bytes == 60 * 256 + 1024 and row.bits_per_elem == 8.0
    assert row.bytes_read == common.weight_bytes(tiny) + 60 * 256 and row.bytes_written == 1024


def test_a_step_over_uneven_heads_reads_their_padding(tiny):
    """adakv moves cells between a layer's heads; the cache pads every head to the layer's
    most and the step reads (and masks) the padding: traffic counts the cells read, more than
    kept_bytes, never fewer."""
    c = case(phase="model_decode", kv_dtype="fp16", policy="adakv", scorer="knorm",
             compression_ratio=0.5)  # fmt: skip
    state = carrying(engine.build)(c)
    heads = [[int(n) for n in layer.split(",")] for layer in state.extra["kept_heads"].split(";")]
    assert [sum(h) for h in heads] == [30, 30] and any(len(set(h)) > 1 for h in heads)
    read = sum(2 * max(h) * 256 for h in heads)  # 2 KV heads x the layer's most, 256 B a cell
    assert state.traffic[0] - common.weight_bytes(tiny) == read > state.extra["kept_bytes"]
