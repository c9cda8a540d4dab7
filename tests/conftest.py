"""Shared test helpers: an independent float64 numpy attention oracle and small suite files."""

from __future__ import annotations

import os

import numpy as np
import pytest

import kvbench  # noqa: F401  first: it loads the fast BLAS, which must precede any mlx.core import


def numpy_attention(q, k, v, scale, causal=False, mask=None):
    """float64 attention written from the definition: q [B,Hq,Lq,D], k/v [B,Hkv,Lk,D]."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    out = np.zeros((b, hq, lq, d))
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hkv)  # query head h reads KV head h // group
            s = q[bi, h] @ k[bi, kh].T * scale  # [Lq, Lk]
            if causal:
                allowed = np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq)
                s = np.where(allowed, s, -np.inf)
            if mask is not None:
                s = np.where(np.broadcast_to(mask, (b, hq, lq, lk))[bi, h], s, -np.inf)
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            out[bi, h] = (p / p.sum(axis=-1, keepdims=True)) @ v[bi, kh]
    return out


@pytest.fixture
def write_suite(tmp_path):
    """Write YAML text to a suite file and return its path."""

    def write(text: str, name: str = "suite.yaml"):
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


class _Quiet:
    """A progress display that prints nothing (harness/run/progress.py's interface)."""

    def start(self, label):
        pass

    def done(self):
        pass

    def close(self):
        pass


@pytest.fixture
def quiet():
    """A silent progress for run_suite."""
    return _Quiet()


# tests/benchmarks holds pytest-benchmark timings, not checks: skipped unless `make bench-pytest`
# (which sets KVBENCH_BENCH=1) selects them.
collect_ignore_glob = [] if os.environ.get("KVBENCH_BENCH") == "1" else ["benchmarks/*"]
