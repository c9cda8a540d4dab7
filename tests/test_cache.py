"""The full cache: pre-allocation, writes at positions, views, fill."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.stores.cache import KVCache


def test_allocates_every_layer_at_capacity():
    cache = KVCache(get_format("fp16"), n_layers=3, n_seqs=2, n_kv_heads=4, capacity=10, head_dim=8)
    assert len(cache.arrays()) == 6  # K and V for 3 layers
    assert all(a.shape == (2, 4, 10, 8) and a.dtype == mx.float16 for a in cache.arrays())
    # 3 layers x (K+V) x 2 seqs x 4 heads x 10 positions x 8 dims x 2 bytes
    assert sum(a.nbytes for a in cache.arrays()) == 3 * 2 * 2 * 4 * 10 * 8 * 2


def test_write_lands_at_its_positions_only():
    cache = KVCache(get_format("fp32"), 2, 1, 2, 6, 4)
    k = mx.ones((1, 2, 2, 4))
    cache.write(1, k, 2 * k, pos=3)
    mx.eval(cache.arrays())
    keys, values = np.array(cache.keys[1]["data"]), np.array(cache.values[1]["data"])
    assert keys[:, :, 3:5].min() == 1 and values[:, :, 3:5].min() == 2
    assert np.abs(keys[:, :, [0, 1, 2, 5]]).max() == 0
    assert np.abs(np.array(cache.keys[0]["data"])).max() == 0  # other layer untouched


def test_fill_writes_every_layer_and_sets_offset():
    cache = KVCache(get_format("fp32"), 3, 1, 1, 8, 4)
    k = mx.arange(20, dtype=mx.float32).reshape(1, 1, 5, 4)
    cache.fill(k, -k)
    assert cache.offset == 5
    for layer in range(3):
        kv, vv = cache.view(layer, 5)
        assert np.array_equal(np.array(kv["data"]), np.array(k))
        assert np.array_equal(np.array(vv["data"]), -np.array(k))


def test_write_past_capacity_is_refused():
    cache = KVCache(get_format("fp16"), 1, 1, 1, 4, 4)
    with pytest.raises(IndexError, match="capacity 4"):
        cache.write(0, mx.zeros((1, 1, 2, 4)), mx.zeros((1, 1, 2, 4)), pos=3)


def test_encode_on_write_casts_to_the_format():
    cache = KVCache(get_format("bf16"), 1, 1, 1, 2, 4)
    cache.write(0, mx.full((1, 1, 1, 4), 1 / 3), mx.zeros((1, 1, 1, 4)), pos=0)
    stored = cache.keys[0]["data"]
    assert stored.dtype == mx.bfloat16
    assert float(stored[0, 0, 0, 0].astype(mx.float32)) == float(
        mx.array(1 / 3).astype(mx.bfloat16).astype(mx.float32)
    )
