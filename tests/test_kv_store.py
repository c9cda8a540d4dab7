"""The model's KV store: exact bytes against hand counts and against the arrays actually held,
region bookkeeping (sinks, quantized body, residual window), per-channel key scales against a
numpy quantizer, and attention through kvbench kernels."""

import mlx.core as mx
import numpy as np
import pytest

from kvbench.kernels.model.cache import MixedCache, PlainCache
from kvbench.kernels.model.spec import CacheSpec, kv_bytes, region_counts

D = 64


def rand(n, h=1, seed=0):
    return mx.random.normal((1, h, n, D), key=mx.random.key(seed))


# ---- bytes: hand counts (D = 64) -------------------------------------------------------------
# int4 per row: 64 codes * 4 bits = 32 bytes + one fp16 scale = 34 bytes per row.
# int8 per row: 64 + 2 = 66. mxfp4: 32 + 2 E8M0 scales (1 byte per 32) = 34.
# nvfp4: 32 + 4 E4M3 scales (per 16) = 36. affine4 (g64): 32 + fp16 scale + fp16 bias = 36.


def test_plain_int4_bytes():
    # K and V: 2 * 34 bytes per token, 100 tokens, 2 layers, 3 KV heads
    assert kv_bytes(CacheSpec("int4"), 100, 2, 3, D) == 2 * 34 * 100 * 2 * 3 == 40800


@pytest.mark.parametrize("name,row", [("mxfp4", 34), ("nvfp4", 36), ("affine4", 36), ("fp16", 128)])
def test_plain_bytes_per_row(name, row):
    assert kv_bytes(CacheSpec(name), 10, 1, 1, D) == 2 * 10 * row


def test_separate_k_and_v_formats():
    assert kv_bytes(CacheSpec("int8", "int4"), 10, 1, 1, D) == (66 + 34) * 10 == 1000


def test_sinks_and_residual_window():
    # 110 tokens, 4 sinks, window 32: body = 96 (3 flushes), residual 10; fp16 = 128 B/token
    spec = CacheSpec("int4", sink_tokens=4, recent_tokens=32)
    assert region_counts(spec, 110) == (4, 96, 10)
    per_stream = (4 + 10) * 128 + 96 * 34  # 1792 + 3264
    assert kv_bytes(spec, 110, 1, 1, D) == 2 * per_stream == 10112


def test_per_channel_keys():
    # keys: 3 flushed groups, each 64 channel rows of 32 positions: 32*4/8 + 2 = 18 B per row
    # values per token as usual; residual 14 tokens in fp16 for both
    spec = CacheSpec("int4", k_axis="channel", recent_tokens=32)
    k = 3 * 64 * 18 + 14 * 128  # 3456 + 1792
    v = 96 * 34 + 14 * 128  # 3264 + 1792
    assert kv_bytes(spec, 110, 1, 1, D) == k + v == 10304


@pytest.mark.parametrize(
    "spec",
    [
        CacheSpec("int4"),
        CacheSpec("mxfp4"),
        CacheSpec("int8", "int4", sink_tokens=3),
        CacheSpec("int4", k_axis="channel", recent_tokens=32),
        CacheSpec("affine4", "int8", 32, None, "channel", sink_tokens=2, recent_tokens=32),
    ],
)
def test_formula_equals_held_arrays(spec):
    cls = PlainCache if spec.plain else MixedCache
    cache = cls(spec, 2, 3, D, 200, "reference")
    for n in (70, 1, 40):  # prefill, a decode step, a second batch
        for layer in range(2):
            cache.attend(layer, rand(n, 9), rand(n, 3, 1), rand(n, 3, 2), scale=0.125)
        cache.advance(n)
    mx.eval(cache.arrays())
    assert cache.held_bytes() == kv_bytes(spec, 111, 2, 3, D)


# ---- regions and per-channel scales ------------------------------------------------------------


@pytest.mark.parametrize("axis", ["token", "channel"])
def test_regions_keep_order(axis):
    """fp16 in every region: what is read back is exactly the fp16 input, in order."""
    spec = CacheSpec("fp16", "fp32", k_axis=axis, sink_tokens=3, recent_tokens=8)
    cache = MixedCache(spec, 1, 1, D, 64, "reference")
    xs = [rand(n, seed=i) for i, n in enumerate((5, 1, 13, 2, 9))]
    for x in xs:
        cache.k[0].write(x)
    got = np.array(cache.k[0].dense(mx.float32))
    want = np.array(mx.concatenate(xs, axis=2).astype(mx.float16).astype(mx.float32))
    np.testing.assert_array_equal(got, want)
    assert (cache.k[0].n_sink, cache.k[0].n_body, cache.k[0].n_resid) == (3, 24, 3)


def test_channel_scales_match_numpy():
    """int8 keys per channel over a group of 32 positions, against a numpy quantizer."""
    spec = CacheSpec("int8", "fp16", k_axis="channel", recent_tokens=32)
    cache = MixedCache(spec, 1, 1, D, 64, "reference")
    x = np.array(rand(37)) * np.linspace(0.1, 20, D)  # channels of very different ranges
    cache.k[0].write(mx.array(x))
    got = np.array(cache.k[0].dense(mx.float32))[0, 0]  # [37, D]
    g = x[0, 0, :32]  # [32, D]
    scale = (np.abs(g).max(axis=0) / 127).astype(np.float16).astype(np.float32)  # per channel
    q = np.clip(np.round(g.astype(np.float32) / scale), -127, 127)
    np.testing.assert_allclose(got[:32], q * scale, rtol=1e-6)
    np.testing.assert_array_equal(got[32:], x[0, 0, 32:].astype(np.float16).astype(np.float32))


# ---- attention -----------------------------------------------------------------------------


def run_steps(cache, steps=(20, 1, 1, 7)):
    outs = []
    for i, n in enumerate(steps):
        q, k, v = rand(n, 9, 10 + i), rand(n, 3, 20 + i), rand(n, 3, 30 + i)
        outs.append(np.array(cache.attend(0, q, k, v, scale=0.125)))
        cache.advance(n)
    return outs


@pytest.mark.parametrize(
    "dtype,mixed",
    [  # v_group differs, so the spec is not plain: the mixed path with an fp32 body only
        ("fp32", CacheSpec("fp32", "fp32", v_group=32)),
        # sinks and residual are fp16, and so is the body: exactly the plain fp16 cache
        ("fp16", CacheSpec("fp16", "fp16", v_group=32, sink_tokens=4, recent_tokens=8)),
    ],
)
def test_mixed_path_equals_plain_path(dtype, mixed):
    assert not mixed.plain
    plain = run_steps(PlainCache(CacheSpec(dtype), 1, 3, D, 40, "reference"))
    got = run_steps(MixedCache(mixed, 1, 3, D, 40, "reference"))
    for a, b in zip(plain, got):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,kernel", [("mxfp4", "quantized_matmul"), ("int4", "tiled")])
def test_quantized_kernels_on_stored_data(name, kernel):
    ref = run_steps(PlainCache(CacheSpec(name), 1, 3, D, 40, "reference"))
    got = run_steps(PlainCache(CacheSpec(name), 1, 3, D, 40, kernel))
    for a, b in zip(ref, got):
        np.testing.assert_allclose(a, b, atol=2e-2)


def test_bad_specs():
    with pytest.raises(ValueError, match="k_axis"):
        CacheSpec("int4", k_axis="head")
    with pytest.raises(ValueError, match="recent_tokens"):
        CacheSpec("int4", k_axis="channel")
    with pytest.raises(ValueError, match="sdpa"):
        PlainCache(CacheSpec("int4"), 1, 1, D, 8, "sdpa")
    with pytest.raises(ValueError):  # 12 positions cannot be packed 8 per uint32 word
        MixedCache(CacheSpec("int4", k_axis="channel", recent_tokens=12), 1, 1, D, 8, "reference")
