"""KV-cache storage formats: the registry, and the dense floating-point formats.

Every format implements the Format protocol (kernels/formats/protocol.py): a dict of named arrays
whose
leading axes are [n_seqs, n_kv_heads, positions], so that the cache can write and slice positions
without knowing the format. `nbytes` is the exact storage formula (data + scales + biases) that
byte-accounting tests check by hand; `bits_per_elem` derives from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import mlx.core as mx

from kvbench.kernels.formats import fp8, ggml, quant, turbo
from kvbench.kernels.formats.protocol import Format, Stored


@dataclass(frozen=True)
class Dense(Format):
    """Plain floating-point storage: one array `data` of shape [B, H, L, D] in `dtype`."""

    name: str
    dtype: mx.Dtype
    group_size: int | None = None  # dense formats have no scales; kept for a uniform signature

    quantized = False

    @property
    def compute_dtype(self) -> mx.Dtype:
        return self.dtype

    @property
    def data_bits(self) -> int:
        return 8 * self.dtype.size

    def alloc(self, shape: tuple[int, ...]) -> Stored:
        return {"data": mx.zeros(shape, dtype=self.dtype)}

    def encode(self, x: mx.array) -> Stored:
        return {"data": x.astype(self.dtype)}

    def decode(self, stored: Stored, dtype: mx.Dtype | None = None) -> mx.array:
        return stored["data"].astype(dtype or self.dtype)

    def nbytes(self, n_rows: int, head_dim: int) -> int:
        """Exact bytes to store `n_rows` rows of `head_dim` values."""
        return n_rows * head_dim * self.dtype.size

    def mx_quantize_args(self) -> None:
        return None  # not stored as mx.quantize returns it

    def describe_scales(self, head_dim: int) -> str:
        return "no scales"


# name -> constructor taking group_size (None for formats without scales)
FORMATS = {
    "fp16": partial(Dense, "fp16", mx.float16),
    "bf16": partial(Dense, "bf16", mx.bfloat16),
    "fp32": partial(Dense, "fp32", mx.float32),
    "fp4": quant.fp4,
    "int4": quant.int4,
    "int8": quant.int8,
    "mxfp4": quant.mlx_native("mxfp4"),
    "nvfp4": quant.mlx_native("nvfp4"),
    "affine4": quant.mlx_native("affine4"),
    "affine8": quant.mlx_native("affine8"),
    "affine2": quant.mlx_native("affine2"),  # 2- and 3-bit: mlx-lm's kv_bits 2 / 3
    "affine3": quant.mlx_native("affine3"),
    "q4_0": ggml.ggml_format("q4_0"),  # ggml's block formats, bit-exact (kernels/formats/ggml.py)
    "q4_1": ggml.ggml_format("q4_1"),
    "q5_0": ggml.ggml_format("q5_0"),
    "q5_1": ggml.ggml_format("q5_1"),
    "q8_0": ggml.ggml_format("q8_0"),
    "q8_0_avx2": ggml.ggml_format("q8_0_avx2"),  # q8_0 as llama.cpp's x86 KV writes round it
    "iq4_nl": ggml.ggml_format("iq4_nl"),
    # TurboQuant (kernels/formats/turbo.py): Lloyd-Max codes of a rotated row, its fp16 norm
    **{name: turbo.turbo(name) for name in turbo.NAMES},
    "fp8_e4m3": fp8.fp8_format("fp8_e4m3"),  # vLLM's FP8 KV cache (kernels/formats/fp8.py)
    "fp8_e5m2": fp8.fp8_format("fp8_e5m2"),
}


def get_format(name: str, group_size: int | None = None, fp8_scale="one") -> Format:
    """The format `name` with scale granularity `group_size` (None: per row / mode default)
    and, for the FP8 formats, the scale `fp8_scale` (kernels/formats/fp8.py SCALE_MODES or a
    positive number).

    Raises KeyError for an unknown name, ValueError for a group size or an fp8_scale the format
    cannot use."""
    if name not in FORMATS:
        raise KeyError(f"unknown kv_dtype {name!r}; known: {', '.join(FORMATS)}")
    if name in fp8.KINDS:
        return FORMATS[name](group_size=group_size, fp8_scale=fp8_scale)
    if fp8_scale != "one":
        raise ValueError(f"fp8_scale applies to {', '.join(fp8.KINDS)}, not {name}")
    return FORMATS[name](group_size=group_size)
