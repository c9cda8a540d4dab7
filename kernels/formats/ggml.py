"""ggml's KV-cache block formats, bit for bit: q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl, and q8_0 as
llama.cpp's x86 CPU build writes it (q8_0_avx2).

As ggml defines them (ggml/src/ggml-quants.c `quantize_row_*_ref`, the layouts in
ggml-common.h), every block is 32 values of one row, in float32 arithmetic:

  q4_0  d = m / -8 (m: the element of largest magnitude, sign kept), q = trunc(x/d + 8.5)
        clipped to [0, 15], value = (q - 8) * d. Block: d fp16, 16 bytes of nibbles: 18 bytes.
  q4_1  d = (max - min) / 15, q = trunc((x - min)/d + 0.5) in [0, 15], value = q * d + min.
        Block: d fp16, min fp16, 16 bytes of nibbles: 20 bytes.
  q5_0  d = m / -16, q = trunc(x/d + 16.5) in [0, 31], value = (q - 16) * d. Block: d fp16,
        4 bytes of fifth bits, 16 bytes of nibbles: 22 bytes.
  q5_1  d = (max - min) / 31, q = trunc((x - min)/d + 0.5) in [0, 31], value = q * d + min.
        Block: d fp16, min fp16, 4 bytes of fifth bits, 16 bytes of nibbles: 24 bytes.
  q8_0  d = absmax / 127, q = roundf(x/d) (half away from zero), value = q * d.
        Block: d fp16, 32 int8: 34 bytes.
  q8_0_avx2  q8_0's block as ggml-cpu's AVX/AVX2 `quantize_row_q8_0` (the `from_float` llama.cpp's
        KV-cache writes call on x86) fills it: q = round half to even (x * (127 / absmax)), not
        roundf(x * (1 / d)): a tie, or a last-bit difference of the two inverses, moves a code.
  iq4_nl  the non-linear 4-bit type (`quantize_row_iq4_nl_ref`, which ggml-cpu's from_float
        calls too): codes index IQ4_NL_VALUES; with m the signed extreme, l = the nearest value
        to x * (1 / (m / -127)) (ggml's best_index_int8: a tie goes up), then
        d = sum(w q x) / sum(w q q) with w = x^2 (least squares; float32 sums in index order),
        value = IQ4_NL_VALUES[l] * d. A block with absmax < 1e-15 stores d = 0 and, as ggml,
        the codes of the row's previous block (its first block: 0; ggml leaves whatever its
        stack held). Block: d fp16, 16 bytes of nibbles: 18 bytes.

"x/d" is x * (1/d) with 1/d computed in float32 from the float32 d (not the stored fp16 d);
d = 0 gives 1/d = 0. Nibbles: byte j (0..15) of a block holds element j in its low nibble and
element j + 16 in its high nibble. Fifth bits: a little-endian uint32 whose bit j is bit 4 of
element j's code.

kvbench's int4 differs from q4_0 (docs/formats.md): scale absmax / 7, round half to even, so it
uses 15 of the 16 levels; q4_0's scale is the signed extreme / -8, so that extreme lands exactly
on level -8 and all 16 levels are used.

Storage (leading axes [B, H, L], so the cache slices positions as for every format): "data" the
nibbles (uint8 [.., D/2]) or q8_0's codes (int8 [.., D]), "high" the fifth bits (uint8
[.., D/8]), "scales" d (float16 [.., D/32]), "mins" (float16 [.., D/32]). `to_blocks` lays them
out as ggml's blocks, byte for byte (tests compare them with the `gguf` package's quantizer).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from kvbench.kernels.formats.protocol import Format, Stored

QK = 32  # values per block (ggml's QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0 = 32)

# name -> (code bits, has min, offset subtracted from q for symmetric kinds, divisor of d)
KINDS = {
    "q4_0": (4, False, 8, -8.0),
    "q4_1": (4, True, 0, 15.0),
    "q5_0": (5, False, 16, -16.0),
    "q5_1": (5, True, 0, 31.0),
    "q8_0": (8, False, 0, 127.0),
    "q8_0_avx2": (8, False, 0, 127.0),
    "iq4_nl": (4, False, 0, -127.0),  # d's first guess: m / -127 (then least squares)
}
IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
GROUP_MAX_EPS = 1e-15  # ggml-quants.c: a block below it is all zero
BIT_SHIFTS = mx.arange(32, dtype=mx.uint32)


def signed_extreme(xb: mx.array) -> mx.array:
    """The element of largest magnitude of each block (first one on ties, as argmax), sign
    kept: [..., nb, 32] -> [..., nb, 1]."""
    i = mx.argmax(mx.abs(xb), axis=-1, keepdims=True)
    return mx.take_along_axis(xb, i, axis=-1)


def _inverse(d: mx.array) -> mx.array:
    return mx.where(d == 0, 0.0, 1.0 / mx.where(d == 0, 1.0, d))


def roundf(y: mx.array) -> mx.array:
    """C's roundf: to nearest, halves away from zero (exact: y - trunc(y) is exact)."""
    t = mx.where(y < 0, mx.ceil(y), mx.floor(y))
    frac = mx.abs(y - t)
    return t + mx.where(frac >= 0.5, mx.sign(y), 0.0)


def pack_low_nibbles(q: mx.array) -> mx.array:
    """uint8 codes [..., nb, 32] -> [..., nb*16]: byte j = (q[j] & 15) | (q[j+16] & 15) << 4."""
    lo, hi = q[..., :16] & 15, q[..., 16:] & 15
    out = lo | (hi << 4)
    return out.reshape(*out.shape[:-2], -1)


def unpack_low_nibbles(data: mx.array) -> mx.array:
    """uint8 [..., nb*16] -> codes [..., nb, 32] (low nibbles first)."""
    b = data.reshape(*data.shape[:-1], -1, 16)
    return mx.concatenate([b & 15, b >> 4], axis=-1)


def pack_high_bits(q: mx.array) -> mx.array:
    """Bit 4 of each code [..., nb, 32] as a little-endian uint32 per block, in bytes
    [..., nb*4]."""
    bits = ((q.astype(mx.uint32) >> 4) & 1) << BIT_SHIFTS
    word = mx.sum(bits, axis=-1).astype(mx.uint32)  # disjoint bits: sum == or; [..., nb]
    by = mx.stack([(word >> (8 * i)) & 255 for i in range(4)], axis=-1).astype(mx.uint8)
    return by.reshape(*by.shape[:-2], -1)


def unpack_high_bits(high: mx.array) -> mx.array:
    """[..., nb*4] bytes -> bit 4 of each code, as 0/16 [..., nb, 32] (uint8)."""
    by = high.reshape(*high.shape[:-1], -1, 4).astype(mx.uint32)
    word = by[..., 0] | by[..., 1] << 8 | by[..., 2] << 16 | by[..., 3] << 24
    return (((word[..., None] >> BIT_SHIFTS) & 1) << 4).astype(mx.uint8)


def best_index(al: mx.array) -> mx.array:
    """ggml's best_index_int8 over IQ4_NL_VALUES, elementwise: 0 at or below the first value, 15
    at or above the last; else the nearer of the two values around al, a tie to the upper."""
    vals = mx.array(IQ4_NL_VALUES, dtype=mx.float32)
    mu = sum((al >= v).astype(mx.int32) for v in IQ4_NL_VALUES[1:]) + 1  # val[mu-1] <= al <
    mu = mx.clip(mu, 1, 15)
    down = (al - vals[mu - 1]) < (vals[mu] - al)  # float32 differences, as the C
    idx = mx.where(down, mu - 1, mu)
    return mx.where(al <= IQ4_NL_VALUES[0], 0, mx.where(al >= IQ4_NL_VALUES[-1], 15, idx))


def ordered_sum(t: mx.array) -> mx.array:
    """t [..., n] summed over the last axis in index order, in t's dtype (as a C loop; a
    pairwise sum rounds differently)."""
    total = t[..., 0]
    for j in range(1, t.shape[-1]):
        total = total + t[..., j]
    return total


def iq4_nl_blocks(xb: mx.array) -> tuple[mx.array, mx.array]:
    """quantize_row_iq4_nl_ref on blocks xb [..., nb, 32] float32: (d [..., nb, 1] float32,
    codes [..., nb, 32] uint8)."""
    m = signed_extreme(xb)  # [..., nb, 1]
    zero = mx.abs(m) < GROUP_MAX_EPS
    d0 = m / IQ4_NL_VALUES[0]
    l = best_index(xb * _inverse(mx.where(zero, 0, d0)))  # noqa: E741
    q = mx.array(IQ4_NL_VALUES, dtype=mx.float32)[l]
    wq = (xb * xb) * q  # weight x^2, as ((w * q) * x) and ((w * q) * q)
    sqx, sq2 = ordered_sum(wq * xb)[..., None], ordered_sum(wq * q)[..., None]
    d = mx.where(zero | (sq2 <= 0), 0.0, sqx / mx.where(sq2 > 0, sq2, 1.0))
    codes = l.astype(mx.uint8)
    for b in range(codes.shape[-2]):  # a zero block keeps the previous block's codes (ggml's L)
        prev = codes[..., b - 1, :] if b else mx.zeros_like(codes[..., 0, :])
        codes[..., b, :] = mx.where(zero[..., b, :], prev, codes[..., b, :])
    return d, codes


@dataclass(frozen=True)
class GgmlBlock(Format):
    """One of ggml's 32-value block formats (module docstring), stored as separate arrays."""

    name: str
    group_size: int | None = None  # always 32 (ggml's block); None or 32 accepted

    quantized = True
    compute_dtype = mx.float16

    def __post_init__(self):
        if self.group_size not in (None, QK):
            raise ValueError(f"{self.name}: ggml blocks hold {QK} values, got {self.group_size!r}")

    @property
    def data_bits(self) -> int:
        return KINDS[self.name][0]

    @property
    def has_min(self) -> bool:
        return KINDS[self.name][1]

    def block_bytes(self) -> int:
        """Bytes of one ggml block: fp16 d, fp16 min, fifth bits, codes."""
        return 2 + 2 * self.has_min + QK * self.data_bits // 8

    def _check(self, head_dim: int) -> None:
        if head_dim % QK:
            raise ValueError(f"{self.name}: head_dim {head_dim} must be a multiple of {QK}")

    def mx_quantize_args(self) -> None:
        return None

    def describe_scales(self, head_dim: int) -> str:
        return f"group {QK} (ggml block)" + (" with min" if self.has_min else "")

    def nbytes(self, n_rows: int, head_dim: int) -> int:
        self._check(head_dim)
        return n_rows * head_dim // QK * self.block_bytes()

    def alloc(self, shape: tuple[int, ...]) -> Stored:
        *lead, d = shape
        self._check(d)
        nb = d // QK
        if self.data_bits == 8:
            out = {"data": mx.zeros((*lead, d), dtype=mx.int8)}
        else:
            out = {"data": mx.zeros((*lead, d // 2), dtype=mx.uint8)}
        if self.data_bits == 5:
            out["high"] = mx.zeros((*lead, 4 * nb), dtype=mx.uint8)
        out["scales"] = mx.zeros((*lead, nb), dtype=mx.float16)
        if self.has_min:
            out["mins"] = mx.zeros((*lead, nb), dtype=mx.float16)
        return out

    def encode(self, x: mx.array) -> Stored:
        *lead, d = x.shape
        self._check(d)
        bits, has_min, _, div = KINDS[self.name]
        xb = x.astype(mx.float32).reshape(*lead, d // QK, QK)  # [..., nb, 32]
        out: Stored = {}
        if bits == 8:
            amax = mx.max(mx.abs(xb), axis=-1, keepdims=True)
            dd = amax / div
            if self.name == "q8_0_avx2":  # 127 / amax, _mm256_round_ps: half to even
                q = mx.round(xb * mx.where(amax != 0, div / mx.where(amax != 0, amax, 1), 0))
            else:
                q = roundf(xb * _inverse(dd))
            out["data"] = q.astype(mx.int8).reshape(*lead, d)
        elif self.name == "iq4_nl":
            dd, q = iq4_nl_blocks(xb)
            out["data"] = pack_low_nibbles(q)
        else:
            top = 2**bits - 1
            if has_min:
                lo = mx.min(xb, axis=-1, keepdims=True)
                dd = (mx.max(xb, axis=-1, keepdims=True) - lo) / div
                y = (xb - lo) * _inverse(dd) + 0.5
            else:
                dd = signed_extreme(xb) / div
                y = xb * _inverse(dd) + (KINDS[self.name][2] + 0.5)
            q = mx.clip(mx.floor(y), 0, top).astype(mx.uint8)  # y >= 0: floor == trunc
            out["data"] = pack_low_nibbles(q)
            if bits == 5:
                out["high"] = pack_high_bits(q)
        out["scales"] = dd[..., 0].astype(mx.float16)
        if has_min:
            out["mins"] = lo[..., 0].astype(mx.float16)
        return out

    def codes(self, stored: Stored) -> mx.array:
        """Integer code values [..., nb, 32] (offset removed for the symmetric kinds; iq4_nl's
        codebook values), int32."""
        if self.data_bits == 8:
            data = stored["data"]
            return data.reshape(*data.shape[:-1], -1, QK).astype(mx.int32)
        q = unpack_low_nibbles(stored["data"])
        if self.name == "iq4_nl":
            return mx.array(IQ4_NL_VALUES, dtype=mx.int32)[q]
        if self.data_bits == 5:
            q = q | unpack_high_bits(stored["high"])
        return q.astype(mx.int32) - KINDS[self.name][2]

    def decode(self, stored: Stored, dtype: mx.Dtype | None = None) -> mx.array:
        dtype = dtype or self.compute_dtype
        q = self.codes(stored).astype(dtype)  # exact: |q| <= 127
        out = q * stored["scales"].astype(dtype)[..., None]
        if self.has_min:
            out = out + stored["mins"].astype(dtype)[..., None]
        return out.reshape(*out.shape[:-2], -1)  # [..., D]

    def to_blocks(self, stored: Stored) -> mx.array:
        """The stored rows as ggml's blocks, byte for byte: uint8 [..., nb, block_bytes]
        (d, then min, then the fifth bits, then the codes)."""
        nb = stored["scales"].shape[-1]
        lead = stored["scales"].shape[:-1]
        parts = [stored["scales"][..., None].view(mx.uint8)]  # [..., nb, 2] little-endian
        if self.has_min:
            parts.append(stored["mins"][..., None].view(mx.uint8))
        if self.data_bits == 5:
            parts.append(stored["high"].reshape(*lead, nb, 4))
        parts.append(stored["data"].view(mx.uint8).reshape(*lead, nb, -1))
        return mx.concatenate(parts, axis=-1)


def ggml_format(name: str):
    return lambda group_size=None: GgmlBlock(name, group_size)
