"""The shared GPU kernel source, compiled with g++ and run on CPU threads (tests/cpu_sim/).

Each GPU thread is a std::thread; barriers and simdgroup shuffles are real synchronisation.
This verifies the shared text (kernels/gpu/flash_decode_common.h and flash_decode_body.inc)
compiles as C++ and, run as written with the launch plan's threadgroups, matches the reference.
The Metal and CUDA preludes are not exercised: only a GPU can do that. Skipped without g++.
"""

import hashlib
import math
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from kvbench.engines.parity import PARITY_REL_TOL, compare_outputs
from kvbench.kernels import gpu_emulate, gpu_kernels, launch
from kvbench.kernels.attention import reference
from kvbench.kernels.formats import get_format

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "tests" / "cpu_sim" / "flash_decode_sim.cpp"
GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ (C++20) to build the simulation")

# (kv_dtype, group, d, tile, threads, group_size, kv_len): dense / fp4 / int4, GQA 1/4/8
CONFIGS = [
    ("fp16", 4, 64, 16, 64, None, 50),
    ("fp4", 8, 64, 8, 64, 32, 40),
    ("int4", 1, 128, 16, 32, None, 37),
]


def build(plan: launch.LaunchPlan, code: str, tmp: Path) -> Path:
    t = dict(plan.template)
    defines = {
        "KV_CODE": launch.KV_CODES[code],
        "SIM_T": "_Float16" if t["T"] == "float16" else "float",
        "SIM_G": t["G"],
        "SIM_D": t["D"],
        "SIM_TILE": t["TILE_KV"],
        "SIM_THREADS": t["THREADS"],
        "SIM_GS": t["GS"],
    }
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    sources = [SIM, gpu_kernels.COMMON, gpu_kernels.BODY]
    key = hashlib.sha1("".join(flags).encode() + b"".join(p.read_bytes() for p in sources))
    exe = tmp / f"sim-{key.hexdigest()[:12]}"
    if exe.exists():
        return exe
    cmd = [GXX, "-std=c++20", "-O1", "-pthread", f"-I{gpu_kernels.COMMON.parent}", *flags]
    part = exe.with_suffix(".part")
    subprocess.run([*cmd, str(SIM), "-o", str(part)], check=True, capture_output=True, text=True)
    part.rename(exe)
    return exe


def run_sim(exe: Path, work: Path, q, k: dict, v: dict, plan, scale: float, n_bh: int):
    work.mkdir()
    dummy = np.zeros(1, np.float16)
    arrays = {
        "q": q,
        "k": k["data"],
        "v": v["data"],
        "k_scales": k.get("scales", dummy),
        "v_scales": v.get("scales", dummy),
        "params": np.array(plan.params, np.int32),
        "scale": np.array([scale], np.float32),
    }
    for name, a in arrays.items():
        np.ascontiguousarray(a).tofile(work / f"{name}.bin")
    subprocess.run([str(exe), str(work), str(n_bh)], check=True, timeout=120)
    shapes = plan.output_shapes
    return [
        np.fromfile(work / f"{n}.bin", np.float32).reshape(s)
        for n, s in zip(("o_part", "m_part", "l_part"), shapes)
    ]


@pytest.fixture(scope="module")
def bin_dir(request, tmp_path_factory):
    """Binaries are cached in .pytest_cache, keyed by the sources and flags: compiling is most
    of this file's time. Without the cache (-p no:cacheprovider) they go to a temporary
    directory for this session."""
    cache = getattr(request.config, "cache", None)
    if cache is None:
        return tmp_path_factory.mktemp("kvbench-cpu-sim")
    return Path(cache.mkdir("kvbench-cpu-sim"))


@pytest.mark.parametrize("kv_dtype,group,d,tile,threads,group_size,kv_len", CONFIGS)
def test_shared_source_on_cpu_threads(
    bin_dir, tmp_path, kv_dtype, group, d, tile, threads, group_size, kv_len
):
    fmt = get_format(kv_dtype, group_size)
    hkv = 2
    kq, kk, kv = mx.random.split(mx.random.key(1), 3)
    q = mx.random.normal((1, hkv * group, 1, d), key=kq).astype(mx.float16)
    k = fmt.encode(mx.random.normal((1, hkv, kv_len, d), key=kk))
    v = fmt.encode(mx.random.normal((1, hkv, kv_len, d), key=kv))
    problem = gpu_kernels.problem_of(q, k, fmt)
    plan = launch.plan(problem, tile, threads)
    exe = build(plan, problem.kv_code, bin_dir)
    as_np = lambda s: {n: np.array(a) for n, a in s.items()}  # noqa: E731
    scale = 1 / math.sqrt(d)
    parts = run_sim(exe, tmp_path / "run", np.array(q), as_np(k), as_np(v), plan, scale, hkv)
    out = gpu_emulate.combine_splits(*parts).reshape(q.shape)
    ref = reference(q, k, v, fmt, scale=scale)
    assert compare_outputs(mx.array(out), ref)["rel_err"] <= PARITY_REL_TOL[mx.float16]
    # and the numpy emulation predicts the compiled source's partials (same order of operations)
    emu = gpu_emulate.partials(np.array(q), as_np(k), as_np(v), problem, plan, scale)
    for got, want in zip(parts, emu):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_sim_prelude_defines_what_the_gpu_preludes_define():
    import re

    def names(text):
        return set(re.findall(r"#define (\w+)", text)) | set(
            re.findall(r"float (lane_\w+)\(", text)
        )

    metal_prelude = gpu_kernels.SOURCES["metal"].read_text().split(gpu_kernels.ENTRY_MARK)[0]
    assert names(metal_prelude) <= names(SIM.read_text())
    assert "FP4_MAGNITUDE" in SIM.read_text()
