"""TurboQuant (kernels/formats/turbo.py, lloyd_max.py): the Lloyd-Max codebook against an
independent quadrature and Max's Gaussian table, the encoding against a numpy reference written
here, the exact bytes by hand, the QJL variant's unbiased inner products (a statistical test
whose tolerance comes from the estimator's exact variance), the kernels, and bad input."""

from __future__ import annotations

import math
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from kvbench.kernels.attention.registry import KERNELS, reference
from kvbench.kernels.formats import lloyd_max, turbo
from kvbench.kernels.formats.registry import get_format

# Max (1960), Table I: positive Lloyd-Max output levels of N(0, 1) at 1..4 bits
MAX_GAUSSIAN = {
    1: (0.7979,),
    2: (0.4528, 1.510),
    3: (0.2451, 0.7560, 1.344, 2.152),
    4: (0.1284, 0.3881, 0.6568, 0.9424, 1.256, 1.618, 2.069, 2.733),
}
# the Gaussian Lloyd-Max mean squared error (1 bit: 1 - 2/pi); the paper's Theorem 1 rounds
# these to 0.36, 0.117, 0.03, 0.009
GAUSSIAN_MSE = {1: 1 - 2 / math.pi, 2: 0.1175, 3: 0.03454, 4: 0.009497}


def sphere_density(z: np.ndarray, d: int) -> np.ndarray:
    """sqrt(d) x, x one coordinate of a uniform point on S^(d-1), written out with math.gamma."""
    c = math.gamma(d / 2) / (math.sqrt(math.pi) * math.gamma((d - 1) / 2))
    return c * (1 - z * z / d) ** ((d - 3) / 2) / math.sqrt(d)


def cell_moments(a: float, b: float, d: int) -> tuple[float, float]:
    """Mass and first moment over [a, b] by 64-point Gauss-Legendre (not the module's grid)."""
    t, w = np.polynomial.legendre.leggauss(64)
    z = (b - a) / 2 * t + (a + b) / 2
    f = sphere_density(z, d) * (b - a) / 2
    return float(np.sum(w * f)), float(np.sum(w * f * z))


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_codebook_meets_the_lloyd_max_conditions(bits, d):
    c = np.array(lloyd_max.codebook(bits, d))
    assert len(c) == 2**bits and np.all(np.diff(c) > 0)
    np.testing.assert_allclose(c, -c[::-1], atol=1e-12)  # symmetric law, symmetric codebook
    edges = [-math.sqrt(d), *lloyd_max.boundaries(bits, d), math.sqrt(d)]
    np.testing.assert_allclose(edges[1:-1], (c[1:] + c[:-1]) / 2)  # nearest-neighbour cells
    total = 0.0
    for k in range(len(c)):  # each centroid is the conditional mean of its cell
        mass, first = cell_moments(edges[k], edges[k + 1], d)
        total += mass
        assert first / mass == pytest.approx(c[k], abs=2e-6)
    assert total == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_codebook_tends_to_max_gaussian_table(bits):
    c = lloyd_max.codebook(bits, 4096)  # the marginal tends to N(0, 1/d)
    np.testing.assert_allclose(c[len(c) // 2 :], MAX_GAUSSIAN[bits], atol=2e-3)
    assert lloyd_max.distortion(bits, 4096) == pytest.approx(GAUSSIAN_MSE[bits], rel=5e-3)
    # below that dimension the bounded marginal is a little easier to quantize
    assert lloyd_max.distortion(bits, 64) < lloyd_max.distortion(bits, 4096)


def numpy_encode(x: np.ndarray, name: str) -> dict:
    """Reference TurboQuant written here: argmin over the centroids, bits packed one by one."""
    bits, variant = turbo.parse_name(name)
    m = bits - 1 if variant == "prod" else bits
    d = x.shape[-1]
    cents = np.array(lloyd_max.codebook(m, d)) / math.sqrt(d)
    norm = np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True).astype(np.float16)
    safe = np.where(norm > 0, norm.astype(np.float64), 1.0)  # a zero row stays zero
    y = (x / safe) @ turbo.rotation_np(turbo.SEED, d).astype(np.float64)
    idx = np.argmin(np.abs(y[..., None] - cents), axis=-1)
    out = {"codes": pack_loop(idx, m), "norms": norm}
    if variant == "prod":
        r = y - cents[idx]
        s = turbo.qjl_np(turbo.SEED, d).astype(np.float64)
        out["signs"] = pack_loop((r @ s.T >= 0).astype(int), 1)
        out["rnorms"] = np.linalg.norm(r, axis=-1, keepdims=True).astype(np.float16)
    return out


def pack_loop(idx: np.ndarray, m: int) -> np.ndarray:
    flat = idx.reshape(-1, idx.shape[-1])
    out = np.zeros((flat.shape[0], flat.shape[1] * m // 8), dtype=np.uint8)
    for row in range(flat.shape[0]):
        for j, code in enumerate(flat[row]):
            for t in range(m):  # stream bit j*m + t holds bit t of index j
                pos = j * m + t
                out[row, pos // 8] |= ((int(code) >> t) & 1) << (pos % 8)
    return out.reshape(*idx.shape[:-1], -1)


def numpy_decode(st: dict, name: str, d: int) -> np.ndarray:
    bits, variant = turbo.parse_name(name)
    m = bits - 1 if variant == "prod" else bits
    cents = np.array(lloyd_max.codebook(m, d)) / math.sqrt(d)
    stream = np.unpackbits(st["codes"], axis=-1, bitorder="little")
    idx = (stream.reshape(*stream.shape[:-1], d, m) << np.arange(m)).sum(-1)
    y = cents[idx]
    if variant == "prod":
        pm1 = np.unpackbits(st["signs"], axis=-1, bitorder="little") * 2.0 - 1
        s = turbo.qjl_np(turbo.SEED, d).astype(np.float64)
        y = y + math.sqrt(math.pi / 2) / d * st["rnorms"].astype(np.float64) * (pm1 @ s)
    r = turbo.rotation_np(turbo.SEED, d).astype(np.float64)
    return st["norms"].astype(np.float64) * (y @ r.T)


@pytest.mark.parametrize("name", turbo.NAMES)
def test_encoding_matches_numpy_reference(name):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 3, 24, 64)) * rng.uniform(0.1, 8, (2, 3, 24, 1))).astype(
        np.float32
    )
    x[0, 0, 0] = 0.0  # a zero row: norm 0, decodes to zeros
    fmt = get_format(name)
    got = {k: np.array(v) for k, v in fmt.encode(mx.array(x)).items()}
    want = numpy_encode(x, name)
    assert got.keys() == want.keys()
    np.testing.assert_array_equal(got["norms"], want["norms"])
    # float32 against float64 rounding may move a value lying on a cell edge: rare
    differ = np.mean(got["codes"] != want["codes"])
    assert differ < 2e-3, differ
    if fmt.prod:
        assert np.mean(got["signs"] != want["signs"]) < 2e-3
    dec = np.array(fmt.decode(fmt.encode(mx.array(x)), mx.float32))
    np.testing.assert_allclose(dec, numpy_decode(got, name, 64), rtol=1e-4, atol=1e-4)
    assert not dec[0, 0, 0].any()


BYTES_128 = {"tq2_mse": 34, "tq3_mse": 50, "tq4_mse": 66, "tq2_prod": 36, "tq3_prod": 52,
             "tq4_prod": 68}  # fmt: skip


@pytest.mark.parametrize("name,per_row", BYTES_128.items())
def test_bytes_by_hand(name, per_row):
    """D = 128: codes 128*m/8, an fp16 norm (2); prod: m = b - 1, + 16 sign bytes + fp16 gamma."""
    fmt = get_format(name)
    assert fmt.nbytes(1, 128) == per_row and fmt.nbytes(1000, 128) == 1000 * per_row
    assert fmt.data_bits == int(name[2])
    stored = fmt.alloc((1, 2, 5, 128))
    assert sum(a.nbytes for a in stored.values()) == fmt.nbytes(10, 128)
    assert sum(a.nbytes for a in fmt.encode(mx.ones((1, 2, 5, 128))).values()) == fmt.nbytes(
        10, 128
    )
    assert fmt.bits_per_elem(128) == 8 * per_row / 128


def test_rotation_is_orthonormal_and_seeded():
    r = turbo.rotation_np(turbo.SEED, 64).astype(np.float64)
    np.testing.assert_allclose(r @ r.T, np.eye(64), atol=1e-6)
    assert not np.array_equal(r, turbo.rotation_np(turbo.SEED + 1, 64))
    np.testing.assert_array_equal(np.abs(r) * 8, np.ones((64, 64)))  # signs times H/sqrt(64)


def qjl_estimates(x, ys, name: str, seeds) -> tuple[np.ndarray, ...]:
    """For queries ys [k, d] and each seed: <y, decode(encode(x))>, the same with the Lloyd-Max
    part alone, and the QJL term's exact variance over S given that seed's rotation:
    n^2 ((pi/2) gamma^2 |w|^2 - <w, r>^2) / d with w = y R (the term is a mean of d i.i.d.
    terms sqrt(pi/2) gamma <s_i, w> sign(<s_i, r>), each of mean <w, r>). [seeds, k] each."""
    d = x.shape[-1]
    est, mse, var = [], [], []
    for seed in seeds:
        fmt = turbo.TurboQuant(name, seed=seed)
        st = fmt.encode(mx.array(x))
        rot = turbo.rotation_np(seed, d).astype(np.float64)
        n = float(np.array(st["norms"]).astype(np.float64)[0])
        est.append(np.array(fmt.decode(st, mx.float32), dtype=np.float64) @ ys.T)
        y_mse = np.array(fmt.centroid_rows(st), dtype=np.float64)
        mse.append(n * (y_mse @ rot.T) @ ys.T)
        w, r = ys @ rot, x / n @ rot - y_mse  # rotated queries; the sketched residual
        var.append(n * n * (math.pi / 2 * (r @ r) * np.sum(w * w, -1) - (w @ r) ** 2) / d)
    return np.array(est), np.array(mse), np.array(var)


@pytest.mark.parametrize("name", ["tq2_prod", "tq3_prod", "tq4_prod"])
def test_prod_inner_products_are_unbiased(name):
    """Over many seeds (rotation and S), the mean of <y, x~> is within 4.5 standard errors of
    <y, x>; the standard error is the exact conditional variance above (averaged over the
    seeds: the mean is <y, x> for every rotation), plus the fp16 norms' rounding (each at most
    2^-11 relative). The empirical variance agrees with the formula. The Lloyd-Max part alone
    fails the same test for y along x: its inner products shrink toward zero (the paper's
    bias), which is what the sketch corrects."""
    rng = np.random.default_rng(11)
    d, seeds = 64, range(400)
    x = rng.standard_normal(d) * 3.0
    ys = np.stack([x / np.linalg.norm(x), rng.standard_normal(d)])  # along x; unrelated
    truth = ys @ x
    est, mse, var = qjl_estimates(x.astype(np.float32), ys, name, seeds)
    se = np.sqrt(var.sum(0)) / len(seeds)
    rounding = 2 * 2.0**-11 * np.linalg.norm(x) * np.linalg.norm(ys, axis=-1)
    assert np.all(np.abs(est.mean(0) - truth) < 4.5 * se + rounding), (est.mean(0), truth, se)
    ratio = est.var(0, ddof=1) / var.mean(0)
    assert np.all((0.75 < ratio) & (ratio < 1.33)), ratio  # chi-square, 399 dof: far inside
    mse_se = mse.std(0, ddof=1) / math.sqrt(len(seeds))  # its spread over rotations
    assert mse.mean(0)[0] - truth[0] < -(4.5 * (se[0] + mse_se[0]) + rounding[0])


@pytest.mark.parametrize("name", ["tq3_mse", "tq4_prod"])
@pytest.mark.parametrize("kernel", ["dequant_sdpa", "tiled"])
def test_kernels_run_turbo_caches(name, kernel):
    """Each decoding path over a TurboQuant cache equals the float32 reference over the same
    stored rows (tiled: tiles of 32 over 96 positions, so three tiles fold)."""
    fmt = get_format(name)
    rng = np.random.default_rng(5)
    q = mx.array(rng.standard_normal((1, 6, 1, 64)).astype(np.float16))
    k, v = (fmt.encode(mx.array(rng.standard_normal((1, 2, 96, 64)))) for _ in range(2))
    out = KERNELS[kernel].fn(q, k, v, fmt, mask=None, scale=0.125, tile_kv=32)
    want = reference(q.astype(mx.float32), k, v, fmt, scale=0.125)
    np.testing.assert_allclose(np.array(out), np.array(want), atol=1e-2)


def float32_twin(name: str):
    """The format computing in float32, so two kernels' difference is the algebra's alone."""
    fmt = get_format(name)
    object.__setattr__(fmt, "compute_dtype", mx.float32)  # frozen dataclass: a test-only twin
    return fmt


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("name", ["tq2_mse", "tq3_mse", "tq4_mse", "tq2_prod", "tq4_prod"])
@pytest.mark.parametrize("kernel", ["turbo_sdpa", "turbo_tiled"])
def test_rotated_basis_kernels_equal_dequantize_then_attend(name, kernel, d):
    """q rotated once (and the output back once) gives what decoding every row gives: in
    float32 to float32 rounding, over GQA 3, three query positions under a causal mask and
    tiles of 40 over 100 positions (the last tile short)."""
    fmt = float32_twin(name)
    rng = np.random.default_rng(d)
    q = mx.array(rng.standard_normal((2, 6, 3, d)).astype(np.float32))
    k, v = (fmt.encode(mx.array(rng.standard_normal((2, 2, 100, d)) * 3)) for _ in range(2))
    kw = {"mask": "causal", "scale": d**-0.5, "tile_kv": 40}
    out = np.array(KERNELS[kernel].fn(q, k, v, fmt, **kw))
    want = np.array(KERNELS["dequant_sdpa"].fn(q, k, v, fmt, **kw))
    assert np.abs(want).max() > 0.1  # the outputs are not near zero
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", ["tq3_mse", "tq3_prod"])
@pytest.mark.parametrize("kernel", ["turbo_sdpa", "turbo_tiled"])
def test_rotated_basis_kernels_in_float16_match_the_reference(name, kernel):
    """As the timed cases run them (float16 compute): within float16 rounding of the float32
    reference over the same stored rows; and the kernels refuse every other format."""
    fmt = get_format(name)
    rng = np.random.default_rng(7)
    q = mx.array(rng.standard_normal((1, 6, 1, 64)).astype(np.float16))
    k, v = (fmt.encode(mx.array(rng.standard_normal((1, 2, 96, 64)))) for _ in range(2))
    out = KERNELS[kernel].fn(q, k, v, fmt, mask=None, scale=0.125, tile_kv=32)
    want = np.array(reference(q.astype(mx.float32), k, v, fmt, scale=0.125))
    err = np.linalg.norm(np.array(out, dtype=np.float32) - want) / np.linalg.norm(want)
    assert err < 2e-3, err
    assert "TurboQuant" in KERNELS[kernel].accepts(get_format("q4_0"))
    assert KERNELS[kernel].accepts(fmt) is None


@pytest.mark.parametrize("kernel", ["turbo_sdpa", "turbo_tiled"])
def test_model_caches_run_the_rotated_basis_kernels(kernel):
    """A model's cache (kernels/model/cache.py) over tq3_mse through each rotated-basis kernel:
    a causal prefill of 20 positions, then decode steps, within float16 rounding of the same
    cache read by the float32 reference kernel."""
    from kvbench.kernels.model.cache import PlainCache
    from kvbench.kernels.model.spec import CacheSpec

    rng = np.random.default_rng(8)
    caches = [PlainCache(CacheSpec("tq3_mse"), 1, 3, 64, 40, kern, 8)
              for kern in (kernel, "reference")]  # fmt: skip
    for n in (20, 1, 3):
        q, k, v = (mx.array(rng.standard_normal((1, h, n, 64)).astype(np.float32))
                   for h in (9, 3, 3))  # fmt: skip
        got, want = (np.array(c.attend(0, q, k, v, 0.125)) for c in caches)
        assert np.linalg.norm(got - want) < 3e-3 * np.linalg.norm(want)
        for c in caches:
            c.advance(n)


def test_bad_bit_width_group_or_head_dim():
    with pytest.raises(ValueError, match="bit width 5 not supported"):
        turbo.parse_name("tq5_mse")
    with pytest.raises(ValueError, match="not a TurboQuant name"):
        turbo.parse_name("tq3_fast")
    with pytest.raises(ValueError, match="group_size must be left out"):
        get_format("tq3_mse", 32)
    for d in (96, 80, 4):
        with pytest.raises(ValueError, match=f"head_dim {d} must be a power of two"):
            get_format("tq4_prod").nbytes(1, d)


@pytest.mark.parametrize(
    "fixed,line",
    [
        ("model: tiny, kv_dtype: tq5_mse", "fixed.kv_dtype: tq5_mse: TurboQuant bit width 5"),
        ("model: tiny, kv_dtype: fp16, v_dtype: tq1_prod", "fixed.v_dtype: tq1_prod: TurboQuant"),
        ("model: tiny, kv_dtype: tq3_mse, group_size: 32", "group_size: tq3_mse: group_size must"),
        ("model: custom, n_layers: 1, n_q_heads: 2, n_kv_heads: 1, head_dim: 96, "
         "kv_dtype: tq4_prod", "head_dim: tq4_prod: head_dim 96 must be a power of two"),
    ],
)  # fmt: skip
def test_suite_refuses_what_turbo_cannot_use(write_suite, fixed, line):
    """One line naming the file, key and reason; exit 2; nothing runs (no --dry-run needed)."""
    path = write_suite(f"fixed: {{{fixed}, context_len: 8}}\n")
    r = subprocess.run([sys.executable, "-m", "kvbench", "run", path], capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert r.stderr.startswith(f"kvbench: {path}: {line}"), r.stderr


def test_peer_script_without_the_package_says_so_in_one_line():
    """scripts/turbo_peer.py needs mlx-turboquant, which kvbench does not install."""
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("mlx_turboquant") is not None:
        pytest.skip("mlx-turboquant is installed here")
    script = Path(__file__).resolve().parent.parent / "scripts" / "turbo_peer.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "pip install --no-deps mlx-turboquant==0.0.2" in r.stderr
