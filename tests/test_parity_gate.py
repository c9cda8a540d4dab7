"""A kernel that disagrees with the reference gets an error row, never a time."""

import mlx.core as mx
import pandas as pd

from kvbench.case import Case
from kvbench.kernels.attention.registry import KERNELS, Kernel, any_format
from kvbench.kernels.attention.tiled import tiled
from kvbench.run import session
from kvbench.run.session import run_suite
from kvbench.suite.suite import Settings, Suite


def wrong_tiled(q, k, v, fmt, *, mask=None, scale, tile_kv=None):
    """The tiled kernel with a classic bug: the last partial tile is dropped."""
    n = k["data"].shape[2] // tile_kv * tile_kv
    cut = lambda s: {name: a[:, :, :n] for name, a in s.items()}  # noqa: E731
    return tiled(q, cut(k), cut(v), fmt, mask=mask, scale=scale, tile_kv=tile_kv)


def test_wrong_kernel_gets_an_error_row_and_no_time(monkeypatch, tmp_path, quiet):
    monkeypatch.setitem(KERNELS, "wrong", Kernel(wrong_tiled, any_format))
    monkeypatch.setattr(  # the peak-bandwidth probe reads 256 MiB: not what is tested here
        session, "peak_read_bandwidth", lambda backend: {"peak_gbps": None, "peak_method": None}
    )
    settings = Settings(warmup_s=0.01, min_samples=2, max_samples=3, budget_s=0.05, rounds=1)
    suite = Suite(path="-", name="gate", settings=settings)
    base = dict(model="tiny", n_layers=1, n_q_heads=8, n_kv_heads=2, head_dim=64, tile_kv=32)
    cases = [
        Case(**base, context_len=100, kernel="wrong"),  # 100 % 32 != 0: 4 positions dropped
        Case(**base, context_len=100, kernel="tiled"),
        Case(**base, context_len=100, kernel="tiled", kv_dtype="int4"),
        Case(**base, context_len=100, kernel="metal"),
    ]
    writer = run_suite(suite, cases, tmp_path, progress=quiet)
    rows = pd.read_csv(writer.csv_path).set_index("kernel")
    bad = rows.loc["wrong"]
    assert bad.status == "error" and "ParityError" in bad.error and "rel_err" in bad.error
    assert pd.isna(bad.median_ms) and pd.isna(bad.n_samples)
    samples = pd.read_csv(writer.samples_path)
    assert bad.case_id not in set(samples.case_id)
    tiled_rows = rows.loc["tiled"]
    assert (tiled_rows.status == "ok").all() and (tiled_rows.median_ms > 0).all()
    assert rows.loc["metal"].status == "skipped" and "not cpu" in rows.loc["metal"].error


def test_gate_rejects_nan():
    from kvbench.engines.parity import ParityError, parity_gate

    out = mx.full((1, 2, 1, 4), mx.nan)
    try:
        parity_gate("x", out, mx.ones((1, 2, 1, 4)), mx.float16)
    except ParityError:
        return
    raise AssertionError("NaN passed the gate")
