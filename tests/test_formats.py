"""The Format protocol: every registered format declares every member itself."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kvbench.kernels.formats.protocol import Format
from kvbench.kernels.formats.registry import FORMATS, get_format

MEMBERS = ("alloc", "encode", "decode", "nbytes", "mx_quantize_args", "describe_scales")
# width of one element's code, scales excluded, by hand from each format's definition
DATA_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "affine8": 8}
DATA_BITS |= {name: 4 for name in ("fp4", "int4", "mxfp4", "nvfp4", "affine4")}
DATA_BITS |= {"affine2": 2, "affine3": 3}
DATA_BITS |= {"q4_0": 4, "q4_1": 4, "q5_0": 5, "q5_1": 5, "q8_0": 8}  # ggml's blocks
DATA_BITS |= {f"tq{b}_{v}": b for b in (2, 3, 4) for v in ("mse", "prod")}  # TurboQuant
DATA_BITS |= {"q8_0_avx2": 8, "iq4_nl": 4}  # ggml: q8_0 as x86 writes it; non-linear 4-bit
DATA_BITS |= {"fp8_e4m3": 8, "fp8_e5m2": 8}  # one byte, the scale per tensor


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_implements_the_protocol(name):
    fmt = get_format(name)
    assert isinstance(fmt, Format) and fmt.name == name
    for member in MEMBERS:  # a member left to the protocol's stub would return None silently
        assert getattr(type(fmt), member) is not getattr(Format, member), member
    assert isinstance(fmt.quantized, bool) and isinstance(fmt.compute_dtype, mx.Dtype)
    assert fmt.data_bits == DATA_BITS[name]
    assert fmt.bits_per_elem(128) == 8 * fmt.nbytes(1, 128) / 128 >= fmt.data_bits


def test_mx_quantize_args_only_for_what_mx_quantize_stores():
    native = {"mxfp4", "nvfp4", "affine4", "affine8", "affine2", "affine3"}
    assert {n for n in FORMATS if get_format(n).mx_quantize_args() is not None} == native
    assert get_format("affine4", 32).mx_quantize_args() == {
        "group_size": 32,
        "bits": 4,
        "mode": "affine",
    }
    x = mx.random.normal((2, 64))
    parts = get_format("nvfp4").encode(x)
    assert [p.shape for p in parts.values()] == [
        p.shape for p in mx.quantize(x.astype(mx.float16), **get_format("nvfp4").mx_quantize_args())
    ]


def test_describe_scales():
    assert get_format("fp16").describe_scales(128) == "no scales"
    assert get_format("int4").describe_scales(128) == "per row (group 128)"
    assert get_format("int4", 32).describe_scales(128) == "group 32"
    assert get_format("mxfp4").describe_scales(128) == "group 32 (mode default)"
    assert get_format("affine4", 128).describe_scales(128) == "group 128"
