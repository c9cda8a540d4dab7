"""A model run under a cache policy (kernels/model/evicting.py, kernels/model/policies/): the
context is prefilled with every position held, then compressed where a deployment compresses
it (kvpress's setup: at the end of the context; the question or continuation that follows is
never compressed), and what follows runs over the kept cells (a decode policy keeps evicting
after every pass).

* kept_positions: the positions each layer and KV head keeps of a context, what kvpress's
  presses are held against.
"""

from __future__ import annotations

from kvbench.kernels.model.evicting import make_policy_cache
from kvbench.kernels.model.load import Model
from kvbench.kernels.model.run import prefill
from kvbench.kernels.model.spec import CacheSpec


def kept_positions(model: Model, tokens: list[int], policy, ubatch: int = 512, spec=None) -> list:
    """Per layer, [Hkv, kept] the positions each KV head keeps after `tokens` (the context) go
    through the model in passes of `ubatch` and the cache compresses (float32 cells unless
    `spec` says otherwise; heads keeping fewer cells than the layer's most padded with -1)."""
    cache = make_policy_cache(spec or CacheSpec("fp32"), model, len(tokens), "reference", policy)
    prefill(model, cache, list(tokens), ubatch)
    cache.compress()
    return cache.kept_positions()
