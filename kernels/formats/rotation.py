"""Rotation before quantization: an orthonormal Walsh-Hadamard transform over head_dim.

A quantized K (or V) row whose energy sits in a few channels (RoPE pairs, outlier channels)
wastes most of its group's levels; rotating the row by an orthonormal H spreads that energy over
the group before the format quantizes it. llama.cpp does this by default for quantized KV types
(ggml-org/llama.cpp PR #21038: `attn_rot_k` / `attn_rot_v` in src/llama-kv-cache.cpp).

H is block-diagonal: Sylvester Walsh-Hadamard blocks of `block` channels, each scaled by
1/sqrt(block), so H = H^T = H^-1. The block is a power of two from MIN_BLOCK to head_dim that
divides head_dim. Its default is llama.cpp's rule (src/llama-kv-cache.cpp, b11434): K one block
of the largest power of two dividing head_dim (llama.cpp starts at 64 and doubles while
head_dim % (2 * block) == 0), V blocks of 64 (its PR's comments: small V blocks measured
better). llama.cpp rotates only when head_dim % 64 == 0; kvbench, asked to rotate another
head_dim, takes the largest power-of-two divisor for K and min(64, that) for V. llama.cpp
applies the matrices in its attention (src/llama-graph.cpp build_attn): Q and K by K's, V by
V's, the attention output by V's again, after the model's QK norm and RoPE, on sliding-window
layers as on global ones. So does kvbench:

* keys stored rotated (k H): q.k = (q H).(k H) since H H^T = I, so the attention path rotates
  q once per step and never touches the stored cache;
* values stored rotated (v H): sum_j p_j (v_j H) = (sum_j p_j v_j) H, so the path rotates the
  attention output back once per step (out H^T = out H).

Exact bytes are unchanged: the format stores the rotated rows as it would any rows. The
quality path (a model's cache) may instead rotate, quantize, dequantize and rotate back
(`round_trip`), which is the same arithmetic up to rounding.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx
import numpy as np

ROTATIONS = ("none", "hadamard")
# key channel order of a RoPE model: Hugging Face's half-split (channel i pairs with i + D/2) or
# GGUF's interleaved (2i pairs with 2i+1: llama.cpp's converter permutes Q/K rows so)
K_ORDERS = ("hf", "gguf")
MIN_BLOCK = 8  # a smaller block barely mixes channels: refused rather than run as a no-op
V_BLOCK = 64  # llama.cpp's V block (src/llama-kv-cache.cpp n_rot_v)
PARTS = ("k", "v")


def largest_block(head_dim: int) -> int:
    """The largest power of two dividing head_dim (ValueError under MIN_BLOCK)."""
    block = head_dim & -head_dim  # lowest set bit = largest power of two dividing head_dim
    if head_dim <= 0 or block < MIN_BLOCK:
        raise ValueError(
            f"hadamard rotation: head_dim {head_dim} has no power-of-two block of at least "
            f"{MIN_BLOCK} (largest power-of-two divisor {block})"
        )
    return block


def default_block(head_dim: int, part: str) -> int:
    """llama.cpp's block for K ("k": the largest power of two dividing head_dim) or V ("v":
    64, or the largest power-of-two divisor when that is smaller)."""
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    largest = largest_block(head_dim)
    return largest if part == "k" else min(V_BLOCK, largest)


def block_size(head_dim: int, block: int | None = None, part: str = "k") -> int:
    """The block in effect: `block` when given (checked: a power of two from MIN_BLOCK to
    head_dim dividing head_dim), else default_block(head_dim, part)."""
    if block is None:
        return default_block(head_dim, part)
    if block < MIN_BLOCK or block > head_dim or block & (block - 1) or head_dim % block:
        raise ValueError(
            f"rotation block {block}: must be a power of two from {MIN_BLOCK} to head_dim "
            f"{head_dim} that divides it"
        )
    return block


def sylvester(n: int) -> np.ndarray:
    """The n x n Sylvester Hadamard matrix of +-1 (n a power of two): H_2n = [[H, H], [H, -H]]."""
    h = np.ones((1, 1), dtype=np.float64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


@cache
def _matrix_np(head_dim: int, block: int) -> np.ndarray:
    blk = sylvester(block) / np.sqrt(block)
    return np.kron(np.eye(head_dim // block), blk).astype(np.float32)  # [D, D] block-diagonal


def hadamard(head_dim: int, block: int | None = None) -> mx.array:
    """float32 [D, D] orthonormal block-diagonal Walsh-Hadamard matrix (blocks of `block`,
    default K's: the largest power of two dividing head_dim); symmetric."""
    return mx.array(_matrix_np(head_dim, block_size(head_dim, block)))


def check(rotation: str, head_dim: int, block: int | None = None, part: str = "k") -> None:
    """ValueError when `rotation` is unknown or its block cannot apply at head_dim."""
    if rotation not in ROTATIONS:
        raise ValueError(f"unknown rotation {rotation!r}; known: {', '.join(ROTATIONS)}")
    if rotation == "hadamard":
        block_size(head_dim, block, part)


def gguf_order(x: mx.array) -> mx.array:
    """Rows x [..., D] in Hugging Face's half-split channel order -> GGUF's interleaved order:
    out[2i] = x[i], out[2i+1] = x[i + D/2]. Grouped keys see different channels together, so
    a format's error on real keys depends on it; q.k does not (q reordered alike)."""
    d = x.shape[-1]
    perm = mx.array([i // 2 + (i % 2) * (d // 2) for i in range(d)])
    return mx.take(x, perm, axis=-1)


def rotate(x: mx.array, rotation: str, block: int | None = None) -> mx.array:
    """x [..., D] rotated (x H, blocks of `block`; None: the largest power of two dividing D),
    computed in float32 and returned in x's dtype; x itself when rotation is "none". H is its
    own inverse, so this also rotates back."""
    if rotation == "none":
        return x
    h = hadamard(x.shape[-1], block)
    return (x.astype(mx.float32) @ h).astype(x.dtype)


def round_trip(
    x: mx.array, fmt, rotation: str, dtype: mx.Dtype = mx.float32, block: int | None = None
) -> mx.array:
    """What a rotated cache gives back for rows x [..., D], in the unrotated basis: rotate,
    encode in `fmt`, decode (in `dtype`), rotate back. Equal, up to rounding, to rotating q and
    the attention output instead (module docstring)."""
    stored = fmt.encode(rotate(x, rotation, block))
    return rotate(fmt.decode(stored, dtype), rotation, block)
