"""K/V/query data for a case: deterministic from a seed, float32, un-quantized.

The same float32 K/V feed the cache (encoded into its format) and the float32 reference, so
accuracy compares a format against exactly the data it was given.
"""

from __future__ import annotations

import mlx.core as mx


def gaussian(shape: tuple[int, ...], key: mx.array) -> mx.array:
    return mx.random.normal(shape, key=key)


KV_DATA = {
    "gaussian": gaussian,
}


def make_qkv(kind: str, q_shape: tuple[int, ...], kv_shape: tuple[int, ...], seed: int):
    """(q, k, v) float32: q [B, Hq, Lq, D], k and v [B, Hkv, L, D]."""
    kq, kk, kv = mx.random.split(mx.random.key(seed), 3)
    gen = KV_DATA[kind]
    return gaussian(q_shape, kq), gen(kv_shape, kk), gaussian(kv_shape, kv)
