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


# ---- residency: a fill that covers whole buffers leaves every layer its own bytes -------------
# MLX hands back the update itself when a slice update covers a whole array; before the store
# wrote such fills in two parts, every layer held the one encoded input (issue #28).


def _fill_residency(fmt_name: str, store_factory, fill) -> dict:
    from kvbench.engines.contract import memory_baseline
    from kvbench.engines.residency import measure

    k = mx.random.normal((2, 2, 64, 32), key=mx.random.key(1))  # [B, Hkv, L, D] float32
    v = mx.random.normal((2, 2, 64, 32), key=mx.random.key(2))
    mx.eval(k, v)
    baseline = memory_baseline()
    store = store_factory(get_format(fmt_name))
    mx.eval(store.arrays())
    fill(store, k, v)
    return {**measure(store.arrays(), baseline), "store": store, "k": k, "v": v}


@pytest.mark.parametrize("fmt_name", ["fp16", "fp32", "int4", "mxfp4"])
def test_whole_buffer_fill_is_resident_in_every_layer(fmt_name):
    from kvbench.kernels.stores.cache import ALL, KVStore

    m = _fill_residency(
        fmt_name,
        lambda fmt: KVStore(fmt, 4, 2, 2, 64, 32),
        lambda s, k, v: s.put_every_layer((ALL, ALL, ALL), k, v),
    )
    fmt = get_format(fmt_name)
    exact = 4 * 2 * fmt.nbytes(2 * 2 * 64, 32)  # layers x (K, V) x the formula's rows
    assert m["declared"] == exact
    assert m["resident"] == exact  # before the fix: one layer's bytes (fp32: 0, the input itself)
    assert m["shared"] == 0
    want_k = np.array(fmt.decode(fmt.encode(m["k"]), mx.float32))
    for layer in range(4):
        got = np.array(fmt.decode(m["store"].keys[layer], mx.float32))
        assert np.array_equal(got, want_k)


def test_fill_to_capacity_gives_every_layer_its_own_buffer():
    m = _fill_residency(
        "fp16",
        lambda fmt: KVCache(fmt, 3, 2, 2, 64, 32),
        lambda s, k, v: s.fill(k, v),
    )
    assert m["resident"] == m["declared"] == 3 * 2 * 2 * 2 * 64 * 32 * 2
    assert m["shared"] == 0


def test_whole_buffer_write_does_not_hold_the_callers_array():
    from kvbench.engines.residency import shared_pairs

    cache = KVCache(get_format("fp16"), 1, 1, 2, 8, 4)
    k = mx.random.normal((1, 2, 8, 4)).astype(mx.float16)  # encodes to itself
    cache.write(0, k, k, pos=0)
    assert shared_pairs([k, *cache.arrays()]) == 0
    assert np.array_equal(np.array(cache.keys[0]["data"]), np.array(k))


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.uint32])
def test_shared_pairs_sees_aliasing(dtype):
    from kvbench.engines.residency import shared_pairs

    a = mx.zeros((4, 8), dtype)  # bfloat16: read through a uint16 view of the same buffer
    b = mx.zeros((4, 8), dtype)
    c = mx.zeros((4, 8), dtype)
    c[:, :] = a  # a whole-array slice update: c now holds a's buffer
    assert shared_pairs([a, b]) == 0
    assert shared_pairs([a, b, c]) == 1
    assert shared_pairs([a, a]) == 1  # one array object listed for two places: one buffer, shared
