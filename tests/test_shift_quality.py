"""phase quality under kv_edit shift (kernels/model/shift_quality.py, harness/engines/model.py):
a chunk longer than the context read through passkey.cpp's schedule on the tiny model, its
schedule counted by hand, the float32 cache against its own shifted reference and against the
chunk read whole, and the suite's one-line refusals (harness/suite/model_edit.py)."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from tiny_model import TINY, weights, write_gguf

from kvbench.case import Case
from kvbench.engines import common
from kvbench.engines import model as engine
from kvbench.engines.contract import TOKENS, carrying
from kvbench.errors import SuiteError
from kvbench.kernels.model import quality, shift_quality
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.load import load_model
from kvbench.kernels.model.run import forward
from kvbench.kernels.model.shift import Schedule
from kvbench.suite import model_edit

TEXT = tuple(np.random.default_rng(5).integers(0, TINY["vocab"], 700).tolist())
# context_limit 16, n_keep 4: 256 cells, n_ctx 252 = 6 batches of 42; chunks of 300 tokens
SHIFT = dict(phase="quality", kv_edit="shift", context_limit=16, n_keep=4, ga_w=42,
             context_len=300, chunks=2)  # fmt: skip


@pytest.fixture()
def tiny(tmp_path, monkeypatch):
    model = load_model(write_gguf(tmp_path / "t.gguf", weights(seed=3)))
    monkeypatch.setattr(common, "model_of", lambda name: (model, None))
    monkeypatch.setattr(common, "tokens_of", lambda name, text: TEXT)
    engine.shift_reference_of.cache_clear()
    yield model
    engine.shift_reference_of.cache_clear()


def case(**kw) -> Case:
    base = dict(model="smollm2-135m", n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=64)
    return Case(**{**base, "kernel": "reference", **SHIFT, **kw})


def test_the_schedule_by_hand(tiny):
    # 300 tokens: batches at 0, 42, .., 210 fill n_ctx 252; a shift before 252 (42 tokens) and
    # before 294 (6): 2 a chunk. Each drops positions 4..45 and moves 46..251 back by 42 (206
    # keys re-rotated, x 2 layers); n_past 210 + 6 = 216. Scored: positions 252..298 (47).
    assert Schedule(16, 4, 42).n_ctx == 252
    assert list(shift_quality.scored_positions(Schedule(16, 4, 42), 300)) == list(range(252, 299))
    row = carrying(engine.build)(case(kv_dtype="fp32")).check()
    assert row["kv_shifts"] == 2 * 2 and row["n_past"] == 216 and row["cells_alloc"] == 256
    assert row["edit_units"] == 2 * (2 * 206 * TINY["n_layers"])
    assert row["n_scored"] == 2 * 47 and row["ubatch"] == 42
    assert row["prefill_tokens"] == 2 * 300 and row["decode_tokens"] == 0
    per = row[TOKENS]
    assert per["position"].tolist() == 2 * list(range(252, 299))
    assert per["token"].tolist() == list(TEXT[253:300]) + list(TEXT[553:600])


def test_a_float32_cache_is_its_own_shifted_reference_and_not_the_unshifted_one(tiny):
    row = carrying(engine.build)(case(kv_dtype="fp32")).check()
    assert row["kl_mean"] == 0 and row["delta_ppl"] == 0 and row["top1_agree"] == 1
    # the shift discarded what the unshifted context still holds
    assert row["shift_kl"] > 1e-4 and row["shift_delta_ppl"] != 0
    assert row["shift_delta_ppl"] == pytest.approx(row["ppl_ref"] - row["ppl_noshift"])
    int4 = carrying(engine.build)(case(kv_dtype="int4")).check()
    assert int4["kl_mean"] > 1e-4 and int4["ppl_ref"] == row["ppl_ref"]  # the same reference
    assert int4["shift_kl"] == row["shift_kl"]


def test_the_unshifted_reference_is_the_chunk_read_whole(tiny):
    """Against one forward pass over the chunk in a cache that holds it (an independent read:
    no batches, no schedule)."""
    sch, chunk = Schedule(16, 4, 42), list(TEXT[:300])
    got = shift_quality.reference_pieces(tiny, [chunk], sch, 64, shifted=False)[0]
    cache = make_cache(quality.REFERENCE_SPEC, tiny.config, 300, "reference")
    logits = forward(tiny, mx.array([chunk]), cache)[0, 252:299]
    want = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    np.testing.assert_allclose(np.array(mx.concatenate(got)), np.array(want), atol=1e-4)


SHAPE = SimpleNamespace(trained_context=256, windows=(None, None))


def refused(size=None, **kw) -> str:
    c = case(**kw)
    with pytest.raises(SuiteError) as e:
        model_edit.check("s.yaml", c, SHAPE, [size or c.context_len], model_edit.QUALITY_KEEP)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_refusals_name_the_key():
    model_edit.check("s.yaml", case(), SHAPE, [300], model_edit.QUALITY_KEEP)  # passes
    # n_ctx 252: a chunk of 253 shifts before its last token, which has no target
    assert "a chunk needs 254" in refused(context_len=253)
    assert "context_len" in refused(context_len=200)
    # empty n_keep: passkey.cpp's 32; 256 cells, n_ctx 224, not a multiple of 42
    assert "overrun" in refused(n_keep=None)
    assert "self-extend under quality is not built" in refused(kv_edit="self-extend", ga_n=2)
    assert "llama-perplexity" in refused(kernel="llama.cpp")
    assert "policy" in refused(policy="window", compression_ratio=0.5)
    assert "plain cache" in refused(kv_dtype="int8", v_dtype="int4")
    assert "phase retrieval or quality" in refused(phase="generate")
    assert "ga_n: self-extend's; a context shift does not read it" in refused(ga_n=4)
    assert "div_sign: self-extend's" in refused(div_sign="llama.cpp")
    # retrieval: 216 prompt tokens + 16 answer positions fit n_ctx 252 (cells 256 - n_keep 4)
    rc = dict(phase="retrieval", task="passkey-llamacpp", chunks=1, context_len=216)
    assert "no shift happens" in refused(**rc)


def test_sliding_window_layers_take_a_shift_and_self_extend_only_with_every_cell():
    windowed = SimpleNamespace(trained_context=256, windows=((8, 0), None))
    rc = dict(phase="retrieval", task="passkey-llamacpp", chunks=1, context_len=300)
    for kw in ({}, rc):  # quality and retrieval shifts pass
        model_edit.check("s.yaml", case(**kw), windowed, [300], model_edit.QUALITY_KEEP)
    with pytest.raises(SuiteError, match="swa_cache: .*set swa_cache: full"):
        model_edit.check("s.yaml", case(**rc, kv_edit="self-extend", ga_n=2), windowed, [300],
                         model_edit.QUALITY_KEEP)  # fmt: skip


def test_quality_keeps_passkey_cpps_n_keep_by_default(tiny):
    c = case(n_keep=None, ga_w=56)  # 256 cells - 32 = 224 = 4 x 56
    state = carrying(engine.build)(c)
    assert state.effective["n_keep"] == 32
    assert model_edit.edit_of(c)[-1] == "quality"


def test_the_engine_checks_a_model_fetched_after_the_suite(tiny):
    """A registered model fetched after its suite was checked (context=False there) is
    checked when its engine builds: a chunk too short to score after a shift is one clear
    error, not an IndexError inside the scoring."""
    if not model_edit.fetched("smollm2-135m"):
        pytest.skip("SmolLM2 not fetched: its shape is what the engine checks")
    with pytest.raises(ValueError, match="context_len: chunks of 200 tokens"):
        carrying(engine.build)(case(context_len=200))
