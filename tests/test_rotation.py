"""Rotation before quantization (kernels/formats/rotation.py): the Hadamard matrix against its
definition, refusals, every attention path against a numpy computation, the cache engine."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from kvbench.case import Case
from kvbench.engines.cache import build
from kvbench.engines.contract import carrying
from kvbench.errors import SuiteError
from kvbench.kernels.attention.registry import KERNELS, rotated
from kvbench.kernels.formats import rotation
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.model.cache import MixedCache, PlainCache
from kvbench.kernels.model.spec import CacheSpec
from kvbench.suite.cache_spec import spec_of
from kvbench.suite.suite import resolve

# ---- independent numpy reference (from the definitions, not from rotation.py) -------------


def np_walsh(n: int) -> np.ndarray:
    """Walsh-Hadamard by its closed form: H[i, j] = (-1)^popcount(i & j) / sqrt(n)."""
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    bits = np.vectorize(lambda a: bin(a).count("1"))(i & j)
    return ((-1.0) ** bits / math.sqrt(n)).astype(np.float32)


def np_int4(x: np.ndarray, g: int) -> np.ndarray:
    """int4 as docs/formats.md states it: fp16 scale = absmax / 7 per group, codes
    round-half-even clipped to [-8, 7]; returns the dequantized values (float32)."""
    xg = x.astype(np.float32).reshape(*x.shape[:-1], -1, g)
    s = (np.abs(xg).max(-1, keepdims=True) / np.float32(7)).astype(np.float16).astype(np.float32)
    q = np.clip(np.round(xg / np.where(s > 0, s, 1)), -8, 7)
    return (q * s).reshape(x.shape)


def np_attention(q, k, v, scale):
    """Plain softmax attention in float64, GQA by repeating K/V heads."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = (q.astype(np.float64) * scale) @ k.swapaxes(-1, -2)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


# ---- the matrix ----------------------------------------------------------------------------


@pytest.mark.parametrize("d", [8, 64, 128])
def test_hadamard_is_the_walsh_matrix_and_orthonormal(d):
    h = np.array(rotation.hadamard(d))
    np.testing.assert_allclose(h, np_walsh(d), atol=1e-7)
    np.testing.assert_allclose(h @ h.T, np.eye(d), atol=1e-6)
    np.testing.assert_array_equal(h, h.T)


def test_non_power_of_two_is_block_diagonal():
    h = np.array(rotation.hadamard(96))  # 96 = 3 x 32
    assert rotation.block_size(96) == 32
    want = np.kron(np.eye(3), np_walsh(32))
    np.testing.assert_allclose(h, want, atol=1e-7)
    np.testing.assert_allclose(h @ h.T, np.eye(96), atol=1e-6)


@pytest.mark.parametrize(
    "d,k,v", [(64, 64, 64), (128, 128, 64), (256, 256, 64), (96, 32, 32), (80, 16, 16)]
)
def test_default_blocks_are_llamacpps_rule(d, k, v):
    """src/llama-kv-cache.cpp (b11434): n_rot_k starts at 64 and doubles while head_dim %
    (2 * n_rot_k) == 0; n_rot_v stays 64. Below 64 (llama.cpp does not rotate there) the
    largest power-of-two divisor, for V no more than 64."""
    assert rotation.default_block(d, "k") == k and rotation.default_block(d, "v") == v


@pytest.mark.parametrize("block", [8, 64, 128])
def test_block_matrix_is_walsh_blocks_on_the_diagonal(block):
    h = np.array(rotation.hadamard(256, block))
    want = np.kron(np.eye(256 // block), np_walsh(block))
    np.testing.assert_allclose(h, want, atol=1e-7)
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    got = np.array(rotation.rotate(mx.array(x), "hadamard", block))
    np.testing.assert_allclose(got, x @ want, atol=1e-5)


@pytest.mark.parametrize("d,block", [(256, 4), (256, 48), (256, 512), (96, 64), (64, 0)])
def test_refuses_a_block_that_is_not_a_dividing_power_of_two(d, block):
    with pytest.raises(ValueError, match=f"rotation block {block}"):
        rotation.check("hadamard", d, block)


@pytest.mark.parametrize("d", [12, 20, 7, 0])
def test_refuses_head_dims_without_a_block(d):
    with pytest.raises(ValueError, match="no power-of-two block"):
        rotation.check("hadamard", d)


def test_unknown_rotation_refused_and_none_is_identity():
    with pytest.raises(ValueError, match="unknown rotation"):
        rotation.check("givens", 64)
    x = mx.ones((2, 64))
    assert rotation.rotate(x, "none") is x


def test_round_trip_recovers_dense_rows():
    x = mx.random.normal((3, 4, 64), key=mx.random.key(0))
    back = rotation.round_trip(x, get_format("fp32"), "hadamard")
    np.testing.assert_allclose(np.array(back), np.array(x), atol=1e-5)


# ---- attention paths: rotated stored cache == numpy rotate / quantize / attend --------------

PATHS = [  # (kernel, format, group): every timed path that runs on this backend
    ("reference", "int4", 32),
    ("sdpa", "fp32", None),
    ("ops", "fp32", None),
    ("dequant_sdpa", "int4", 32),
    ("tiled", "int4", 32),
    ("partial", "int4", 32),
]


def _qkv(d=64, lk=80, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 8, 1, d)).astype(np.float32)
    k = rng.standard_normal((1, 2, lk, d)).astype(np.float32)
    k[..., 5] *= 12  # an outlier channel, so rotation changes what int4 keeps
    v = rng.standard_normal((1, 2, lk, d)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("kernel,name,group", PATHS)
@pytest.mark.parametrize("rk,rv", [("hadamard", "hadamard"), ("hadamard", "none")])
def test_rotated_paths_match_numpy(kernel, name, group, rk, rv):
    q, k, v = _qkv()
    fmt = get_format(name, group)
    h = np_walsh(64)
    kr, vr = (k @ h if rk != "none" else k), (v @ h if rv != "none" else v)
    kd, vd = (np_int4(kr, group), np_int4(vr, group)) if name == "int4" else (kr, vr)
    want = np_attention(q @ h, kd, vd, 0.125)
    want = want @ h.T if rv != "none" else want
    ks = fmt.encode(rotation.rotate(mx.array(k), rk))
    vs = fmt.encode(rotation.rotate(mx.array(v), rv))
    run = rotated(KERNELS[kernel].fn, rk, rv)
    out = np.array(run(mx.array(q), ks, vs, fmt, mask=None, scale=0.125, tile_kv=32))
    tol = 3e-3 if fmt.compute_dtype == mx.float16 and kernel != "dequant_sdpa" else 2e-4
    np.testing.assert_allclose(out, want, atol=tol)  # fp16 matmuls inside tiled / partial


def test_rotation_changes_the_int4_result_on_outlier_keys():
    """The check above could pass with the rotation dropped on both sides; this one cannot:
    with an outlier channel, rotated int4 keys are nearer the exact attention than plain."""
    q, k, v = _qkv()
    exact = np_attention(q, k, v, 0.125)
    fmt = get_format("int4", 32)
    errs = {}
    for rk in ("none", "hadamard"):
        run = rotated(KERNELS["dequant_sdpa"].fn, rk, "none")
        ks = fmt.encode(rotation.rotate(mx.array(k), rk))
        out = np.array(run(mx.array(q), ks, fmt.encode(mx.array(v)), fmt, scale=0.125))
        errs[rk] = np.linalg.norm(out - exact)
    assert errs["hadamard"] < 0.8 * errs["none"]


def test_quantized_matmul_path_matches_numpy_over_its_decoded_cache():
    q, k, v = _qkv()
    fmt = get_format("affine4")
    h = np_walsh(64)
    ks = fmt.encode(rotation.rotate(mx.array(k), "hadamard"))
    vs = fmt.encode(rotation.rotate(mx.array(v), "hadamard"))
    kd, vd = (np.array(fmt.decode(s, mx.float32)) for s in (ks, vs))
    want = np_attention(q @ h, kd, vd, 0.125) @ h
    run = rotated(KERNELS["quantized_matmul"].fn, "hadamard", "hadamard")
    out = np.array(run(mx.array(q).astype(mx.float16), ks, vs, fmt, scale=0.125))
    np.testing.assert_allclose(out, want, atol=2e-2)


# ---- the cache engine and the suite checks --------------------------------------------------

TINY = dict(model="tiny", n_layers=2, n_q_heads=8, n_kv_heads=2, head_dim=64, context_len=96)


@pytest.mark.parametrize("kernel", ["dequant_sdpa", "tiled"])
def test_cache_engine_stores_rotated_and_passes_parity(kernel):
    plain = Case(**TINY, kv_dtype="int4", group_size=32, kernel=kernel, kv_data="outliers")
    rot = Case(**{**vars(plain), "rotate_k": "hadamard", "rotate_v": "hadamard"})
    assert plain.case_id != rot.case_id and "rotK:hadamard" in rot.label()
    acc = {c.rotate_k: carrying(build)(c).check() for c in (plain, rot)}  # parity gate inside check
    # outlier channels: the rotation spreads them over the group (measured here: recon error
    # 0.170 -> 0.084, cosine 0.967 -> 0.980 for dequant_sdpa)
    assert acc["hadamard"]["cosine"] > acc["none"]["cosine"]
    assert acc["hadamard"]["kv_recon_err"] < 0.7 * acc["none"]["kv_recon_err"]


def test_cache_engine_rotates_in_the_cases_blocks():
    """rot_block_k / rot_block_v reach the stored rows: layer 0's fp32 cache holds K times the
    numpy block matrix of 32 and V times that of 64; the row records the blocks in effect."""
    from kvbench.kernels.data import make_qkv

    base = dict(TINY, head_dim=128, kv_dtype="fp32", kernel="sdpa", rotate_k="hadamard")
    case = Case(**base, rotate_v="hadamard", rot_block_k=32)
    state = carrying(build)(case)
    _, k, v = make_qkv(case.kv_data, (1, 8, 1, 128), (1, 2, 96, 128), case.seed, None)
    k_stored, v_stored = (np.array(a) for a in state.cache()[:2])
    for got, x, block in ((k_stored, k, 32), (v_stored, v, 64)):
        want = np.array(x) @ np.kron(np.eye(128 // block), np_walsh(block))
        np.testing.assert_allclose(got[:, :, :95], want[:, :, :95], atol=1e-5)
    assert state.effective["rot_block_k"] == 32 and state.effective["rot_block_v"] == 64
    assert carrying(build)(Case(**base)).effective["rot_block_k"] == 128  # llama.cpp's rule
    assert carrying(build)(Case(**base)).effective["rot_block_v"] is None  # V not rotated
    assert state.check()["rel_err"] < 1e-5  # exact on fp32: the rotation undone


def test_cache_engine_rotation_keeps_bytes():
    base = Case(**TINY, kv_dtype="int4", group_size=32, kernel="dequant_sdpa")
    rot = Case(**{**vars(base), "rotate_k": "hadamard"})
    assert carrying(build)(rot).kv_bytes == carrying(build)(base).kv_bytes


@pytest.mark.parametrize(
    "extra,key,why",
    [
        (
            {"rotate_k": "hadamard", "head_dim": 12, "kv_dtype": "fp16", "kernel": "sdpa"},
            "rotate_k",
            "no power-of-two block",
        ),
        ({"rotate_v": "givens"}, "rotate_v", "unknown rotation"),
        (
            {"rotate_k": "hadamard", "layout": "unified", "workload": "independent", "n_seqs": 2},
            "rotate_k",
            "not with this layout",
        ),
        ({"rotate_v": "hadamard", "kernel": "numpy"}, "rotate_v", "not with this kernel"),
        ({"rot_block_k": 32}, "rot_block_k", "set without rotate_k"),
        ({"rotate_v": "hadamard", "rot_block_v": 48}, "rot_block_v", "power of two from 8"),
        ({"rotate_v": "hadamard", "rot_block_v": 128}, "rot_block_v", "to head_dim 64"),
    ],
)
def test_suite_refuses_rotation_where_it_cannot_run(extra, key, why):
    fields = {**TINY, "kv_dtype": "int4", "kernel": "dequant_sdpa", **extra}
    with pytest.raises(SuiteError) as e:
        resolve("s.yaml", fields)
    assert e.value.key == key and why in str(e.value)


# ---- the model's cache (quality path) -------------------------------------------------------


def _steps(cache, steps=(20, 1, 1, 7), d=64):
    outs = []
    for i, n in enumerate(steps):
        q, k, v = (
            mx.random.normal((1, h, n, d), key=mx.random.key(s + i))
            for h, s in ((6, 10), (2, 20), (2, 30))
        )
        k = k * mx.array(np.where(np.arange(d) == 9, 10.0, 1.0), dtype=mx.float32)  # outlier
        outs.append(np.array(cache.attend(0, q, k, v, scale=0.125)))
        cache.advance(n)
    return np.concatenate(outs, axis=2)


@pytest.mark.parametrize("window", [False, True])
def test_model_cache_stores_rows_in_the_specs_blocks(window):
    """Global and sliding-window layers alike (llama.cpp rotates both, src/llama-graph.cpp
    build_attn with the iSWA input): K stored times the block matrix of rot_block_k (32), V of
    llama.cpp's V rule (64) at head_dim 128; attention unchanged on an fp32 cache."""
    from kvbench.kernels.model.cache import WindowCache

    spec = CacheSpec("fp32", rotate_k="hadamard", rotate_v="hadamard", rot_block_k=32)
    assert spec.rot(128) == ("hadamard", "hadamard", 32, 64) and spec.label == "fp32-rotK32-rotV"
    make = (lambda s: WindowCache(s, 2, 128, 16, 0, 8, "reference")) if window else (
        lambda s: PlainCache(s, 1, 2, 128, 40, "reference"))  # fmt: skip
    cache, exact = make(spec), make(CacheSpec("fp32"))
    k, v, q = (
        mx.random.normal((1, h, 5, 128), key=mx.random.key(i)) for i, h in enumerate((2, 2, 4))
    )
    out = cache.attend(0, q, k, v, scale=0.1)
    np.testing.assert_allclose(np.array(out), np.array(exact.attend(0, q, k, v, 0.1)), atol=1e-5)
    stored = cache.kv.keys[0]["data"], cache.kv.values[0]["data"]
    for got, x, block in ((stored[0], k, 32), (stored[1], v, 64)):
        want = np.array(x) @ np.kron(np.eye(128 // block), np_walsh(block))
        np.testing.assert_allclose(np.array(got)[:, :, :5], want, atol=1e-5)


def test_q_quant_rounds_in_ks_blocks():
    from kvbench.kernels.model.spec import quantize_query

    q = mx.random.normal((1, 2, 1, 128), key=mx.random.key(3))
    q8, h = get_format("q8_0"), np.kron(np.eye(4), np_walsh(32))
    want = np.array(q8.decode(q8.encode(mx.array(np.array(q) @ h)), mx.float32)) @ h
    np.testing.assert_allclose(np.array(quantize_query(q, "q8_0", "hadamard", 32)), want, atol=1e-5)
    spec = CacheSpec("q8_0", q_quant="q8_0", rotate_k="hadamard", rot_block_k=32)
    got, _ = spec.keys_in_order(q, q)
    np.testing.assert_allclose(np.array(got), want, atol=1e-5)


def test_model_cache_rotation_is_exact_on_a_float32_cache():
    plain = _steps(PlainCache(CacheSpec("fp32"), 1, 2, 64, 40, "reference"))
    rot = CacheSpec("fp32", rotate_k="hadamard", rotate_v="hadamard")
    np.testing.assert_allclose(_steps(PlainCache(rot, 1, 2, 64, 40, "reference")), plain, atol=1e-5)


def test_model_cache_round_trip_equals_rotating_q_and_output():
    """The mixed cache rotates, quantizes, dequantizes and rotates back; the plain cache stores
    rotated rows and rotates q and the output: the same arithmetic. Both differ from no
    rotation (int4 per row, an outlier key channel)."""
    rot = CacheSpec("int4", rotate_k="hadamard", rotate_v="hadamard", k_group=32)
    plain = _steps(PlainCache(rot, 1, 2, 64, 40, "reference"))
    mixed = _steps(MixedCache(rot, 1, 2, 64, 40, "reference"))
    np.testing.assert_allclose(mixed, plain, atol=1e-4)
    none = _steps(PlainCache(CacheSpec("int4", k_group=32), 1, 2, 64, 40, "reference"))
    exact = _steps(PlainCache(CacheSpec("fp32"), 1, 2, 64, 40, "reference"))
    assert np.abs(plain - exact).mean() < 0.8 * np.abs(none - exact).mean()
    assert rot.label == "int4/g32-rotK-rotV"


def test_model_spec_carries_the_case_rotation():
    case = Case(
        "smollm2-135m", 30, 9, 3, 64, 128, phase="quality", kv_dtype="int4", rotate_k="hadamard"
    )
    assert spec_of(case).rotate_k == "hadamard" and spec_of(case).rotate_v == "none"
    resolve(
        "s.yaml",
        {
            "model": "smollm2-135m",
            "phase": "quality",
            "context_len": 128,
            "kv_dtype": "int4",
            "kernel": "reference",
            "rotate_k": "hadamard",
        },
    )
    with pytest.raises(ValueError, match="rotate_k"):
        CacheSpec("int4", rotate_k="givens")


# ---- key channel order and llama.cpp's rotation rule ----------------------------------------


def test_gguf_order_is_the_converters_permutation():
    """llama.cpp's convert_hf_to_gguf permutes a head's Q/K rows by reshape(2, D/2) ->
    swapaxes -> flatten; the same on the channel axis of a key is gguf_order."""
    d = 64
    hf = np.arange(d, dtype=np.float32)[None]
    want = hf.reshape(1, 2, d // 2).swapaxes(1, 2).reshape(1, d)
    np.testing.assert_array_equal(np.array(rotation.gguf_order(mx.array(hf))), want)


def test_k_order_keeps_dense_attention_and_changes_grouped_keys():
    spec = lambda **kw: CacheSpec(**kw)  # noqa: E731
    exact = _steps(PlainCache(spec(k_dtype="fp32"), 1, 2, 64, 40, "reference"))
    gguf = _steps(PlainCache(spec(k_dtype="fp32", k_order="gguf"), 1, 2, 64, 40, "reference"))
    np.testing.assert_allclose(gguf, exact, atol=1e-5)
    a = _steps(PlainCache(spec(k_dtype="q4_0"), 1, 2, 64, 40, "reference"))
    b = _steps(PlainCache(spec(k_dtype="q4_0", k_order="gguf"), 1, 2, 64, 40, "reference"))
    c = _steps(MixedCache(spec(k_dtype="q4_0", k_order="gguf"), 1, 2, 64, 40, "reference"))
    assert np.abs(a - b).max() > 1e-3  # other channels share a block
    np.testing.assert_allclose(c, b, atol=1e-4)
    assert spec(k_dtype="q4_0", k_order="gguf").label == "q4_0-kgguf"


def test_llamacpp_rotation_rule_and_env():
    from kvbench.engines import llamacpp as engine
    from kvbench.peers.llamacpp import rotations

    assert rotations("q4_0", "q4_0", 64, False) == ("hadamard", "hadamard")
    assert rotations("f16", "q8_0", 128, False) == ("none", "hadamard")
    assert rotations("q4_0", "q4_0", 64, True) == ("none", "none")
    assert rotations("q4_0", "q4_0", 96, False) == ("none", "none")  # 96 % 64 != 0
    base = dict(model="smollm2-135m", n_layers=30, n_q_heads=9, n_kv_heads=3, head_dim=64,
                context_len=128, phase="quality", kernel="llama.cpp", kv_dtype="q4_0")  # fmt: skip
    plain = Case(**base)
    rot = Case(**base, rotate_k="hadamard", rotate_v="hadamard")
    half = Case(**base, rotate_k="hadamard")
    assert engine.rotation_env(plain) == {"LLAMA_ATTN_ROT_DISABLE": "1"}
    assert engine.rotation_env(rot) == {}
    assert engine.rotation_reason(plain) is None and engine.rotation_reason(rot) is None
    assert "rotate_v=hadamard" in engine.rotation_reason(half)
    own = Case(**base, rotate_k="hadamard", rotate_v="hadamard", rot_block_k=64, rot_block_v=64)
    assert engine.rotation_reason(own) is None  # llama.cpp's own blocks at head_dim 64
    small = Case(**base, rotate_k="hadamard", rotate_v="hadamard", rot_block_v=32)
    assert engine.rotation_reason(small) == "llama.cpp rotates V in blocks of 64, not 32"


def test_q_quant_rounds_queries_through_q8_0_in_the_key_basis():
    from kvbench.kernels.model.spec import quantize_query

    q = mx.random.normal((1, 3, 2, 64), key=mx.random.key(5))
    assert quantize_query(q, "none", "hadamard") is q
    q8 = get_format("q8_0")
    h = np_walsh(64)
    want = np.array(q8.decode(q8.encode(mx.array(np.array(q) @ h)), mx.float32)) @ h
    got = np.array(quantize_query(q, "q8_0", "hadamard"))
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.abs(got - np.array(q)).max() > 1e-4  # it does round
    spec = CacheSpec("q8_0", q_quant="q8_0", k_order="gguf")
    assert spec.label == "q8_0-kgguf-qq8_0"
    with pytest.raises(ValueError, match="q_quant"):
        CacheSpec("q8_0", q_quant="q4_0")


def test_peers_llamacpp_suite_pairs_every_quality_row():
    """The cross-check: each kvbench quality row has a llama.cpp row of the same format,
    rotation, context and chunks (>= 500 scored tokens), and kvbench's keys are in GGUF order."""
    from kvbench.suite.suite import expand, load_suite

    cases = [c for c in expand(load_suite("suites/peers-llamacpp.yaml")) if c.phase == "quality"]
    key = lambda c: (c.kv_dtype, c.rotate_k, c.rotate_v, c.context_len, c.chunks)  # noqa: E731
    ours = {key(c) for c in cases if c.kernel != "llama.cpp"}
    theirs = {key(c) for c in cases if c.kernel == "llama.cpp"}
    assert ours == theirs and ("q4_0", "hadamard", "hadamard", 128, 8) in ours
    assert all(c.k_order == "gguf" for c in cases if c.kernel != "llama.cpp")
    assert all(c.chunks * (c.context_len // 2 - 1) >= 500 for c in cases)
