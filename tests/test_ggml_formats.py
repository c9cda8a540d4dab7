"""ggml's block formats (kernels/formats/ggml.py) byte for byte against the `gguf` package's
numpy quantizer (gguf-py, written by llama.cpp's authors to match ggml-quants.c), the bytes
against hand counts, and what separates q4_0 from kvbench's int4."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from kvbench.kernels.formats.ggml import GgmlBlock
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.model.fetch import model_path

NAMES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]
# hand counts of one 32-value block: fp16 d (2) + fp16 min (2, *_1 only) + fifth bits (4, q5_*)
# + codes (32 * bits / 8)
BLOCK_BYTES = {"q4_0": 2 + 16, "q4_1": 2 + 2 + 16, "q5_0": 2 + 4 + 16, "q5_1": 2 + 2 + 4 + 16,
               "q8_0": 2 + 32}  # fmt: skip


def qtype(name: str) -> GGMLQuantizationType:
    return getattr(GGMLQuantizationType, name.upper())


def blocks_of(name: str, x: np.ndarray) -> np.ndarray:
    """kvbench's encoding of x [..., D] as ggml block bytes [..., D/32 * block bytes]."""
    fmt = get_format(name)
    got = np.array(fmt.to_blocks(fmt.encode(mx.array(x))))
    return got.reshape(*x.shape[:-1], -1)


def hard_rows() -> np.ndarray:
    """Rows that hit the rules' edges: zeros, +-extremes tied, constant, halves, tiny, huge."""
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((12, 64)).astype(np.float32)
    rows[0] = 0  # d = 0 -> 1/d = 0
    rows[1, :32] = 3.0
    rows[1, 5] = -3.0  # |max| tied with opposite signs: the first one's sign wins
    rows[2] = 1.5  # constant block: max == min
    rows[3, :32] = np.arange(32) - 16.0  # exact half steps after scaling
    rows[4, :32] = (np.arange(32) - 15.5) * 0.25
    rows[5] *= 1e-6
    rows[6] *= 6e4 / np.abs(rows[6]).max()  # d stays finite in fp16
    rows[7, 32:] = -rows[7, :32]
    rows[8, :32] = np.linspace(-127, 127, 32) / 127 * 2.5  # q8_0: halves of d
    return rows


def random_rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.01, 8, (2, 3, 9, 1))
    x = rng.standard_normal((2, 3, 9, 128)) * scale
    x[..., 7] *= 20  # an outlier channel
    return x.astype(np.float32)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("rows", ["random", "hard", "fp16"])
def test_bytes_equal_gguf_quantizer(name, rows):
    x = {
        "random": random_rows(1),
        "hard": hard_rows(),
        "fp16": random_rows(2).astype(np.float16).astype(np.float32),  # what a cache feeds
    }[rows]
    want = quantize(x, qtype(name))
    got = blocks_of(name, x)
    assert got.shape == want.shape and got.dtype == want.dtype == np.uint8
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", NAMES)
def test_decode_equals_gguf_dequantize(name):
    x = random_rows(3)
    fmt = get_format(name)
    got = np.array(fmt.decode(fmt.encode(mx.array(x)), mx.float32))
    np.testing.assert_array_equal(got, dequantize(quantize(x, qtype(name)), qtype(name)))


@pytest.mark.skipif(model_path() is None, reason="SmolLM2 not fetched (kvbench model fetch)")
@pytest.mark.parametrize("name", ["q4_0", "q8_0", "q5_1"])
def test_bytes_equal_gguf_on_real_kv(name):
    from kvbench.kernels.model.capture import default_capture

    k, v = default_capture(64)  # SmolLM2's K (post-RoPE) and V, [3, 64, 64]
    for x in (k, v):
        np.testing.assert_array_equal(blocks_of(name, x), quantize(x, qtype(name)))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_bytes_per_row_hand_count(name, head_dim):
    fmt = get_format(name)
    n_blocks = head_dim // 32
    assert fmt.nbytes(1, head_dim) == n_blocks * BLOCK_BYTES[name]
    assert GGML_QUANT_SIZES[qtype(name)] == (32, BLOCK_BYTES[name])
    stored = fmt.alloc((2, 3, 5, head_dim))
    assert sum(a.nbytes for a in stored.values()) == fmt.nbytes(2 * 3 * 5, head_dim)
    enc = fmt.encode(mx.zeros((2, 3, 5, head_dim)))
    assert {k: (a.shape, a.dtype) for k, a in enc.items()} == {
        k: (a.shape, a.dtype) for k, a in stored.items()
    }
    # bits per element: q4_0 4.5, q4_1 5, q5_0 5.5, q5_1 6, q8_0 8.5
    assert fmt.bits_per_elem(head_dim) == 8 * BLOCK_BYTES[name] / 32


def test_group_and_head_dim_refused():
    with pytest.raises(ValueError, match="32 values"):
        get_format("q4_0", 64)
    assert get_format("q4_0", 32).group_size == 32
    with pytest.raises(ValueError, match="multiple of 32"):
        get_format("q8_0").nbytes(1, 48)


def test_q4_0_uses_sixteen_levels_int4_fifteen():
    """The difference docs/formats.md names: q4_0's d = signed extreme / -8 puts that extreme on
    level -8 (code 0) and uses all 16 levels; int4's scale absmax / 7 never reaches -8."""
    x = np.linspace(-1, 1, 32, dtype=np.float32)[None] * np.float32(0.937)
    q4 = GgmlBlock("q4_0")
    codes = np.array(q4.codes(q4.encode(mx.array(x))))[0, 0]
    assert sorted(set(codes.tolist())) == list(range(-8, 8))  # all 16 levels
    int4 = get_format("int4", 32)
    ivals = np.array(int4.code_values(int4.encode(mx.array(x))["data"]))[0]
    assert -8 not in ivals.tolist() and len(set(ivals.tolist())) == 15


def test_q8_0_rounds_halves_away_from_zero():
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, :4] = [127.0, 2.5, -2.5, 0.5]  # d = 1: halves exactly
    q8 = get_format("q8_0")
    codes = np.array(q8.codes(q8.encode(mx.array(x))))[0, 0, :4].tolist()
    assert codes == [127, 3, -3, 1]  # int8 (round half to even) would give 2, -2, 0
