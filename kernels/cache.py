"""The full KV cache: every layer's K and V pre-allocated to a fixed capacity.

Storage per layer is the format's dict of arrays, each [n_seqs, n_kv_heads, capacity, ...].
Writes are slice updates into the pre-allocated buffers (as mlx-lm's KVCache does), so a decode
step writes one position per layer instead of growing an array. `alloc_bytes` is measured from
the arrays actually allocated, not computed from the formula.
"""

from __future__ import annotations

import mlx.core as mx

from .formats import Stored


class KVCache:
    def __init__(
        self, fmt, n_layers: int, n_seqs: int, n_kv_heads: int, capacity: int, head_dim: int
    ):
        self.fmt = fmt
        self.capacity = capacity
        shape = (n_seqs, n_kv_heads, capacity, head_dim)
        self.keys: list[Stored] = [fmt.alloc(shape) for _ in range(n_layers)]
        self.values: list[Stored] = [fmt.alloc(shape) for _ in range(n_layers)]
        self.offset = 0  # next position to write (the number of positions filled)

    @property
    def n_layers(self) -> int:
        return len(self.keys)

    def write(self, layer: int, k: mx.array, v: mx.array, pos: int) -> None:
        """Store k, v [B, Hkv, n, D] at positions pos..pos+n of `layer` (encoding on write)."""
        n = k.shape[2]
        if pos < 0 or pos + n > self.capacity:
            raise IndexError(f"write of {n} positions at {pos} exceeds capacity {self.capacity}")
        for store, x in ((self.keys[layer], k), (self.values[layer], v)):
            for name, part in self.fmt.encode(x).items():
                store[name][:, :, pos : pos + n, ...] = part

    def view(self, layer: int, n_kv: int) -> tuple[Stored, Stored]:
        """The first n_kv positions of `layer`'s K and V (slices, no copy)."""
        if n_kv == self.capacity:
            return self.keys[layer], self.values[layer]
        cut = lambda s: {name: a[:, :, :n_kv, ...] for name, a in s.items()}  # noqa: E731
        return cut(self.keys[layer]), cut(self.values[layer])

    def fill(self, k: mx.array, v: mx.array) -> None:
        """Prefill: write the same k, v [B, Hkv, n, D] into every layer from position 0."""
        for layer in range(self.n_layers):
            self.write(layer, k, v, 0)
            mx.eval(self.layer_arrays(layer))  # one layer at a time bounds peak memory
        self.offset = k.shape[2]

    def layer_arrays(self, layer: int) -> list[mx.array]:
        return [*self.keys[layer].values(), *self.values[layer].values()]

    def arrays(self) -> list[mx.array]:
        return [a for layer in range(self.n_layers) for a in self.layer_arrays(layer)]

    def alloc_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())
