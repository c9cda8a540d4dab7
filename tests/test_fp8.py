"""FP8 formats (kernels/formats/fp8.py) against an independent reference built here: the value
set from the OCP FP8 definition (exact rationals), a brute-force nearest-value encoder with ties
to the even code and saturation, and vLLM's scale rules written out by hand."""

import math
from fractions import Fraction

import mlx.core as mx
import numpy as np
import pytest

from kvbench.kernels.formats import fp8
from kvbench.kernels.formats.registry import get_format

SPECS = {  # name -> (exponent bits, mantissa bits, bias); E4M3 is the "fn" variant (no inf)
    "fp8_e4m3": (4, 3, 7),
    "fp8_e5m2": (5, 2, 15),
}


def reference_values(name: str) -> dict[int, Fraction]:
    """code -> exact value for every finite code, written from the format's definition."""
    e_bits, m_bits, bias = SPECS[name]
    out = {}
    for code in range(256):
        e = (code >> m_bits) & ((1 << e_bits) - 1)
        m = code & ((1 << m_bits) - 1)
        if name == "fp8_e4m3" and e == 15 and m == 7:
            continue  # NaN
        if name == "fp8_e5m2" and e == 31:
            continue  # inf / NaN
        mag = (
            Fraction(m, 1 << m_bits) * Fraction(2) ** (1 - bias)
            if e == 0
            else (1 + Fraction(m, 1 << m_bits)) * Fraction(2) ** (e - bias)
        )
        out[code] = -mag if code & 0x80 else mag
    return out


def brute_force_codes(y: np.ndarray, name: str) -> np.ndarray:
    """Nearest finite value, ties to the code with an even mantissa, beyond the largest
    finite value: that value (sign kept), NaN -> 0x7F."""
    vals = reference_values(name)
    pos = sorted((c, v) for c, v in vals.items() if c < 0x80)
    top = max(v for _, v in pos)
    out = []
    for x in y.tolist():
        if math.isnan(x):
            out.append(0x7F)
            continue
        neg = math.copysign(1.0, x) < 0
        a = min(Fraction(abs(x)) if math.isfinite(x) else top, top)
        best = min(pos, key=lambda cv: (abs(cv[1] - a), cv[0] & 1))
        out.append(best[0] | (0x80 if neg else 0))
    return np.array(out, dtype=np.uint8)


@pytest.mark.parametrize("name", SPECS)
def test_value_table_is_the_definition(name):
    table = fp8._table_np(name)
    ref = reference_values(name)
    for code in range(256):
        if code in ref:
            assert Fraction(float(table[code])) == ref[code], code
        else:
            assert not np.isfinite(table[code])
    assert fp8.max_value(name) == {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}[name]
    assert table[0x38 if name == "fp8_e4m3" else 0x3C] == 1.0
    if name == "fp8_e5m2":
        assert table[0x7C] == np.inf and table[0xFC] == -np.inf


def _edge_values(name: str) -> np.ndarray:
    """Every finite value, every midpoint between neighbours (ties), just either side of
    them, beyond the largest value, the smallest subnormal's half, signed zeros, inf, NaN."""
    v = sorted({float(x) for x in reference_values(name).values()})
    mids = [(a + b) / 2 for a, b in zip(v, v[1:])]
    pts = np.array(v + mids, dtype=np.float32)
    near = np.concatenate([np.nextafter(pts, np.inf), np.nextafter(pts, -np.inf)])
    top = fp8.max_value(name)
    extra = [top * 1.03, top * 1.1, top * 4, 1e30, np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-30]
    return np.concatenate([pts, near, np.array(extra, dtype=np.float32)]).astype(np.float32)


@pytest.mark.parametrize("name", SPECS)
def test_encoder_matches_brute_force_on_edges_and_random(name):
    rng = np.random.default_rng(0)
    rand = (rng.standard_normal(3000) * np.exp2(rng.integers(-20, 20, 3000))).astype(np.float32)
    y = np.concatenate([_edge_values(name), rand])
    got = np.array(fp8.encode_codes(mx.array(y), name))
    np.testing.assert_array_equal(got, brute_force_codes(y, name))


def test_e4m3_agrees_with_mlx_to_fp8_on_finite_values():
    """mx.to_fp8 (E4M3 only) gives the same bytes for finite inputs; it maps NaN to 448, where
    vLLM's conversion keeps NaN, so NaN is left out."""
    y = _edge_values("fp8_e4m3")
    y = y[np.isfinite(y)]
    mine = np.array(fp8.encode_codes(mx.array(y), "fp8_e4m3"))
    np.testing.assert_array_equal(mine, np.array(mx.to_fp8(mx.array(y))))


@pytest.mark.parametrize("name", SPECS)
def test_scale_divides_on_write_and_multiplies_on_read(name):
    x = mx.random.normal((2, 3, 5, 32), key=mx.random.key(1)) * 30
    fmt = get_format(name, fp8_scale=0.25)
    stored = fmt.encode(x)
    xs = np.array(x, dtype=np.float32) / np.float32(0.25)
    want = brute_force_codes(xs.ravel(), name).reshape(xs.shape)
    np.testing.assert_array_equal(np.array(stored["data"]), want)
    back = np.array(fmt.decode(stored, mx.float32))
    np.testing.assert_array_equal(back, fp8._table_np(name)[want] * np.float32(0.25))
    half = np.array(fmt.decode(stored, mx.float16))  # float32 product rounded once
    np.testing.assert_array_equal(half, back.astype(np.float16))


def test_calibration_is_vllms_rule():
    """vLLM calc_kv_scales: k_scale = max|K| / 200, v_scale = max|V| / 100 (float32), per
    tensor; per_head: max over each KV head / the format's largest value."""
    k = np.random.default_rng(2).standard_normal((1, 4, 16, 64)).astype(np.float32) * 7
    pending = get_format("fp8_e4m3", fp8_scale="calibrated")
    assert pending.pending
    for role, div in (("k", 200), ("v", 100)):
        got = pending.calibrate(mx.array(k), role).scale
        assert got == (float(np.abs(k).max() / np.float32(div)),)
    ph = get_format("fp8_e4m3", fp8_scale="per_head").calibrate(mx.array(k), "k")
    want = np.abs(k).max(axis=(0, 2, 3)) / np.float32(448)
    assert ph.scale == tuple(float(s) for s in want)
    stored = ph.encode(mx.array(k))  # per head: head h divided by its own scale
    xs = k / want[None, :, None, None]
    codes = brute_force_codes(xs.ravel(), "fp8_e4m3").reshape(xs.shape)
    np.testing.assert_array_equal(np.array(stored["data"]), codes)
    assert int(ph.saturated(mx.array(k)).item()) == 0  # amax / 448: the largest lands on 448
    with pytest.raises(ValueError, match="not calibrated"):
        pending.encode(mx.array(k))


def test_saturated_values_are_counted():
    x = mx.array([1.0, 447.0, 448.0, 449.0, -500.0, np.inf, np.nan, 60000.0])
    assert int(get_format("fp8_e4m3").saturated(x).item()) == 4  # 449, -500, inf, 60000
    assert int(get_format("fp8_e5m2").saturated(x).item()) == 2  # inf, 60000
    assert int(get_format("fp8_e4m3", fp8_scale=2.0).saturated(x).item()) == 2  # /2: 449, 500 fit


def test_bytes_by_hand():
    one = get_format("fp8_e4m3")
    assert one.nbytes(10, 128) == 1280 and one.bits_per_elem(128) == 8.0
    assert one.tensor_bytes(8) == 4  # one float32 scale per layer's K (or V)
    assert get_format("fp8_e5m2", fp8_scale="calibrated").tensor_bytes(8) == 4
    assert get_format("fp8_e4m3", fp8_scale="per_head").tensor_bytes(8) == 32
    assert get_format("int4").tensor_bytes(8) == 0
    assert one.alloc((1, 2, 3, 64))["data"].nbytes == one.nbytes(6, 64)


@pytest.mark.parametrize("bad", [0, 0.0, -1, -0.5, math.inf, -math.inf, math.nan, "x", "", True])
def test_bad_scales_refused(bad):
    with pytest.raises(ValueError, match="fp8_scale must be"):
        fp8.parse_scale(bad)
    with pytest.raises(ValueError, match="fp8_scale must be"):
        get_format("fp8_e4m3", fp8_scale=bad)


def test_fp8_scale_on_another_format_and_group_sizes_refused():
    with pytest.raises(ValueError, match="applies to"):
        get_format("int4", fp8_scale="calibrated")
    with pytest.raises(ValueError, match="no group size"):
        get_format("fp8_e4m3", 32)
