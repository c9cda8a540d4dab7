"""Peers: each matches the float32 reference on small shapes; absent packages skip, never fail."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import mlx.core as mx
import pandas as pd
import pytest

from kvbench import engines
from kvbench.case import Case
from kvbench.engines import cache as cache_engine
from kvbench.engines import metrics
from kvbench.engines import peers as peers_engine
from kvbench.kernels.attention.registry import reference
from kvbench.kernels.data import make_qkv
from kvbench.kernels.formats.registry import FORMATS, get_format
from kvbench.peers.base import DecodeData
from kvbench.peers.registry import PEERS, missing_reason
from kvbench.run import session
from kvbench.suite.suite import Settings, Suite, expand, load_suite

REPO = Path(__file__).resolve().parent.parent
TINY = dict(model="tiny", n_layers=2, n_q_heads=8, n_kv_heads=2, head_dim=64)


def case(kernel: str, kv_dtype: str = "fp16", context_len: int = 200, **kw) -> Case:
    return Case(**TINY, context_len=context_len, kv_dtype=kv_dtype, kernel=kernel, **kw)


def need(kernel: str) -> None:
    reason = missing_reason(kernel)
    if reason:
        pytest.skip(reason)


DENSE_CASES = [
    ("mlx_lm", "fp16", {}),
    ("mlx_lm", "fp32", {}),
    ("mlx_lm", "fp16", {"context_len": 257}),  # the priming step grows mlx-lm's buffer
    ("mlx_lm_rotating", "fp16", {}),
    ("mlx_lm_rotating", "bf16", {"window": 64}),  # wrapped: attends over the last 64
    ("torch_sdpa", "fp16", {}),
    ("torch_sdpa", "bf16", {}),
    ("torch_sdpa", "fp32", {"n_seqs": 2}),
    ("numpy_ref", "fp32", {"n_seqs": 2}),
]


@pytest.mark.parametrize("kernel,kv_dtype,kw", DENSE_CASES)
def test_peer_matches_reference(kernel, kv_dtype, kw):
    need(kernel)
    c = case(kernel, kv_dtype, **kw)
    assert engines.skip_reason(c, "cpu") is None
    state = engines.engine_for(c).build(c)
    acc = state.check()  # raises ParityError on a mismatch
    tol = 1e-5 if kv_dtype == "fp32" else 1e-2
    assert acc["rel_err"] < tol and acc["cosine"] > 0.999
    assert set(state.stages) == {"step", "write", "attend"}
    for fn in state.stages.values():
        mx.eval(fn())
    assert state.check()["rel_err"] == pytest.approx(acc["rel_err"], rel=1e-3, abs=1e-7)


def quant_data(kv_dtype: str, context_len: int) -> DecodeData:
    q, k, v = make_qkv("gaussian", (1, 8, 1, 64), (1, 2, context_len, 64), 0)
    return DecodeData(q, k, v, n_layers=2, kv_dtype=kv_dtype, scale=0.125)


@pytest.mark.parametrize("kv_dtype", ["affine4", "affine8"])
def test_mlx_lm_quant_matches_reference_over_its_stored_cache(kv_dtype):
    need("mlx_lm_quant")
    data = quant_data(kv_dtype, 300)
    peer = PEERS["mlx_lm_quant"].make(data)
    for _ in range(3):  # every sample is the same step: the result must not drift
        mx.eval(peer.step())
    k, v = peer.stored(0)
    assert k.shape == (1, 2, 300, 64)
    dense = get_format("fp32")
    ref = reference(data.q, {"data": k}, {"data": v}, dense, scale=data.scale)
    rel = mx.linalg.norm(peer.output(0) - ref) / mx.linalg.norm(ref)
    assert rel.item() < 1e-2
    exact = reference(data.q, {"data": data.k}, {"data": data.v}, dense, scale=data.scale)
    err = (mx.linalg.norm(peer.output(0) - exact) / mx.linalg.norm(exact)).item()
    assert err < (0.3 if kv_dtype == "affine4" else 0.03)


@pytest.mark.skipif("affine4" not in FORMATS, reason="affine4/affine8 formats land with issue 3")
def test_mlx_lm_quant_through_the_engine():
    need("mlx_lm_quant")
    acc = engines.engine_for(c := case("mlx_lm_quant", "affine4")).build(c).check()
    assert 1e-4 < acc["kv_recon_err"] < 0.3


def test_every_sample_is_the_same_step():
    need("mlx_lm_rotating")
    for kernel, kw in (("mlx_lm", {}), ("mlx_lm_rotating", {"window": 64})):
        data = quant_data("fp16", 200)
        peer = PEERS[kernel].make(dataclasses.replace(data, **kw))
        before = [(c.offset, getattr(c, "_idx", None)) for c in peer.caches]
        mx.eval(peer.step())
        first = peer.output(0)
        mx.eval(peer.step())
        assert [(c.offset, getattr(c, "_idx", None)) for c in peer.caches] == before
        assert mx.array_equal(first, peer.output(0))
    assert peer.span == 64 and peer.stored(0)[0].shape[2] == 64


def test_absent_packages_give_skip_reasons(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlx_lm", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    for kernel in ("mlx_lm", "mlx_lm_rotating", "torch_sdpa"):
        reason = engines.skip_reason(case(kernel), "cpu")
        assert "not installed" in reason and "kvbench[peers]" in reason
    assert engines.skip_reason(case("numpy_ref", "fp32"), "cpu") is None


def test_absent_packages_are_skipped_rows_in_a_run(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mlx_lm", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(
        session, "peak_read_bandwidth", lambda backend: {"peak_gbps": 10.0, "peak_method": "test"}
    )
    settings = Settings(warmup_s=0.01, min_samples=2, max_samples=3, budget_s=0.05, rounds=1)
    suite = Suite(path="t.yaml", name="t", settings=settings)
    cases = [case(k, "fp32", 64) for k in ("mlx_lm", "torch_sdpa", "numpy_ref", "sdpa")]
    writer = session.run_suite(suite, cases, tmp_path, progress=None)
    df = pd.read_csv(writer.csv_path).set_index("kernel")
    assert df.loc["mlx_lm", "status"] == "skipped"
    assert df.loc["mlx_lm", "error"] == "mlx-lm not installed: pip install kvbench[peers]"
    assert df.loc["torch_sdpa", "status"] == "skipped"
    assert (df.loc[["numpy_ref", "sdpa"], "status"] == "ok").all()
    # the same byte model: GB/s of a peer and of kvbench's kernel compare like for like
    assert df.loc["numpy_ref", "bytes_read"] == df.loc["sdpa", "bytes_read"]
    assert pd.isna(df.loc["numpy_ref", "peak_mem_bytes"])  # numpy memory is not MLX's
    assert df.loc["numpy_ref", "alloc_bytes"] == df.loc["sdpa", "kv_bytes"]
    # facts the report needs are recorded in the measured rows (not copied into the report)
    assert df.loc[["numpy_ref", "sdpa"], "kernel_kind"].tolist() == ["peer", "kvbench"]
    assert (df.loc[["numpy_ref", "sdpa"], "data_bits"] == 32).all()


@pytest.mark.parametrize(
    "c,backend,expect",
    [
        (case("numpy_ref", "fp16"), "cpu", "runs kv_dtype fp32, not fp16"),
        (case("numpy_ref", "fp32"), "cuda", "runs on cpu, not cuda"),
        (case("torch_sdpa"), "metal", "runs on cpu/cuda, not metal"),
        (case("mlx_lm_quant", "fp16"), "cpu", "runs kv_dtype affine4/affine8, not fp16"),
        (case("mlx_lm", phase="prefill"), "cpu", "decode phase only"),
        (case("mlx_lm", window=64), "cpu", "layout: window"),
        (case("sdpa", window=64), "cpu", "layout: window"),
    ],
)
def test_unsupported_combinations_are_skipped_with_a_reason(c, backend, expect):
    assert expect in engines.skip_reason(c, backend)


def test_engines_are_picked_by_kernel_name():
    assert engines.engine_for(case("mlx_lm")).build.__wrapped__ is peers_engine.build
    assert engines.engine_for(case("sdpa")).build.__wrapped__ is cache_engine.build


def test_window_shrinks_the_byte_model_and_flops():
    fmt = get_format("fp16")
    full, win = case("mlx_lm_rotating"), case("mlx_lm_rotating", window=50)
    read_full, _ = metrics.traffic_bytes(full, fmt)
    read_win, _ = metrics.traffic_bytes(win, fmt)
    per_position = 2 * 2 * 2 * 64 * 2  # layers x (K, V) x kv heads x D x 2 bytes
    assert read_full - read_win == 150 * per_position
    assert metrics.flops(win) * 4 == metrics.flops(full)
    assert metrics.kv_bytes(win, fmt) * 4 == metrics.kv_bytes(full, fmt)
    assert case("mlx_lm_rotating", window=500).case_id != full.case_id
    assert dataclasses.replace(full, window=None).case_id == full.case_id


@pytest.mark.parametrize("name", ["peers", "peers-gpu", "peers-quant"])
def test_peer_suites_load(name):
    cases = expand(load_suite(REPO / "suites" / f"{name}.yaml"))
    kernels = {c.kernel for c in cases}
    assert {"sdpa", "mlx_lm"} <= kernels
    assert ("mlx_lm_quant" in kernels) == (name != "peers")


def test_inventory_lists_the_peers():
    from kvbench.run.inventory import inventory

    text = inventory()
    assert "peer kernels" in text and "numpy_ref" in text and "mlx_lm_quant" in text
