"""Peers: the KV caches and attention people would otherwise use, driven like kvbench's own.

Each peer runs one decode case in its own framework over the same float32 data (kernels/data.py
make_qkv, converted once when the peer is built): it fills its cache with the first L-1
positions, takes one priming step (any growth of its buffers lands there), and then every timed
step writes the L-th token into every layer and attends over the cache. Every sample is the same
L-th step: mlx-lm's caches are rewound with their own `trim(1)` (a Python integer update, no
array work) before the write; torch and numpy caches are written at a fixed index.

Peers import their package lazily, so this module imports without mlx-lm or torch; a missing
package is a reason to skip (`missing_reason`), never an error. This module knows nothing of the
harness: it gets arrays and returns arrays.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import sys
import types
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


# ---- mlx-lm ------------------------------------------------------------------------------


def mlx_lm_models():
    """mlx_lm.models.cache and mlx_lm.models.base. mlx_lm/__init__ imports its generate and
    convert stack (transformers, and torch when installed: 6-9 s on the 2-core CPU) that these
    two modules do not use; unless mlx_lm is already imported, they are loaded under a bare
    package object instead (the process then has no mlx_lm.load / generate)."""
    if "mlx_lm" not in sys.modules:
        spec = importlib.util.find_spec("mlx_lm")
        pkg = types.ModuleType("mlx_lm", "mlx-lm's models only, loaded by kvbench")
        pkg.__path__, pkg.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules["mlx_lm"] = pkg
    import mlx_lm.models.base as base
    import mlx_lm.models.cache as cache

    return cache, base


def _flat(x) -> list[mx.array]:
    """The arrays of nested lists and tuples of arrays, in order."""
    return [x] if isinstance(x, mx.array) else [a for y in x for a in _flat(y)]


class MlxLm(DecodePeer):
    """mlx-lm's cache classes with mlx-lm's attention function, one layer at a time as its
    models call them: `keys, values = cache.update_and_fetch(k, v)` then
    `scaled_dot_product_attention(queries, keys, values, cache=cache, scale, mask)`."""

    def __init__(self, data: DecodeData, make_cache: Callable, act: mx.Dtype):
        self.sdpa = mlx_lm_models()[1].scaled_dot_product_attention
        self.n_layers, self.scale = data.n_layers, data.scale
        ctx = data.context_len
        self.q = data.q.astype(act)
        # the new token converted on its own: a slice of the converted context would keep the
        # whole converted copy alive beside the cache (counted in the peer's memory, not kvbench's)
        self.k_new, self.v_new = (x[:, :, ctx - 1 :].astype(act) for x in (data.k, data.v))
        mx.eval(self.q, self.k_new, self.v_new)
        k, v = data.k[:, :, : ctx - 1].astype(act), data.v[:, :, : ctx - 1].astype(act)
        self.caches = [make_cache() for _ in range(self.n_layers)]
        for c in self.caches:  # prefill, one layer at a time to bound peak memory
            c.update_and_fetch(k, v)
            mx.eval(self.cache_arrays(c))
        mx.eval([c.update_and_fetch(self.k_new, self.v_new) for c in self.caches])  # priming
        self.span = min(data.window + data.sinks, ctx) if data.window else ctx

    @staticmethod
    def cache_arrays(c) -> list:
        return [c.keys, c.values]

    def write(self, layer: int):
        c = self.caches[layer]
        c.trim(1)  # back to L-1 positions: every sample is the same L-th step
        return c.update_and_fetch(self.k_new, self.v_new)

    def fetch(self, layer: int):
        return self.caches[layer].keys_and_values()

    def attend(self, layer: int, kv):
        c = self.caches[layer]
        # a fresh array object per call: mlx-lm's quantized path does `queries *= scale`,
        # which would rescale our stored q in place; its models pass a new q every call
        q = self.q.reshape(self.q.shape)
        mask = c.make_mask(1, return_array=False, window_size=None)  # as models ask: None here
        return self.sdpa(q, *kv, cache=c, scale=self.scale, mask=mask)

    def done(self, outs: list):
        return outs + [self.cache_arrays(c) for c in self.caches]

    def arrays(self) -> list[mx.array]:
        """Every MLX array the caches hold (a quantized cache's data, scales and biases)."""
        return _flat([self.cache_arrays(c) for c in self.caches])

    def output(self, layer: int) -> mx.array:
        return self.last[layer].astype(mx.float32)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)  # capacity, mlx-lm's 256-step padding included

    def stored(self, layer: int):
        k, v = self.caches[layer].keys_and_values()
        return k.astype(mx.float32), v.astype(mx.float32)


def mlx_lm(data: DecodeData) -> MlxLm:
    return MlxLm(data, mlx_lm_models()[0].KVCache, MX_DTYPES[data.kv_dtype])


class MlxLmQuant(MlxLm):
    def __init__(self, data: DecodeData):
        QuantizedKVCache = mlx_lm_models()[0].QuantizedKVCache
        self.bits, self.group_size = QUANT_BITS[data.kv_dtype], data.group_size or 64
        make = lambda: QuantizedKVCache(group_size=self.group_size, bits=self.bits)  # noqa: E731
        super().__init__(data, make, mx.float16)

    def stored(self, layer: int):
        kq, vq = self.caches[layer].keys_and_values()  # (data, scales, biases) each
        deq = lambda t: mx.dequantize(*t, group_size=self.group_size, bits=self.bits)  # noqa: E731
        return deq(kq).astype(mx.float32), deq(vq).astype(mx.float32)


class MlxLmRotating(MlxLm):
    def __init__(self, data: DecodeData):
        RotatingKVCache = mlx_lm_models()[0].RotatingKVCache
        size, keep = (data.window or data.context_len) + data.sinks, data.sinks
        make = lambda: RotatingKVCache(max_size=size, keep=keep)  # noqa: E731
        super().__init__(data, make, MX_DTYPES[data.kv_dtype])

    def stored(self, layer: int):
        c = self.caches[layer]
        k, v = c.keys_and_values()
        if c.offset > c.max_size:  # wrapped: the sinks, then slot _idx holds the oldest position
            keep, i = c.keep, c._idx
            k, v = (
                mx.concatenate([x[:, :, :keep], x[:, :, i:], x[:, :, keep:i]], axis=2)
                for x in (k, v)
            )
        return k.astype(mx.float32), v.astype(mx.float32)


# ---- peers with a pre-allocated cache ----------------------------------------------------


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


class TorchSdpa(Preallocated):
    """torch.nn.functional.scaled_dot_product_attention (enable_gqa=True) over a preallocated
    torch cache per layer, written by slice assignment. Work on CPU is synchronous; on CUDA
    each timed call ends with torch.cuda.synchronize()."""

    def __init__(self, data: DecodeData):
        import torch
        import torch.nn.functional as F

        self.torch, self.F = torch, F
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
        dt, dev = dtype[data.kv_dtype], torch.device(data.device)
        self.cuda = dev.type == "cuda"
        to = lambda a: torch.from_numpy(np.array(a)).to(dev, dt)  # noqa: E731
        self.q = to(data.q)
        super().__init__(data, to(data.k), to(data.v))
        self.done([])

    def copy(self, a):
        return a.clone()

    def empty_like(self, a):
        return self.torch.empty_like(a)

    def nbytes_of(self, a) -> int:
        return a.numel() * a.element_size()

    def to_numpy(self, a) -> np.ndarray:
        return a.float().cpu().numpy()

    def no_grad(self):
        return self.torch.no_grad()

    def attend(self, layer: int, kv):
        with self.no_grad():
            return self.F.scaled_dot_product_attention(
                self.q, *kv, scale=self.scale, enable_gqa=True
            )

    def done(self, outs: list):
        if self.cuda:
            self.torch.cuda.synchronize()
        return None


class NumpyRef(Preallocated):
    """Plain numpy float32 decode attention over a preallocated numpy cache: GQA folded into
    rows (each KV head serves its G query heads in one matmul), max-subtracted softmax."""

    def __init__(self, data: DecodeData):
        q, k, v = (np.array(a, dtype=np.float32) for a in (data.q, data.k, data.v))
        super().__init__(data, k, v)
        b, hq, _, d = q.shape
        hkv = k.shape[1]
        self.q_shape = q.shape
        self.qg = (q * self.scale).reshape(b, hkv, hq // hkv, d)  # [B, Hkv, G, D]

    def copy(self, a):
        return a.copy()

    def empty_like(self, a):
        return np.empty_like(a)

    def nbytes_of(self, a) -> int:
        return a.nbytes

    def to_numpy(self, a) -> np.ndarray:
        return np.asarray(a, dtype=np.float32)

    def attend(self, layer: int, kv):
        k, v = kv
        scores = self.qg @ k.swapaxes(-1, -2)  # [B, Hkv, G, L]
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        return (probs @ v).reshape(self.q_shape)  # [B, Hkv, G, D] -> [B, Hq, 1, D]


# ---- registry ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    make: Callable  # DecodeData -> DecodePeer (allocates, prefills and primes: untimed)
    module: str  # the package whose absence skips the case
    install: str  # how to get it (the skip reason says so)
    formats: tuple[str, ...]  # kv_dtype values it runs
    backends: tuple[str, ...]  # kvbench backends it runs beside
    uses_mlx: bool = True  # its arrays live in MLX memory (peak memory is tracked)
    windowed: bool = False  # honours the case's window


MLX_LM = "mlx-lm not installed: pip install kvbench[peers]"
TORCH = (
    "torch not installed: pip install kvbench[peers] (macOS); on Linux a CPU or CUDA build of "
    "torch>=2.5, see docs/peers.md"
)
ANY_MLX = ("cpu", "metal", "cuda")

PEERS = {
    "mlx_lm": Peer(mlx_lm, "mlx_lm", MLX_LM, DENSE, ANY_MLX),
    "mlx_lm_quant": Peer(MlxLmQuant, "mlx_lm", MLX_LM, tuple(QUANT_BITS), ANY_MLX),
    "mlx_lm_rotating": Peer(MlxLmRotating, "mlx_lm", MLX_LM, DENSE, ANY_MLX, windowed=True),
    "torch_sdpa": Peer(TorchSdpa, "torch", TORCH, DENSE, ("cpu", "cuda"), uses_mlx=False),
    "numpy_ref": Peer(NumpyRef, "numpy", "numpy not installed", ("fp32",), ("cpu",), False),
}


EXTERNAL_PEERS = ("llama.cpp",)  # peers outside MLX, run by their own engine (harness/engines)


def kernel_kind(name: str) -> str:
    """ "peer" for a peer kernel, "kvbench" for kvbench's own (recorded on every row)."""
    return "peer" if name in PEERS or name in EXTERNAL_PEERS else "kvbench"


def version(name: str) -> str:
    """The peer's package and version, e.g. "mlx-lm 0.32.2" (recorded on its rows)."""
    dist = {"mlx_lm": "mlx-lm"}.get(PEERS[name].module, PEERS[name].module)
    try:
        return f"{dist} {importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return dist


def missing_reason(name: str) -> str | None:
    """Why peer `name` cannot be imported here (its package is absent), or None."""
    peer = PEERS[name]
    if peer.module in sys.modules:  # tests simulate absence with sys.modules[module] = None
        found = sys.modules[peer.module] is not None
    else:
        try:
            found = importlib.util.find_spec(peer.module) is not None
        except (ImportError, ValueError):
            found = False
    return None if found else peer.install


def peer_unsupported_reason(name: str, kv_dtype: str, backend: str) -> str | None:
    """Why peer `name` cannot run kv_dtype on backend, or None when it can."""
    peer = PEERS[name]
    if backend not in peer.backends:
        return f"kernel {name} runs on {'/'.join(peer.backends)}, not {backend}"
    if kv_dtype not in peer.formats:
        return f"kernel {name} runs kv_dtype {'/'.join(peer.formats)}, not {kv_dtype}"
    return missing_reason(name)
