"""FP8 KV-cache formats as vLLM stores them: fp8_e4m3 and fp8_e5m2 with a float32 scale.

vLLM (`kv_cache_dtype="fp8"` / "fp8_e5m2"; csrc quant_utils.cuh `scaled_vec_conversion`) writes
each K or V element as `__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, type)`: x in float32
divided by the layer's scale, rounded to the nearest FP8 value, ties to even, and a magnitude
beyond the largest finite one saturated to it (E4M3 448, E5M2 57344); NaN stays NaN. It reads
`fp8 * scale` in float32, rounded once to the compute dtype. kvbench does the same:

  byte = fp8(x / scale)         read = value(byte) * scale

The scale (`fp8_scale` axis, SCALE_MODES): "one" (vLLM's default: 1.0), a positive number,
"calibrated" (vLLM's calculate_kv_scales, on the first forward of each attention layer:
k_scale = max|K| / 200, v_scale = max|V| / 100, the K_SCALE_CONSTANT / V_SCALE_CONSTANT
defaults of vllm/envs.py), or "per_head" (one scale per KV head, as a checkpoint's calibrated
per-head scales: max over the first prefill of that head's |x| / the format's largest value).
A calibrated format is pending until `calibrate` fixes its scale from the first rows it is
given; the model cache (kernels/model/cache.py) calibrates each layer's K and V apart.

Codes (OCP FP8, the bit layout; values derived from it by `code_value`): sign<<7 | exponent |
mantissa. E4M3 ("fn": 4 exponent bits, bias 7, 3 mantissa bits): no infinity, 0x7F/0xFF NaN,
max 448, smallest subnormal 2^-9. E5M2 (bias 15, 2 mantissa bits): IEEE-like, exponent 31 is
inf (mantissa 0) or NaN, max 57344, smallest subnormal 2^-16.

Storage: {"data": uint8 [B, H, L, D]}; the scale is the format's own (per tensor: 4 bytes per
layer for K and 4 for V, `tensor_bytes`; per head: 4 per KV head), not a per-row array.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import mlx.core as mx
import numpy as np

from kvbench.kernels.formats.protocol import Format, Stored

# name -> (exponent bits, mantissa bits, bias, has infinity)
KINDS = {"fp8_e4m3": (4, 3, 7, False), "fp8_e5m2": (5, 2, 15, True)}
SCALE_MODES = ("one", "calibrated", "per_head")  # or a positive finite number
RANGE = {"k": 200.0, "v": 100.0}  # vLLM envs K_SCALE_CONSTANT, V_SCALE_CONSTANT (defaults)
NAN_CODE = 0x7F
SCALE_BYTES = 4  # a float32 scale


def code_value(code: int, name: str) -> float:
    """The value of an 8-bit code of format `name`, from its bit layout."""
    e_bits, m_bits, bias, has_inf = KINDS[name]
    sign = -1.0 if code & 0x80 else 1.0
    field, mant = (code >> m_bits) & ((1 << e_bits) - 1), code & ((1 << m_bits) - 1)
    top = (1 << e_bits) - 1
    if field == top and (has_inf or mant == (1 << m_bits) - 1):
        return sign * math.inf if has_inf and mant == 0 else math.nan
    if field == 0:  # subnormal: mant / 2^m * 2^(1 - bias)
        return sign * mant * 2.0 ** (1 - bias - m_bits)
    return sign * (1 + mant / (1 << m_bits)) * 2.0 ** (field - bias)


@cache
def _table_np(name: str) -> np.ndarray:
    return np.array([code_value(c, name) for c in range(256)], dtype=np.float32)


def max_value(name: str) -> float:
    """The largest finite magnitude (E4M3 448, E5M2 57344)."""
    t = _table_np(name)
    return float(np.max(np.abs(t[np.isfinite(t)])))


def overflow_bound(name: str) -> tuple[float, bool]:
    """Where rounding leaves the finite range: the midpoint between the largest value and the
    next one the exponent would give, and whether that tie rounds up (to the even code: E5M2's
    57344 has an odd mantissa, so 61440 overflows; E4M3's 448 an even one, so 464 stays)."""
    e_bits, m_bits, bias, _ = KINDS[name]
    top = max_value(name)
    step = 2.0 ** (math.floor(math.log2(top)) - m_bits)
    odd = int(top / step) & 1
    return top + step / 2, bool(odd)


def parse_scale(value) -> str | float:
    """A mode name, or a positive finite float; ValueError with the reason otherwise."""
    if isinstance(value, str) and value in SCALE_MODES:
        return value
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        want = ", ".join(SCALE_MODES)
        raise ValueError(f"fp8_scale must be {want} or a positive finite number, got {value!r}")
    return number


def encode_codes(y: mx.array, name: str) -> mx.array:
    """uint8 codes of float32 values y (already divided by the scale): round to nearest, ties
    to even, saturate to the largest finite value, NaN to 0x7F (the __NV_SATFINITE rule)."""
    e_bits, m_bits, bias, _ = KINDS[name]
    e_min, top = 1 - bias, max_value(name)
    a = mx.abs(y)
    exp = ((a.view(mx.uint32) >> 23) & 0xFF).astype(mx.int32) - 127  # floor(log2 a)
    exp = mx.maximum(exp, e_min)  # below 2^e_min the grid is the subnormals' (fixed ulp)
    ulp = ((exp - m_bits + 127) << 23).astype(mx.uint32).view(mx.float32)  # 2^(exp-m), exact
    v = mx.minimum(mx.round(a / ulp) * ulp, top)  # exact: power-of-two steps; round: to even
    vb = v.view(mx.uint32)
    ev = ((vb >> 23) & 0xFF).astype(mx.int32) - 127
    mant = ((vb >> (23 - m_bits)) & ((1 << m_bits) - 1)).astype(mx.int32)
    normal = ((ev + bias) << m_bits) | mant
    sub = (v * 2.0 ** (bias - 1 + m_bits)).astype(mx.int32)  # v / 2^(e_min - m), exact
    mag = mx.where(v >= 2.0**e_min, normal, sub)
    sign = ((y.view(mx.uint32) >> 31) << 7).astype(mx.int32)
    return mx.where(mx.isnan(y), NAN_CODE, sign | mag).astype(mx.uint8)


@dataclass(frozen=True)
class Fp8(Format):
    """vLLM's FP8 KV cache (module docstring): one byte per element, a float32 scale per
    tensor or per KV head, held by the format (`scale`, one value or one per head)."""

    name: str
    group_size: int | None = None  # no groups: the scale is per tensor (or per head)
    scale_mode: str | float = "one"
    scale: tuple[float, ...] | None = None  # None: pending (calibrated / per_head)

    quantized = True
    compute_dtype = mx.float16
    data_bits = 8

    def __post_init__(self):
        if self.group_size is not None:
            raise ValueError(f"{self.name}: no group size (one scale per tensor or per head)")
        mode = parse_scale(self.scale_mode)
        if self.scale is None and mode not in ("calibrated", "per_head"):
            object.__setattr__(self, "scale", (1.0 if mode == "one" else mode,))

    @property
    def pending(self) -> bool:
        """True until a calibrated / per_head format has its scale (`calibrate`)."""
        return self.scale is None

    @property
    def max_value(self) -> float:
        return max_value(self.name)

    def calibrate(self, x: mx.array, role: str) -> Fp8:
        """This format with its scale fixed from rows x [B, H, L, D] (the first prefill of one
        layer's K (role "k") or V ("v")); itself when the scale is already fixed."""
        if not self.pending:
            return self
        a = mx.abs(x.astype(mx.float32))
        if self.scale_mode == "per_head":
            amax, div = mx.max(a, axis=(0, 2, 3)), self.max_value  # [H]
        else:
            amax, div = mx.max(a).reshape(1), RANGE[role]
        s = (amax / div).tolist()  # float32 division, as vLLM's float32 tensors
        # an all-zero tensor would give scale 0 (x / 0: NaN bytes); 1.0 stores its zeros exactly
        scale = [v if v > 0 else 1.0 for v in s]
        return Fp8(self.name, None, self.scale_mode, tuple(scale))

    def _scale(self, ndim: int) -> mx.array:
        """The scale shaped to broadcast over [B, H, ...] (per head along axis 1)."""
        if self.pending:
            raise ValueError(f"{self.name}: fp8_scale {self.scale_mode} not calibrated yet")
        s = mx.array(self.scale, dtype=mx.float32)
        return s.reshape(1, -1, *([1] * (ndim - 2))) if len(self.scale) > 1 else s[0]

    def tensor_scale(self) -> tuple[float, ...]:
        if self.pending:
            raise ValueError(f"{self.name}: fp8_scale {self.scale_mode} not calibrated yet")
        return self.scale

    def alloc(self, shape: tuple[int, ...]) -> Stored:
        return {"data": mx.zeros(shape, dtype=mx.uint8)}

    def encode(self, x: mx.array) -> Stored:
        return {"data": encode_codes(x.astype(mx.float32) / self._scale(x.ndim), self.name)}

    def saturated(self, x: mx.array) -> mx.array:
        """How many elements of x, divided by the scale, round past the largest finite value
        and are stored as it instead (E4M3: |x/s| > 464, E5M2: >= 61440; inf included, NaN
        not): an int32 scalar (lazy). Between 448 and 464 E4M3 rounds to 448 as it would
        anyway: not counted."""
        y = mx.abs(x.astype(mx.float32) / self._scale(x.ndim))
        bound, tie_up = overflow_bound(self.name)
        return mx.sum(y >= bound if tie_up else y > bound).astype(mx.int32)

    def decode(self, stored: Stored, dtype: mx.Dtype | None = None) -> mx.array:
        data = stored["data"]
        vals = mx.array(_table_np(self.name))[data]  # one gather, float32 exact
        if self.scale != (1.0,):
            vals = vals * self._scale(data.ndim)
        return vals.astype(dtype or self.compute_dtype)

    def nbytes(self, n_rows: int, head_dim: int) -> int:
        """One byte per element; the scale is per tensor (tensor_bytes), not per row."""
        return n_rows * head_dim

    def tensor_bytes(self, n_kv_heads: int) -> int:
        """The float32 scale(s) of one layer's K (or V): one, or one per KV head."""
        return SCALE_BYTES * (n_kv_heads if self.scale_mode == "per_head" else 1)

    def mx_quantize_args(self) -> None:
        return None

    def describe_scales(self, head_dim: int) -> str:
        if self.scale_mode == "per_head":
            return "float32 per KV head (calibrated on the first prefill)"
        if self.scale_mode == "calibrated":
            return "float32 per tensor (calibrated on the first prefill, as vLLM)"
        return f"float32 per tensor ({self.scale[0]:g})"


def fp8_format(name: str):
    return lambda group_size=None, fp8_scale="one": Fp8(name, group_size, fp8_scale)
