"""The core count the split planner uses (kernels/attention/gpu/device.py): probes, override,
default."""

from kvbench.kernels.attention.gpu import device as gpu_device
from kvbench.kernels.attention.gpu import launch

IOREG = """+-o AGXAcceleratorG14X  <class AGXAcceleratorG14X, id 0x1000003a5, registered>
    {
      "gpu-core-count" = 38
      "model" = "Apple M2 Max"
    }
"""


def test_parse_ioreg():
    assert gpu_device.parse_ioreg(IOREG) == 38
    assert gpu_device.parse_ioreg("no such key") is None


def test_env_overrides_the_probe(monkeypatch):
    monkeypatch.setenv("KVBENCH_GPU_CORES", "60")
    monkeypatch.setitem(gpu_device.PROBES, "cuda", lambda: 132)
    assert gpu_device.core_count("cuda") == (60, "env")


def test_probe_then_default(monkeypatch):
    monkeypatch.delenv("KVBENCH_GPU_CORES", raising=False)
    monkeypatch.setitem(gpu_device.PROBES, "cuda", lambda: 114)
    monkeypatch.setitem(gpu_device.PROBES, "metal", lambda: None)
    assert gpu_device.core_count("cuda") == (114, "cudart")
    assert gpu_device.core_count("metal") == (launch.METAL.default_cores, "default")


def test_bad_env_value_is_ignored(monkeypatch):
    monkeypatch.setenv("KVBENCH_GPU_CORES", "many")
    monkeypatch.setitem(gpu_device.PROBES, "metal", lambda: 10)
    assert gpu_device.core_count("metal") == (10, "ioreg")


def test_the_probe_is_asked_once_per_process(monkeypatch):
    """The planner runs on every kernel call: the probe (a dlopen, or an `ioreg` process) must
    not (it was host time inside every timed step)."""
    calls = []
    monkeypatch.delenv("KVBENCH_GPU_CORES", raising=False)
    monkeypatch.setitem(gpu_device.PROBES, "cuda", lambda: calls.append(1) or 120)
    assert [gpu_device.core_count("cuda") for _ in range(3)] == [(120, "cudart")] * 3
    assert calls == [1]
