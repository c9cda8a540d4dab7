"""The mlx_lm, mlx_lm_quant and mlx_lm_rotating peers: mlx-lm's KVCache, QuantizedKVCache and
RotatingKVCache with mlx-lm's attention function."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable

import mlx.core as mx

from kvbench.peers.base import MX_DTYPES, QUANT_BITS, DecodeData, DecodePeer


def mlx_lm_models():
    """mlx_lm.models.cache and mlx_lm.models.base. mlx_lm/__init__ imports its generate and
    convert stack (transformers, and torch when installed: 6-9 s on the 2-core CPU) that these
    two modules do not use; unless mlx_lm is already imported, they are loaded under a bare
    package object instead (the process then has no mlx_lm.load / generate)."""
    if "mlx_lm" not in sys.modules:
        spec = importlib.util.find_spec("mlx_lm")
        pkg = types.ModuleType("mlx_lm", "mlx-lm's models only, loaded by kvbench")
        pkg.__path__, pkg.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules["mlx_lm"] = pkg
    import mlx_lm.models.base as base
    import mlx_lm.models.cache as cache

    return cache, base


def _flat(x) -> list[mx.array]:
    """The arrays of nested lists and tuples of arrays, in order."""
    return [x] if isinstance(x, mx.array) else [a for y in x for a in _flat(y)]


class MlxLm(DecodePeer):
    """mlx-lm's cache classes with mlx-lm's attention function, one layer at a time as its
    models call them: `keys, values = cache.update_and_fetch(k, v)` then
    `scaled_dot_product_attention(queries, keys, values, cache=cache, scale, mask)`."""

    def __init__(self, data: DecodeData, make_cache: Callable, act: mx.Dtype):
        self.sdpa = mlx_lm_models()[1].scaled_dot_product_attention
        self.n_layers, self.scale = data.n_layers, data.scale
        ctx = data.context_len
        self.q = data.q.astype(act)
        # the new token converted on its own: a slice of the converted context would keep the
        # whole converted copy alive beside the cache (counted in the peer's memory, not kvbench's)
        self.k_new, self.v_new = (x[:, :, ctx - 1 :].astype(act) for x in (data.k, data.v))
        mx.eval(self.q, self.k_new, self.v_new)
        k, v = data.k[:, :, : ctx - 1].astype(act), data.v[:, :, : ctx - 1].astype(act)
        self.caches = [make_cache() for _ in range(self.n_layers)]
        for c in self.caches:  # prefill, one layer at a time to bound peak memory
            c.update_and_fetch(k, v)
            mx.eval(self.cache_arrays(c))
        mx.eval([c.update_and_fetch(self.k_new, self.v_new) for c in self.caches])  # priming
        self.span = min(data.window + data.sinks, ctx) if data.window else ctx

    @staticmethod
    def cache_arrays(c) -> list:
        return [c.keys, c.values]

    def write(self, layer: int):
        c = self.caches[layer]
        c.trim(1)  # back to L-1 positions: every sample is the same L-th step
        return c.update_and_fetch(self.k_new, self.v_new)

    def fetch(self, layer: int):
        return self.caches[layer].keys_and_values()

    def attend(self, layer: int, kv):
        c = self.caches[layer]
        # a fresh array object per call: mlx-lm's quantized path does `queries *= scale`,
        # which would rescale our stored q in place; its models pass a new q every call
        q = self.q.reshape(self.q.shape)
        mask = c.make_mask(1, return_array=False, window_size=None)  # as models ask: None here
        return self.sdpa(q, *kv, cache=c, scale=self.scale, mask=mask)

    def done(self, outs: list):
        return outs + [self.cache_arrays(c) for c in self.caches]

    def arrays(self) -> list[mx.array]:
        """Every MLX array the caches hold (a quantized cache's data, scales and biases)."""
        return _flat([self.cache_arrays(c) for c in self.caches])

    def output(self, layer: int) -> mx.array:
        return self.last[layer].astype(mx.float32)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)  # capacity, mlx-lm's 256-step padding included

    def stored(self, layer: int):
        k, v = self.caches[layer].keys_and_values()
        return k.astype(mx.float32), v.astype(mx.float32)


def mlx_lm(data: DecodeData) -> MlxLm:
    return MlxLm(data, mlx_lm_models()[0].KVCache, MX_DTYPES[data.kv_dtype])


class MlxLmQuant(MlxLm):
    def __init__(self, data: DecodeData):
        QuantizedKVCache = mlx_lm_models()[0].QuantizedKVCache
        self.bits, self.group_size = QUANT_BITS[data.kv_dtype], data.group_size or 64
        make = lambda: QuantizedKVCache(group_size=self.group_size, bits=self.bits)  # noqa: E731
        super().__init__(data, make, mx.float16)

    def stored(self, layer: int):
        kq, vq = self.caches[layer].keys_and_values()  # (data, scales, biases) each
        deq = lambda t: mx.dequantize(*t, group_size=self.group_size, bits=self.bits)  # noqa: E731
        return deq(kq).astype(mx.float32), deq(vq).astype(mx.float32)


class MlxLmRotating(MlxLm):
    def __init__(self, data: DecodeData):
        RotatingKVCache = mlx_lm_models()[0].RotatingKVCache
        size, keep = (data.window or data.context_len) + data.sinks, data.sinks
        make = lambda: RotatingKVCache(max_size=size, keep=keep)  # noqa: E731
        super().__init__(data, make, MX_DTYPES[data.kv_dtype])

    def stored(self, layer: int):
        c = self.caches[layer]
        k, v = c.keys_and_values()
        if c.offset > c.max_size:  # wrapped: the sinks, then slot _idx holds the oldest position
            keep, i = c.keep, c._idx
            k, v = (
                mx.concatenate([x[:, :, :keep], x[:, :, i:], x[:, :, keep:i]], axis=2)
                for x in (k, v)
            )
        return k.astype(mx.float32), v.astype(mx.float32)
