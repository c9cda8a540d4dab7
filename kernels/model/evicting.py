"""A model cache that keeps only the positions a CachePolicy selects (kernels/model/protocol.py;
kernels/model/policies/): token eviction, composed with every per-token format and rotation.

Each layer stores its cells in the spec's format (rotated, quantized on write, as PlainCache)
with the position each KV head's cell holds. Every forward pass's queries and the held cells
go to the policy (`observe`); `compress()`, called where a deployment compresses (the end of the
context's prefill, kvpress's setup: the question is never compressed), asks `select` per layer
and gathers each KV head's kept cells to the front; a decode policy (`decode`) is asked again
after every later pass. Heads that keep different counts (adakv) pad to the layer's largest
count with masked cells. Attention decodes the held cells to a dense array and runs a dense
kernel with the position mask (a dequantize-then-attend path, as MixedCache).

`kept_bytes` is the exact bytes of what is kept: the format's bytes of every kept cell (K and
V), the format's per-tensor scales, plus what the policy stores (state_bytes); the padding
cells adakv allocates are in `held_bytes` (measured), not in kept_bytes.
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from kvbench.kernels.attention.registry import KERNELS
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.formats.rotation import rotate
from kvbench.kernels.model.cache import (
    LayerFormats,
    WindowCache,
    attend_kernel,
    check_kernel,
    stored_basis,
)
from kvbench.kernels.model.protocol import Observation


class EvictingCache:
    """PartedCache (kernels/model/protocol.py) whose cells a policy selects (see module)."""

    def __init__(self, spec, config, capacity, kernel, policy, ropes=None, tile_kv=None):
        if not spec.plain:
            raise ValueError(f"a cache policy holds one per-token format; {spec.label} is not")
        self.formats = LayerFormats(spec, config.n_layers)
        self.fmt = self.formats.read
        f32 = kernel in KERNELS and KERNELS[kernel].float32
        self.dtype = mx.float32 if f32 else mx.float16
        self.dense_fmt = get_format("fp32" if f32 else "fp16")
        check_kernel(kernel, self.dense_fmt)
        h, d, n = config.n_kv_heads, config.head_dim, config.n_layers
        self.k = [self.fmt.alloc((1, h, capacity, d)) for _ in range(n)]
        self.v = [self.fmt.alloc((1, h, capacity, d)) for _ in range(n)]
        self.pos = [np.full((h, capacity), -1, np.int64) for _ in range(n)]
        self.cells = [0] * n  # cells in use per layer (each head's count <= this)
        self.last: list[Observation | None] = [None] * n
        self.kernel, self.tile_kv, self.offset = kernel, tile_kv, 0
        self.rot, self.spec, self.policy = spec.rot(d), spec, policy
        self.ropes, self.n_layers, self.compressed = ropes, n, False
        self.head_dim, self.policy_s = d, 0.0
        self.compress_at: int | None = None  # compress once when this many positions are held

    def attend(self, layer: int, q, k, v, scale: float) -> mx.array:
        self.write(layer, k, v)
        return self.read(layer, q, scale)

    def write(self, layer: int, k, v) -> None:
        """The new k, v [1, Hkv, n, D] stored (rotated, quantized) in the next cells."""
        kp, vp = self.formats.encode(layer, *stored_basis(self.spec, self.rot, k, v))
        c, n = self.cells[layer], k.shape[2]
        if c + n > self.pos[layer].shape[1]:
            raise ValueError(f"cache full: {c} + {n} cells > {self.pos[layer].shape[1]}")
        for store, parts in ((self.k[layer], kp), (self.v[layer], vp)):
            for name, part in parts.items():
                store[name][:, :, c : c + n] = part
        self.pos[layer][:, c : c + n] = np.arange(self.offset, self.offset + n)
        self.cells[layer] = c + n

    def dense(self, layer: int, dtype) -> tuple[mx.array, mx.array]:
        """The held cells' K and V [1, Hkv, cells, D] decoded to dtype, in the model's basis
        (an FP8 format's rows, read at scale 1, times the layer's K and V scales)."""
        rk, rv, bk, bv = self.rot
        c = self.cells[layer]
        kd = self.fmt.decode({n: a[:, :, :c] for n, a in self.k[layer].items()}, dtype)
        vd = self.fmt.decode({n: a[:, :, :c] for n, a in self.v[layer].items()}, dtype)
        ks, vs = self.formats.scales(layer)
        return rotate(head_scaled(kd, ks), rk, bk), rotate(head_scaled(vd, vs), rv, bv)

    def read(self, layer: int, q, scale: float) -> mx.array:
        """Attention of q [1, Hq, n, D] over the held cells, each query seeing the cells at or
        before its position; the pass then goes to the policy."""
        c, pos = self.cells[layer], self.pos[layer][:, : self.cells[layer]]
        kd, vd = self.dense(layer, self.dtype)
        qpos = np.arange(self.offset, self.offset + q.shape[2])
        seen = (pos[:, None, :] >= 0) & (pos[:, None, :] <= qpos[None, :, None])  # [H, n, c]
        mask = mx.repeat(mx.array(seen[None]), q.shape[1] // kd.shape[1], axis=1)
        q = self.spec.query_in_order(q)
        out = attend_kernel(self.kernel, q, {"data": kd}, {"data": vd}, self.dense_fmt, scale,
                            self.tile_kv, mask=mask)  # fmt: skip
        self._observe(layer, q, pos, c)
        return out

    def _observe(self, layer: int, q, pos, c) -> None:
        if self.compressed and not self.policy.decode:
            return  # selected once: what follows the context is never compressed
        kd, vd = self.dense(layer, mx.float32)
        rope = self.ropes[layer] if self.ropes else None
        obs = Observation(layer, self.n_layers, q.astype(mx.float32), self.offset, kd, vd,
                          pos.copy(), rope)  # fmt: skip
        self.policy.observe(obs)
        self.last[layer] = obs

    def advance(self, n: int) -> None:
        self.offset += n
        if self.compressed and self.policy.decode:
            self.compress()
        elif not self.compressed and self.offset == self.compress_at:
            self.compress()  # the context's end, set by the caller (compress.py)

    def compress(self) -> None:
        """Every layer keeps the cells the policy selects (the end of the context's prefill;
        after every pass for a decode policy); its wall time, the pass's writes evaluated
        first, adds to policy_s (the policy's own cost beside the passes)."""
        mx.eval(self.arrays())
        t0 = time.perf_counter()
        for layer in self.layers():
            last = self.last[layer]  # the layer's last pass, over the cells held now
            kd, vd = self.dense(layer, mx.float32)
            pos = self.pos[layer][:, : self.cells[layer]].copy()
            obs = Observation(layer, self.n_layers, last.q, last.q_start, kd, vd, pos, last.rope)
            self.keep(layer, self.policy.select(obs))
        mx.eval(self.arrays())
        self.policy_s += time.perf_counter() - t0
        if not self.compressed:  # what the context kept (decode policies hold it since)
            self.kept_cells_at, self.kept_bytes_at = self.kept_cells(), self.kept_bytes()
        self.compressed = True
        if not self.policy.decode:  # never observed or selected again: the passes' queries
            self.last = [None] * self.n_layers  # and dense cells go (not held by the steps)

    def layers(self) -> list[int]:
        """The layers whose cells the policy selects."""
        return list(range(self.n_layers))

    def keep(self, layer: int, keep: np.ndarray) -> None:
        """Gather each head's kept cells (bool [Hkv, cells]) to the front, in cell order."""
        counts = keep.sum(axis=1)
        m = int(counts.max())
        idx = np.zeros((keep.shape[0], m), np.int64)
        pos = np.full((keep.shape[0], m), -1, np.int64)
        for h in range(keep.shape[0]):
            cells = np.flatnonzero(keep[h])
            idx[h, : len(cells)], idx[h, len(cells) :] = cells, cells[-1] if len(cells) else 0
            pos[h, : len(cells)] = self.pos[layer][h, cells]
        at = mx.array(idx)[None, :, :, None]  # [1, H, m, 1]
        for store in (self.k[layer], self.v[layer]):
            for name, a in store.items():
                part = a[:, :, : self.cells[layer]]  # [1, H, cells, W]
                at_w = mx.broadcast_to(at, (*at.shape[:3], part.shape[-1]))
                store[name][:, :, :m] = mx.take_along_axis(part, at_w, axis=2)
        self.pos[layer][:] = -1
        self.pos[layer][:, :m] = pos
        self.cells[layer] = m

    def kept_cells(self) -> list[list[int]]:
        """Per layer, per KV head: positions held now."""
        return [[int((p[h] >= 0).sum()) for h in range(p.shape[0])] for p in self.pos]

    def read_cells(self) -> list[int]:
        """Per layer: the cells a pass's attention reads for each KV head besides the pass's
        own, as held now: the kept cells, and a layer whose heads keep different counts
        (adakv) pads every head to its most (read, masked)."""
        return list(self.cells)

    def kept_positions(self) -> list[np.ndarray]:
        """Per layer: [Hkv, cells] positions held (-1 padding), each head's ascending."""
        return [np.sort(p[:, :c], axis=-1) for p, c in zip(self.pos, self.cells)]

    def kept_bytes(self) -> int:
        """Exact bytes of what is kept (see module): every kept cell's K and V rows in their
        formats, each layer's per-tensor scales, and the policy's own state."""
        kf, vf = self.spec.formats()
        h, d = self.pos[0].shape[0], self.head_dim
        cells = sum(sum(layer) for layer in self.kept_cells())
        fixed = (kf.tensor_bytes(h) + vf.tensor_bytes(h)) * self.n_layers
        return kf.nbytes(cells, d) + vf.nbytes(cells, d) + fixed + self.policy.state_bytes()

    def mark(self):
        return self.offset, [p.copy() for p in self.pos], list(self.cells)

    def rewind(self, mark) -> None:
        self.offset, pos, cells = mark
        self.pos, self.cells = [p.copy() for p in pos], list(cells)

    def arrays(self) -> list[mx.array]:
        return [a for s in (*self.k, *self.v) for a in s.values()]

    def held_bytes(self) -> int:
        return sum(a[:, :, :c].nbytes for s, c in zip((*self.k, *self.v), self.cells * 2)
                   for a in s.values())  # fmt: skip

    def saturated(self) -> int:
        return self.formats.saturated()


def head_scaled(x: mx.array, scale: tuple) -> mx.array:
    """x [1, Hkv, cells, D] times its tensor scale: one, or one per KV head (FP8)."""
    if scale == (1.0,):
        return x
    return x * mx.array(scale, dtype=x.dtype).reshape(1, -1, 1, 1)


def ropes_of(model) -> list | None:
    """Each layer's RoPE module (mlx-lm's `self_attn.rope`), for the policies that rotate
    queries back (expected_attention); None where the architecture names it otherwise."""
    layers = getattr(model.net, "layers", None) or []
    ropes = [getattr(getattr(layer, "self_attn", None), "rope", None) for layer in layers]
    return ropes if ropes and all(r is not None for r in ropes) else None


class WindowedEvictingCache(EvictingCache):
    """A model with sliding-window layers (Gemma 3) under a policy: its window layers keep
    their own rings (cache.py WindowCache: the model's sinks + window at every write, never
    asked), its global layers the cells the policy selects. kept_cells counts a window layer's
    visible positions, min(n, window + sinks), as the model's byte formula does."""

    def __init__(
        self, spec, config, capacity, kernel, policy, ropes, windows, max_step, tile_kv=None
    ):
        super().__init__(spec, config, capacity, kernel, policy, ropes, tile_kv)
        h, d = config.n_kv_heads, config.head_dim
        self.rings = {i: WindowCache(spec, h, d, w[0], w[1], max_step, kernel, tile_kv)
                      for i, w in enumerate(windows) if w}  # fmt: skip
        for i in self.rings:  # the policy's arrays for a window layer: none
            self.k[i] = self.v[i] = {}
            self.pos[i] = np.full((h, 0), -1, np.int64)

    def write(self, layer: int, k, v) -> None:
        if layer in self.rings:
            return self.rings[layer].write(0, k, v)
        super().write(layer, k, v)

    def read(self, layer: int, q, scale: float) -> mx.array:
        if layer in self.rings:
            return self.rings[layer].read(0, q, scale)
        return super().read(layer, q, scale)

    def advance(self, n: int) -> None:
        for ring in self.rings.values():
            ring.advance(n)
        super().advance(n)

    def layers(self):
        return [i for i in range(self.n_layers) if i not in self.rings]

    def kept_cells(self) -> list[list[int]]:
        out = super().kept_cells()
        for i, r in self.rings.items():  # the positions a ring layer shows the next query
            out[i] = [min(self.offset, r.ring.window + r.ring.sinks)] * self.pos[i].shape[0]
        return out

    def read_cells(self) -> list[int]:
        out = super().read_cells()
        for i, cells in enumerate(self.kept_cells()):
            out[i] = max(cells) if i in self.rings else out[i]  # a ring: its visible positions
        return out

    def mark(self):
        return super().mark(), [r.mark() for r in self.rings.values()]

    def rewind(self, mark) -> None:
        mine, rings = mark
        super().rewind(mine)
        for r, m in zip(self.rings.values(), rings):
            r.rewind(m)

    def arrays(self) -> list[mx.array]:
        return super().arrays() + [a for r in self.rings.values() for a in r.arrays()]

    def held_bytes(self) -> int:
        return super().held_bytes() + sum(r.held_bytes() for r in self.rings.values())

    def saturated(self) -> int:
        return super().saturated() + sum(r.saturated() for r in self.rings.values())


def make_policy_cache(spec, model, capacity: int, kernel: str, policy, tile_kv=None, max_step=None):
    """An EvictingCache for `model` (kernels/model/load.py Model) asking `policy`; a model with
    sliding-window layers keeps their rings (max_step: the most tokens one pass writes)."""
    windows = getattr(model.config, "windows", None) or ()
    if any(windows):
        return WindowedEvictingCache(spec, model.config, capacity, kernel, policy, ropes_of(model),
                                     windows, max_step or capacity, tile_kv)  # fmt: skip
    return EvictingCache(spec, model.config, capacity, kernel, policy, ropes_of(model), tile_kv)
