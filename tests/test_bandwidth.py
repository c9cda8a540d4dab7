"""The peak-bandwidth probes: every probe of the backend runs and the fastest one is the peak."""

from __future__ import annotations

import math
import re

from kvbench.run import bandwidth


def test_cpu_peak_is_the_fastest_probe():
    got = bandwidth.peak_read_bandwidth("cpu", nbytes=32 * 2**20)
    figures = dict(re.findall(r"(mx\.sum|numpy\.sum) ([0-9.]+) GB/s", got["peak_method"]))
    assert set(figures) == {"mx.sum", "numpy.sum"}
    assert math.isfinite(got["peak_gbps"]) and got["peak_gbps"] > 0
    assert f"{got['peak_gbps']:.1f}" == max(figures.values(), key=float)


def test_gpu_backends_use_the_mlx_probe_only():
    assert bandwidth.PROBES_BY_BACKEND.get("metal", ("mx.sum",)) == ("mx.sum",)
