"""The evicting model cache (kernels/model/evicting.py): attention over each KV head's kept
cells against numpy, a policy that keeps everything equal to the plain cache on the tiny model,
the kept positions after a compress, exact kept bytes by hand, mark / rewind."""

import mlx.core as mx
import numpy as np
import pandas as pd
import pytest
from tiny_model import TINY, weights, write_gguf

from kvbench.kernels.model import policies as P
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.compress import kept_positions
from kvbench.kernels.model.evicting import EvictingCache, make_policy_cache
from kvbench.kernels.model.load import Shape, load_model
from kvbench.kernels.model.run import forward, prefill
from kvbench.kernels.model.spec import CacheSpec

SHAPE = Shape("llama", n_layers=1, n_heads=4, n_kv_heads=2, head_dim=32, vocab=64,
              trained_context=None)  # fmt: skip
TOKS = np.random.default_rng(0).integers(0, TINY["vocab"], 24).tolist()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(write_gguf(tmp_path_factory.mktemp("m") / "t.gguf", weights(seed=7)))


def test_attention_over_each_heads_kept_cells():
    """Heads keeping different cells (padded, masked) attend as numpy over their own cells."""
    rng = np.random.default_rng(1)
    cache = EvictingCache(
        CacheSpec("fp32"), SHAPE, 16, "reference", P.make("knorm", P.Budget(kv_budget=4))
    )
    k = rng.standard_normal((1, 2, 10, 32)).astype(np.float32)
    v = rng.standard_normal((1, 2, 10, 32)).astype(np.float32)
    cache.write(0, mx.array(k), mx.array(v))
    cache.advance(10)
    keep = np.zeros((2, 10), bool)
    keep[0, [0, 3, 7]], keep[1, [1, 2, 5, 8, 9]] = True, True
    cache.keep(0, keep)
    assert cache.kept_cells() == [[3, 5]]
    q = rng.standard_normal((1, 4, 1, 32)).astype(np.float32)
    kn = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    out = np.array(cache.attend(0, mx.array(q), mx.array(kn), mx.array(kn), 0.2))
    for hq in range(4):
        h = hq // 2
        ks = np.concatenate([k[0, h, keep[h]], kn[0, h]])
        vs = np.concatenate([v[0, h, keep[h]], kn[0, h]])
        s = ks @ q[0, hq, 0] * 0.2
        p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        np.testing.assert_allclose(out[0, hq, 0], p @ vs, rtol=1e-5, atol=1e-6)
    assert cache.kept_positions()[0][0].tolist() == [-1, -1, 0, 3, 7, 10]  # padding first


@pytest.mark.parametrize("spec", [CacheSpec("fp32"), CacheSpec("fp8_e4m3", fp8_scale=0.01),
                                  CacheSpec("fp8_e4m3", fp8_scale="calibrated")])  # fmt: skip
def test_keeping_everything_is_the_plain_cache(tiny, spec):
    """FP8 with a tensor scale too: the cells are read at scale 1 and scaled back per layer
    and KV head (before the fix the dense K/V ignored the scale: logits off by 5.0). The dense
    read scales the K/V, the plain one folds the scale into q and the output: a last-bit
    difference in layer 0's output can move a later layer's e4m3 code by a sixteenth of its
    value, so the calibrated scale's logits agree to 2e-2 (measured 6.5e-3 on an AMD EPYC,
    under 1e-4 on an Intel Xeon), far inside the bug's 5.0."""
    pol = P.make("knorm", P.Budget(compression_ratio=0.0))
    cache = make_policy_cache(spec, tiny, len(TOKS), "reference", pol)
    prefill(tiny, cache, TOKS[:16], 8)
    cache.compress()
    got = forward(tiny, mx.array([TOKS[16:]]), cache)
    plain = make_cache(spec, tiny.config, len(TOKS), "reference")
    prefill(tiny, plain, TOKS[:16], 8)
    want = forward(tiny, mx.array([TOKS[16:]]), plain)
    tol = 2e-2 if spec.fp8_scale == "calibrated" else 1e-4
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=tol, atol=tol)


def test_window_keeps_sinks_and_recent_and_keeps_evicting(tiny):
    pol = P.make("window", P.Budget(kv_budget=8), sinks=2)
    pos = kept_positions(tiny, TOKS[:16], pol, ubatch=5)
    assert len(pos) == TINY["n_layers"]
    for layer in pos:
        assert layer.tolist() == [[0, 1, 10, 11, 12, 13, 14, 15]] * TINY["n_kv_heads"]
    cache = make_policy_cache(CacheSpec("fp32"), tiny, len(TOKS), "reference", pol)
    prefill(tiny, cache, TOKS[:16], 8)
    cache.compress()
    forward(tiny, mx.array([[TOKS[16]]]), cache)  # a decode step: the oldest non-sink goes
    assert cache.kept_positions()[0][0].tolist() == [0, 1, 11, 12, 13, 14, 15, 16]


def test_kept_bytes_by_hand(tiny):
    pol = P.make("snapkv", P.Budget(compression_ratio=0.5), window=4)
    cache = make_policy_cache(CacheSpec("q8_0"), tiny, 16, "reference", pol)
    prefill(tiny, cache, TOKS[:16], 16)
    cache.compress()
    # 8 cells x 2 heads x 2 layers, K and V; q8_0 at head_dim 64: 2 blocks of 34 bytes a row
    assert cache.kept_bytes() == 8 * 2 * 2 * 2 * (2 * 34)
    assert cache.held_bytes() == cache.kept_bytes()
    row = 2 * 34  # q8_0 at head_dim 64
    for layer in range(2):  # per layer, after the fill: 8 kept cells x 2 heads, K and V
        held = [a[:, :, : cache.cells[layer]].nbytes for s in (cache.k[layer], cache.v[layer])
                for a in s.values()]  # fmt: skip
        assert cache.cells[layer] == 8 and sum(held) == 2 * 8 * 2 * row
        # the buffers stay allocated at the capacity (16 cells): what is resident is the
        # capacity's bytes; kept_bytes is what a cache that frees evicted cells would hold
        whole = [a.nbytes for s in (cache.k[layer], cache.v[layer]) for a in s.values()]
        assert sum(whole) == 2 * 16 * 2 * row


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    """gemma3_text, layers 0-2 a sliding window of 8 positions, layer 3 global."""
    from tiny_model import write_random_mlx_dir

    path = write_random_mlx_dir(tmp_path_factory.mktemp("g") / "g", "gemma3_text", n_layers=4)
    return load_model(path)


def test_a_windowed_model_keeps_its_rings_and_the_policy_selects_the_global_layer(tiny_gemma):
    """Window layers attend as the plain windowed cache (nothing selected there); the global
    layer keeps what the policy selects; keep-all equals the plain cache's logits."""
    toks = TOKS[:20]
    pol = P.make("knorm", P.Budget(compression_ratio=0.0))
    cache = make_policy_cache(CacheSpec("fp32"), tiny_gemma, 24, "reference", pol, max_step=8)
    prefill(tiny_gemma, cache, toks[:16], 8)
    cache.compress()
    got = forward(tiny_gemma, mx.array([toks[16:]]), cache)
    plain = make_cache(CacheSpec("fp32"), tiny_gemma.config, 24, "reference", max_step=8)
    prefill(tiny_gemma, plain, toks[:16], 8)
    want = forward(tiny_gemma, mx.array([toks[16:]]), plain)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)
    pos = kept_positions(tiny_gemma, toks[:16], P.make("knorm", P.Budget(kv_budget=5)), ubatch=8)
    h = tiny_gemma.config.n_kv_heads
    assert [p.shape for p in pos] == [(h, 0)] * 3 + [(h, 5)]
    half = make_policy_cache(CacheSpec("fp16"), tiny_gemma, 24, "reference",
                             P.make("knorm", P.Budget(kv_budget=5)), max_step=8)  # fmt: skip
    prefill(tiny_gemma, half, toks[:16], 8)
    half.compress()
    assert half.kept_cells() == [[8] * h] * 3 + [[5] * h]  # rings: window 8, no sinks
    assert half.read_cells() == [8, 8, 8, 5]  # what a step reads per KV head, layer by layer


def test_a_windowed_models_ring_bytes_are_fixed_not_per_context_token(tiny_gemma):
    """16 context tokens, kv_budget 5 on the global layer: the three rings hold 8 cells a KV
    head whatever the context, so they are kept_ring_bytes and only the global layer's 5 cells
    scale with the context (kept_bytes_per_token). Stating the rings per context token too made
    Gemma-3's policy rows at 2K 133% of its full cache."""
    from kvbench.analysis.findings.budget import bytes_per_token
    from kvbench.kernels.model.compress import Kept

    h, d = tiny_gemma.config.n_kv_heads, tiny_gemma.config.head_dim
    cache = make_policy_cache(CacheSpec("fp16"), tiny_gemma, 24, "reference",
                              P.make("knorm", P.Budget(kv_budget=5)), max_step=8)  # fmt: skip
    prefill(tiny_gemma, cache, TOKS[:16], 8)
    cache.compress()
    kept = Kept()
    kept.note(cache, 16)
    row = kept.fields()
    cell = 2 * d * 2  # K and V of one cell, fp16
    assert row["kept_ring_bytes"] == 3 * 8 * h * cell
    assert row["kept_bytes_per_token"] == 5 * h * cell / 16
    at_64 = bytes_per_token(pd.DataFrame([{**row, "context_len": 64, "kv_bytes": 0}]))[0] * 64
    assert at_64 == 3 * 8 * h * cell + 64 * 5 * h * cell / 16  # rings as they are, global x 4


def _compressed(tiny, pol):
    cache = make_policy_cache(CacheSpec("fp16"), tiny, len(TOKS), "reference", pol)
    prefill(tiny, cache, TOKS[:16], 8)
    cache.compress()
    return cache


def test_rewind_restores_a_prefill_time_policys_cache(tiny):
    """After a prefill-time compression a step only writes the next cell: rewinding offset,
    positions and cell counts is the whole state. A step of token A, rewound, then token B
    equals token B on a cache that never saw A (logits bit for bit, positions, cells)."""
    pol = lambda: P.make("snapkv", P.Budget(compression_ratio=0.5), window=4)  # noqa: E731
    cache, fresh = _compressed(tiny, pol()), _compressed(tiny, pol())
    mark = cache.mark()
    mx.eval(forward(tiny, mx.array([[TOKS[16]]]), cache), cache.arrays())
    assert cache.cells == [9, 9] and cache.offset == 17  # 8 kept + A
    cache.rewind(mark)
    got = forward(tiny, mx.array([[TOKS[17]]]), cache)
    want = forward(tiny, mx.array([[TOKS[17]]]), fresh)
    assert mx.array_equal(got, want)
    assert cache.offset == fresh.offset and cache.cells == fresh.cells
    for a, b in zip(cache.kept_positions(), fresh.kept_positions()):
        assert a.tolist() == b.tolist()


def test_rewind_cannot_restore_a_decode_time_policys_cache(tiny):
    """Why model_decode refuses window, h2o and tova: after the step their select gathers the
    kept cells again (the oldest non-sink leaves, the rest move down a cell), so rewound
    positions no longer name the data in their cells and the next step differs."""
    pol = lambda: P.make("window", P.Budget(kv_budget=8), sinks=2)  # noqa: E731
    cache, fresh = _compressed(tiny, pol()), _compressed(tiny, pol())
    mark = cache.mark()
    mx.eval(forward(tiny, mx.array([[TOKS[16]]]), cache), cache.arrays())
    cache.rewind(mark)
    got = forward(tiny, mx.array([[TOKS[17]]]), cache)
    want = forward(tiny, mx.array([[TOKS[17]]]), fresh)
    assert not mx.allclose(got, want, atol=1e-3)
