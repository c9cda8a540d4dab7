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

tests/test_model_protocol.py finds every class of kernels/model/ with `attend` and `advance` and
checks it against the level it claims.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import mlx.core as mx


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


LEVELS = {
    "ModelCache": ModelCache,
    "StoredCache": StoredCache,
    "RewindableCache": RewindableCache,
    "PartedCache": PartedCache,
}
