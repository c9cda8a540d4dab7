"""Quantize-on-write in one kernel (kernels/attention/gpu/encode.py): the shared kernel text,
compiled by g++ under the CPU prelude (tests/cpu_sim/kv_encode_sim.cpp: every GPU thread one
call, over a grid rounded up to whole threadgroups), stores bit for bit what the MLX-ops encoders
of kernels/formats/ store, for fp4 and int4 (per row and per group of 32), q4_0, q8_0, fp8_e4m3
and fp8_e5m2 (per tensor and per head); plus the launch plan. The CUDA / Metal texts are
compiled by tests/test_compile_gates.py; nothing here runs on a GPU. Skipped without g++.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from kvbench.kernels.attention.gpu import encode
from kvbench.kernels.attention.gpu import kernels as gpu_kernels
from kvbench.kernels.formats.registry import get_format

SIM = Path(__file__).parent / "cpu_sim" / "kv_encode_sim.cpp"
GXX = shutil.which("g++")
B, HKV = 2, 4  # 8 rows: row b * HKV + h, so an FP8 head scale lands on the right rows


@pytest.fixture(scope="module")
def sim(request, tmp_path_factory) -> Path:
    if GXX is None:
        pytest.skip("needs g++ (C++20) to build the encode kernel's CPU simulation")
    cache = getattr(request.config, "cache", None)
    where = Path(cache.mkdir("kvbench-encode-sim")) if cache else tmp_path_factory.mktemp("enc")
    sources = [SIM, SIM.with_name("sim_prelude.h"), encode.ENCODE_COMMON, encode.ENCODE_BODY]
    exe = where / f"enc-{hashlib.sha1(b''.join(p.read_bytes() for p in sources)).hexdigest()[:12]}"
    if not exe.exists():
        part = exe.with_suffix(".part")
        cmd = [GXX, "-std=c++20", "-O1", "-Wall", "-Werror", "-Wno-unused-parameter"]
        cmd += ["-ffp-contract=off", f"-I{encode.ENCODE_COMMON.parent}", f"-I{SIM.parent}"]
        subprocess.run([*cmd, str(SIM), "-o", str(part)], check=True)
        part.rename(exe)
    return exe


def rows(d: int, seed: int) -> np.ndarray:
    """float16 [B, HKV, 1, D]: gaussian rows with outlier channels, and rows built to hit the
    encoders' edges: exact ties of every rounding rule (|x| = 7 and 6 give scale 1, so x/s
    lands on .5 and on the E2M1 midpoints; -8 gives q4_0 d = 1), zeros and -0.0, a repeated
    extreme of both signs (q4_0 takes the first), float16 subnormals and values past FP8's
    range (saturation). Finite values only: NaN and inf inputs are not matched (MLX's clip and
    the kernel's fmin / fmax treat NaN differently)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B * HKV, d)) * np.where(rng.random(d) < 0.05, 20.0, 1.0)
    ties = np.resize(np.arange(-7.0, 7.5, 0.5), d)  # absmax 7: int4 scale 1, y = x
    ties[0] = 7.0
    mids = np.resize([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0, 6.0], d)
    q4 = np.resize(np.arange(-8.0, 8.0, 0.5) + 0.0, d)
    q4[0] = -8.0
    zeros = np.zeros(d)
    zeros[1::2] = -0.0
    extreme = rng.standard_normal(d)
    extreme[[3, 9]] = [-5.0, 5.0]
    tiny = rng.standard_normal(d) * 2.0**-20  # float16 subnormals; FP8 subnormals at scale 1
    big = np.clip(rng.standard_normal(d) * 3e4, -6e4, 6e4)  # past E4M3's 448, finite in fp16
    x[1:8] = [ties, mids, q4, zeros, extreme, tiny, big]
    x[4, 1::2] = -0.0
    return x.astype(np.float16).reshape(B, HKV, 1, d)


def run_sim(exe: Path, tmp: Path, name: str, k: np.ndarray, v: np.ndarray, hs, gs: int) -> dict:
    d = k.shape[-1]
    k.tofile(tmp / "k.bin")
    v.tofile(tmp / "v.bin")
    np.asarray(hs, np.float32).tofile(tmp / "hs.bin")
    n_rows, per_head = k.size // d, k.shape[2]
    cmd = [str(exe), name, str(d), str(gs), str(tmp), str(n_rows), str(HKV), str(per_head)]
    subprocess.run(cmd, check=True, timeout=60)
    dtype, width = encode.CODES[name]
    np_dtype = {mx.uint32: np.uint32, mx.uint8: np.uint8, mx.int8: np.int8}[dtype]
    out = {}
    for role in ("k", "v"):
        codes = np.fromfile(tmp / f"{role}_codes.bin", np_dtype)
        out[role] = {"data": codes.reshape(*k.shape[:3], -1)}
        if name not in encode.FP8:
            scales = np.fromfile(tmp / f"{role}_scales.bin", np.float16)
            out[role]["scales"] = scales.reshape(*k.shape[:3], -1)
    return out


def bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


CASES = [
    ("fp4", None, 128), ("fp4", 32, 128), ("int4", None, 128), ("int4", 32, 64),
    ("q4_0", None, 128), ("q8_0", None, 64), ("fp8_e4m3", None, 128), ("fp8_e5m2", None, 64),
]  # fmt: skip


@pytest.mark.parametrize("name,group,d", CASES)
def test_kernel_stores_what_the_mlx_ops_encoder_stores(sim, tmp_path, name, group, d):
    fmt = get_format(name, group)
    k, v = rows(d, 1), rows(d, 2)
    gs = encode.unit_elems(name, d, group)
    got = run_sim(sim, tmp_path, name, k, v, [1.0] * (2 * HKV), gs)
    for role, x in (("k", k), ("v", v)):
        want = fmt.encode(mx.array(x))
        assert set(got[role]) == set(want)
        for part, arr in want.items():
            assert got[role][part].shape == arr.shape, (role, part)
            assert np.array_equal(bits(got[role][part]), bits(np.array(arr))), (role, part)


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_scales_per_tensor_and_per_head(sim, tmp_path, name):
    d = 64
    k, v = rows(d, 3), rows(d, 4)
    per_tensor = get_format(name, None, fp8_scale=0.25)
    k_fmt = get_format(name, None, fp8_scale="per_head").calibrate(mx.array(k), "k")
    v_fmt = get_format(name, None, fp8_scale="per_head").calibrate(mx.array(v), "v")
    assert len(set(k_fmt.scale)) > 1  # the heads really differ
    for kf, vf in ((per_tensor, per_tensor), (k_fmt, v_fmt)):
        hs = np.array(encode.head_scales(kf, vf, HKV))  # what the wrapper passes: [2, HKV]
        got = run_sim(sim, tmp_path, name, k, v, hs, 32)
        for role, x, f in (("k", k, kf), ("v", v, vf)):
            want = np.array(f.encode(mx.array(x))["data"])
            assert np.array_equal(got[role]["data"], want), (role, f.scale)


def test_fp8_head_scales_follow_the_head_over_several_positions(sim, tmp_path):
    """Rows [B, Hkv, L, D] with L = 3 (a prefill's): each row takes its own head's scale."""
    name, d = "fp8_e4m3", 64
    rng = np.random.default_rng(8)
    k = (rng.standard_normal((B, HKV, 3, d)) * 40).astype(np.float16)
    v = (rng.standard_normal((B, HKV, 3, d)) * 40).astype(np.float16)
    k_fmt = get_format(name, None, fp8_scale="per_head").calibrate(mx.array(k), "k")
    v_fmt = get_format(name, None, fp8_scale="per_head").calibrate(mx.array(v), "v")
    got = run_sim(sim, tmp_path, name, k, v, np.array(encode.head_scales(k_fmt, v_fmt, HKV)), 32)
    assert np.array_equal(got["k"]["data"], np.array(k_fmt.encode(mx.array(k))["data"]))
    assert np.array_equal(got["v"]["data"], np.array(v_fmt.encode(mx.array(v))["data"]))
    assert encode.plan(name, k.shape, mx.float16, None).params == (B * HKV * 3, HKV, 3)


def test_a_planted_tie_rule_fails(sim, tmp_path):
    """The check can fail: int4 rounding half away from zero (not to even) moves the ties."""
    d = 64
    k = rows(d, 5)
    got = run_sim(sim, tmp_path, "int4", k, k, [1.0] * 8, d)
    fmt = get_format("int4", None)
    s = np.array(fmt.encode(mx.array(k))["scales"]).astype(np.float32)
    y = k.astype(np.float32) / np.where(s > 0, s, 1)
    away = np.clip(np.trunc(y + np.copysign(0.5, y)), -8, 7).astype(np.int64) & 0xF
    words = (away.reshape(B, HKV, 1, d // 8, 8) << (4 * np.arange(8))).sum(-1).astype(np.uint32)
    assert not np.array_equal(got["k"]["data"], words)  # the tie row differs


def test_plan_counts_threads_and_outputs():
    p = encode.plan("int4", (2, 8, 1, 128), mx.float16, 32)
    assert p.grid == (2 * 8 * 4, 2, 1) and p.threadgroup == (64, 1, 1)  # units x (K, V)
    assert p.params == (16, 8, 1) and dict(p.template) == {"T": "float16", "D": 128, "GS": 32}
    assert p.output_shapes == ((2, 8, 1, 16),) * 2 + ((2, 8, 1, 4),) * 2
    tiny = encode.plan("fp8_e4m3", (1, 1, 1, 4), mx.float16, None)
    assert tiny.grid == (1, 2, 1) and tiny.threadgroup == (1, 1, 1)
    assert tiny.output_names == ("k_codes", "v_codes")
    q4 = encode.plan("q4_0", (1, 8, 1, 128), mx.bfloat16, None)
    assert q4.output_shapes[0] == (1, 8, 1, 64) and dict(q4.template)["GS"] == 32
    with pytest.raises(ValueError, match="head_dim 48"):
        encode.plan("q8_0", (1, 1, 1, 48), mx.float16, None)


def test_accepts_and_refuses():
    assert encode.accepts(get_format("q4_0", None)) is None
    assert "no encode kernel" in encode.accepts(get_format("iq4_nl", None))
    assert "not calibrated" in encode.accepts(get_format("fp8_e4m3", None, fp8_scale="per_head"))


def test_sources_share_the_body_and_prelude():
    for backend in ("cuda", "metal"):
        header, source = encode.encode_source(backend, "q4_0")
        assert header.startswith("#define ENC_CODE 3\n")
        assert source.endswith(gpu_kernels.read(encode.ENCODE_BODY))
        assert gpu_kernels._parts(backend)[0] in header
    cuda = "".join(encode.encode_source("cuda", "q4_0"))
    assert "__fmul_rn" in cuda and "__fadd_rn" in cuda  # never contracted into an fma


def sim_factory(exe: Path, tmp: Path):
    """mx.fast.cuda_kernel stand-in that runs the CPU simulation: the wrapper's inputs, template
    and output order go through as they would to MLX."""

    def factory(name, input_names, output_names, source, header="", **_):
        def call(*, inputs, template, grid, threadgroup, output_shapes, output_dtypes, **__):
            args = dict(zip(input_names, inputs))
            t, (n_rows, hkv, per_head) = dict(template), np.array(args["params"]).tolist()
            assert grid[0] == n_rows * t["D"] // t["GS"] and grid[1] == 2
            code = name.removeprefix("kvbench_kv_encode_")
            for role in ("k", "v"):
                np.array(args[f"{role}_new"]).tofile(tmp / f"{role}.bin")
            np.resize(np.array(args["head_scales"], np.float32), 2 * hkv).tofile(tmp / "hs.bin")
            cmd = [str(exe), code, str(t["D"]), str(t["GS"]), str(tmp), str(n_rows), str(hkv)]
            cmd.append(str(per_head))
            subprocess.run(cmd, check=True, timeout=60)
            files = {"k_codes": "k_codes", "v_codes": "v_codes", "k_scales": "k_scales",
                     "v_scales": "v_scales"}  # fmt: skip
            out = []
            for n, shape, dtype in zip(output_names, output_shapes, output_dtypes):
                raw = np.fromfile(tmp / f"{files[n]}.bin", np.dtype(str(dtype).split(".")[-1]))
                out.append(mx.array(raw.reshape(shape)))
            return out

        return call

    return factory


@pytest.mark.parametrize("name", ["q4_0", "fp8_e5m2"])
def test_wrapper_end_to_end_with_the_simulated_kernel(sim, tmp_path, monkeypatch, name):
    monkeypatch.setattr(mx.fast, "cuda_kernel", sim_factory(sim, tmp_path))
    encode.compiled.cache_clear()
    try:
        d = 64
        k, v = mx.array(rows(d, 6)), mx.array(rows(d, 7))
        k_fmt = get_format(name, None, **({"fp8_scale": 0.5} if name in encode.FP8 else {}))
        v_fmt = get_format(name, None, **({"fp8_scale": 2.0} if name in encode.FP8 else {}))
        got_k, got_v = encode.encode_kv("cuda", k_fmt, v_fmt, k, v)
        for got, fmt, x in ((got_k, k_fmt, k), (got_v, v_fmt, v)):
            want = fmt.encode(x)
            assert set(got) == set(want)
            for part in want:
                assert np.array_equal(bits(np.array(got[part])), bits(np.array(want[part])))
    finally:
        encode.compiled.cache_clear()
