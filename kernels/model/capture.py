"""Real K/V from the model: capture from a float32 prefill, save as .npz for `kv_data: file`,
and read mlx-lm's saved prompt caches (.safetensors).

Capture runs the model over the tokens with a float32 cache and keeps each layer's K (post-RoPE,
as caches hold them, or pre-RoPE, where per-channel key outliers are reported by KVQuant) and V
exactly as the projections produced them, before any format touches them.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import mlx.core as mx
import numpy as np

from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.load import Model
from kvbench.kernels.model.run import forward
from kvbench.kernels.model.spec import CacheSpec

REFERENCE_SPEC = CacheSpec("fp32")


class _Tap:
    """A float32 cache (a ModelCache, kernels/model/protocol.py) that keeps each layer's K/V
    as the model hands them over, and the pre-RoPE keys: `pre` maps the id of each RoPE output
    to its input (_RopeTap), and the keys a layer stores are the very array its RoPE returned."""

    def __init__(self, inner):
        self.inner, self.kv, self.pre = inner, [], {}

    @property
    def offset(self) -> int:
        return self.inner.offset

    def attend(self, layer: int, q, k, v, scale: float) -> mx.array:
        self.kv.append((self.pre.get(id(k), (None, None))[1], k, v))
        return self.inner.attend(layer, q, k, v, scale)

    def advance(self, n: int) -> None:
        self.inner.advance(n)


class _RopeTap:
    """A layer's RoPE, unchanged, remembering each output's input (both kept alive, so ids
    stay unique)."""

    def __init__(self, rope, seen: dict):
        self.rope, self.seen = rope, seen

    def __call__(self, x, offset=0):
        y = self.rope(x, offset=offset)
        self.seen[id(y)] = (y, x)
        return y


def capture_kv(model: Model, tokens: list[int], post_rope: bool = True) -> list[tuple]:
    """Per layer (k, v) float32 numpy [n_kv_heads, L, head_dim] from a float32 prefill of
    `tokens` (L = len(tokens)); keys post-RoPE as caches hold them, or pre-RoPE (what the
    layer's RoPE was given: the keys as projected, after any key norm)."""
    tap = _Tap(make_cache(REFERENCE_SPEC, model.config, len(tokens), "reference"))
    ropes = [m for _, m in model.net.named_modules() if callable(getattr(m, "rope", None))]
    try:
        for m in ropes:
            m.rope = _RopeTap(m.rope, tap.pre)
        forward(model, mx.array([tokens]), tap, logits_from=len(tokens))
    finally:
        for m in ropes:
            m.rope = m.rope.rope
    out = []
    for k_pre, k, v in tap.kv:
        kk = k if post_rope else k_pre
        if kk is None:
            raise ValueError(f"model {model.config.arch}: its keys did not come from a `rope`")
        mx.eval(kk, v)
        out.append((np.array(kk[0], dtype=np.float32), np.array(v[0], dtype=np.float32)))
    return out


def save_kv_npz(path: str | Path, kv: list[tuple], layer: int | None = None) -> int:
    """Save a capture as .npz: arrays `k` and `v` (one layer, [n_kv_heads, L, head_dim], the
    shape `kv_data: file` reads; default the middle layer) plus `k_<i>` / `v_<i>` for every
    layer. Returns the layer stored as k / v."""
    layer = len(kv) // 2 if layer is None else layer
    arrays = {"k": kv[layer][0], "v": kv[layer][1]}
    for i, (k, v) in enumerate(kv):
        arrays[f"k_{i}"], arrays[f"v_{i}"] = k, v
    np.savez(path, **arrays)
    return layer


def read_mlx_prompt_cache(path: str | Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer (k, v) float32 [B, Hkv, L, D] from mlx-lm's `save_prompt_cache` file.

    Its layout (mlx_lm/models/cache.py): arrays tree-flattened from [c.state for c in cache],
    so layer i of a KVCache is "i.0" (keys) and "i.1" (values); a QuantizedKVCache stores
    (data, scales, biases) as "i.0.0".."i.0.2" and "i.1.0".."i.1.2", and its meta_state
    (offset, group_size, bits) as metadata "0.i.0".."0.i.2"; class names are "2.i"."""
    try:
        arrays, md = mx.load(str(path), return_metadata=True)
    except (OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"cannot read prompt cache {path}: {e}") from None
    out, i = [], 0
    while f"{i}.0" in arrays or f"{i}.0.0" in arrays:
        out.append(tuple(_state(arrays, md, i, part, path) for part in (0, 1)))
        i += 1
    if not out:
        raise ValueError(f"{path}: no KVCache or QuantizedKVCache layers (keys '0.0' / '0.0.0')")
    return out


def _state(arrays: dict, md: dict, i: int, part: int, path) -> np.ndarray:
    if f"{i}.{part}" in arrays:
        return np.array(arrays[f"{i}.{part}"].astype(mx.float32))
    try:
        gs, bits = int(md[f"0.{i}.1"]), int(md[f"0.{i}.2"])
    except (KeyError, ValueError):
        raise ValueError(f"{path}: layer {i} is quantized but has no group_size/bits") from None
    w, s, b = (arrays[f"{i}.{part}.{j}"] for j in range(3))
    deq = mx.dequantize(w, s, b, group_size=gs, bits=bits).astype(mx.float32)
    return np.array(deq)


@lru_cache(maxsize=4)
def default_capture(context_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The middle layer's post-RoPE K and V [n_kv_heads, context_len, head_dim] of the default
    model over the first context_len tokens of the default text (`kv_data: model`)."""
    from kvbench.kernels.model.fetch import require_model
    from kvbench.kernels.model.load import load_model
    from kvbench.kernels.model.text import default_text
    from kvbench.kernels.model.tokenizer import load_tokenizer

    model = load_model(require_model())
    tokens = load_tokenizer(model).encode(default_text())[:context_len]
    if len(tokens) < context_len:
        raise ValueError(f"the default text has {len(tokens)} tokens, fewer than {context_len}")
    kv = capture_kv(model, tokens)
    return kv[len(kv) // 2]
