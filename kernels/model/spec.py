"""What a model cache holds: CacheSpec, and its exact bytes.

A CacheSpec names the K and V formats (`k_dtype`, `v_dtype`, each with a group size), the axis
key scales run along (`k_axis`: "token" = one scale per position (and group of channels), as
every kvbench format stores; "channel" = one scale per channel over a group of positions, as
KIVI quantizes keys), `sink_tokens` (the first positions, kept in fp16) and `recent_tokens`
(a residual window in fp16: new positions wait there and are quantized `recent_tokens` at a
time when it fills, as KIVI's residual does; 0 = quantize every position on write).

`kv_bytes` is the exact storage formula of a spec after n tokens (the regions as filled).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import mlx.core as mx

from kvbench.kernels.formats.fp8 import KINDS as FP8_KINDS
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.formats.rotation import K_ORDERS, ROTATIONS, block_size, gguf_order, rotate
from kvbench.kernels.stores.footprint import layer_cells

AXES = ("token", "channel")


@dataclass(frozen=True)
class CacheSpec:
    k_dtype: str = "fp16"
    v_dtype: str | None = None  # None: same as k_dtype
    k_group: int | None = None
    v_group: int | None = None  # None with v_dtype None: same as k_group
    k_axis: str = "token"
    sink_tokens: int = 0
    recent_tokens: int = 0
    rotate_k: str = "none"  # rotation before quantization (kernels/formats/rotation.py)
    rotate_v: str = "none"
    k_order: str = "hf"  # key channel order stored: "hf" (the model's) or "gguf" (llama.cpp's)
    q_quant: str = "none"  # "q8_0": queries rounded through q8_0 blocks before the key dot
    fp8_scale: str | float = "one"  # an FP8 format's scale (kernels/formats/fp8.py)
    rot_block_k: int | None = None  # Hadamard blocks; None: llama.cpp's rule (rotation.py)
    rot_block_v: int | None = None

    def __post_init__(self):
        if self.k_axis not in AXES:
            raise ValueError(f"k_axis must be one of {AXES}, got {self.k_axis!r}")
        if self.sink_tokens < 0 or self.recent_tokens < 0:
            raise ValueError("sink_tokens and recent_tokens must be >= 0")
        if self.k_axis == "channel" and self.recent_tokens == 0:
            raise ValueError("k_axis channel quantizes groups of recent_tokens positions: set it")
        if {self.rotate_k, self.rotate_v} - set(ROTATIONS):
            raise ValueError(f"rotate_k / rotate_v must be one of {ROTATIONS}")
        if self.k_order not in K_ORDERS:
            raise ValueError(f"k_order must be one of {K_ORDERS}, got {self.k_order!r}")
        if self.q_quant not in Q_QUANTS:
            raise ValueError(f"q_quant must be one of {Q_QUANTS}, got {self.q_quant!r}")

    @property
    def v_name(self) -> str:
        return self.v_dtype or self.k_dtype

    @property
    def v_grp(self) -> int | None:
        return self.v_group if self.v_dtype is not None else self.v_group or self.k_group

    def formats(self):
        """K's and V's formats (an FP8 one at fp8_scale: pending when it is calibrated)."""
        scale = lambda name: self.fp8_scale if name in FP8_KINDS else "one"  # noqa: E731
        k = get_format(self.k_dtype, self.k_group, scale(self.k_dtype))
        return k, get_format(self.v_name, self.v_grp, scale(self.v_name))

    @property
    def saturates(self) -> bool:
        """K or V in an FP8 format: rows of this spec carry kv_saturated."""
        return bool({self.k_dtype, self.v_name} & set(FP8_KINDS))

    @property
    def plain(self) -> bool:
        same = self.v_name == self.k_dtype and self.v_grp == self.k_group
        return same and self.k_axis == "token" and not self.sink_tokens + self.recent_tokens

    @property
    def label(self) -> str:
        k = self.k_dtype + (f"/g{self.k_group}" if self.k_group else "")
        v = self.v_name + (f"/g{self.v_grp}" if self.v_grp else "")
        out = k if self.v_name == self.k_dtype and self.v_grp == self.k_group else f"K{k}-V{v}"
        if self.k_axis == "channel":
            out += "-kchan"
        if self.sink_tokens:
            out += f"-sink{self.sink_tokens}"
        if self.recent_tokens:
            out += f"-recent{self.recent_tokens}"
        for part, rot, block in (
            ("K", self.rotate_k, self.rot_block_k),
            ("V", self.rotate_v, self.rot_block_v),
        ):
            out += f"-rot{part}{block or ''}" if rot != "none" else ""
        out += "-kgguf" if self.k_order == "gguf" else ""
        out += f"-fp8s:{self.fp8_scale}" if self.fp8_scale != "one" else ""
        return out + ("-qq8_0" if self.q_quant == "q8_0" else "")

    def keys_in_order(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        """q and k with their channels in the stored key order (q.k unchanged); with q_quant,
        q rounded as llama.cpp's CPU flash attention rounds it against a quantized K."""
        return self.query_in_order(q), self.key_in_order(k)

    def key_in_order(self, k: mx.array) -> mx.array:
        """k [..., D] with its channels in the stored key order."""
        return gguf_order(k) if self.k_order == "gguf" else k

    def query_in_order(self, q: mx.array) -> mx.array:
        """q [..., D] in the stored key order, rounded as q_quant says."""
        q = self.key_in_order(q)
        return quantize_query(q, self.q_quant, self.rotate_k, self.rot(q.shape[-1])[2])

    def rot(self, head_dim: int) -> tuple[str, str, int | None, int | None]:
        """(rotate_k, rotate_v, K's block, V's block) at head_dim, as the attention path takes
        them (kernels/attention/registry.py rotated): a null block is llama.cpp's rule
        (kernels/formats/rotation.py default_block); None where that part is not rotated."""
        bk, bv = (
            None if r == "none" else block_size(head_dim, b, part)
            for r, b, part in ((self.rotate_k, self.rot_block_k, "k"),
                               (self.rotate_v, self.rot_block_v, "v"))
        )  # fmt: skip
        return self.rotate_k, self.rotate_v, bk, bv


Q_QUANTS = ("none", "q8_0")


def quantize_query(q: mx.array, q_quant: str, rotate_k: str, block: int | None = None) -> mx.array:
    """q [..., D] as llama.cpp's CPU flash attention uses it against a quantized K (ggml-cpu
    ops.cpp: Q is converted to K's vec_dot_type, q8_0 for q4_0 / q8_0 keys, before the dot
    product): in the keys' stored basis (rotated when K is), rounded through q8_0 blocks of 32,
    then back to the model's basis (K's blocks of `block`). "none": q unchanged."""
    if q_quant == "none":
        return q
    fmt = get_format(q_quant)
    rounded = fmt.decode(fmt.encode(rotate(q, rotate_k, block)), mx.float32)
    return rotate(rounded, rotate_k, block).astype(q.dtype)


# ---- exact bytes ---------------------------------------------------------------------------


def region_counts(spec: CacheSpec, n: int) -> tuple[int, int, int]:
    """(sink, quantized, residual) positions held after n tokens."""
    sink = min(spec.sink_tokens, n)
    rest = n - sink
    r = spec.recent_tokens
    body = rest if r == 0 else rest // r * r
    return sink, body, rest - body


def stream_bytes(spec: CacheSpec, fmt, channel: bool, n: int, head_dim: int) -> int:
    """Bytes of one K or V stream (one layer, one sequence, one KV head) after n tokens."""
    sink, body, resid = region_counts(spec, n)
    fp16 = 2 * head_dim * (sink + resid)
    if channel:  # each flushed group: head_dim rows of recent_tokens positions
        return fp16 + body // spec.recent_tokens * fmt.nbytes(head_dim, spec.recent_tokens)
    return fp16 + fmt.nbytes(body, head_dim)


def kv_bytes(
    spec: CacheSpec,
    n_tokens: int,
    n_layers: int,
    n_kv_heads: int,
    head_dim: int,
    n_seqs: int = 1,
    windows: tuple = (),
) -> int:
    """Exact bytes of the K and V a spec holds after n_tokens (data, scales, biases, fp16
    sinks and residual), over every layer, KV head and sequence, plus each layer's per-tensor
    scales (FP8); each layer at the positions it holds (`windows`: a sliding-window layer
    min(n_tokens, window + sinks), kernels/stores/footprint.py layer_cells)."""
    kf, vf = spec.formats()
    total = 0
    for n, layers in Counter(layer_cells(n_tokens, windows, n_layers)).items():
        per = stream_bytes(spec, kf, spec.k_axis == "channel", n, head_dim)
        total += layers * (per + stream_bytes(spec, vf, False, n, head_dim))
    fixed = kf.tensor_bytes(n_kv_heads) + vf.tensor_bytes(n_kv_heads)
    return total * n_kv_heads * n_seqs + fixed * n_layers
