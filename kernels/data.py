"""K/V/query data for a case: deterministic from a seed, float32, un-quantized.

The same float32 K/V feed the cache (encoded into its format) and the float32 reference, so
accuracy compares a format against exactly the data it was given. Queries are always gaussian.

Kinds (KV_DATA):
* gaussian: K and V i.i.d. standard normal.
* outliers: V gaussian; K gaussian except a few fixed channels per KV head whose magnitude is
  OUTLIER_GAIN times larger. This models the per-channel key outliers reported by KIVI (Liu et
  al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache": a few fixed key
  channels carry very large magnitudes while the value cache shows no fixed outlier pattern)
  and KVQuant (Hooper et al. 2024, "KVQuant: Towards 10 Million Context Length LLM Inference
  with KV Cache Quantization": outlier channels in pre-RoPE keys). The channel count
  (head_dim / 32 per head) and gain (10x) are illustrative choices, not fitted to a model.
* file: K and V read from an .npz file (the case's kv_file) holding arrays `k` and `v`, each
  [n_kv_heads, L, head_dim] (the same data for every sequence) or [n_seqs, n_kv_heads, L,
  head_dim], any float dtype, with L >= the case's context length; the first context_len
  positions are used. One layer's capture serves every layer of the cache.
* model: real K/V: the default model (SmolLM2-135M, `kvbench model fetch`) run over the default
  text (kernels/model/text.py), keys post-RoPE as caches hold them, from its middle layer
  (kernels/model/capture.py); the case's shape must be the model's (3 KV heads, head_dim 64). The
  capture is a float32 prefill of context_len tokens (slow on a CPU: seconds per 10 tokens).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

OUTLIER_GAIN = 10.0
OUTLIER_EVERY = 32  # one outlier channel per 32 channels of head_dim (4 of 128)


def gaussian(shape, kk, kv, kv_file=None) -> tuple[mx.array, mx.array]:
    return mx.random.normal(shape, key=kk), mx.random.normal(shape, key=kv)


def outliers(shape, kk, kv, kv_file=None) -> tuple[mx.array, mx.array]:
    """Keys with a few large-magnitude channels per KV head (fixed across positions)."""
    b, h, _, d = shape
    kc, kn = mx.random.split(kk)
    n_out = max(1, d // OUTLIER_EVERY)
    # a random permutation per head; its first n_out channels are the outliers
    order = mx.argsort(mx.random.uniform(shape=(h, d), key=kc), axis=-1)  # [H, D]
    is_out = mx.any(order[:, :n_out, None] == mx.arange(d)[None, None, :], axis=1)  # [H, D]
    gain = mx.where(is_out, OUTLIER_GAIN, 1.0)[None, :, None, :]  # [1, H, 1, D]
    return mx.random.normal(shape, key=kn) * gain, mx.random.normal(shape, key=kv)


def load_kv_file(path: str, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """float32 (k, v) [B, Hkv, L, D] from an .npz; ValueError with the reason if unusable."""
    b, h, ctx, d = shape
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {name: f[name] for name in ("k", "v") if name in f}
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read K/V file {path}: {e}") from None
    out = []
    for name in ("k", "v"):
        if name not in arrays:
            raise ValueError(f"{path}: no array {name!r} (need arrays 'k' and 'v')")
        a = arrays[name]
        if a.ndim == 3:
            a = np.broadcast_to(a[None], (b, *a.shape))
        ok = a.ndim == 4 and a.shape[0] == b and a.shape[1] == h and a.shape[3] == d
        if not ok or a.shape[2] < ctx or not np.issubdtype(a.dtype, np.floating):
            raise ValueError(
                f"{path}: array {name!r} is {arrays[name].dtype}{list(arrays[name].shape)}; "
                f"need float [n_kv_heads={h}, L>={ctx}, head_dim={d}] or "
                f"[n_seqs={b}, {h}, L>={ctx}, {d}]"
            )
        a = np.ascontiguousarray(a[:, :, :ctx], dtype=np.float32)
        if not np.isfinite(a).all():  # a NaN would surface later as a misleading ParityError
            bad = int(a.size - np.isfinite(a).sum())
            raise ValueError(f"{path}: array {name!r} holds {bad} NaN or inf values")
        out.append(a)
    return out[0], out[1]


def from_file(shape, kk, kv, kv_file=None) -> tuple[mx.array, mx.array]:
    if not kv_file:
        raise ValueError("kv_data=file needs kv_file (path of an .npz with arrays k and v)")
    k, v = load_kv_file(kv_file, shape)
    return mx.array(k), mx.array(v)


def from_model(shape, kk, kv, kv_file=None) -> tuple[mx.array, mx.array]:
    from kvbench.kernels.model.capture import (
        default_capture,  # the model is loaded only when asked for
    )

    k, v = default_capture(shape[2])  # [Hkv, L, D] each
    if (k.shape[0], k.shape[2]) != (shape[1], shape[3]):
        raise ValueError(f"kv_data=model holds {k.shape[0]} heads x {k.shape[2]}, not {shape}")
    return tuple(mx.broadcast_to(mx.array(x)[None], shape) for x in (k, v))


KV_DATA = {
    "gaussian": gaussian,
    "outliers": outliers,
    "file": from_file,
    "model": from_model,
}


def make_qkv(
    kind: str,
    q_shape: tuple[int, ...],
    kv_shape: tuple[int, ...],
    seed: int,
    kv_file: str | None = None,
):
    """(q, k, v) float32: q [B, Hq, Lq, D], k and v [B, Hkv, L, D]."""
    kq, kk, kv = mx.random.split(mx.random.key(seed), 3)
    k, v = KV_DATA[kind](kv_shape, kk, kv, kv_file)
    return mx.random.normal(q_shape, key=kq), k, v
