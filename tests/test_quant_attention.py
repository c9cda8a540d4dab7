"""Attention over quantized caches, quantize-on-write in the cache engine, K/V data kinds."""

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from kvbench.case import Case
from kvbench.engines import metrics
from kvbench.engines.cache import build
from kvbench.engines.contract import carrying
from kvbench.engines.parity import compare_outputs
from kvbench.errors import SuiteError
from kvbench.kernels.attention.registry import KERNELS, reference, unsupported_reason
from kvbench.kernels.data import OUTLIER_GAIN, make_qkv
from kvbench.kernels.formats.registry import FORMATS, get_format
from kvbench.suite.suite import resolve

QUANTIZED = [n for n in FORMATS if get_format(n).quantized]
MLX_NATIVE = ["mxfp4", "nvfp4", "affine4", "affine8", "affine2", "affine3"]


def _qkv(lq=1, hq=8, hkv=2, lk=96, d=64):
    q, k, v = make_qkv("gaussian", (2, hq, lq, d), (2, hkv, lk, d), seed=3)
    return q.astype(mx.float16), k, v


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("kernel", ["dequant_sdpa", "quantized_matmul"])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_quantized_kernels_match_reference_on_same_cache(name, kernel, mask):
    fmt = get_format(name)
    reason = unsupported_reason(kernel, fmt, "cpu")
    if kernel == "quantized_matmul" and name not in MLX_NATIVE:
        assert reason and "MLX-native" in reason
        return
    assert reason is None
    q, k, v = _qkv(lq=3 if mask else 1)
    ks, vs = fmt.encode(k), fmt.encode(v)
    out = KERNELS[kernel].fn(q, ks, vs, fmt, mask=mask, scale=0.125)
    ref = reference(q.astype(mx.float32), ks, vs, fmt, mask=mask, scale=0.125)
    assert out.shape == q.shape
    assert compare_outputs(out, ref)["rel_err"] < 1e-2


def test_dense_kernels_refuse_quantized_and_vice_versa():
    assert unsupported_reason("sdpa", get_format("fp4"), "cpu")
    assert unsupported_reason("dequant_sdpa", get_format("fp16"), "cpu")
    assert unsupported_reason("quantized_matmul", get_format("int4"), "cpu")


@pytest.mark.parametrize("name", ["fp16", "fp4", "int4", "int8", "mxfp4", "affine4"])
def test_cache_is_packed_and_measured(name):
    """alloc_bytes (active-memory growth) equals the exact formula: the cache is packed."""
    kernel = "sdpa" if name == "fp16" else "dequant_sdpa"
    case = Case("tiny", 2, 8, 2, 64, 96, kv_dtype=name, kernel=kernel, kv_data="outliers")
    state = carrying(build)(case)
    assert state.alloc_bytes == metrics.kv_bytes(case, get_format(name))
    acc = state.check()
    assert acc["cosine"] > 0.9  # per-row 4-bit scales suffer from the outlier channels
    if name == "fp16":
        assert acc["kv_recon_err"] < 1e-3
    else:
        assert 1e-4 < acc["kv_recon_err"] < 0.3


def test_outliers_have_large_key_channels():
    _, k, v = make_qkv("outliers", (1, 4, 1, 64), (1, 4, 512, 64), seed=0)
    rms = np.sqrt((np.array(k) ** 2).mean(axis=(0, 2)))  # [H, D] per-channel rms
    big = rms > OUTLIER_GAIN / 2
    assert (big.sum(axis=-1) == 2).all()  # 64 / 32 outlier channels per head
    assert np.sqrt((np.array(v) ** 2).mean()) < 1.1  # values stay gaussian


def test_kv_file(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "kv.npz"
    np.savez(path, k=rng.standard_normal((2, 50, 64)), v=rng.standard_normal((2, 50, 64)))
    combo = {"model": "tiny", "context_len": 40, "kv_data": "file", "kv_file": str(path)}
    case = resolve("s.yaml", combo)
    _, k, _ = make_qkv("file", (1, 8, 1, 64), (1, 2, 40, 64), 0, case.kv_file)
    np.testing.assert_allclose(np.array(k)[0], np.load(path)["k"][:, :40], rtol=1e-6)
    with pytest.raises(SuiteError, match="L>=60"):
        resolve("s.yaml", {**combo, "context_len": 60})
    with pytest.raises(SuiteError, match="kv_file"):
        resolve("s.yaml", {**combo, "kv_file": None})
    with pytest.raises(SuiteError, match="cannot read"):
        resolve("s.yaml", {**combo, "kv_file": str(tmp_path / "missing.npz")})
    # kv_file is ignored (and left out of the case id) for generated data
    plain = resolve("s.yaml", {**combo, "kv_data": "gaussian"})
    assert plain.kv_file is None
    assert plain.case_id == resolve("s.yaml", {"model": "tiny", "context_len": 40}).case_id


def test_suite_rejects_group_the_format_cannot_use():
    with pytest.raises(SuiteError, match="group_size"):
        resolve(
            "s.yaml", {"model": "tiny", "context_len": 8, "kv_dtype": "mxfp4", "group_size": 64}
        )
    with pytest.raises(SuiteError, match="group_size"):
        resolve("s.yaml", {"model": "tiny", "context_len": 8, "kv_dtype": "fp4", "group_size": 128})


def test_quant_suites_load():
    from kvbench.suite.suite import expand, load_suite

    root = Path(__file__).resolve().parent.parent
    cpu = expand(load_suite(root / "suites/quant.yaml"))
    assert {c.kv_dtype for c in cpu} == set(QUANTIZED) | {"fp16"}
    gpu = expand(load_suite(root / "suites/quant-gpu.yaml"))
    assert {c.group_size for c in gpu} == {None, 32}


def test_peak_memory_covers_stages_not_the_check(monkeypatch):
    """A check that allocates 64 MiB must not show up in peak_mem_bytes."""
    from kvbench import engines
    from kvbench.engines import cache as cache_engine
    from kvbench.engines.contract import Engine
    from kvbench.run import runner
    from kvbench.suite.suite import Settings

    real_build = cache_engine.build

    def build_with_big_check(case):
        state = carrying(real_build)(case)
        check = state.check

        def heavy_check():
            mx.eval(mx.zeros((16, 2**20), dtype=mx.float32))  # 64 MiB, freed on return
            return check()

        state.check = heavy_check
        return state

    engine = Engine(lambda c: True, None, build_with_big_check)
    monkeypatch.setitem(engines.ENGINES, "cache", engine)
    case = Case("tiny", 2, 8, 2, 64, 64, kv_dtype="fp4", kernel="dequant_sdpa")
    run = runner.CaseRun(case)
    settings = Settings(warmup_s=0.01, min_samples=2, max_samples=3, budget_s=0.02, rounds=1)
    runner.measure_round(run, settings, 0)
    kv = metrics.kv_bytes(case, get_format("fp4"))
    assert kv <= run.peak_mem_bytes < 2**24
    assert run.reported["fill_peak_bytes"] >= kv
