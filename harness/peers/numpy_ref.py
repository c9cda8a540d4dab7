"""The numpy_ref peer: plain numpy float32 decode attention over a preallocated numpy cache."""

from __future__ import annotations

import numpy as np

from kvbench.peers.base import DecodeData, Preallocated


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
