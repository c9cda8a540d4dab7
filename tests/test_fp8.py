"""FP8 formats (kernels/formats/fp8.py) against an independent reference built here: the value
set from the OCP FP8 definition (exact rationals), a brute-force nearest-value encoder with ties
to the even code and saturation, and vLLM's scale rules written out by hand."""

import math
from fractions import Fraction

import mlx.core as mx
import numpy as np
import pytest

from kvbench.engines.contract import carrying
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
    assert int(ph.saturated(mx.array(k)).item()) == 0  # amax / 448: the largest lands at ~448
    with pytest.raises(ValueError, match="not calibrated"):
        pending.encode(mx.array(k))


def test_saturated_values_are_counted():
    """Counted: what rounds past the largest value and is stored as it. E4M3: the next value
    the exponent would give is 480, so |y| in (448, 464] rounds to 448 on its own (464 is a
    tie, to the even 448) and |y| > 464 saturates; E5M2: 57344 then 65536, the tie 61440 goes
    to the even 65536, so |y| >= 61440 saturates."""
    x = mx.array([1.0, 447.0, 448.0, 449.0, 463.9, 464.0, 464.1, -500.0, np.inf, np.nan,
                  60000.0, 61439.0, 61440.0])  # fmt: skip
    assert int(get_format("fp8_e4m3").saturated(x).item()) == 6  # 464.1 ... 61440
    assert int(get_format("fp8_e5m2").saturated(x).item()) == 2  # inf, 61440
    # halved: only inf, 60000, 61439, 61440 stay past 464
    assert int(get_format("fp8_e4m3", fp8_scale=2.0).saturated(x).item()) == 4
    assert fp8.overflow_bound("fp8_e4m3") == (464.0, False)
    assert fp8.overflow_bound("fp8_e5m2") == (61440.0, True)


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


# ---- the cache engine and the suite ----------------------------------------------------------


@pytest.mark.parametrize("kernel", ["reference", "dequant_sdpa", "tiled"])
def test_cache_engine_runs_fp8_and_counts_saturation(kernel):
    """Every MLX path that decodes a stored format reads FP8; the row's kv_saturated is the
    count of layer 0's K and V elements past 464 after the scale (stored as 448), by hand from
    the same data; alloc_bytes is the cache's bytes less the per-tensor scales (floats kvbench
    holds in the format, 4 bytes per layer for K and for V in kv_bytes)."""
    from kvbench.case import Case
    from kvbench.engines import metrics
    from kvbench.engines.cache import build
    from kvbench.kernels.data import make_qkv

    case = Case("tiny", 2, 8, 2, 64, 96, kv_dtype="fp8_e4m3", kernel=kernel,
                kv_data="outliers", fp8_scale="0.01")  # fmt: skip
    state = carrying(build)(case)
    fmt = get_format("fp8_e4m3", fp8_scale="0.01")
    assert state.kv_bytes == metrics.kv_bytes(case, fmt) == 2 * 2 * (2 * 96 * 64 + 4)
    assert state.alloc_bytes == state.kv_bytes - 2 * 2 * 4
    acc = state.check()
    _, k, v = make_qkv("outliers", (1, 8, 1, 64), (1, 2, 96, 64), 0, None)
    kv = np.concatenate([np.array(x.astype(mx.float16), dtype=np.float32) for x in (k, v)])
    assert acc["kv_saturated"] == int(np.sum(np.abs(kv / np.float32(0.01)) > 464)) > 0
    plain = carrying(build)(
        Case("tiny", 2, 8, 2, 64, 96, kv_dtype="fp8_e4m3", kernel=kernel)
    ).check()
    assert plain["kv_saturated"] == 0 and plain["cosine"] > 0.99


BAD_SCALES = {"0": "0", "-1": "-1", "inf": ".inf", "nan": ".nan", "text": "big", "bool": "true"}


@pytest.mark.parametrize("name", BAD_SCALES)
def test_bad_fp8_scale_is_one_line_exit_2(tmp_path, capsys, name):
    from kvbench.cli import main

    path = tmp_path / "s.yaml"
    path.write_text(
        "fixed: {model: tiny, context_len: 16, kv_dtype: fp8_e4m3, kernel: tiled, "
        f"fp8_scale: {BAD_SCALES[name]}}}\n"
    )
    assert main(["run", str(path), "--dry-run"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{path}: fixed.fp8_scale" in lines[0], lines
    assert "positive finite number" in lines[0]


@pytest.mark.parametrize(
    "extra, why",
    [
        ("kv_dtype: int4, kernel: tiled, fp8_scale: 0.5", "applies to fp8_e4m3"),
        ("kv_dtype: fp8_e5m2, kernel: tiled, fp8_scale: calibrated", "a model phase"),
        ("kv_dtype: fp8_e4m3, kernel: tiled, group_size: 32", "no group size"),
    ],
)
def test_fp8_combinations_refused(tmp_path, capsys, extra, why):
    from kvbench.cli import main

    path = tmp_path / "s.yaml"
    path.write_text(f"fixed: {{model: tiny, context_len: 16, {extra}}}\n")
    assert main(["run", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and why in err, err


def test_fp8_scale_number_from_a_suite(tmp_path):
    from kvbench.suite.cache_spec import format_of
    from kvbench.suite.suite import expand, load_suite

    path = tmp_path / "s.yaml"
    path.write_text(
        "fixed: {model: tiny, context_len: 16, kernel: tiled, fp8_scale: 0.25}\n"
        "sweep: {kv_dtype: [fp8_e4m3, fp8_e5m2]}\n"
    )
    cases = expand(load_suite(path))
    assert [format_of(c).scale for c in cases] == [(0.25,), (0.25,)]
    assert all("fp8s:0.25" in c.label() for c in cases)


# ---- a real model's cache (kernels/model/cache.py) ------------------------------------------


def _scales_and_keys(cache, layer: int):
    """((K scale, V scale), stored K bytes [1, H, L, D]) of one layer of a model cache."""
    from kvbench.kernels.model.cache import MixedCache

    if isinstance(cache, MixedCache):
        k, v = cache.k[layer], cache.v[layer]
        return (k.fmt.scale, v.fmt.scale), k.body["data"]
    kf, vf = cache.formats.layers[layer]
    return (kf.scale, vf.scale), cache.kv.keys[layer]["data"]


@pytest.mark.parametrize("cls", ["PlainCache", "MixedCache"])
def test_model_cache_calibrates_each_layer_k_and_v_on_the_first_prefill(cls):
    """Plain (the kernel reads the stored bytes at scale 1, the scales folded into q and the
    output) and mixed (dequantized per stream) caches store the same bytes from the same
    per-layer K and V scales, and attend alike."""
    from kvbench.kernels.model import cache as C
    from kvbench.kernels.model.spec import CacheSpec, kv_bytes

    spec = CacheSpec("fp8_e4m3", fp8_scale="calibrated")
    assert spec.plain
    cache = getattr(C, cls)(spec, 2, 3, 64, 40, "reference")
    rng = np.random.default_rng(3)
    pre, outs = {}, []
    for layer in range(2):
        q, k, v = (rng.standard_normal((1, h, 20, 64)).astype(np.float32) for h in (9, 3, 3))
        k, v = k * (layer + 1), v * 3
        pre[layer] = (k, v)
        outs.append(cache.attend(layer, mx.array(q), mx.array(k), mx.array(v), scale=0.125))
    cache.advance(20)
    for layer, (k, v) in pre.items():
        (sk, sv), body = _scales_and_keys(cache, layer)
        assert sk == (float(np.abs(k).max() / np.float32(200)),)
        assert sv == (float(np.abs(v).max() / np.float32(100)),)
        want = brute_force_codes((k / np.float32(sk[0])).ravel(), "fp8_e4m3")
        np.testing.assert_array_equal(np.array(body[:, :, :20]).ravel(), want)
    assert cache.saturated() == 0
    # a later token past 464 * k_scale is stored as 448 * k_scale and counted; the scale stays
    big = np.zeros((1, 3, 1, 64), dtype=np.float32)
    big[0, 0, 0, :5] = 1000.0 * sk[0]
    q1 = mx.zeros((1, 9, 1, 64))
    cache.attend(1, q1, mx.array(big), mx.zeros((1, 3, 1, 64)), scale=0.125)
    assert cache.saturated() == 5 and _scales_and_keys(cache, 1)[0][0] == sk
    assert kv_bytes(spec, 21, 2, 3, 64) == 2 * (2 * 21 * 3 * 64 + 4 + 4)
    per_head = CacheSpec("fp8_e5m2", fp8_scale="per_head")
    assert kv_bytes(per_head, 21, 2, 3, 64) == 2 * (2 * 21 * 3 * 64 + 2 * 4 * 3)


def test_plain_and_mixed_fp8_caches_attend_alike():
    """Folding the scales into q and the output equals decoding value * scale (float32)."""
    from kvbench.kernels.model.cache import MixedCache, PlainCache
    from kvbench.kernels.model.spec import CacheSpec

    rng = np.random.default_rng(6)
    for scale in ("calibrated", "per_head", 0.05):
        spec = CacheSpec("fp8_e4m3", fp8_scale=scale)
        caches = [cls(spec, 1, 3, 64, 40, "reference") for cls in (PlainCache, MixedCache)]
        for n in (20, 1, 3):  # a prefill, then decode steps
            q, k, v = (rng.standard_normal((1, h, n, 64)).astype(np.float32) for h in (9, 3, 3))
            k *= np.array([1, 5, 20], dtype=np.float32)[None, :, None, None]
            a, b = (c.attend(0, mx.array(q), mx.array(k), mx.array(v), 0.125) for c in caches)
            np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-5)
            for c in caches:
                c.advance(n)
        assert caches[0].saturated() == caches[1].saturated()


def test_model_cache_per_head_scales():
    from kvbench.kernels.model.cache import PlainCache
    from kvbench.kernels.model.spec import CacheSpec

    cache = PlainCache(CacheSpec("fp8_e4m3", fp8_scale="per_head"), 1, 3, 64, 20, "reference")
    k = np.random.default_rng(4).standard_normal((1, 3, 10, 64)).astype(np.float32)
    k *= np.array([1, 10, 100], dtype=np.float32)[None, :, None, None]
    cache.attend(0, mx.zeros((1, 3, 10, 64)), mx.array(k), mx.array(k), scale=0.125)
    want = tuple(float(s) for s in np.abs(k).max(axis=(0, 2, 3)) / np.float32(448))
    assert _scales_and_keys(cache, 0)[0] == (want, want)


@pytest.mark.parametrize("scale", ["one", "calibrated", "per_head", 0.001])
def test_quality_rows_carry_kv_saturated(tmp_path, scale):
    """The quality phase on the tiny model: finite, with the saturated count of every chunk,
    layer and head."""
    from tiny_model import weights, write_gguf

    from kvbench.kernels.model import quality as Q
    from kvbench.kernels.model.load import load_model
    from kvbench.kernels.model.spec import CacheSpec

    model = load_model(write_gguf(tmp_path / "t.gguf", weights(seed=7)))
    ch = Q.chunks(list(range(3, 67)), 32, 2)
    r = Q.quality(model, ch, CacheSpec("fp8_e4m3", fp8_scale=scale), Q.reference_run(model, ch))
    assert all(np.isfinite(v) for v in r.values())
    # calibrated on the chunk's first forward (16 tokens here): vLLM's max/200 and max/100
    # leave 2.2x and 4.5x headroom for later tokens; per_head's max/448 leaves none, so a
    # later token past the first ones' max saturates
    assert (r["kv_saturated"] > 0) == (scale in (0.001, "per_head")), r["kv_saturated"]


@pytest.mark.parametrize(
    "axes, rows",
    [  # rows per layer (positions x KV heads) each layout holds: by hand
        ({"layout": "unified", "n_seqs": 3, "workload": "shared-prefix", "prefix_frac": 1 / 3},
         (3 + 3 * 6) * 2),  # a 3-token prefix once, then 6 tokens per sequence
        ({"layout": "paged", "n_seqs": 3, "workload": "shared-prefix", "prefix_frac": 1 / 3,
          "page_size": 8}, None),
        ({"layout": "window", "window": 4}, None),
    ],
)  # fmt: skip
def test_layout_rows_count_the_per_tensor_scales(axes, rows):
    """Every engine's kv_bytes holds the FP8 scales: 4 bytes per layer for K and for V on top
    of one byte per element, so fp8 bytes = fp16 bytes / 2 + 16 here (2 layers)."""
    import dataclasses

    from kvbench import engines
    from kvbench.case import Case

    c = Case("tiny", 2, 8, 2, 64, 9, kv_dtype="fp8_e4m3", kernel="tiled", **axes)
    half = dataclasses.replace(c, kv_dtype="fp16")
    got, dense = (engines.engine_for(x).build(x).kv_bytes for x in (c, half))
    assert got == dense // 2 + 2 * 2 * 4
    if rows is not None:
        assert got == 2 * 2 * (rows * 64 + 4)


def test_sliding_window_layers_calibrate_too():
    """A sliding-window layer (Gemma's) stores a calibrated FP8 spec with its own K and V
    scales and attends as the same cache without a window would over the visible cells."""
    from kvbench.kernels.model.cache import PlainCache, WindowCache
    from kvbench.kernels.model.spec import CacheSpec

    spec = CacheSpec("fp8_e4m3", fp8_scale="calibrated")
    win = WindowCache(spec, 2, 64, 64, 0, 24, "reference")  # a window wider than the run
    full = PlainCache(spec, 1, 2, 64, 64, "reference")
    rng = np.random.default_rng(8)
    for n in (24, 1, 1):
        q, k, v = (rng.standard_normal((1, h, n, 64)).astype(np.float32) for h in (4, 2, 2))
        a, b = (c.attend(0, mx.array(q), mx.array(k), mx.array(v), 0.125) for c in (win, full))
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-5)
        win.advance(n)
        full.advance(n)
    assert win.formats.layers[0] == full.formats.layers[0]
    assert win.formats.layers[0][0].scale != (1.0,)
