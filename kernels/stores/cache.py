"""KV stores: every layer's K and V pre-allocated, and the full cache built on them.

A store holds per layer one K and one V dict of the format's arrays, each
[n_buffers, n_kv_heads, size, ...] (a buffer is a sequence of the full cache, or a stream of a
layout: kernels/stores/layouts.py LayoutStore). Writes are slice updates into the pre-allocated
buffers
(as mlx-lm's KVCache does), so a decode step writes one position per layer instead of growing an
array. The bytes a store allocates are measured by the engines (active-memory growth), not here.
"""

from __future__ import annotations

import mlx.core as mx

from kvbench.kernels.formats.protocol import Format, Stored

ALL = slice(None)


def write_into(target: mx.array, index: tuple, part: mx.array) -> None:
    """target[index] = part, always into target's own buffer. MLX hands back the update itself
    when a slice update covers the whole array: the pre-allocated buffer is freed and every
    layer written from one part shares that part (a 256 MiB 8-layer cache measured resident as
    16 MiB until each layer's first write). Such a write goes in as two partial writes."""
    if target[index].shape != target.shape:
        target[index] = part
        return
    full = mx.broadcast_to(part, target.shape)
    axis = next((i for i, n in enumerate(target.shape) if n > 1), None)
    if axis is None:  # a single element: a copy of its own
        target[...] = mx.array(full)
        return
    lead = (ALL,) * axis
    target[(*lead, slice(0, 1))] = full[(*lead, slice(0, 1))]
    target[(*lead, slice(1, None))] = full[(*lead, slice(1, None))]


class KVStore:
    """Per layer K and V, each the format's arrays [n_buffers, n_kv_heads, size, ...]."""

    def __init__(
        self, fmt: Format, n_layers: int, n_buffers: int, n_kv_heads: int, size: int, head_dim: int
    ):
        self.fmt, self.size = fmt, size
        shape = (n_buffers, n_kv_heads, size, head_dim)
        self.keys: list[Stored] = [fmt.alloc(shape) for _ in range(n_layers)]
        self.values: list[Stored] = [fmt.alloc(shape) for _ in range(n_layers)]

    @property
    def n_layers(self) -> int:
        return len(self.keys)

    def put(self, layer: int, index: tuple, k: mx.array, v: mx.array) -> None:
        """Store k, v at `index` (buffers, heads, positions) of `layer`, encoding on write."""
        self._put_parts(layer, index, self.fmt.encode(k), self.fmt.encode(v))

    def put_encoded(self, layer: int, index: tuple, k_parts: Stored, v_parts: Stored) -> None:
        """Store already encoded K and V parts at `index` of `layer` (each encoded its own way:
        a calibrated FP8 K and V have different scales)."""
        self._put_parts(layer, index, k_parts, v_parts)

    def _put_parts(self, layer: int, index: tuple, k_parts: Stored, v_parts: Stored) -> None:
        for store, parts in ((self.keys[layer], k_parts), (self.values[layer], v_parts)):
            for name, part in parts.items():
                write_into(store[name], index, part)

    def put_every_layer(self, index: tuple, k: mx.array, v: mx.array) -> None:
        """Store the same k, v at `index` of every layer (encoded once)."""
        k_parts, v_parts = self.fmt.encode(k), self.fmt.encode(v)
        for layer in range(self.n_layers):
            self._put_parts(layer, index, k_parts, v_parts)
            mx.eval(self.layer_arrays(layer))  # one layer at a time bounds peak memory

    def view(self, layer: int, n_kv: int, buffers: slice = ALL) -> tuple[Stored, Stored]:
        """Buffers `buffers`, positions [0, n_kv) of `layer`'s K and V (slices, no copy)."""
        if buffers == ALL and n_kv == self.size:
            return self.keys[layer], self.values[layer]
        cut = lambda s: {name: a[buffers, :, :n_kv] for name, a in s.items()}  # noqa: E731
        return cut(self.keys[layer]), cut(self.values[layer])

    def layer_arrays(self, layer: int) -> list[mx.array]:
        return [*self.keys[layer].values(), *self.values[layer].values()]

    def arrays(self) -> list[mx.array]:
        return [a for layer in range(self.n_layers) for a in self.layer_arrays(layer)]


class KVCache(KVStore):
    """The full KV cache: every layer's K and V for n_seqs sequences, `capacity` positions
    each (one buffer per sequence, the batch axis)."""

    def __init__(
        self, fmt: Format, n_layers: int, n_seqs: int, n_kv_heads: int, capacity: int, head_dim: int
    ):
        super().__init__(fmt, n_layers, n_seqs, n_kv_heads, capacity, head_dim)
        self.offset = 0  # next position to write (the number of positions filled)

    @property
    def capacity(self) -> int:
        return self.size

    def positions(self, pos: int, n: int) -> tuple:
        if pos < 0 or pos + n > self.capacity:
            raise IndexError(f"write of {n} positions at {pos} exceeds capacity {self.capacity}")
        return (ALL, ALL, slice(pos, pos + n))

    def write(self, layer: int, k: mx.array, v: mx.array, pos: int) -> None:
        """Store k, v [B, Hkv, n, D] at positions pos..pos+n of `layer` (encoding on write)."""
        self.put(layer, self.positions(pos, k.shape[2]), k, v)

    def fill(self, k: mx.array, v: mx.array) -> None:
        """Prefill: write the same k, v [B, Hkv, n, D] into every layer from position 0."""
        self.put_every_layer(self.positions(0, k.shape[2]), k, v)
        self.offset = k.shape[2]
