"""What every model cache declares (kernels/model/cache.py and the wrappers around it).

A model cache holds every layer's K/V in kvbench formats and attends with a kvbench kernel over
what it holds; kernels/model/seam.py hands it each layer's new K/V from inside mlx-lm's model,
and kernels/model/run.py advances it once per forward pass. Three levels, each adding to the
last, so a wrapper declares only what its readers use:

* ModelCache: what a forward pass needs (seam.py, run.forward): `offset`, `attend`, `advance`.
  capture.py's tap is one.
* StoredCache: plus `arrays`, the stored arrays to evaluate beside a step's logits (run.prefill,
  decode timing). generate.py's DeferredCache is one.
* RewindableCache: plus `mark` / `rewind` (a decode step repeated at a fixed depth) and
  `held_bytes` (what the stored arrays hold now, measured).
* PartedCache: plus `write` and `read`, the two halves of `attend` (attend = write, then
  read), so a profile times the cache write and the attention over the stored cache apart
  (kernels/model/parts.py). Every cache make_cache returns.

Which positions a cache keeps is a CachePolicy (below; kernels/model/policies/, one module per
policy, docs/policies.md): it observes every forward pass of every layer and, at the end of the
context's prefill (and after every decode step for a policy that evicts while decoding),
selects the cells each KV head keeps, within a budget in tokens. kernels/model/evicting.py is
the cache that asks it; the sliding-window layer (cache.py WindowCache: sinks + the recent
window at every write) and KIVI's fp16 residual (cache.py Stream) decide through
policies/window.py and policies/residual.py.

tests/test_model_protocol.py finds every class of kernels/model/ with `attend` and `advance` and
checks it against the level it claims.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import mlx.core as mx
import numpy as np


@runtime_checkable
class ModelCache(Protocol):
    offset: int  # positions held: where the next forward pass's first token lands (RoPE reads it)

    def attend(self, layer: int, q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
        """Write the new k, v [1, Hkv, n, D] of `layer` (in the cache's format) at `offset`..,
        then attention of q [1, Hq, n, D] over every position the layer holds (causal among
        the n new ones): float32 [1, Hq, n, D]."""
        ...

    def advance(self, n: int) -> None:
        """After every layer has attended: `offset` += n."""
        ...


@runtime_checkable
class StoredCache(ModelCache, Protocol):
    def arrays(self) -> list[mx.array]:
        """Every stored array (evaluated with a step's output, so its writes are in the step)."""
        ...


@runtime_checkable
class RewindableCache(StoredCache, Protocol):
    def mark(self) -> Any:
        """The state to come back to: enough to rewind to the positions held now."""
        ...

    def rewind(self, mark: Any) -> None:
        """Back to `mark`: the next write lands where it landed after mark() (re-writing the
        same token at the same depth writes the same bytes)."""
        ...

    def held_bytes(self) -> int:
        """Bytes of the stored arrays' slices that hold positions now (measured, not a formula)."""
        ...

    def saturated(self) -> int:
        """K/V elements written so far that the format stored as its largest value instead of
        their own (FP8: kernels/formats/fp8.py); 0 for a format that does not saturate."""
        ...


@runtime_checkable
class PartedCache(RewindableCache, Protocol):
    def write(self, layer: int, k: mx.array, v: mx.array) -> None:
        """attend's first half: the new k, v [1, Hkv, n, D] stored at `offset`.. (quantized
        on write)."""
        ...

    def read(self, layer: int, q: mx.array, scale: float) -> mx.array:
        """attend's second half: attention of q [1, Hq, n, D] over what the layer holds, the n
        new positions written (causal among them): float32 [1, Hq, n, D]."""
        ...


@dataclass(frozen=True)
class Observation:
    """One layer of one forward pass, as a policy sees it (after the layer attended).

    Cells are the layer's stored slots; `positions` says which token position each cell of each
    KV head holds (-1: an empty or padding cell). Arrays are lazy: a policy that reads none of
    them costs no decode."""

    layer: int  # the model's layer index
    n_layers: int
    q: mx.array  # [1, Hq, n, D] float32: the pass's queries (after RoPE), n new positions
    q_start: int  # position of q's first query
    k: mx.array  # [1, Hkv, m, D] float32: every held cell's key (decoded, the model's basis)
    v: mx.array  # [1, Hkv, m, D] float32: every held cell's value
    positions: np.ndarray  # [Hkv, m] int64: the position each cell holds, -1 none
    rope: Callable[[mx.array, int], mx.array] | None = None  # the layer's RoPE: (x, offset)

    @property
    def n_positions(self) -> int:
        """Positions written so far (the next position)."""
        return self.q_start + self.q.shape[2]


@runtime_checkable
class CachePolicy(Protocol):
    """Which positions a model cache keeps: scores and a selection per layer and KV head."""

    name: str
    decode: bool  # selects again after every decode step (h2o, tova, window): False, once

    def observe(self, obs: Observation) -> None:
        """Every forward pass of every layer, after it attended (scores that accumulate, query
        statistics, the last queries); a policy that needs none does nothing."""
        ...

    def select(self, obs: Observation) -> np.ndarray:
        """bool [Hkv, m]: the cells of obs's layer each KV head keeps (a head's count is its
        budget in tokens), asked at the end of the context's prefill and, for a decode policy,
        after every decode step; obs is that layer's last pass."""
        ...

    def state_bytes(self) -> int:
        """Bytes the policy holds beside the K/V it keeps (scores, statistics, position maps)."""
        ...


LEVELS = {
    "ModelCache": ModelCache,
    "StoredCache": StoredCache,
    "RewindableCache": RewindableCache,
    "PartedCache": PartedCache,
}
