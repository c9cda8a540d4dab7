"""Quality metrics, text, K/V capture and decode on the tiny model (fast), and on the real
SmolLM2-135M when it has been fetched (`kvbench model fetch`; skipped otherwise)."""

import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from tiny_model import TINY, weights, write_gguf

from kvbench.kernels.data import load_kv_file
from kvbench.kernels.formats.registry import FORMATS
from kvbench.kernels.model import load as L
from kvbench.kernels.model import quality as Q
from kvbench.kernels.model import run as R
from kvbench.kernels.model import text as T
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.capture import capture_kv, read_mlx_prompt_cache, save_kv_npz
from kvbench.kernels.model.fetch import model_path
from kvbench.kernels.model.load import load_model
from kvbench.kernels.model.spec import CacheSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # model_table.py

RNG = np.random.default_rng(0)
TOKS = RNG.integers(0, TINY["vocab"], 64).tolist()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(write_gguf(tmp_path_factory.mktemp("m") / "t.gguf", weights(seed=7)))


def test_chunks_and_scored_positions():
    ch = Q.chunks(list(range(100)), 16)
    assert len(ch) == 6 and ch[1][0] == 16
    assert Q.targets_of(ch[0]) == list(range(9, 16))  # logits 8..14 predict tokens 9..15
    with pytest.raises(ValueError, match="fewer than"):
        Q.chunks(list(range(10)), 16)


def test_bos_overwrites_each_chunks_first_token():
    # as llama-perplexity: tokens[start] = BOS, the rest of the chunk unchanged (not shifted)
    ch = Q.chunks([-1, *range(1, 40)], 16, 2, bos_id=-1)
    assert ch == [[-1, *range(1, 16)], [-1, *range(17, 32)]]
    assert Q.targets_of(ch[1]) == list(range(25, 32))  # the overwritten token is never a target


def test_reference_against_itself_is_exact(tiny):
    ch = Q.chunks(TOKS, 32)
    ref = Q.reference_run(tiny, ch)
    assert ref[0].shape == (15, TINY["vocab"])
    r = Q.quality(tiny, ch, CacheSpec("fp32"), ref)
    assert r["kl_mean"] == pytest.approx(0, abs=1e-6) and r["top1_agree"] == 1.0
    assert r["delta_ppl"] == pytest.approx(0, abs=1e-4) and r["n_scored"] == 30


def test_ppl_is_exp_mean_nll(tiny):
    """ppl from an independent numpy log-softmax of the reference logits."""
    ch = Q.chunks(TOKS, 32, 1)
    cache = make_cache(CacheSpec("fp32"), tiny.config, 32)
    logits = np.array(R.forward(tiny, mx.array([ch[0]]), cache)[0], dtype=np.float64)
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = [-lp[j, ch[0][j + 1]] for j in range(16, 31)]
    r = Q.quality(tiny, ch, CacheSpec("fp16"), Q.reference_run(tiny, ch))
    assert r["ppl_ref"] == pytest.approx(np.exp(np.mean(nll)), rel=1e-4)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_quality_is_finite(tiny, name):
    ch = Q.chunks(TOKS, 32, 1)
    r = Q.quality(tiny, ch, CacheSpec(name), Q.reference_run(tiny, ch))
    assert all(np.isfinite(v) for v in r.values())
    assert r["kl_mean"] >= 0 and 0 <= r["top1_agree"] <= 1


def test_options_quality_is_finite_and_ubatch_runs(tiny):
    ch = Q.chunks(TOKS, 32, 1)
    ref = Q.reference_run(tiny, ch)
    spec = CacheSpec("int4", "int8", k_axis="channel", sink_tokens=2, recent_tokens=8)
    r = Q.quality(tiny, ch, spec, ref, ubatch=8)
    assert np.isfinite(r["ppl"]) and r["kl_mean"] > 0


def test_capture_post_rope_is_rope_of_pre_rope(tiny, tmp_path):
    post, pre = capture_kv(tiny, TOKS[:20]), capture_kv(tiny, TOKS[:20], post_rope=False)
    assert len(post) == TINY["n_layers"] and post[0][0].shape == (2, 20, 64)
    rope = tiny.net.model.layers[1].self_attn.rope  # the model's own RoPE
    roped = np.array(rope(mx.array(pre[1][0])[None], offset=0)[0])
    np.testing.assert_allclose(post[1][0], roped, atol=1e-5)
    np.testing.assert_array_equal(post[1][1], pre[1][1])  # values are never rotated
    path = tmp_path / "kv.npz"
    layer = save_kv_npz(path, post)
    k, v = load_kv_file(str(path), (1, 2, 16, 64))  # what kv_data: file reads
    np.testing.assert_array_equal(k[0], post[layer][0][:, :16])
    assert v.shape == (1, 2, 16, 64)


def save_like_mlx_lm(path, layers, quantized=None):
    """The layout mlx-lm's save_prompt_cache writes (see model_kv.read_mlx_prompt_cache)."""
    arrays, md = {}, {}
    for i, (k, v) in enumerate(layers):
        for part, x in ((0, k), (1, v)):
            if quantized:
                for j, a in enumerate(mx.quantize(mx.array(x), group_size=64, bits=quantized)):
                    arrays[f"{i}.{part}.{j}"] = a
            else:
                arrays[f"{i}.{part}"] = mx.array(x).astype(mx.float16)
        md[f"0.{i}.0"], md[f"0.{i}.1"], md[f"0.{i}.2"] = str(k.shape[2]), "64", str(quantized)
        md[f"2.{i}"] = "QuantizedKVCache" if quantized else "KVCache"
    mx.save_safetensors(str(path), arrays, md)


@pytest.mark.parametrize("bits", [None, 8])
def test_read_mlx_prompt_cache(tmp_path, bits):
    layers = [(RNG.standard_normal((1, 2, 5, 64)), RNG.standard_normal((1, 2, 5, 64)))] * 3
    save_like_mlx_lm(tmp_path / "c.safetensors", layers, bits)
    got = read_mlx_prompt_cache(tmp_path / "c.safetensors")
    assert len(got) == 3 and got[2][1].shape == (1, 2, 5, 64)
    tol = 2e-3 if bits is None else 0.05  # fp16 storage; 8-bit affine groups of 64
    np.testing.assert_allclose(got[0][0], layers[0][0], atol=tol * 4, rtol=tol)
    with pytest.raises(ValueError, match="nothing.safetensors"):
        read_mlx_prompt_cache(tmp_path / "nothing.safetensors")


def test_default_text_is_deterministic_prose():
    a, b = T.default_text(), T.default_text()
    assert a == b and len(a) > 100_000
    assert "statement" in a and "::=" not in a  # grammar blocks dropped
    assert T.text_info(a)["text_sha256"] == T.text_info(b)["text_sha256"]


def test_text_file(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("Hello there.\n", encoding="utf-8")
    assert T.text_file(p) == "Hello there.\n"
    with pytest.raises(ValueError, match="missing.txt"):
        T.text_file(tmp_path / "missing.txt")
    (tmp_path / "e.txt").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        T.text_file(tmp_path / "e.txt")


# ---- the real model (fetched) ------------------------------------------------------------------

REAL = model_path()
needs_model = pytest.mark.skipif(REAL is None, reason="SmolLM2 not fetched: kvbench model fetch")


@pytest.fixture(scope="module")
def smol():
    from kvbench.kernels.model.tokenizer import load_tokenizer

    model = load_model(REAL)
    return model, load_tokenizer(model)


@needs_model
def test_real_model_greedy_text_is_coherent(smol):
    model, tok = smol
    prompt = tok.encode("The capital of France is")
    cache = make_cache(CacheSpec("fp32"), model.config, len(prompt) + 4)
    assert "Paris" in tok.decode(R.greedy(model, cache, prompt, 3))


@needs_model
def test_real_model_fp16_ppl_within_1pct_and_rope_matters(smol, monkeypatch):
    model, tok = smol
    ch = Q.chunks(tok.encode(T.default_text()), 32, 1)  # 15 scored tokens: keeps it quick
    ref = Q.reference_run(model, ch)
    r = Q.quality(model, ch, CacheSpec("fp16"), ref)
    assert abs(r["ppl"] / r["ppl_ref"] - 1) < 0.01
    assert 2 < r["ppl_ref"] < 100  # a sane perplexity for English prose
    # Q/K rows left in llama.cpp's permuted order under half-split RoPE: much worse
    monkeypatch.setattr(L, "PERMUTED_ARCHS", ())
    bad = load_model(REAL)
    wrong = Q.quality(bad, ch, CacheSpec("fp32"), ref)
    assert wrong["ppl"] > 2 * r["ppl_ref"]


def test_decode_cases_match_the_reference_kernel_on_the_same_cache(tiny):
    """Each (spec, kernel) the decode table times gives the decode step that the float32
    reference kernel gives over the same stored format (kernels compute in fp16)."""
    from model_table import DECODE_CASES

    def step(spec, kernel):
        cache = make_cache(spec, tiny.config, 40, kernel)
        R.prefill(tiny, cache, TOKS[:32], ubatch=16)
        return np.array(R.decode_step(tiny, cache, TOKS[32]))

    for spec, kernel in DECODE_CASES:
        ref = step(spec, "reference")
        err = np.abs(step(spec, kernel) - ref).max() / np.abs(ref).max()
        assert err < 0.02, (spec.label, kernel, err)


def test_decode_ms_row_through_the_harness_timer(tiny):
    from model_table import decode_ms

    row = decode_ms(tiny, CacheSpec("int8"), "tiled", TOKS[:16], steps=3)
    assert set(row) == {"decode_ms", "decode_ms_min", "tokens_per_s", "peak_mb"}
    assert 0 < row["decode_ms_min"] <= row["decode_ms"] and row["peak_mb"] > 0
    assert row["tokens_per_s"] == 1e3 / row["decode_ms"]


def test_attention_error_rows(tiny):
    from model_table import ERROR_FORMATS, error_rows

    rows = {(r["format"], r["kv_data"]): r for r in error_rows(tiny, TOKS, 32)}
    assert len(rows) == 3 * len(ERROR_FORMATS)
    assert rows[("fp16", "smollm2")]["rel_err"] < 1e-3
    # planted outlier channels hurt per-row int4 keys: larger reconstruction error
    assert rows[("int4", "outliers")]["kv_recon_err"] > rows[("int4", "gaussian")]["kv_recon_err"]


def test_position_buckets_by_hand():
    """Two chunks of 6 scored tokens, 4 buckets: index i of 6 goes to bucket i * 4 // 6,
    i.e. [0, 0, 1, 2, 2, 3] (sizes 2, 1, 2, 1 per chunk)."""
    a = {"kl": np.array([1.0, 2, 3, 4, 5, 6]), "agree": np.array([1, 1, 0, 1, 0, 0], bool)}
    b = {"kl": np.array([0.0, 0, 9, 2, 0, 4]), "agree": np.array([1, 0, 1, 1, 1, 1], bool)}
    got = Q.position_buckets([a, b])
    assert [got[f"n_pos{i}"] for i in range(1, 5)] == [4, 2, 4, 2]
    assert got["kl_pos1"] == pytest.approx((1 + 2 + 0 + 0) / 4)
    assert got["kl_pos2"] == pytest.approx((3 + 9) / 2)
    assert got["kl_pos3"] == pytest.approx((4 + 5 + 2 + 0) / 4)
    assert got["kl_pos4"] == pytest.approx((6 + 4) / 2)
    assert got["top1_pos1"] == pytest.approx(3 / 4) and got["top1_pos2"] == pytest.approx(1 / 2)
    assert got["top1_pos3"] == pytest.approx(3 / 4) and got["top1_pos4"] == pytest.approx(1 / 2)


def test_quality_rows_carry_buckets_that_pool_to_the_mean(tiny):
    ch = Q.chunks(TOKS, 32)
    r = Q.quality(tiny, ch, CacheSpec("int4"), Q.reference_run(tiny, ch))
    n = [r[f"n_pos{i}"] for i in range(1, 5)]
    assert n == [8, 8, 8, 6] and sum(n) == r["n_scored"]  # 15 per chunk: 4, 4, 4, 3
    pooled = sum(r[f"kl_pos{i}"] * n[i - 1] for i in range(1, 5)) / sum(n)
    assert pooled == pytest.approx(r["kl_mean"], rel=1e-5)


# ---- micro-batched chunks (#33): llama-perplexity's n_ubatch, on global and window layers ----


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    """gemma3_text, layers 0-2 a sliding window of 8 positions, layer 3 global."""
    from tiny_model import write_random_mlx_dir

    model = load_model(write_random_mlx_dir(tmp_path_factory.mktemp("g") / "g", "gemma3_text",
                                            n_layers=4))  # fmt: skip
    assert model.config.windows == ((8, 0), (8, 0), (8, 0), None)
    return model


def _caches(monkeypatch) -> list:
    """Every cache quality.py makes from now on (to read their rings)."""
    made = []

    def spy(*a, **kw):
        made.append(Q.__dict__["_make_cache"](*a, **kw))
        return made[-1]

    monkeypatch.setitem(Q.__dict__, "_make_cache", Q.make_cache)
    monkeypatch.setattr(Q, "make_cache", spy)
    return made


@pytest.mark.parametrize("ubatch", [4, 5, 20])
def test_ubatched_chunk_equals_one_forward(tiny_gemma, monkeypatch, ubatch):
    """A 40-token chunk fed in micro-batches gives the log-probabilities of one forward over
    it, to float32 rounding (a float32 cache: the K/V of a 4-token matmul differ from a
    40-token one's in the last bits only), through the window layers (8 positions: each
    micro-batch here crosses the window) and the global one; 5 and 20 do not divide the chunk,
    5 cuts a micro-batch at the scored half's start (20). Each window layer's ring holds
    8 + ubatch - 1 cells."""
    chunk = np.random.default_rng(1).integers(0, TINY["vocab"], 40).tolist()
    made = _caches(monkeypatch)
    whole = Q.chunk_logprobs(tiny_gemma, chunk, CacheSpec("fp32"))
    parts = list(Q.piece_logprobs(tiny_gemma, chunk, CacheSpec("fp32"), ubatch=ubatch))
    assert sum(p.shape[0] for p in parts) == whole.shape[0] == 19  # positions 20..38
    np.testing.assert_allclose(np.array(mx.concatenate(parts)), np.array(whole), atol=2e-5)
    assert [s.ring.size for s in made[0].stores[:3]] == [8 + 40 - 1] * 3  # one forward
    assert [s.ring.size for s in made[1].stores[:3]] == [8 + ubatch - 1] * 3
    assert made[1].stores[3].kv.capacity == 40  # the global layer holds the whole chunk


def test_ubatched_quality_equals_one_forward(tiny_gemma):
    """Quantized caches: a last-bit difference of a float32 K can move a q8_0 / q4_0 code by
    one step, so the logits are not equal to float32 rounding, but the row's figures are (to
    1e-3 relative, or 1e-6 nats where the KL itself is ~4e-5)."""
    ch = Q.chunks(np.random.default_rng(0).integers(0, TINY["vocab"], 80).tolist(), 40, 2)
    ref, ref_ub = Q.reference_run(tiny_gemma, ch), Q.reference_run(tiny_gemma, ch, ubatch=6)
    assert ref_ub[0].shape == ref[0].shape == (19, TINY["vocab"])
    for name in ("q8_0", "q4_0"):
        whole = Q.quality(tiny_gemma, ch, CacheSpec(name), ref)
        ub = Q.quality(tiny_gemma, ch, CacheSpec(name), ref_ub, ubatch=6)
        assert ub["n_scored"] == whole["n_scored"] == 2 * 19 and ub["n_pos4"] == whole["n_pos4"]
        assert ub["ppl"] == pytest.approx(whole["ppl"], rel=1e-5)
        assert ub["ppl_ref"] == pytest.approx(whole["ppl_ref"], rel=1e-5)
        for key in ("kl_mean", "kl_pos1", "kl_pos4", "top1_agree"):
            assert ub[key] == pytest.approx(whole[key], rel=1e-3, abs=1e-6), (name, key)
        assert whole["kl_mean"] > 1e-5  # the format differs from the reference: teeth
    # the reference kept in pieces (the engine's: no copy of a chunk's rows) gives the same row,
    # the pieces cut at other places than the row's (4 against 6) so rows_of joins across them
    pieces = Q.reference_pieces(tiny_gemma, ch, ubatch=4)
    assert [p.shape[0] for p in pieces[0]] == [4, 4, 4, 4, 3]
    got = Q.quality(tiny_gemma, ch, CacheSpec("q4_0"), pieces, ubatch=6)
    assert got["kl_mean"] == pytest.approx(ub["kl_mean"], rel=1e-3, abs=1e-6)
    assert got["ppl_ref"] == pytest.approx(ub["ppl_ref"], rel=1e-5)
    joined = [mx.concatenate(p) for p in pieces]
    assert Q.quality(tiny_gemma, ch, CacheSpec("q4_0"), joined, ubatch=6) == got


def spec_only(c):
    """The resolved case as the model engine reads it (its cache spec), for a model with no
    file to plan from (of_case reads the model's metadata for its planned bytes)."""
    from types import SimpleNamespace

    from kvbench.suite.cache_spec import spec_of

    return SimpleNamespace(spec=spec_of(c))


def test_the_engine_feeds_quality_in_ubatches_of_512(tiny_gemma, monkeypatch):
    """The engine's quality rows: chunks of 1024 in micro-batches of 512 (llama-perplexity's
    n_ubatch), so a window layer's ring is window + sinks + 511 cells; the row says so."""
    from kvbench.case import Case
    from kvbench.engines import common
    from kvbench.engines import model as engine

    tokens = tuple(np.random.default_rng(2).integers(0, TINY["vocab"], 1024).tolist())
    monkeypatch.setattr(common, "model_of", lambda name: (tiny_gemma, None))
    monkeypatch.setattr(common, "tokens_of", lambda name, text: tokens)
    monkeypatch.setattr(common, "chunk_bos", lambda name: None)
    engine.reference_of.cache_clear()
    made = _caches(monkeypatch)
    try:
        c = Case("g", 4, 4, 2, 64, 1024, phase="quality", kv_dtype="fp16", kernel="reference")
        row = engine.build(c, spec_only(c)).check()
        w = Case("g", 4, 4, 2, 64, 1024, phase="quality", kv_dtype="fp16", kernel="reference",
                 window=16, sink_tokens=4)  # fmt: skip
        wrow = engine.build(w, spec_only(w)).check()
    finally:
        engine.reference_of.cache_clear()
    assert row["ubatch"] == wrow["ubatch"] == 512 and row["n_scored"] == 511
    ref, fp16, windowed = made  # the float32 reference once, then each row's cache
    for cache in (ref, fp16):
        assert [s.ring.size for s in cache.stores[:3]] == [8 + 0 + 511] * 3
    assert [s.ring.size for s in windowed.stores] == [16 + 4 + 511] * 4  # every layer a window
    assert row["prefill_tokens"] == 1024 and row["prefill_tokens_per_s"] > 0 and row["wall_s"] > 0


def test_per_token_values_are_the_rows_tokens(tiny):
    # each scored token's nll and kl, at its chunk position and with its true next token; their
    # means are the row's figures
    ch = Q.chunks(TOKS, 32)
    r = Q.quality(tiny, ch, CacheSpec("int4"), Q.reference_run(tiny, ch), keep_tokens=True)
    t = r["per_token"]
    assert t["chunk"].tolist() == [0] * 15 + [1] * 15
    assert t["position"].tolist() == list(range(16, 31)) * 2  # logits 16..30 of each chunk
    assert t["token"].tolist() == Q.targets_of(ch[0]) + Q.targets_of(ch[1])
    assert np.exp(t["nll"].mean()) == pytest.approx(r["ppl"], rel=1e-6)
    assert t["kl"].mean() == pytest.approx(r["kl_mean"], rel=1e-6)


def test_delta_ppl_err_is_the_paired_delta_method_error():
    """delta_ppl_err by hand: Δppl = exp(mean a) - exp(mean b) over the same tokens; its
    gradient (ppl, -ppl_ref) gives the per-token series ppl*a - ppl_ref*b, whose standard error
    (n - 1 in the variance) is the paired error; far under ppl_err when the tokens agree."""
    rng = np.random.default_rng(0)
    ref = rng.gamma(2.0, 1.3, 500)
    nll = ref + rng.normal(0.0, 0.01, 500)  # a cache close to the reference
    stats = [{"kl": np.abs(nll - ref), "nll": nll, "agree": np.ones(500)}]
    got = Q.summarize(stats, ref)
    ppl, ppl_ref = np.exp(nll.mean()), np.exp(ref.mean())
    series = ppl * nll - ppl_ref * ref
    assert got["delta_ppl_err"] == pytest.approx(series.std(ddof=1) / np.sqrt(500), rel=1e-9)
    assert got["ppl_ref_err"] == pytest.approx(ppl_ref * ref.std(ddof=1) / np.sqrt(500), rel=1e-9)
    assert got["delta_ppl_err"] < got["ppl_err"] / 20
