"""Every kernel against an independent float64 numpy oracle, over GQA, head dims, lengths."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from conftest import numpy_attention

from kvbench.kernels.attention.registry import KERNELS, causal_mask, unsupported_reason
from kvbench.kernels.formats.registry import get_format

TOL = {"fp32": 2e-5, "fp16": 2e-2, "bf16": 8e-2}  # max abs error on unit-variance data


def _data(b, hq, hkv, lq, lk, d, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((b, hq, lq, d)).astype(np.float32),
        rng.standard_normal((b, hkv, lk, d)).astype(np.float32),
        rng.standard_normal((b, hkv, lk, d)).astype(np.float32),
    )


def _run(kernel, dtype, q, k, v, **kw):
    fmt = get_format(dtype)
    act = fmt.compute_dtype
    out = KERNELS[kernel].fn(
        mx.array(q).astype(act),
        fmt.encode(mx.array(k)),
        fmt.encode(mx.array(v)),
        fmt,
        scale=1 / math.sqrt(q.shape[-1]),
        tile_kv=None,
        **kw,
    )
    return np.array(out.astype(mx.float32))


@pytest.mark.parametrize("kernel", ["reference", "sdpa", "f32_sdpa", "ops"])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (8, 1)])  # GQA 1, 4, 8
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("lk", [1, 37, 256])
def test_decode_matches_numpy(kernel, hq, hkv, d, lk):
    q, k, v = _data(2, hq, hkv, 1, lk, d)
    expect = numpy_attention(q, k, v, 1 / math.sqrt(d))
    for dtype in ("fp32", "fp16"):
        got = _run(kernel, dtype, q, k, v, mask=None)
        assert np.abs(got - expect).max() < TOL[dtype], (kernel, dtype)


@pytest.mark.parametrize("kernel", ["reference", "sdpa", "f32_sdpa", "ops"])
@pytest.mark.parametrize("lq,lk", [(5, 5), (3, 11)])  # prefill, and a chunk after a prefix
def test_causal_matches_numpy(kernel, lq, lk):
    q, k, v = _data(1, 8, 2, lq, lk, 64, seed=1)
    expect = numpy_attention(q, k, v, 0.125, causal=True)
    got = _run(kernel, "fp32", q, k, v, mask="causal")
    assert np.abs(got - expect).max() < TOL["fp32"]


@pytest.mark.parametrize("kernel", ["reference", "sdpa", "f32_sdpa", "ops"])
def test_boolean_mask_matches_numpy(kernel):
    q, k, v = _data(2, 8, 2, 1, 20, 64, seed=2)
    rng = np.random.default_rng(3)
    mask = rng.random((2, 1, 1, 20)) < 0.6
    mask[..., 0] = True  # every row keeps at least one key
    expect = numpy_attention(q, k, v, 0.125, mask=mask)
    got = _run(kernel, "fp32", q, k, v, mask=mx.array(mask))
    assert np.abs(got - expect).max() < TOL["fp32"]


@pytest.mark.parametrize(
    "dtype, group", [("fp16", None), ("bf16", None), ("int8", 32), ("int4", 32)]
)
@pytest.mark.parametrize("lq,mask", [(1, None), (4, "causal")])
def test_f32_sdpa_is_the_reference_on_the_same_stored_cache(dtype, group, lq, mask):
    """f32_sdpa computes in float32 over what a half-precision or quantized cache stores: the
    float32 oracle over the same stored bytes, to float32 tolerance (not the format's)."""
    q, k, v = _data(1, 8, 2, lq, 40, 64, seed=4)
    fmt = get_format(dtype, group)
    ks, vs = fmt.encode(mx.array(k)), fmt.encode(mx.array(v))
    args = dict(mask=mask, scale=0.125, tile_kv=None)
    got = KERNELS["f32_sdpa"].fn(mx.array(q), ks, vs, fmt, **args)
    want = KERNELS["reference"].fn(mx.array(q), ks, vs, fmt, **args)
    assert got.dtype == mx.float32
    assert np.abs(np.array(got) - np.array(want)).max() < TOL["fp32"]


def test_causal_mask_aligns_queries_to_the_end():
    m = np.array(causal_mask(2, 4))
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_dense_kernels_refuse_unknown_backend_with_reason():
    assert unsupported_reason("sdpa", get_format("fp16"), "cpu") is None
    reason = unsupported_reason("sdpa", get_format("fp16"), "tpu")
    assert reason and "tpu" in reason
