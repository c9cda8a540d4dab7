"""The shared GPU kernel source, compiled with g++ and run on CPU threads (tests/cpu_sim/).

Each GPU thread is a std::thread; barriers and simdgroup shuffles are real synchronisation.
This verifies the shared text (kernels/attention/gpu/src/flash_decode_common.h,
flash_decode_body.inc and
flash_decode_combine.inc) compiles as C++ and, run as written with the launch plan's
threadgroups and the arrays' strides, matches the float32 reference and the numpy emulation
(kernels/attention/gpu/emulate.py: the same order of operations, so partials agree to float32
rounding).
Covers dense / fp4 / int4 / iq4_nl / fp8_e4m3 / fp8_e5m2 (FP8 at a per-tensor and a per-head
scale) / tq4_mse / tq2_mse (q rotated in and the output back, as the wrapper does), GQA
1/2/4/8, D 64/128, all three vector widths, lengths under and not a multiple of the tile,
B*Hkv*L < 8, several splits and sliced (strided) caches.
The Metal and CUDA preludes are not
exercised: only a GPU can do that. Skipped without g++.
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
from kvbench.kernels.attention.gpu import emulate as gpu_emulate
from kvbench.kernels.attention.gpu import kernels as gpu_kernels
from kvbench.kernels.attention.gpu import launch
from kvbench.kernels.attention.registry import reference
from kvbench.kernels.formats.registry import get_format

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "tests" / "cpu_sim" / "flash_decode_sim.cpp"
SIM_PRELUDE = SIM.with_name("sim_prelude.h")
GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ (C++20) to build the simulation")
SIM_TYPES = {"float16": ("_Float16", np.float16), "float32": ("float", np.float32)}
C_TYPES = {"float16": "_Float16", "float32": "float", "uint32": "uint32_t", "uint8": "uint8_t"}

# (kv_dtype, G, D, tile, threads, group_size, (B, Hkv, kv_len, capacity), n_splits)
CONFIGS = [
    ("fp16", 4, 64, 16, 64, None, (1, 2, 50, 50), None),  # 50 not a multiple of the tile
    ("fp4", 8, 64, 8, 64, 32, (1, 2, 40, 64), 3),  # sliced cache, 3 splits
    ("int4", 1, 128, 16, 32, None, (2, 2, 37, 40), 2),  # batch 2, sliced
    ("fp32", 8, 128, 32, 128, None, (1, 1, 3, 3), None),  # B*Hkv*L = 3 < 8, L < tile
    ("fp16", 1, 64, 32, 128, None, (1, 2, 3, 16), None),  # B*Hkv*L = 6, sliced
    ("int4", 4, 64, 32, 128, 64, (1, 1, 1, 4), None),  # one position
    ("fp16", 2, 8, 32, 64, None, (1, 2, 5, 9), 2),  # D = 8: one lane per row, 32 slots
    ("iq4_nl", 1, 128, 32, 128, None, (1, 2, 70, 80), 2),  # 16-byte vectors = one block, sliced
    ("iq4_nl", 2, 64, 16, 64, None, (2, 1, 45, 45), 3),  # 8-byte vectors: half a block
    ("iq4_nl", 4, 128, 32, 128, None, (1, 2, 3, 3), None),  # 4-byte vectors, L < tile
    ("fp8_e4m3@0.25", 1, 128, 32, 128, None, (1, 2, 50, 64), 2),  # per tensor, sliced
    ("fp8_e4m3@per_head", 4, 64, 16, 64, None, (2, 2, 37, 37), 2),  # per KV head
    ("fp8_e5m2@per_head", 8, 128, 32, 128, None, (1, 2, 40, 48), None),  # 4-byte vectors
    ("fp8_e5m2", 2, 64, 32, 128, None, (1, 1, 2, 2), None),  # scale 1, B*Hkv*L*D/4 words < 8
    ("tq4_mse", 4, 128, 32, 128, None, (1, 2, 60, 64), 2),  # rotated q, codebook in the header
    ("tq4_mse", 1, 64, 16, 64, None, (2, 1, 3, 3), None),  # 16-byte vectors, L < tile
    ("tq2_mse", 2, 128, 32, 128, None, (1, 2, 45, 45), 3),  # 16 codes per word
]


def make_format(kv_dtype: str, gs, x: mx.array):
    """'name' or 'name@fp8_scale'; a per_head FP8 scale calibrated on x (the kernel takes one
    scale per KV head for K and V alike)."""
    name, _, fp8_scale = kv_dtype.partition("@")
    fmt = get_format(name, gs, fp8_scale=fp8_scale or "one")
    return fmt.calibrate(x, "k")


def build(plan: launch.LaunchPlan, code: str, tmp: Path, kt: str, st: str) -> Path:
    """The simulation for `plan`; kt, st: the numpy dtype names of K/V data and scales."""
    t = dict(plan.template)
    defines = {
        "KV_CODE": launch.KV_CODES[code],
        "SIM_T": SIM_TYPES[t["T"]][0],
        "SIM_KT": C_TYPES[kt],
        "SIM_ST": C_TYPES[st],
        **{f"SIM_{n}": t[n] for n in ("G", "D", "THREADS", "GS", "VEC")},
        "SIM_TILE": t["TILE_KV"],
    }
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    if code in launch.TQ_CODES:  # the codebook the wrapper writes into the header
        book = gpu_kernels.codebook_defines(code, t["D"]).splitlines()
        flags += ["-D" + "=".join(line.split()[1:]) for line in book]
    sources = [SIM, SIM_PRELUDE, gpu_kernels.COMMON, gpu_kernels.BODY, gpu_kernels.COMBINE_BODY]
    key = hashlib.sha1("".join(flags).encode() + b"".join(p.read_bytes() for p in sources))
    exe = tmp / f"sim-{key.hexdigest()[:12]}"
    if exe.exists():
        return exe
    cmd = [GXX, "-std=c++20", "-O1", "-fno-strict-aliasing", "-pthread", "-Wall", "-Werror"]
    cmd += ["-Wno-unused-parameter", "-Wno-unused-variable", "-Wno-unused-but-set-variable"]
    part = exe.with_suffix(".part")
    inc = [f"-I{gpu_kernels.COMMON.parent}", f"-I{SIM.parent}"]
    subprocess.run([*cmd, *inc, *flags, str(SIM), "-o", str(part)], check=True, text=True)
    part.rename(exe)
    return exe


def elem_strides(a: np.ndarray) -> np.ndarray:
    return np.array([s // a.itemsize for s in a.strides], np.int64)


def write_array(work: Path, name: str, view: np.ndarray) -> None:
    """The view's whole buffer (base) and the view's strides, as the kernel sees them."""
    base = view if view.base is None else view.base
    assert (
        base.flags.c_contiguous
        and view.__array_interface__["data"] == base.__array_interface__["data"]
    )
    base.tofile(work / f"{name}.bin")
    elem_strides(view).tofile(work / f"{name}_strides.bin")


def run_sim(exe, work: Path, q, k: dict, v: dict, plan, scale: float, dtype):
    """k, v: {"data", "scales"} as the split kernel takes them (gpu_kernels.scale_inputs)."""
    work.mkdir()
    views = {"q": q, "k": k["data"], "v": v["data"]}
    views |= {"k_scales": k["scales"], "v_scales": v["scales"]}
    for name, a in views.items():
        write_array(work, name, a)
    np.array(plan.params, np.int32).tofile(work / "params.bin")
    np.array([scale], np.float32).tofile(work / "scale.bin")
    subprocess.run([str(exe), str(work), str(plan.threadgroups[1])], check=True, timeout=120)
    parts = [
        np.fromfile(work / f"{n}.bin", np.float32).reshape(s)
        for n, s in zip(("o_part", "m_part", "l_part"), plan.output_shapes)
    ]
    return parts, np.fromfile(work / "out.bin", dtype).reshape(q.shape)


@pytest.fixture(scope="module")
def bin_dir(request, tmp_path_factory):
    """Binaries are cached in .pytest_cache, keyed by the sources and flags: compiling is most
    of this file's time. Without the cache (-p no:cacheprovider) they go to a temporary
    directory for this session."""
    cache = getattr(request.config, "cache", None)
    if cache is None:
        return tmp_path_factory.mktemp("kvbench-cpu-sim")
    return Path(cache.mkdir("kvbench-cpu-sim"))


@pytest.mark.parametrize("kv_dtype,group,d,tile,threads,gs,shape,n_splits", CONFIGS)
def test_shared_source_on_cpu_threads(
    bin_dir, tmp_path, kv_dtype, group, d, tile, threads, gs, shape, n_splits
):
    b, hkv, kv_len, cap = shape
    kq, kk, kv = mx.random.split(mx.random.key(1), 3)
    k_raw = mx.random.normal((b, hkv, cap, d), key=kk) * mx.arange(1, hkv + 1)[:, None, None]
    fmt = make_format(kv_dtype, gs, k_raw)  # heads of different size: per_head scales differ
    q = mx.random.normal((b, hkv * group, 1, d), key=kq).astype(fmt.compute_dtype)
    full_k = fmt.encode(k_raw)
    full_v = fmt.encode(mx.random.normal((b, hkv, cap, d), key=kv))
    k = {n: a[:, :, :kv_len] for n, a in full_k.items()}  # mx views, as KVCache.view
    v = {n: a[:, :, :kv_len] for n, a in full_v.items()}
    np_view = lambda s: {n: np.array(a)[:, :, :kv_len] for n, a in s.items()}  # noqa: E731
    kn, vn = (np_view(gpu_kernels.kernel_rows(s)) for s in (full_k, full_v))
    if gpu_kernels.kv_code(fmt) in launch.FP8_CODES:  # float32 [Hkv], as the wrapper passes
        ks, vs = (np.array(s) for s in gpu_kernels.scale_inputs(k, v, fmt))
    else:  # the stored group scales, sliced views of the full cache (or a dummy for dense)
        ks, vs = (s.get("scales", np.zeros(1, np.float16)) for s in (kn, vn))
    kn, vn = {"data": kn["data"], "scales": ks}, {"data": vn["data"], "scales": vs}
    problem = gpu_kernels.problem_of(q, k, fmt)
    plan = launch.plan(problem, tile, threads, launch.CUDA, n_splits=n_splits, n_cores=4)
    exe = build(plan, problem.kv_code, bin_dir, kn["data"].dtype.name, ks.dtype.name)
    scale = 1 / math.sqrt(d)
    dtype = SIM_TYPES[problem.dtype][1]
    tq = problem.kv_code in launch.TQ_CODES  # q rotated in, the output back (the wrapper's)
    q_in = np.array(fmt.basis_query(q).astype(q.dtype) if tq else q)
    parts, out = run_sim(exe, tmp_path / "run", q_in, kn, vn, plan, scale, dtype)
    final = fmt.basis_output(mx.array(out)).astype(q.dtype) if tq else mx.array(out)
    ref = reference(q, k, v, fmt, scale=scale)
    assert compare_outputs(final, ref)["rel_err"] <= PARITY_REL_TOL[fmt.compute_dtype]
    # the numpy emulation predicts the compiled source (same order of operations)
    emu = gpu_emulate.partials(q_in, kn, vn, problem, plan, scale)
    for got, want in zip(parts, emu):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    emu_out = gpu_emulate.combine(*emu, dtype).reshape(q.shape)
    np.testing.assert_allclose(out.astype(np.float32), emu_out.astype(np.float32), rtol=1e-3)


def test_sim_prelude_defines_what_the_gpu_preludes_define():
    import re

    def names(text):
        macros = set(re.findall(r"#define (\w+)", text))
        return macros | set(re.findall(r"(?:KV_FN|inline) \w+ (\w+)\(", text))

    sim = names(SIM.read_text() + SIM_PRELUDE.read_text())
    for backend in ("metal", "cuda"):
        prelude = gpu_kernels._parts(backend)[0]
        assert names(prelude) <= sim, names(prelude) - sim
