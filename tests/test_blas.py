"""The BLAS under MLX's Linux CPU backend (harness/blas.py): chosen before mlx.core is imported,
the same numbers as an independent float64 product, an opt-out, and bad settings refused.
Each case runs in a fresh interpreter: the choice is made once per process, at import."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from kvbench import blas

LINUX = platform.system() == "Linux"
SYSTEM_BLAS = next((p for origin, p in blas.candidates() if p.exists()), None)
needs_fast_blas = pytest.mark.skipif(
    not (LINUX and (SYSTEM_BLAS or os.environ.get("CI"))),
    reason=f"no fast BLAS on this machine ({blas.INSTALL_HINT}); .ci/run installs one",
)

PROBE = """
import json, sys
import kvbench.blas as blas
import mlx.core as mx
import numpy as np
rng = np.random.default_rng(0)
a = rng.standard_normal((300, 576), dtype=np.float32)
b = rng.standard_normal((576, 200), dtype=np.float32)
c = np.array(mx.matmul(mx.array(a), mx.array(b), stream=mx.cpu))
ref = a.astype(np.float64) @ b.astype(np.float64)
maps = open("/proc/self/maps").read()
print(json.dumps({**blas.chosen(), "err": float(abs(c - ref).max() / abs(ref).max()),
                  "mapped": [l.split()[-1] for l in maps.splitlines() if "blas" in l.lower()]}))
"""


def probe(env: dict | None = None, code: str = PROBE) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in (blas.ENV, "LD_PRELOAD")}
    full.update(env or {})
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_fast_blas
def test_a_fast_blas_is_loaded_and_matmul_matches_float64():
    got = probe()
    assert got["blas"].startswith(("openblas", "mkl")), got
    path = got["blas_source"].split(": ", 1)[1]
    assert any(os.path.realpath(m) == os.path.realpath(path) for m in got["mapped"]), got
    assert got["err"] < 1e-5  # fp32 accumulation over K=576, relative to the largest entry


@pytest.mark.skipif(not LINUX, reason="MLX's Linux CPU wheel only")
def test_opt_out_keeps_the_wheels_blas_with_the_same_numbers():
    got = probe({blas.ENV: "off"})
    assert got["blas"] == "bundled" and "KVBENCH_BLAS=off" in got["blas_source"]
    fast = {os.path.realpath(p) for _, p in blas.candidates()}
    assert not fast & {os.path.realpath(m) for m in got["mapped"]}, got
    assert got["err"] < 1e-5


@pytest.mark.skipif(not LINUX, reason="MLX's Linux CPU wheel only")
def test_mlx_imported_first_is_said_not_hidden():
    got = probe(code="import mlx.core\n" + PROBE)
    assert got["blas"] == "bundled" and "imported before kvbench" in got["blas_source"]


@pytest.mark.skipif(not LINUX, reason="dlopen of a Linux library")
def test_a_library_without_cblas_is_refused_with_the_reason():
    import ctypes.util

    libc = ctypes.util.find_library("c")  # a real library that exports no cblas_sgemm
    got = blas.choose(libc, mlx_loaded=False, system="Linux")
    assert got["blas"] == "bundled" and "exports no cblas_sgemm" in got["problem"]
    got = blas.choose("/no/such/libblas.so", mlx_loaded=False, system="Linux")
    assert got["problem"].startswith("KVBENCH_BLAS: /no/such/libblas.so: cannot load")


def test_other_systems_load_nothing():
    got = blas.choose("auto", mlx_loaded=False, system="Darwin")
    assert got["blas"] == "platform" and "path" not in got


def test_the_cli_refuses_a_bad_setting_in_one_line(tmp_path):
    env = {**os.environ, blas.ENV: str(tmp_path / "missing.so")}
    if not LINUX:
        pytest.skip("KVBENCH_BLAS is read on Linux only")
    cmd = [sys.executable, "-m", "kvbench", "list"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"kvbench: KVBENCH_BLAS: {tmp_path / 'missing.so'}: cannot load: "
        f"{tmp_path / 'missing.so'}: cannot open shared object file: No such file or directory"
    ]


@needs_fast_blas
def test_child_processes_get_the_same_library():
    path = str(blas.preload()["path"])
    env = blas.child_env(ld_preload=True)
    assert env[blas.ENV] == path and path in env["LD_PRELOAD"].split()
    env = blas.child_env(ld_preload=False)
    assert env[blas.ENV] == path and path not in env.get("LD_PRELOAD", "").split()


@needs_fast_blas
def test_the_paired_worker_loads_it_after_its_pin_for_any_tree():
    # harness/run/worker.py loads the driver's choice itself (a tree may choose none), after
    # pinning to one CPU: OpenBLAS then starts one thread, on that CPU
    from kvbench.run import worker

    env = blas.child_env(ld_preload=False)
    code = f"""
import json, os, sys
os.sched_setaffinity(0, {{0}})
sys.path.insert(0, {str(worker.BLAS_FILE.parent / "run")!r})
import worker
got = worker.preload_blas()
import ctypes
lib = ctypes.CDLL(str(got["path"]))
threads = lib.openblas_get_num_threads() if hasattr(lib, "openblas_get_num_threads") else 1
print(json.dumps({{"blas": got["blas"], "threads": threads, "kvbench": "kvbench" in sys.modules}}))
"""
    got = probe(env, code)
    assert got == {"blas": blas.chosen()["blas"], "threads": 1, "kvbench": False}
