"""The Format protocol: every registered format declares every member itself."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kvbench.kernels.formats.protocol import Format, row_parts
from kvbench.kernels.formats.registry import FORMATS, get_format

MEMBERS = ("alloc", "encode", "decode", "nbytes", "mx_quantize_args", "describe_scales")
# formats whose data_bits this file knows by hand from their definitions; every format of the
# registry, these included, is also held to what it stores (below), so a new format needs no
# line here (#41: a hand table of every format failed the recipe's new format)
KNOWN_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "int4": 4, "fp4": 4, "q5_0": 5}
KNOWN_BITS |= {"affine3": 3, "tq2_prod": 2, "fp8_e4m3": 8}


def stored_data_bits(fmt, head_dim: int) -> float:
    """Bits per element of the arrays the format allocates that hold data (not a scale or
    an offset: kernels/formats/protocol.py PART_ROLE), read from its allocation's shapes."""
    return 8 * row_parts(fmt, head_dim)["data"] / head_dim


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_implements_the_protocol(name):
    fmt = get_format(name)
    assert isinstance(fmt, Format) and fmt.name == name
    for member in MEMBERS:  # a member left to the protocol's stub would return None silently
        assert getattr(type(fmt), member) is not getattr(Format, member), member
    assert isinstance(fmt.quantized, bool) and isinstance(fmt.compute_dtype, mx.Dtype)
    # what it declares is what it stores, at two head sizes (group and block counts differ)
    assert fmt.data_bits == stored_data_bits(fmt, 64) == stored_data_bits(fmt, 256)
    assert fmt.data_bits == KNOWN_BITS.get(name, fmt.data_bits)
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
