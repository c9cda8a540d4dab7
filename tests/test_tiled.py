"""Parity of the tiled flash-decoding kernel (MLX ops) against the float32 reference."""

import math

import mlx.core as mx
import pytest

from kvbench.engines.parity import PARITY_REL_TOL, compare_outputs
from kvbench.kernels.attention.registry import KERNELS, reference
from kvbench.kernels.attention.tiled import DEFAULT_TILE_KV, folded_mask
from kvbench.kernels.formats.registry import get_format


def make(fmt, b, hkv, group, lq, lk, d, seed=0):
    kq, kk, kv = mx.random.split(mx.random.key(seed), 3)
    q = mx.random.normal((b, hkv * group, lq, d), key=kq).astype(fmt.compute_dtype)
    k = fmt.encode(mx.random.normal((b, hkv, lk, d), key=kk))
    v = fmt.encode(mx.random.normal((b, hkv, lk, d), key=kv))
    return q, k, v


def rel_err(fmt, q, k, v, mask, tile):
    scale = 1 / math.sqrt(q.shape[-1])
    out = KERNELS["tiled"].fn(q, k, v, fmt, mask=mask, scale=scale, tile_kv=tile)
    ref = reference(q, k, v, fmt, mask=mask, scale=scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    return compare_outputs(out, ref)["rel_err"]


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("lk", [96, 100])  # a multiple of the tile (32) and not
@pytest.mark.parametrize("kv_dtype", ["fp16", "bf16", "fp32", "fp4", "int4"])
def test_decode_parity(group, d, lk, kv_dtype):
    fmt = get_format(kv_dtype)
    q, k, v = make(fmt, 1, 2, group, 1, lk, d)
    assert rel_err(fmt, q, k, v, None, 32) <= PARITY_REL_TOL[fmt.compute_dtype]


@pytest.mark.parametrize(
    "kv_dtype,group_size",
    [("fp4", 32), ("int4", 32), ("int8", None), ("mxfp4", None), ("nvfp4", None), ("affine4", 64)],
)
def test_grouped_scales_and_other_formats(kv_dtype, group_size):
    fmt = get_format(kv_dtype, group_size)
    q, k, v = make(fmt, 2, 2, 4, 1, 77, 64)
    assert rel_err(fmt, q, k, v, None, 16) <= PARITY_REL_TOL[fmt.compute_dtype]


@pytest.mark.parametrize("tile", [1, 7, 64, 1000])  # one row, odd, a multiple, beyond lk
def test_tile_sizes(tile):
    fmt = get_format("fp32")
    q, k, v = make(fmt, 1, 2, 4, 1, 64, 64)
    assert rel_err(fmt, q, k, v, None, tile) <= PARITY_REL_TOL[mx.float32]


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "int4"])
def test_causal_prefill(group, kv_dtype):
    """Causal prefill: early rows see nothing in later tiles (their running max stays -inf)."""
    fmt = get_format(kv_dtype)
    q, k, v = make(fmt, 1, 2, group, 40, 40, 64)
    assert rel_err(fmt, q, k, v, "causal", 16) <= PARITY_REL_TOL[fmt.compute_dtype]


def test_causal_queries_are_the_last_positions():
    fmt = get_format("fp32")
    q, k, v = make(fmt, 1, 2, 4, 5, 70, 64)
    assert rel_err(fmt, q, k, v, "causal", 32) <= PARITY_REL_TOL[mx.float32]


def test_bool_mask():
    fmt = get_format("fp32")
    b, hkv, group, lq, lk = 2, 2, 4, 3, 50
    q, k, v = make(fmt, b, hkv, group, lq, lk, 64)
    mask = mx.random.uniform(shape=(b, hkv * group, lq, lk), key=mx.random.key(3)) > 0.3
    mask[..., 0] = True  # every row sees at least one key
    assert rel_err(fmt, q, k, v, mask, 16) <= PARITY_REL_TOL[mx.float32]
    shared = mx.random.uniform(shape=(lq, lk), key=mx.random.key(4)) > 0.5  # broadcast mask
    shared[:, 0] = True
    assert rel_err(fmt, q, k, v, shared, 16) <= PARITY_REL_TOL[mx.float32]


def test_folded_mask_rows_are_g_major():
    vis = folded_mask("causal", 1, 1, 2, 2, 3, 0, 3)  # G=2, Lq=2, Lk=3
    assert vis.tolist() == [[True, True, False], [True, True, True]] * 2


class Spy:
    """A format that records the positions of every decode call."""

    def __init__(self, fmt):
        self.fmt, self.lengths = fmt, []

    def __getattr__(self, name):
        return getattr(self.fmt, name)

    def decode(self, stored, dtype=None):
        self.lengths.append(stored["data"].shape[2])
        return self.fmt.decode(stored, dtype)


@pytest.mark.parametrize("kv_dtype", ["fp4", "int4"])
def test_fused_dequant_decodes_one_tile_at_a_time(kv_dtype):
    spy = Spy(get_format(kv_dtype))
    q, k, v = make(spy.fmt, 1, 2, 4, 1, 100, 64)
    mx.eval(KERNELS["tiled"].fn(q, k, v, spy, scale=0.125, tile_kv=32))
    assert spy.lengths == [32, 32] * 3 + [4, 4]  # K and V per tile; never the whole cache


def test_default_tile():
    spy = Spy(get_format("fp16"))
    q, k, v = make(spy.fmt, 1, 1, 1, 1, DEFAULT_TILE_KV + 1, 64)
    mx.eval(KERNELS["tiled"].fn(q, k, v, spy, scale=0.125, tile_kv=None))
    assert spy.lengths == [DEFAULT_TILE_KV] * 2 + [1, 1]
