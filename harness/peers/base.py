"""What every peer shares: the decode case as plain data (DecodeData) and the layer loop
(DecodePeer), with Preallocated for the peers that own a pre-allocated cache per layer
(torch_sdpa.py, numpy_ref.py). harness/peers/registry.py lists the peers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

MX_DTYPES = {"fp16": mx.float16, "bf16": mx.bfloat16, "fp32": mx.float32}
QUANT_BITS = {"affine4": 4, "affine8": 8}  # mlx-lm's QuantizedKVCache: affine, fp16 scales+biases
DENSE = tuple(MX_DTYPES)


@dataclass(frozen=True)
class DecodeData:
    """One decode case as plain data: float32 q [B, Hq, 1, D], k and v [B, Hkv, L, D]."""

    q: mx.array
    k: mx.array
    v: mx.array
    n_layers: int
    kv_dtype: str
    scale: float
    group_size: int | None = None  # mlx_lm_quant: None = mlx-lm's default (64)
    window: int | None = None  # mlx_lm_rotating: the last `window` positions; None = all
    sinks: int = 0  # mlx_lm_rotating: first positions kept (keep); max_size = window + sinks
    device: str = "cpu"  # torch: "cpu" or "cuda"

    @property
    def context_len(self) -> int:
        return self.k.shape[2]


class DecodePeer:
    """The layer loop every peer shares; a peer says how it writes, fetches and attends."""

    n_layers: int
    span: int  # positions each query attends over (the window, or the whole context)

    def write(self, layer: int):  # store the new token; return what attend needs
        raise NotImplementedError

    def fetch(self, layer: int):  # what attend needs, without writing
        raise NotImplementedError

    def attend(self, layer: int, kv):
        raise NotImplementedError

    def done(self, outs: list):  # what the timer must evaluate (None: already finished)
        return None

    def step(self):
        outs = [self.attend(i, self.write(i)) for i in range(self.n_layers)]
        self.last = outs
        return self.done(outs)

    def stages(self) -> dict[str, Callable[[], object]]:
        def write():
            for i in range(self.n_layers):
                self.write(i)
            return self.done([])

        def attend():
            return self.done([self.attend(i, self.fetch(i)) for i in range(self.n_layers)])

        return {"step": self.step, "write": write, "attend": attend}

    def output(self, layer: int) -> mx.array:
        """Layer `layer`'s output of the last step, float32 [B, Hq, 1, D]."""
        raise NotImplementedError

    def stored(self, layer: int) -> tuple[mx.array, mx.array]:
        """Layer's K and V as stored (dequantized), float32, oldest attended position first."""
        raise NotImplementedError


class Preallocated(DecodePeer):
    """A peer that owns a pre-allocated cache per layer, K and V [B, Hkv, L, D] in its own array
    type: the first L-1 positions are prefilled, and every write stores the L-th token at the
    fixed index L-1. A subclass converts the float32 data and says how its arrays copy, count
    their bytes and come back as numpy."""

    def __init__(self, data: DecodeData, k, v):
        self.n_layers, self.scale, ctx = data.n_layers, data.scale, data.context_len
        self.pos, self.span = ctx - 1, ctx
        self.k_new, self.v_new = self.copy(k[:, :, ctx - 1 :]), self.copy(v[:, :, ctx - 1 :])
        self.keys = [self.empty_like(k) for _ in range(self.n_layers)]
        self.values = [self.empty_like(v) for _ in range(self.n_layers)]
        for kc, vc in zip(self.keys, self.values):
            kc[:, :, : ctx - 1], vc[:, :, : ctx - 1] = k[:, :, : ctx - 1], v[:, :, : ctx - 1]

    def copy(self, a):
        raise NotImplementedError

    def empty_like(self, a):
        raise NotImplementedError

    def nbytes_of(self, a) -> int:
        raise NotImplementedError

    def to_numpy(self, a) -> np.ndarray:
        raise NotImplementedError

    def no_grad(self):  # the context writes and attention run in
        return contextlib.nullcontext()

    def write(self, layer: int):
        with self.no_grad():
            self.keys[layer][:, :, self.pos : self.pos + 1] = self.k_new
            self.values[layer][:, :, self.pos : self.pos + 1] = self.v_new
        return self.fetch(layer)

    def fetch(self, layer: int):
        return self.keys[layer], self.values[layer]

    def output(self, layer: int) -> mx.array:
        return mx.array(self.to_numpy(self.last[layer]))

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_of(a) for a in self.keys + self.values)

    def stored(self, layer: int):
        return tuple(mx.array(self.to_numpy(a)) for a in self.fetch(layer))
