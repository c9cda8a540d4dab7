"""Where kvbench's attention kernels enter an mlx-lm model.

mlx-lm's architectures call one function for attention,
`mlx_lm.models.base.scaled_dot_product_attention(queries, keys, values, cache, scale, mask)`,
each importing it into its own module namespace, right after `cache.update_and_fetch`. `route`
replaces that name in every module a model's layers come from with `attention` below: when
the layer's cache is kvbench's (a LayerView of a kernels/model/cache.py cache) that cache
attends with the case's kernel over what it stored; any other cache (mlx-lm's own, as the
peers use) goes to mlx-lm's function unchanged. No model code is copied: the architecture
stays mlx-lm's.

An architecture that computes attention itself (e.g. gemma2's logit softcapping) never reaches
the seam; `forward` turns that into a one-line error after the forward pass, and `route`
refuses a model none of whose modules use the function.
"""

from __future__ import annotations

import sys

import mlx.core as mx

from kvbench.kernels.model.protocol import ModelCache


class LayerView:
    """Layer `layer` of a kvbench cache (kernels/model/protocol.py ModelCache: offset, attend,
    advance) as mlx-lm's models use a layer's cache (mlx_lm/models/cache.py: `offset`,
    `update_and_fetch`, `make_mask`, `state`, `is_trimmable`, `size`, `nbytes`, `empty`).

    update_and_fetch keeps the new K/V; mlx-lm's scaled_dot_product_attention, rerouted by
    `route`, then calls `attend`: the cache writes them in its format (quantize on write) and
    runs the case's kernel over what it holds. What update_and_fetch returns is never read on
    that path. The cache advances once per forward pass (`forward`), so `offset` is the
    position of the step's first token in every layer, where the model reads it for RoPE."""

    def __init__(self, cache: ModelCache, layer: int):
        self.cache, self.layer, self.pending, self.attended = cache, layer, None, False

    @property
    def offset(self) -> int:
        return self.cache.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        self.pending = (keys, values)
        return keys, values

    def attend(self, queries: mx.array, scale: float) -> mx.array:
        if self.pending is None:
            raise RuntimeError("attention before update_and_fetch on a kvbench cache")
        k, v = self.pending
        self.pending, self.attended = None, True
        return self.cache.attend(self.layer, queries, k, v, scale).astype(queries.dtype)

    def make_mask(self, *args, **kwargs):
        return None  # the cache knows its positions and masks inside attend

    @property
    def state(self):
        return []

    def is_trimmable(self) -> bool:
        return False

    def size(self) -> int:
        return self.offset

    @property
    def nbytes(self) -> int:
        return 0

    def empty(self) -> bool:
        return self.offset == 0


def _original():
    from mlx_lm.models import base

    return base.scaled_dot_product_attention


def attention(queries, keys, values, cache, scale: float, mask=None, sinks=None) -> mx.array:
    """mlx-lm's scaled_dot_product_attention, with kvbench's kernels for kvbench's caches."""
    if isinstance(cache, LayerView):
        if sinks is not None:
            raise ValueError("learned attention sinks (gpt-oss): kvbench's kernels have none")
        return cache.attend(queries, scale)
    return _original()(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)


def route(net) -> list[str]:
    """Point every module of `net`'s layers that imported mlx-lm's attention function at
    `attention`; returns the modules routed (idempotent)."""
    original = _original()
    routed = []
    for name in sorted({type(m).__module__ for _, m in net.named_modules()}):
        mod = sys.modules.get(name)
        fn = getattr(mod, "scaled_dot_product_attention", None)
        if fn is original or fn is attention:
            mod.scaled_dot_product_attention = attention
            routed.append(name)
    if not routed:
        arch = type(net).__module__.rsplit(".", 1)[-1]
        raise ValueError(f"model {arch}: no module calls mlx-lm's scaled_dot_product_attention; "
                         "kvbench's kernels cannot run inside it")  # fmt: skip
    return routed


_ROUTED: set[type] = set()  # model classes whose modules route (the patch is per module)


def forward(model, tokens: mx.array, cache: ModelCache) -> mx.array:
    """Logits [B, n, vocab] of tokens [B, n] at positions cache.offset.. (lazy), every layer's
    K/V stored in the cache's format and attended by its kernel; the cache then advances n."""
    if type(model.net) not in _ROUTED:  # once per class: a decode step is timed, the walk not
        route(model.net)
        _ROUTED.add(type(model.net))
    views = [LayerView(cache, i) for i in range(model.config.n_layers)]
    out = model.net(tokens, cache=views)
    for v in views:
        if not v.attended:
            raise ValueError(
                f"model {model.config.arch}: layer {v.layer} never called mlx-lm's "
                "scaled_dot_product_attention; kvbench's kernels cannot run inside it"
            )
    cache.advance(tokens.shape[1])
    return out
