"""Quantized formats against an independent numpy implementation, packing, byte formulas."""

import mlx.core as mx
import numpy as np
import pytest

from kvbench.kernels.formats.registry import FORMATS, get_format, quant
from kvbench.suite.presets import PRESETS

QUANTIZED = [n for n in FORMATS if get_format(n).quantized]

# ---- independent numpy implementation (written from the spec, not from kernels/formats/quant.py)
# ----


def np_e2m1_table() -> np.ndarray:
    """All 16 E2M1 values, code = s<<3 | e<<1 | m: normal (1 + m/2) * 2^(e-1), subnormal m/2."""
    out = []
    for code in range(16):
        s, e, m = code >> 3, (code >> 1) & 3, code & 1
        mag = np.ldexp(1 + m / 2, e - 1) if e else m / 2
        out.append(-mag if s else mag)
    return np.array(out, dtype=np.float32)


def np_scales(x: np.ndarray, g: int, qmax: float) -> tuple[np.ndarray, np.ndarray]:
    """(float16 scales [..., D/G], x / scale in float32 [..., D])."""
    xg = x.astype(np.float32).reshape(*x.shape[:-1], -1, g)
    s = (np.abs(xg).max(-1) / np.float32(qmax)).astype(np.float16)
    s32 = s.astype(np.float32)[..., None]
    return s, (xg / np.where(s32 > 0, s32, 1)).reshape(x.shape)


def np_fp4_codes(y: np.ndarray) -> np.ndarray:
    """Nearest E2M1 magnitude, ties to the even code, sign from the sign bit."""
    table = np_e2m1_table()[:8]
    dist = np.abs(np.abs(y)[..., None] - table)  # [..., 8]
    best = dist.min(-1, keepdims=True)
    tied = np.isclose(dist, best, rtol=0, atol=0)
    # among tied codes prefer an even one (mantissa bit 0), then the smaller
    pref = np.where(tied, np.arange(8) % 2 * 8 + np.arange(8), 99)
    mag = pref.argmin(-1)
    return (mag | (np.signbit(y).astype(np.int64) << 3)).astype(np.uint32)


def np_pack(codes: np.ndarray) -> np.ndarray:
    c = codes.astype(np.uint32).reshape(*codes.shape[:-1], -1, 8)
    out = np.zeros(c.shape[:-1], dtype=np.uint32)
    for j in range(8):
        out |= c[..., j] << np.uint32(4 * j)
    return out


def np_encode(name: str, x: np.ndarray, g: int) -> dict:
    if name == "fp4":
        s, y = np_scales(x, g, 6.0)
        return {"data": np_pack(np_fp4_codes(y)), "scales": s}
    if name == "int4":
        s, y = np_scales(x, g, 7.0)
        q = np.clip(np.round(y), -8, 7).astype(np.int64)
        return {"data": np_pack((q % 16).astype(np.uint32)), "scales": s}
    s, y = np_scales(x, g, 127.0)
    return {"data": np.clip(np.round(y), -127, 127).astype(np.int8), "scales": s}


# ---- tests ----------------------------------------------------------------------------------


def test_fp4_values_derived_from_bits():
    assert quant.FP4_MAGNITUDES == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    assert [quant.fp4_value(c) for c in range(16)] == list(np_e2m1_table())


@pytest.mark.parametrize("scale", [1.0, 0.375, 3.0])
def test_every_fp4_code_round_trips(scale):
    row = mx.array(np_e2m1_table() * scale)[None]  # [1, 16]: codes 0..15 in order
    stored = get_format("fp4").encode(row)
    # nibble order: element j in bits 4j..4j+3, element 0 lowest
    assert np.array(stored["data"]).tolist() == [[0x76543210, 0xFEDCBA98]]
    codes = quant.unpack_nibbles(stored["data"])
    assert np.array(codes).tolist() == [list(range(16))]
    back = np.array(get_format("fp4").decode(stored, mx.float32))
    np.testing.assert_array_equal(back, np_e2m1_table()[None] * scale)
    assert np.signbit(back[0, 8])  # code 8 is -0.0 and stays -0.0


def test_int4_nibbles_are_twos_complement():
    row = mx.array(np.arange(-7, 9, dtype=np.float32)[None].clip(-7, 7))  # -7..7, 7 twice
    stored = get_format("int4").encode(row)
    codes = np.array(quant.unpack_nibbles(stored["data"]))[0]
    assert codes.tolist() == [(v % 16) for v in range(-7, 8)] + [7]
    np.testing.assert_array_equal(np.array(get_format("int4").decode(stored, mx.float32)), row)


def test_pack_unpack_inverse_on_random_data():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, size=(3, 5, 64), dtype=np.uint32)
    packed = quant.pack_nibbles(mx.array(codes))
    np.testing.assert_array_equal(np.array(packed), np_pack(codes))
    np.testing.assert_array_equal(np.array(quant.unpack_nibbles(packed)), codes)
    words = rng.integers(0, 2**32, size=(4, 16), dtype=np.uint32)
    np.testing.assert_array_equal(
        np.array(quant.pack_nibbles(quant.unpack_nibbles(mx.array(words)))), words
    )


@pytest.mark.parametrize("name", ["fp4", "int4", "int8"])
@pytest.mark.parametrize("group", [None, 32, 64, 128])
def test_matches_numpy_implementation(name, group):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 3, 7, 128)) * rng.uniform(0.1, 5, (2, 3, 7, 1))).astype(np.float16)
    x[0, 0, 0] = 0  # an all-zero row: scale 0, decodes to zeros
    fmt = get_format(name, group)
    stored = fmt.encode(mx.array(x))
    want = np_encode(name, x, group or 128)
    for key in ("data", "scales"):
        assert stored[key].dtype == fmt.alloc(x.shape)[key].dtype
        np.testing.assert_array_equal(np.array(stored[key]), want[key], err_msg=key)
    decoded = np.array(fmt.decode(stored, mx.float32))
    assert not decoded[0, 0, 0].any()
    err = np.linalg.norm(decoded - x) / np.linalg.norm(x)
    assert err < (0.01 if name == "int8" else 0.15)


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_nbytes_equals_stored_arrays_and_alloc_matches_encode(name, head_dim):
    fmt = get_format(name)
    x = mx.random.normal((2, 2, 3, head_dim), key=mx.random.key(2))
    stored, alloc = fmt.encode(x), fmt.alloc(x.shape)
    assert set(stored) == set(alloc)
    for key in alloc:
        assert (stored[key].shape, stored[key].dtype) == (alloc[key].shape, alloc[key].dtype)
    assert sum(a.nbytes for a in stored.values()) == fmt.nbytes(12, head_dim)
    assert fmt.compute_dtype == mx.float16
    assert fmt.decode(stored).dtype == mx.float16


def test_bad_group_sizes_rejected():
    for name, group in [("fp4", 16), ("int4", 48), ("mxfp4", 64), ("nvfp4", 32), ("affine4", 16)]:
        with pytest.raises(ValueError):
            get_format(name, group)
    with pytest.raises(ValueError):
        get_format("fp4", 128).nbytes(1, 64)  # group larger than the row


# Hand calculations: bytes per row (one position x one head, D = 128), then
# total = 2 (K, V) x layers x n_seqs x kv_heads x context x bytes_per_row.
#   fp16 256; fp4/int4 per row 64 + 2 = 66; g32 64 + 4*2 = 72; int8 g64 128 + 2*2 = 132;
#   int8 per row 128 + 2 = 130; mxfp4 64 + 4*1 = 68; nvfp4 64 + 8*1 = 72;
#   affine4 g64 64 + 2*2 + 2*2 = 72; affine8 g128 128 + 2 + 2 = 132.
HAND = [
    # llama-3-8b: 32 layers, 8 kv heads; ctx 8192, 1 seq: 2*32*8*8192 = 4,194,304 rows
    ("llama-3-8b", 8192, 1, "fp16", None, 1_073_741_824),  # 4,194,304 * 256 = 1 GiB
    ("llama-3-8b", 8192, 1, "fp4", None, 276_824_064),  # * 66
    ("llama-3-8b", 8192, 1, "int4", 32, 301_989_888),  # * 72
    ("llama-3-8b", 8192, 1, "int8", 64, 553_648_128),  # * 132
    ("llama-3-8b", 8192, 1, "mxfp4", None, 285_212_672),  # * 68
    ("llama-3-8b", 8192, 1, "nvfp4", None, 301_989_888),  # * 72
    ("llama-3-8b", 8192, 1, "affine4", 64, 301_989_888),  # * 72
    ("llama-3-8b", 8192, 1, "affine8", 128, 553_648_128),  # * 132
    # mistral-7b: 32 layers, 8 kv heads; ctx 32768: 16,777,216 rows
    ("mistral-7b", 32768, 1, "fp16", None, 4_294_967_296),  # * 256 = 4 GiB
    ("mistral-7b", 32768, 1, "fp4", 128, 1_107_296_256),  # * 66
    ("mistral-7b", 32768, 1, "affine4", None, 1_207_959_552),  # * 72 (default group 64)
    # qwen2-7b: 28 layers, 4 kv heads; ctx 4096, 4 seqs: 2*28*4*4*4096 = 3,670,016 rows
    ("qwen2-7b", 4096, 4, "fp16", None, 939_524_096),  # * 256
    ("qwen2-7b", 4096, 4, "int4", None, 242_221_056),  # * 66
    ("qwen2-7b", 4096, 4, "mxfp4", None, 249_561_088),  # * 68
    ("qwen2-7b", 4096, 4, "int8", None, 477_102_080),  # * 130
]


@pytest.mark.parametrize("model, ctx, seqs, name, group, want", HAND)
def test_byte_formulas_match_hand_calculations(model, ctx, seqs, name, group, want):
    p = PRESETS[model]
    fmt = get_format(name, group)
    assert 2 * p.n_layers * fmt.nbytes(seqs * p.n_kv_heads * ctx, p.head_dim) == want


def test_bits_per_element():
    assert get_format("fp4").bits_per_elem(128) == 4.125  # 4 + 16/128
    assert get_format("int4", 32).bits_per_elem(128) == 4.5
    assert get_format("mxfp4").bits_per_elem(128) == 4.25  # 4 + 8/32
    assert get_format("nvfp4").bits_per_elem(64) == 4.5  # 4 + 8/16
    assert get_format("affine4", 64).bits_per_elem(128) == 4.5  # 4 + (16+16)/64
    assert get_format("fp16").bits_per_elem(128) == 16.0


def test_fp4_ties_round_to_even_code():
    row = np.array([[6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5]], dtype=np.float32)  # scale 1
    want = [7, 0, 2, 2, 4, 4, 6, 6]  # each midpoint goes to the code with mantissa 0
    stored = get_format("fp4").encode(mx.array(row))
    assert np.array(quant.unpack_nibbles(stored["data"]))[0].tolist() == want
    assert np_fp4_codes(row)[0].tolist() == want


@pytest.mark.parametrize("name", ["fp4", "int4", "int8"])
def test_half_precision_decode_is_float32_decode_rounded_once(name):
    fmt = get_format(name, 32)
    stored = fmt.encode(mx.random.normal((4, 128), key=mx.random.key(5)) * 3)
    want = np.array(fmt.decode(stored, mx.float32).astype(mx.float16))
    np.testing.assert_array_equal(np.array(fmt.decode(stored, mx.float16)), want)
