"""`make gpu-verify` (scripts/gpu_verify.py) without a GPU: its plan, the suite it runs, the
refusal on a machine without a GPU, and the offline wheel rejoining. The GPU run itself cannot
be tested here."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_verify  # noqa: E402


def run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "scripts/gpu_verify.py", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_dry_run_lists_every_step_and_validates_the_suite(tmp_path):
    res = run("--dry-run", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    steps = [line.split()[0] for line in res.stdout.splitlines()[:8]]
    assert steps == ["venv", "mlx", "backend", "tests", "overhead", "suite", "copy", "report"]
    assert "KVBENCH_GPU=1" in res.stdout and "suites/gpu-verify.yaml" in res.stdout
    tail = res.stdout.strip().splitlines()[8:]  # after the steps: the suite's dry run
    assert sum("126 cases, 1 rounds, budget 0.5 s per case" in line for line in tail) == 1
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_suite_covers_what_the_issue_asks():
    from kvbench.suite.suite import expand, load_suite

    cases = expand(load_suite(str(ROOT / "suites" / "gpu-verify.yaml")))
    kernels = {c.kernel for c in cases}
    assert kernels >= {"sdpa", "metal", "cuda", "tiled", "dequant_sdpa", "quantized_matmul"}
    assert {"mlx_lm", "mlx_lm_quant"} <= kernels
    dense = {c.context_len for c in cases if c.kv_dtype in ("fp16", "bf16")}
    assert min(dense) == 4096 and max(dense) == 131072
    four_bit = {c.context_len for c in cases if c.kv_dtype in ("fp4", "int4")}
    assert four_bit == {16384, 32768, 65536}
    assert {c.n_q_heads // c.n_kv_heads for c in cases if c.kernel == "cuda"} == {1, 4, 8}
    assert {c.tile_kv for c in cases if c.kernel == "cuda"} == {32, 64}


@pytest.mark.skipif(gpu_verify.gpu_kind() is not None, reason="this machine has a GPU")
def test_refuses_without_a_gpu_in_one_line(tmp_path):
    res = run("--out", str(tmp_path))
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and "NVIDIA GPU" in res.stderr


def test_offline_wheel_halves_are_rejoined(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "part-a").write_bytes(b"first half|")
    (b / "part-b").write_bytes(b"second half")
    (b / "name").write_text("mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl\n")
    (b / "mlx-0.32.4-cp312-cp312-manylinux_2_35_x86_64.whl").write_bytes(b"base")
    files = gpu_verify.wheel_files([a, b], tmp_path)
    assert [f.name for f in files] == [
        "mlx-0.32.4-cp312-cp312-manylinux_2_35_x86_64.whl",
        "mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl",
    ]
    assert files[1].read_bytes() == b"first half|second half"


def fake_venv(tmp_path: Path) -> str:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    return str(venv / "bin" / "python")


def test_current_python_plan_has_no_venv_and_installs_only_given_wheels(tmp_path):
    steps = gpu_verify.plan("cuda", None, [], tmp_path, "t", "suites/gpu-decode.yaml")
    assert [s[0] for s in steps] == ["backend", "tests", "overhead", "suite", "copy", "report"]
    assert "suites/gpu-decode.yaml" in steps[3][1]
    whl = tmp_path / "mlx-0.32.4-cp312-cp312-manylinux_2_35_x86_64.whl"
    steps = gpu_verify.plan("cuda", None, [whl], tmp_path, "t")
    assert steps[0][0] == "mlx" and "--no-index" in steps[0][1] and str(whl) in steps[0][1]


def test_a_step_gets_only_its_share_of_the_budget(tmp_path):
    code = "import time, sys\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    sys.exit(7)"
    # tests may take 40% of a 5 s budget: stopped near 2 s, the suite after it still runs
    steps = [("tests", ["PY", "-c", code], {}), ("suite", ["PY", "-c", "pass"], {})]
    summary = gpu_verify.execute(steps, fake_venv(tmp_path), tmp_path, "t", budget_s=5)
    assert [(s["step"], s["rc"]) for s in summary["steps"]] == [("tests", 7), ("suite", 0)]
    assert summary["steps"][0]["s"] < 4.5


def test_execute_records_each_step_and_stops_after_a_failed_backend(tmp_path):
    steps = [
        ("mlx", ["PY", "-c", "print('installed')"], {}),
        ("backend", ["PY", "-c", "raise SystemExit(3)"], {}),
        ("tests", ["PY", "-c", "pass"], {}),
    ]
    summary = gpu_verify.execute(steps, fake_venv(tmp_path), tmp_path, "t")
    assert [(s["step"], s["rc"]) for s in summary["steps"]] == [("mlx", 0), ("backend", 3)]
    assert summary["ok"] is False
    assert "installed" in (tmp_path / "gpu-verify-t.log").read_text()


def test_execute_interrupts_a_step_past_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_verify, "BUDGET_S", 2)
    code = "import time, sys\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    sys.exit(7)"
    # run as a background job of a shell would run it: SIGINT ignored, which its steps inherit
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        summary = gpu_verify.execute(
            [("suite", ["PY", "-c", code], {})], fake_venv(tmp_path), tmp_path, "t"
        )
    finally:
        signal.signal(signal.SIGINT, before)
    assert summary["steps"][0]["rc"] == 7 and summary["steps"][0]["s"] < 30  # SIGINT, not kill
