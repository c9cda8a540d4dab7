"""The model's task phases (harness/engines/model_tasks.py, kernels/model/generate.py) on the
tiny GGUF model of tests/tiny_model.py: retrieval and generate rows against the float32 cache,
mlx-lm's quantized_kv_start, and the suite checks of the task axes."""

from __future__ import annotations

import zlib
from dataclasses import replace
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from tiny_model import TINY, weights, write_gguf

from kvbench.case import Case
from kvbench.engines import common, engine_for
from kvbench.engines import model as base
from kvbench.engines import model_tasks as engine
from kvbench.engines.contract import carrying
from kvbench.errors import SuiteError
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.model import generate as G
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.capture import capture_kv
from kvbench.kernels.model.load import load_model
from kvbench.kernels.model.run import forward
from kvbench.kernels.model.spec import CacheSpec
from kvbench.suite.cache_spec import spec_of
from kvbench.suite.validate import check_model

TOKENS = tuple(np.random.default_rng(1).integers(0, TINY["vocab"], 200).tolist())


class HashTokenizer:
    """A word per token, ids by crc32 within the tiny vocabulary (no BOS added, no end of turn:
    `tok` names no token, as tokenizer.eog_ids asks)."""

    bos_id, add_bos, eos_id = None, False, None
    tok = SimpleNamespace(token_to_id=lambda text: None)

    def __init__(self):
        self.words: dict[int, str] = {}

    def encode(self, text, add_bos=False):
        ids = []
        for w in text.replace("\n", " \n ").split(" "):
            if w:
                ids.append(zlib.crc32(w.encode()) % TINY["vocab"])
                self.words[ids[-1]] = w
        return ids

    def decode(self, ids):
        return " ".join(self.words.get(i, str(i)) for i in ids)


@pytest.fixture()
def tiny(tmp_path, monkeypatch):
    model = load_model(write_gguf(tmp_path / "t.gguf", weights(seed=3)))
    tok = HashTokenizer()
    monkeypatch.setattr(common, "model_of", lambda name: (model, tok))
    monkeypatch.setattr(common, "tokens_of", lambda name, text: TOKENS)
    for f in (common.prompts_of, engine.reference_answers, engine.generate_reference):
        f.cache_clear()
    yield model
    for f in (common.prompts_of, engine.reference_answers, engine.generate_reference):
        f.cache_clear()


def case(**kw) -> Case:
    base_ = dict(model="smollm2-135m", n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=64)
    return Case(**{**base_, "context_len": 200, "kernel": "reference", **kw})


def test_task_phases_go_to_the_task_engine():
    assert engine_for(case(phase="retrieval", task="niah")).build.__wrapped__ is engine.build
    assert engine_for(case(phase="generate")).build.__wrapped__ is engine.build


def test_retrieval_row_of_the_float32_cache_agrees_with_itself(tiny):
    c = case(phase="retrieval", task="passkey", trials=3, depth=0.25)
    row = carrying(engine.build)(c).check()
    assert row["n_trials"] == 3 and row["n_ref_agree"] == 3 and row["ref_agree"] == 1.0
    assert row["accuracy"] == row["ref_accuracy"] and row["prompt_tokens"] <= 200 - 8
    assert row["accuracy_lo"] <= row["accuracy"] <= row["accuracy_hi"]


def test_task_rows_state_what_their_evidence_cost(tiny):
    """retrieval: each prompt but its last token in micro-batches, then one token at a time
    (at most gen_tokens per trial); generate: each chunk but its last token twice (the free
    run and the teacher-forced run), then gen_tokens decode steps each."""
    c = case(phase="retrieval", task="passkey", trials=2, depth=0.5)
    row = carrying(engine.build)(c).check()
    prompts = common.prompts_of(c.model, c.task, c.context_len, c.depth, c.trials, c.seed)
    assert row["prefill_tokens"] == sum(len(p.tokens) - 1 for p in prompts)
    assert 2 <= row["decode_tokens"] <= sum(p.gen_tokens for p in prompts)
    assert 0 < row["prefill_s"] + row["decode_s"] <= row["wall_s"] and row["ref_wall_s"] > 0
    assert row["ubatch"] == min(512, c.context_len) and row["decode_tokens_per_s"] > 0
    gen = carrying(engine.build)(
        case(phase="generate", context_len=48, gen_tokens=8, chunks=2)
    ).check()
    assert gen["prefill_tokens"] == 2 * 2 * 47 and gen["decode_tokens"] == 2 * 2 * 8
    assert gen["decode_tokens_per_s"] == pytest.approx(32 / gen["decode_s"])


def test_retrieval_rows_of_two_formats_share_prompts_and_reference(tiny):
    carrying(engine.build)(case(phase="retrieval", task="niah", trials=2, kv_dtype="fp32")).check()
    row = carrying(engine.build)(
        case(phase="retrieval", task="niah", trials=2, kv_dtype="int4")
    ).check()
    assert engine.reference_answers.cache_info().hits >= 1
    assert row["n_trials"] == 2 and 0 <= row["n_ref_agree"] <= 2


def test_generate_of_the_float32_cache_never_diverges(tiny):
    row = carrying(engine.build)(case(phase="generate", context_len=48, gen_tokens=8)).check()
    row32 = carrying(engine.build)(case(phase="generate", context_len=48, gen_tokens=8,
                              kv_dtype="fp32")).check()  # fmt: skip
    assert row32["gen_first_diverge"] == 8 and row32["gen_agree"] == 1.0
    assert row32["gen_kl_mean"] == pytest.approx(0, abs=1e-7) and row32["gen_tokens_scored"] == 8
    assert row["gen_kl_mean"] > 0  # fp16 rounding of K/V is not nothing


def test_generate_int4_errs_more_than_fp16(tiny):
    kw = dict(phase="generate", context_len=64, gen_tokens=12, chunks=2)
    fp16 = carrying(engine.build)(case(**kw)).check()
    int4 = carrying(engine.build)(case(kv_dtype="int4", **kw)).check()
    assert int4["gen_kl_mean"] > 10 * fp16["gen_kl_mean"] and int4["gen_tokens_scored"] == 24


def test_first_divergence_by_hand():
    assert G.first_divergence([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert G.first_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert G.first_divergence([5], [6]) == 0


def test_quantized_kv_start_past_the_end_is_the_fp16_cache(tiny):
    """A start never reached leaves the cache fp16: the same logits as an fp16 cache."""
    toks = mx.array([list(TOKENS[:24])])
    late = G.make_deferred(CacheSpec("int4"), tiny.config, 32, start=1000)
    fp16 = make_cache(CacheSpec("fp16"), tiny.config, 32)
    a, b = forward(tiny, toks, late), forward(tiny, toks, fp16)
    np.testing.assert_array_equal(np.array(a), np.array(b))
    assert not late.switched


def test_quantized_kv_start_converts_every_held_position(tiny):
    """Fed in pieces of 4 with start 8: the cache turns int4 after the second piece and then
    holds int4(fp16(K)) of the first 8 positions (layer 0's K does not depend on the cache:
    the capture's K)."""
    cache = G.make_deferred(CacheSpec("int4"), tiny.config, 16, start=8)
    for s in range(0, 12, 4):
        forward(tiny, mx.array([list(TOKENS[s : s + 4])]), cache)
        assert cache.switched == (s + 4 >= 8)
    k0 = mx.array(capture_kv(tiny, list(TOKENS[:8]))[0][0])[None]  # [1, Hkv, 8, D]
    fmt = get_format("int4")
    want = fmt.decode(fmt.encode(k0.astype(mx.float16).astype(mx.float32)), mx.float32)
    ks, _ = cache.late.kv.view(0, 8)
    np.testing.assert_allclose(np.array(fmt.decode(ks, mx.float32)), np.array(want), atol=1e-6)


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    """gemma3_text, layers 0-2 a sliding window of 8 positions, layer 3 global."""
    from tiny_model import write_random_mlx_dir

    path = tmp_path_factory.mktemp("g") / "g"
    return load_model(write_random_mlx_dir(path, "gemma3_text", n_layers=4))


def _rings(cache) -> list[int]:
    return [s.ring.size for s in cache.stores[:3]]


@pytest.mark.parametrize("start", [0, 10])
def test_generate_rings_hold_one_forward_not_the_context(tiny_gemma, start):
    """generate's caches (the float32 reference, the case's, fp16 before quantized_kv_start and
    the quantized one after) size a window layer's ring by what one forward writes: window 8 +
    the prefill's micro-batch of 4 - 1 = 11 cells, not 8 + the capacity of 30 + 6 - 1. The
    switch at start 10 (after the third piece, 12 positions) writes the held fp16 K/V 4 at a
    time; the continuation is that of caches whose rings hold the whole capacity (the same
    tokens; log-probabilities to 3e-3: a ring of another size sums attention in another order,
    and a last-bit change of the next layer's K can move an int8 code; measured 1.2e-4 on an
    Intel Xeon, 1.1e-3 on an AMD EPYC)."""
    prompt, n_new = list(TOKENS[:30]), 6
    ref_tokens, ref_lps = G.reference(tiny_gemma, prompt, n_new, ubatch=4)
    runs = {}
    for step in (4, None):  # rings of 8 + 4 - 1 and of 8 + 36 - 1 cells
        cache = G.make_deferred(CacheSpec("int8"), tiny_gemma.config, 36, start=start,
                                max_step=step)  # fmt: skip
        runs[step] = G.free_run(tiny_gemma, cache, prompt, n_new, ubatch=4)
        late = cache if start == 0 else cache.late
        assert _rings(late) == [8 + (step or 36) - 1] * 3
        if start:
            assert _rings(cache.early) == [8 + (step or 36) - 1] * 3
    assert runs[4][0] == runs[None][0]
    for a, b in zip(runs[4][1], runs[None][1]):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=3e-3)
    row = G.generate_error(tiny_gemma, [prompt], [(ref_tokens, ref_lps)], CacheSpec("int8"),
                           n_new, start=start, ubatch=4)  # fmt: skip
    assert row["gen_tokens_scored"] == n_new and row["gen_kl_mean"] >= 0


def test_suite_checks_of_the_task_axes():
    with pytest.raises(SuiteError, match="task: only phase retrieval uses it"):
        check_model("s.yaml", case(phase="quality", task="niah"))
    with pytest.raises(SuiteError, match="task: phase retrieval needs a task"):
        check_model("s.yaml", case(phase="retrieval"))
    with pytest.raises(SuiteError, match="gen_tokens: only phases generate, serve use it"):
        check_model("s.yaml", case(phase="retrieval", task="niah", gen_tokens=8))
    # at 200 tokens smollm2-135m's vartrack prompt leaves no room for a haystack (checked now)
    check_model("s.yaml", case(phase="retrieval", task="vartrack", depth=1.0, context_len=512))
    check_model("s.yaml", case(phase="generate", quantized_kv_start=64))


def test_a_window_as_long_as_the_context_is_the_full_cache(tiny, monkeypatch):
    """window + sinks covering every position: the same int4 quality row as no window (to
    float32 summation order); a short window attends over less and errs more."""
    from kvbench.engines.model import quality_state

    monkeypatch.setattr(common, "tokens_of", lambda name, text: TOKENS)
    base.reference_of.cache_clear()
    kw = dict(phase="quality", context_len=64, kv_dtype="int4")
    full = carrying(quality_state)(case(**kw)).check()
    same = carrying(quality_state)(case(window=60, sink_tokens=4, **kw)).check()
    short = carrying(quality_state)(case(window=8, sink_tokens=2, **kw)).check()
    assert same["kl_mean"] == pytest.approx(full["kl_mean"], rel=1e-3)  # summation order only
    assert same["top1_agree"] == full["top1_agree"]
    assert short["kl_mean"] > 1.5 * full["kl_mean"]
    base.reference_of.cache_clear()


def test_window_bytes_by_hand(tiny):
    """window 8 + 2 sinks at context 64, fp16: 10 positions x 2 layers x 2 KV heads x 64
    x 2 (K, V) x 2 bytes = 10240; bits per context element 16 x 10 / 64 = 2.5."""
    c = case(phase="quality", context_len=64, kv_dtype="fp16", window=8, sink_tokens=2)
    assert common.model_kv_bytes(c, spec_of(c)) == 10 * 2 * 2 * 64 * 2 * 2
    assert common.model_bits_per_elem(c, spec_of(c)) == pytest.approx(16 * 10 / 64)


def test_retrieval_runs_in_a_window(tiny):
    c = case(phase="retrieval", task="passkey", trials=1, window=32, sink_tokens=4)
    row = carrying(engine.build)(c).check()
    assert row["n_trials"] == 1 and row["prompt_tokens"] <= 200


def test_window_checks():
    with pytest.raises(SuiteError, match="window: a sliding window holds one plain format"):
        check_model("s.yaml", case(phase="quality", kv_dtype="int8", v_dtype="int4", window=16))
    with pytest.raises(SuiteError, match="window: model_decode times the full cache"):
        check_model("s.yaml", case(phase="model_decode", window=16))
    check_model("s.yaml", case(phase="quality", kv_dtype="int4", window=16, sink_tokens=4))


def test_fp8_retrieval_rows_count_saturated_elements(tiny):
    """kv_saturated over every trial's cache: a scale of 1e-4 saturates, 1.0 does not."""
    rows = [
        carrying(engine.build)(
            case(phase="retrieval", task="passkey", trials=2, kv_dtype="fp8_e4m3", fp8_scale=s)
        ).check()  # fmt: skip
        for s in (1e-4, "one")
    ]
    assert rows[0]["kv_saturated"] > 0 == rows[1]["kv_saturated"]
    assert (
        "kv_saturated"
        not in carrying(engine.build)(case(phase="retrieval", task="passkey")).check()
    )


@pytest.mark.parametrize("start", [0, 40])
def test_fp8_generate_rows_count_saturated_elements(tiny, start):
    """kv_saturated over every prompt's free run, through the fp16-first cache too."""
    rows = [
        carrying(engine.build)(
            case(
                phase="generate",
                context_len=48,
                gen_tokens=4,
                kv_dtype="fp8_e5m2",
                fp8_scale=s,
                quantized_kv_start=start,
            )
        ).check()  # fmt: skip
        for s in (1e-6, "one")
    ]
    assert rows[0]["kv_saturated"] > 0 == rows[1]["kv_saturated"]


@pytest.mark.parametrize("policy", ["snapkv", "window"])
def test_retrieval_under_a_policy_compresses_the_haystack_not_the_question(tiny, policy):
    """kvpress's setup: the instruction and haystack (the prompt's haystack span) compressed
    to half, the question after it never; the row's bytes are that context's kept cells."""
    c = case(phase="retrieval", task="passkey", trials=1, policy=policy, compression_ratio=0.5,
             obs_window=8)  # fmt: skip
    c = replace(c, obs_window=64) if policy == "window" else c
    state = carrying(engine.build)(c)
    row = state.check()
    p = common.prompts_of(c.model, "passkey", 200, c.depth, 1, c.seed)[0]
    n = p.haystack[1]
    assert 0 < n < len(p.tokens) and row["context_tokens"] == n
    assert row["kept_cells"] == 2 * 2 * int(n * 0.5)  # 2 layers x 2 KV heads
    assert row["kept_bytes"] == state.kv_bytes and row["n_trials"] == 1


def test_generate_under_a_policy_compresses_the_chunk_before_generation(tiny):
    """The chunk but its last token compressed to half; greedy generation follows; the row's
    bytes are the kept context's (kept_bytes = kv_bytes, the plan)."""
    c = case(phase="generate", context_len=32, gen_tokens=4, policy="knorm",
             compression_ratio=0.5)  # fmt: skip
    state = carrying(engine.build)(c)
    row = state.check()
    assert row["context_tokens"] == 31 and row["kept_cells"] == 2 * 2 * 15
    assert row["kept_bytes"] == state.kv_bytes and row["gen_tokens_scored"] == 4
    assert 0 <= row["gen_agree"] <= 1 and row["policy_s"] > 0
