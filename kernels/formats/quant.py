"""Quantized KV-cache formats: FP4 (E2M1), INT4, INT8 with per-row or per-group scales, and
MLX's native modes (mxfp4, nvfp4, affine 4/8-bit) through mx.quantize / mx.dequantize.

Storage (every array [B, H, L, ...], so the cache slices positions without knowing the format):
  fp4, int4: {"data": uint32 [B, H, L, D/8], "scales": float16 [B, H, L, D/G]}
      8 codes per uint32; element j (0..7) of a word sits in bits 4j..4j+3 (element 0 lowest).
      fp4 code = sign<<3 | exp<<1 | mantissa (E2M1, exponent bias 1), scale = absmax / 6;
      int4 code = the two's-complement nibble of q in [-8, 7], scale = absmax / 7.
  int8: {"data": int8 [B, H, L, D], "scales": float16 [B, H, L, D/G]}, q in [-127, 127].
  mxfp4 / nvfp4 / affine4 / affine8: exactly what mx.quantize returns (uint32 data; scales
  uint8 E8M0 (mxfp4) / uint8 E4M3 (nvfp4) / float16 (affine, with float16 biases)).
G is the group size; group_size None means one scale per row (one position x one head, G = D)
for fp4/int4/int8, and the mode's default group for the MLX-native modes (mxfp4 32, nvfp4 16,
affine 64). Dequantized value = value(code) * scale (affine: q * scale + bias).
Quantization computes in float32 and divides by the float16 scale that is stored, so decode
inverts exactly what encode did.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from kvbench.kernels.formats.protocol import Format, Stored

GROUP_SIZES = (32, 64, 128)  # allowed explicit group sizes for fp4 / int4 / int8
NIBBLE_SHIFTS = mx.array([4 * j for j in range(8)], dtype=mx.uint32)  # element j -> bits 4j..


# ---- FP4 E2M1 value set, derived from the bit layout ----------------------------------------

FP4_EXP_BITS, FP4_MANT_BITS, FP4_BIAS = 2, 1, 1


def fp4_magnitude(code: int) -> float:
    """|value| of the 3 low bits exp<<1 | mantissa of an E2M1 code (no inf/NaN in E2M1).

    exp 0 is subnormal: mantissa/2 * 2^(1-bias); otherwise (1 + mantissa/2) * 2^(exp-bias).
    """
    exp, mant = (code >> FP4_MANT_BITS) & 0b11, code & 0b1
    frac = mant / (1 << FP4_MANT_BITS)
    return frac * 2.0 ** (1 - FP4_BIAS) if exp == 0 else (1 + frac) * 2.0 ** (exp - FP4_BIAS)


def fp4_value(code: int) -> float:
    """The value of a 4-bit E2M1 code: sign<<3 | exp<<1 | mantissa."""
    mag = fp4_magnitude(code & 0b111)
    return -mag if code & 0b1000 else mag


FP4_MAGNITUDES = tuple(fp4_magnitude(c) for c in range(8))  # 0, .5, 1, 1.5, 2, 3, 4, 6
FP4_MAX = max(FP4_MAGNITUDES)
# Round to nearest, ties to even (OCP MX): between codes c and c+1 a tie goes to the even code,
# i.e. down when c is even (strict >) and up when c is odd (>=).
FP4_MIDPOINTS = tuple((a + b) / 2 for a, b in zip(FP4_MAGNITUDES, FP4_MAGNITUDES[1:]))


# ---- packing ---------------------------------------------------------------------------------


def pack_nibbles(codes: mx.array) -> mx.array:
    """uint32 codes [..., D] (each < 16) -> uint32 [..., D/8]; element j in bits 4j..4j+3."""
    *lead, d = codes.shape
    words = codes.astype(mx.uint32).reshape(*lead, d // 8, 8) << NIBBLE_SHIFTS  # [..., D/8, 8]
    return mx.sum(words, axis=-1).astype(mx.uint32)  # disjoint bits: sum == bitwise or


def unpack_nibbles(data: mx.array) -> mx.array:
    """uint32 [..., D/8] -> uint32 codes [..., D] (inverse of pack_nibbles)."""
    *lead, w = data.shape
    return ((data[..., None] >> NIBBLE_SHIFTS) & 0xF).reshape(*lead, w * 8)  # [..., D]


def _signbit(x: mx.array) -> mx.array:
    """True where the float32 sign bit is set (also for -0.0, so code 8 round-trips)."""
    return (x.astype(mx.float32).view(mx.uint32) >> 31).astype(mx.bool_)


def fp4_codes(y: mx.array) -> mx.array:
    """Nearest E2M1 codes (uint8) for values y already divided by their scale."""
    a = mx.abs(y)
    mag = mx.zeros(y.shape, dtype=mx.uint8)  # uint8: a quarter of the transient memory
    for c, mid in enumerate(FP4_MIDPOINTS):
        mag = mag + (a >= mid if c % 2 else a > mid).astype(mx.uint8)
    return mag | (_signbit(y).astype(mx.uint8) << 3)


def int4_codes(y: mx.array) -> mx.array:
    q = mx.clip(mx.round(y), -8, 7).astype(mx.int32)
    return (q & 0xF).astype(mx.uint32)  # two's-complement nibble


# ---- scaled symmetric formats (fp4, int4, int8) -------------------------------------------


# the 16 4-bit code values, built once (decode runs inside timed stages, once per tile)
CODE_TABLES = {
    "fp4": mx.array([fp4_value(c) for c in range(16)], dtype=mx.float32),
    "int4": mx.array([c - 16 if c >= 8 else c for c in range(16)], dtype=mx.float32),
}


@dataclass(frozen=True)
class Scaled(Format):
    """Symmetric quantization with a float16 scale per row or per group of G elements."""

    name: str
    data_bits: int  # bits per stored code
    qmax: float  # largest code magnitude: scale = absmax / qmax
    group_size: int | None = None  # None: one scale per row (G = head_dim)

    quantized = True
    compute_dtype = mx.float16

    def __post_init__(self):
        if self.group_size is not None and self.group_size not in GROUP_SIZES:
            raise ValueError(
                f"{self.name}: group_size must be one of {GROUP_SIZES} or None (per row), "
                f"got {self.group_size!r}"
            )

    def group(self, head_dim: int) -> int:
        g = self.group_size or head_dim
        if head_dim % g or head_dim % 8:
            raise ValueError(
                f"{self.name}: head_dim {head_dim} must be a multiple of 8 and of group {g}"
            )
        return g

    def mx_quantize_args(self) -> None:
        return None  # own packing, not mx.quantize's

    def describe_scales(self, head_dim: int) -> str:
        return f"group {self.group_size}" if self.group_size else f"per row (group {head_dim})"

    def alloc(self, shape: tuple[int, ...]) -> Stored:
        *lead, d = shape
        g = self.group(d)
        if self.data_bits == 4:
            data = mx.zeros((*lead, d // 8), dtype=mx.uint32)
        else:
            data = mx.zeros((*lead, d), dtype=mx.int8)
        return {"data": data, "scales": mx.zeros((*lead, d // g), dtype=mx.float16)}

    def encode(self, x: mx.array) -> Stored:
        *lead, d = x.shape
        g = self.group(d)
        xg = x.astype(mx.float32).reshape(*lead, d // g, g)  # [..., D/G, G]
        scales = (mx.max(mx.abs(xg), axis=-1) / self.qmax).astype(mx.float16)  # [..., D/G]
        s32 = scales.astype(mx.float32)[..., None]
        y = (xg / mx.where(s32 > 0, s32, 1.0)).reshape(*lead, d)  # [..., D] in code units
        if self.name == "fp4":
            data = pack_nibbles(fp4_codes(y))
        elif self.data_bits == 4:
            data = pack_nibbles(int4_codes(y))
        else:
            data = mx.clip(mx.round(y), -127, 127).astype(mx.int8)
        return {"data": data, "scales": scales}

    def code_table(self) -> mx.array:
        """float32 value of each of the 16 4-bit codes (before scaling)."""
        return CODE_TABLES[self.name]

    def code_values(self, data: mx.array, dtype: mx.Dtype = mx.float32) -> mx.array:
        """Code values [..., D] (before scaling) of the stored data, in `dtype` (exact)."""
        if self.data_bits == 4:
            return self.code_table().astype(dtype)[unpack_nibbles(data)]  # one gather
        return data.astype(dtype)

    def decode(self, stored: Stored, dtype: mx.Dtype | None = None) -> mx.array:
        # Computed directly in the output dtype: code value and scale are both exact there and
        # their product is rounded once, as a float32 product cast down would be; this keeps
        # the transient memory of a dequantize at the output's size.
        dtype = dtype or self.compute_dtype
        vals = self.code_values(stored["data"], dtype)
        *lead, d = vals.shape
        g = d // stored["scales"].shape[-1]
        vg = vals.reshape(*lead, d // g, g) * stored["scales"].astype(dtype)[..., None]
        return vg.reshape(*lead, d)  # [..., D]

    def nbytes(self, n_rows: int, head_dim: int) -> int:
        """Codes (bits/8 per element) + one float16 scale per group, per row."""
        g = self.group(head_dim)
        return n_rows * (head_dim * self.data_bits // 8 + 2 * (head_dim // g))


# ---- MLX-native modes ----------------------------------------------------------------------

# mode -> (bits, allowed group sizes, default group, scale bytes, has biases)
MLX_MODES = {
    "mxfp4": ("mxfp4", 4, (32,), 32, 1, False),  # E8M0 scale per 32 (OCP MX)
    "nvfp4": ("nvfp4", 4, (16,), 16, 1, False),  # E4M3 scale per 16
    "affine4": ("affine", 4, GROUP_SIZES, 64, 2, True),  # float16 scale and bias per group
    "affine8": ("affine", 8, GROUP_SIZES, 64, 2, True),
    # below 4 bits: mlx-lm's kv_bits 2 / 3 (3-bit codes straddle uint32 words: D*3/32 words)
    "affine2": ("affine", 2, GROUP_SIZES, 64, 2, True),
    "affine3": ("affine", 3, GROUP_SIZES, 64, 2, True),
}


@dataclass(frozen=True)
class MlxQuant(Format):
    """A format stored exactly as mx.quantize(x, group_size, bits, mode) returns it."""

    name: str
    group_size: int | None = None  # None: the mode's default group size

    quantized = True
    compute_dtype = mx.float16

    def __post_init__(self):
        _, _, allowed, _, _, _ = MLX_MODES[self.name]
        if self.group_size is not None and self.group_size not in allowed:
            raise ValueError(
                f"{self.name}: group_size must be one of {allowed} or None (mode default), "
                f"got {self.group_size!r}"
            )

    @property
    def mode(self) -> str:
        return MLX_MODES[self.name][0]

    @property
    def data_bits(self) -> int:
        return MLX_MODES[self.name][1]

    @property
    def group(self) -> int:
        return self.group_size or MLX_MODES[self.name][3]

    @property
    def has_biases(self) -> bool:
        return MLX_MODES[self.name][5]

    def mx_quantize_args(self) -> dict:
        return {"group_size": self.group, "bits": self.data_bits, "mode": self.mode}

    def describe_scales(self, head_dim: int) -> str:
        return f"group {self.group}" + ("" if self.group_size else " (mode default)")

    def alloc(self, shape: tuple[int, ...]) -> Stored:
        *lead, d = shape
        self._check(d)
        scale_dtype = mx.float16 if self.has_biases else mx.uint8
        out = {
            "data": mx.zeros((*lead, d * self.data_bits // 32), dtype=mx.uint32),
            "scales": mx.zeros((*lead, d // self.group), dtype=scale_dtype),
        }
        if self.has_biases:
            out["biases"] = mx.zeros((*lead, d // self.group), dtype=mx.float16)
        return out

    def _check(self, head_dim: int) -> None:
        if head_dim % self.group or head_dim % 32:
            raise ValueError(
                f"{self.name}: head_dim {head_dim} must be a multiple of 32 and of {self.group}"
            )

    def encode(self, x: mx.array) -> Stored:
        parts = mx.quantize(x.astype(mx.float16), **self.mx_quantize_args())
        return dict(zip(("data", "scales", "biases"), parts))

    def decode(self, stored: Stored, dtype: mx.Dtype | None = None) -> mx.array:
        return mx.dequantize(
            stored["data"],
            stored["scales"],
            stored.get("biases"),
            dtype=dtype or self.compute_dtype,
            **self.mx_quantize_args(),
        )

    def nbytes(self, n_rows: int, head_dim: int) -> int:
        self._check(head_dim)
        scale_bytes = MLX_MODES[self.name][4] * (2 if self.has_biases else 1)
        return n_rows * (head_dim * self.data_bits // 8 + scale_bytes * (head_dim // self.group))


def fp4(group_size: int | None = None) -> Scaled:
    return Scaled("fp4", 4, FP4_MAX, group_size)


def int4(group_size: int | None = None) -> Scaled:
    return Scaled("int4", 4, 7.0, group_size)


def int8(group_size: int | None = None) -> Scaled:
    return Scaled("int8", 8, 127.0, group_size)


def mlx_native(name: str):
    return lambda group_size=None: MlxQuant(name, group_size)
