"""The model's KV cache: each layer's K/V stored in kvbench formats, attended by kvbench kernels.

* A plain spec (same K and V format, per-token scales, no sinks, no window) stores through
  kernels/stores/cache.py's KVCache, and the chosen kernel reads the stored arrays directly: the
  same code path the attention suites time (quantized_matmul and tiled run on packed data).
* Any other spec stores each region (sinks, quantized body, residual) in its own buffers,
  decodes them to one dense array per layer (float32 for a float32 kernel: `reference`,
  `f32_sdpa`; fp16 otherwise) and attends with a dense kernel (reference / sdpa / ops / tiled): a
  dequantize-then-attend path, so its quality is exact but its speed is not that of a fused
  kernel.
"""

from __future__ import annotations

import mlx.core as mx

from kvbench.kernels.attention.registry import KERNELS, kv_scaled, rotated, unsupported_reason
from kvbench.kernels.formats.protocol import Stored
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.formats.rotation import rotate
from kvbench.kernels.model.policies.window import sees
from kvbench.kernels.model.protocol import PartedCache
from kvbench.kernels.model.spec import CacheSpec
from kvbench.kernels.model.stream import Stream
from kvbench.kernels.stores.cache import ALL, KVCache, KVStore
from kvbench.kernels.stores.window import Ring

# ---- caches --------------------------------------------------------------------------------


def attend_kernel(
    kernel: str,
    q,
    k,
    v,
    fmt,
    scale: float,
    tile_kv,
    rot=("none", "none", None, None),
    mask=None,
    kv_scale=((1.0,), (1.0,)),
) -> mx.array:
    """Run KERNELS[kernel] over stored k, v; `mask` the cells each query sees (a boolean
    array), None: causal when several queries are new. `rot`: the (K, V) rotations the cache
    stores rows in and their blocks (CacheSpec.rot: q rotated in, the output rotated back
    out); `kv_scale`: K's and V's per-tensor scales when fmt reads the rows at scale 1 (FP8:
    folded into q and the output)."""
    if mask is None:
        mask = "causal" if q.shape[2] > 1 else None
    dtype = mx.float32 if KERNELS[kernel].float32 else fmt.compute_dtype
    fn = rotated(kv_scaled(KERNELS[kernel].fn, *kv_scale), *rot)
    out = fn(q.astype(dtype), k, v, fmt, mask=mask, scale=scale, tile_kv=tile_kv)
    return out.astype(mx.float32)


def check_kernel(kernel: str, fmt, backend: str = "cpu") -> None:
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; known: {', '.join(KERNELS)}")
    reason = unsupported_reason(kernel, fmt, backend)
    if reason:
        raise ValueError(f"kernel {kernel}: {reason}")


def stored_basis(spec, rot, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
    """The new k, v [1, Hkv, n, D] as a cache stores them before encoding: keys in the stored
    channel order, each rotated as `rot` (spec.rot(head_dim), computed once per cache) says."""
    rk, rv, bk, bv = rot
    return rotate(spec.key_in_order(k), rk, bk), rotate(v, rv, bv)


class LayerFormats:
    """Each layer's K and V formats, fixed at the layer's first write: an FP8 format whose scale
    is calibrated gets K's and V's from that write (vLLM's calculate_kv_scales, per layer);
    every other format is the spec's for every layer. The store reads the rows with `read`
    (FP8 at scale 1) and the kernel folds each layer's scales in (kv_scaled)."""

    def __init__(self, spec, n_layers: int):
        self.fmt = spec.formats()[0]
        self.read = get_format(spec.k_dtype, spec.k_group)  # FP8: scale 1; others: fmt itself
        self.layers: list[tuple | None] = [None] * n_layers
        self.n_saturated = mx.array(0, dtype=mx.int32)  # FP8: elements stored saturated

    def encode(self, layer: int, k: mx.array, v: mx.array) -> tuple[Stored, Stored]:
        if self.layers[layer] is None:
            self.layers[layer] = (self.fmt.calibrate(k, "k"), self.fmt.calibrate(v, "v"))
        kf, vf = self.layers[layer]
        sat = [f.saturated(x) for f, x in ((kf, k), (vf, v))]
        if sat[0] is not None:
            self.n_saturated = self.n_saturated + sat[0] + sat[1]
        return kf.encode(k), vf.encode(v)

    def scales(self, layer: int) -> tuple:
        """(K's, V's) tensor scales of `layer`, as kv_scaled takes them."""
        kf, vf = self.layers[layer]
        return kf.tensor_scale(), vf.tensor_scale()

    def saturated(self) -> int:
        return int(self.n_saturated.item())


class PlainCache:
    """One format for K and V, per-token scales: kernels/stores/cache.py's KVCache, kernel on it."""

    def __init__(self, spec, n_layers, n_kv_heads, head_dim, capacity, kernel, tile_kv=None):
        self.formats = LayerFormats(spec, n_layers)
        self.fmt = self.formats.read
        check_kernel(kernel, self.fmt)
        self.kv = KVCache(self.fmt, n_layers, 1, n_kv_heads, capacity, head_dim)
        self.kernel, self.tile_kv, self.offset = kernel, tile_kv, 0
        self.rot, self.spec = spec.rot(head_dim), spec

    def attend(self, layer: int, q, k, v, scale: float) -> mx.array:
        self.write(layer, k, v)
        return self.read(layer, q, scale)

    def write(self, layer: int, k, v) -> None:
        """The new k, v [1, Hkv, n, D] stored at offset.. (rotated, quantized on write)."""
        parts = self.formats.encode(layer, *stored_basis(self.spec, self.rot, k, v))
        self.kv.put_encoded(layer, self.kv.positions(self.offset, k.shape[2]), *parts)

    def read(self, layer: int, q, scale: float) -> mx.array:
        """The kernel's attention of q [1, Hq, n, D] over the layer's first offset + n positions
        (the n new ones written): q rotated in, the output rotated back; causal."""
        return self.read_seen(layer, q, scale, None)

    def read_seen(self, layer: int, q, scale: float, mask) -> mx.array:
        """read() with `mask` (bool [n, offset + n]: the cells each query sees; None: causal),
        a window by position over every held cell (kernels/model/shift.py ShiftCache)."""
        ks, vs = self.kv.view(layer, self.offset + q.shape[2])
        q, sc = self.spec.query_in_order(q), self.formats.scales(layer)
        return attend_kernel(
            self.kernel, q, ks, vs, self.fmt, scale, self.tile_kv, self.rot, mask, sc
        )

    def advance(self, n: int) -> None:
        self.offset += n
        self.kv.offset = self.offset

    def mark(self) -> int:
        """The state to come back to (rewind): the number of positions held."""
        return self.offset

    def rewind(self, mark: int) -> None:
        """Back to `mark`: the next write lands where it landed after mark() (a decode step
        at a fixed depth, repeated; the same token writes the same bytes again)."""
        self.offset = self.kv.offset = mark

    def arrays(self) -> list[mx.array]:
        return self.kv.arrays()

    def held_bytes(self) -> int:
        """Bytes of the stored arrays' first `offset` positions (measured)."""
        views = [self.kv.view(i, self.offset) for i in range(self.kv.n_layers)]
        return sum(a.nbytes for kv in views for s in kv for a in s.values())

    def saturated(self) -> int:
        """K/V elements written so far that an FP8 format stored saturated (0 for others)."""
        return self.formats.saturated()


class MixedCache:
    """Separate K/V formats, per-channel keys, fp16 sinks and residual window (see module)."""

    def __init__(self, spec, n_layers, n_kv_heads, head_dim, capacity, kernel, tile_kv=None):
        kf, vf = spec.formats()
        f32 = kernel in KERNELS and KERNELS[kernel].float32  # unknown: check_kernel says so
        self.dtype = mx.float32 if f32 else mx.float16
        self.dense_fmt = get_format("fp32" if f32 else "fp16")
        check_kernel(kernel, self.dense_fmt)
        chan = spec.k_axis == "channel"
        if chan:  # each channel's row is recent_tokens positions long: it must suit kf
            try:
                kf.nbytes(head_dim, spec.recent_tokens)
            except ValueError as e:
                reason = f"k_axis channel, recent_tokens {spec.recent_tokens}: {e}"
                raise ValueError(reason) from None
        mk = lambda f, c, r: Stream(spec, f, c, n_kv_heads, head_dim, capacity, r)  # noqa: E731
        self.k = [mk(kf, chan, "k") for _ in range(n_layers)]
        self.v = [mk(vf, False, "v") for _ in range(n_layers)]
        self.kernel, self.tile_kv, self.offset = kernel, tile_kv, 0
        self.rk, self.rv, self.bk, self.bv = spec.rot(head_dim)
        self.spec = spec

    def attend(self, layer: int, q, k, v, scale: float) -> mx.array:
        self.write(layer, k, v)
        return self.read(layer, q, scale)

    def write(self, layer: int, k, v) -> None:
        """rotate -> quantize: the new k, v into the layer's streams."""
        self.k[layer].write(rotate(self.spec.key_in_order(k), self.rk, self.bk))
        self.v[layer].write(rotate(v, self.rv, self.bv))

    def read(self, layer: int, q, scale: float) -> mx.array:
        """dequantize (dense) -> rotate back -> the kernel: the dense view is in the model's
        basis, the same arithmetic as rotating q and the output."""
        kd = {"data": rotate(self.k[layer].dense(self.dtype), self.rk, self.bk)}
        vd = {"data": rotate(self.v[layer].dense(self.dtype), self.rv, self.bv)}
        q = self.spec.query_in_order(q)
        return attend_kernel(self.kernel, q, kd, vd, self.dense_fmt, scale, self.tile_kv)

    def advance(self, n: int) -> None:
        self.offset += n

    def mark(self) -> tuple:
        """The counters of every stream: enough to rewind, because re-writing the same token
        at the same depth writes the same values into the same sink, body and residual cells."""
        return self.offset, [(s.n_sink, s.n_body, s.n_resid) for s in (*self.k, *self.v)]

    def rewind(self, mark: tuple) -> None:
        self.offset, counts = mark
        for s, (a, b, c) in zip((*self.k, *self.v), counts):
            s.n_sink, s.n_body, s.n_resid = a, b, c

    def arrays(self) -> list[mx.array]:
        return [a for s in (*self.k, *self.v) for a in s.arrays()]

    def held_bytes(self) -> int:
        return sum(s.held_bytes() for s in (*self.k, *self.v))

    def saturated(self) -> int:
        """K/V elements written so far that an FP8 format stored saturated (0 for others)."""
        return int(sum(s.n_saturated for s in (*self.k, *self.v)).item())


class WindowCache:
    """One sliding-window layer (mlx-lm's RotatingKVCache(max_size, keep)) in kvbench's window
    layout (kernels/stores/window.py Ring: `keep` sink cells, then a ring of
    window + max_step - 1 cells), K/V stored in one format (a plain spec), attended over every
    cell with the ring's visibility mask."""

    def __init__(self, spec, n_kv_heads, head_dim, window, sinks, max_step, kernel, tile_kv=None):
        if not spec.plain:
            raise ValueError(f"a sliding-window layer holds one plain format; {spec.label} is not")
        self.formats = LayerFormats(spec, 1)
        self.fmt = self.formats.read
        check_kernel(kernel, self.fmt)
        self.ring = Ring(window, sinks, max_step)
        self.kv = KVStore(self.fmt, 1, 1, n_kv_heads, self.ring.size, head_dim)
        self.kernel, self.tile_kv, self.offset = kernel, tile_kv, 0
        self.rot, self.spec = spec.rot(head_dim), spec

    def attend(self, layer: int, q, k, v, scale: float) -> mx.array:
        self.write(layer, k, v)
        return self.read(layer, q, scale)

    def write(self, layer: int, k, v) -> None:
        """As PlainCache's: stored order and rotation, into the ring's next cells."""
        cells = self.ring.write(k.shape[2])
        parts = self.formats.encode(0, *stored_basis(self.spec, self.rot, k, v))
        self.kv.put_encoded(0, (ALL, ALL, mx.array(cells)), *parts)

    def read(self, layer: int, q, scale: float) -> mx.array:
        """Every cell, with the ring's visibility mask for the q.shape[2] new positions."""
        qpos = range(self.offset, self.offset + q.shape[2])  # StreamingLLM's set: policies/window
        mask = mx.array(sees(self.ring.pos, qpos, self.ring.sinks, self.ring.window))
        ks, vs = self.kv.view(0, self.ring.size)
        q, sc = self.spec.query_in_order(q), self.formats.scales(0)
        return attend_kernel(
            self.kernel, q, ks, vs, self.fmt, scale, self.tile_kv, self.rot, mask, sc
        )

    def advance(self, n: int) -> None:
        self.offset += n

    def mark(self) -> tuple:
        return self.offset, self.ring.pos.copy(), self.ring.next

    def rewind(self, mark: tuple) -> None:
        self.offset, pos, self.ring.next = mark
        self.ring.pos = pos.copy()

    def arrays(self) -> list[mx.array]:
        return self.kv.arrays()

    def held_bytes(self) -> int:
        return sum(a.nbytes for a in self.kv.arrays()) * self.ring.held() // self.ring.size

    def saturated(self) -> int:
        return self.formats.saturated()


class LayeredCache:
    """A model whose layers differ (sliding-window layers beside global ones, as the model's
    make_cache asks): one store per layer, each holding that layer alone; a RewindableCache
    (kernels/model/protocol.py) as PlainCache and MixedCache are."""

    def __init__(self, stores: list):
        self.stores, self.offset = stores, 0

    def attend(self, layer: int, q, k, v, scale: float) -> mx.array:
        return self.stores[layer].attend(0, q, k, v, scale)

    def write(self, layer: int, k, v) -> None:
        self.stores[layer].write(0, k, v)

    def read(self, layer: int, q, scale: float) -> mx.array:
        return self.stores[layer].read(0, q, scale)

    def advance(self, n: int) -> None:
        self.offset += n
        for s in self.stores:
            s.advance(n)

    def mark(self) -> list:
        return [s.mark() for s in self.stores]

    def rewind(self, mark: list) -> None:
        for s, m in zip(self.stores, mark):
            s.rewind(m)
        self.offset = self.stores[0].offset

    def arrays(self) -> list[mx.array]:
        return [a for s in self.stores for a in s.arrays()]

    def held_bytes(self) -> int:
        return sum(s.held_bytes() for s in self.stores)

    def saturated(self) -> int:
        return sum(s.saturated() for s in self.stores)


def make_cache(
    spec: CacheSpec, config, capacity: int, kernel: str = "reference", tile_kv=None, max_step=None
) -> PartedCache:
    """A cache for `config` (kernels/model/load.py Shape) holding up to `capacity` positions:
    one store for every layer when every layer keeps its whole context, else one per layer
    (config.windows: (window, sinks) of a sliding-window layer, kernels/stores/window.py's
    ring; `max_step`, the most tokens one forward writes, sizes the ring: default capacity)."""
    cls = PlainCache if spec.plain else MixedCache
    h, d = config.n_kv_heads, config.head_dim
    windows = getattr(config, "windows", None) or (None,) * config.n_layers
    if not any(windows):
        return cls(spec, config.n_layers, h, d, capacity, kernel, tile_kv)
    step = max_step or capacity
    stores = [
        cls(spec, 1, h, d, capacity, kernel, tile_kv)
        if w is None
        else WindowCache(spec, h, d, w[0], w[1], step, kernel, tile_kv)
        for w in windows
    ]
    return LayeredCache(stores)


def layer_windows(net) -> tuple:
    """Per layer None (mlx-lm's KVCache: the whole context) or (max_size, keep) (its
    RotatingKVCache: a sliding window), from the model's own make_cache (mlx-lm's default,
    a KVCache per layer, where it has none)."""
    from mlx_lm.models import cache as mc

    out = []
    for i, c in enumerate(mc.make_prompt_cache(net)):
        if type(c) is mc.KVCache:
            out.append(None)
        elif type(c) is mc.RotatingKVCache:
            out.append((c.max_size, c.keep))
        else:
            raise ValueError(f"layer {i}: mlx-lm cache {type(c).__name__}; kvbench stores K/V "
                             "for KVCache and RotatingKVCache layers only")  # fmt: skip
    return tuple(out)
