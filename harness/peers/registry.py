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

One module per peer: mlx_lm_caches.py (mlx_lm, mlx_lm_quant, mlx_lm_rotating), torch_sdpa.py,
numpy_ref.py; base.py holds what they share (DecodeData, DecodePeer, Preallocated). This module
is the registry: PEERS, and what the harness asks of a peer (skip reasons, version, kind).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass

from kvbench.peers.base import DENSE, QUANT_BITS
from kvbench.peers.mlx_lm_caches import MlxLmQuant, MlxLmRotating, mlx_lm
from kvbench.peers.numpy_ref import NumpyRef
from kvbench.peers.torch_sdpa import TorchSdpa


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
