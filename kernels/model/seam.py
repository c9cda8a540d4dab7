"""Where kvbench's attention kernels enter an mlx-lm model.

mlx-lm's architectures call one function for attention,
`mlx_lm.models.base.scaled_dot_product_attention(queries, keys, values, cache, scale, mask)`,
each importing it into its own module namespace, right after `cache.update_and_fetch`. `route`
replaces that name in every module a model's layers come from with `attention` below: when the
layer's cache is kvbench's (kernels/model/cache.py LayerCache) the cache attends with the case's
kernel over what it stored; any other cache (mlx-lm's own, as the peers use) goes to mlx-lm's
function unchanged. No model code is copied: the architecture stays mlx-lm's.

An architecture that computes attention itself (e.g. gemma2's logit softcapping) never reaches
the seam; kernels/model/cache.py ModelCache.check_attended turns that into a one-line error
after the forward pass, and `route` refuses a model none of whose modules use the function.
"""

from __future__ import annotations

import sys

import mlx.core as mx

from kvbench.kernels.model.cache import LayerCache, ModelCache


def _original():
    from mlx_lm.models import base

    return base.scaled_dot_product_attention


def attention(queries, keys, values, cache, scale: float, mask=None, sinks=None) -> mx.array:
    """mlx-lm's scaled_dot_product_attention, with kvbench's kernels for kvbench's caches."""
    if isinstance(cache, LayerCache):
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


def forward(model, tokens: mx.array, cache: ModelCache) -> mx.array:
    """Logits [B, n, vocab] of tokens [B, n] at positions cache.offset.. (lazy), every layer's
    K/V stored in the cache's format and attended by its kernel."""
    route(model.net)
    out = model.net(tokens, cache=cache.layers)
    cache.check_attended(model.config.arch)
    return out
