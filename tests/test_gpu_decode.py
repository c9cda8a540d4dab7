"""The GPU kernels' FP8 and iq4_nl decoders held against kvbench's dequantization, bit for bit,
without a GPU.

tests/cpu_sim/decode_check.cpp compiles the kernels' shared helpers
(kernels/attention/gpu/src/flash_decode_common.h: fp8_value, iq4_nl_value, code_value, elem_col,
scale_factor) with g++ and applies them to stored rows as flash_decode_body.inc does (vectors of
VEC bytes, 32-bit words, the column each element lands in, its group's or head's scale). Every
FP8 code (256 per kind) and every iq4_nl code is checked against kvbench's table and against an
oracle that shares no code with it (MLX's mx.from_fp8 for E4M3, the top byte of an IEEE float16
for E5M2, ggml's codebook for iq4_nl); rows of random bytes (every code at every position) and
of encoded data are checked against Format.decode(stored, float32) at each vector width the
launch planner can choose. The whole kernel runs on CPU threads in tests/test_cpu_sim.py; no GPU
has run these formats. Skipped without g++.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from kvbench.kernels.attention.gpu import kernels as gpu_kernels
from kvbench.kernels.attention.gpu import launch
from kvbench.kernels.formats import fp8, lloyd_max, turbo
from kvbench.kernels.formats.ggml import IQ4_NL_VALUES
from kvbench.kernels.formats.registry import get_format

CHECK = Path(__file__).resolve().parent / "cpu_sim" / "decode_check.cpp"
GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++ (C++20) to build the decoders")
FP8 = ("fp8_e4m3", "fp8_e5m2")


@pytest.fixture(scope="module")
def bin_dir(request, tmp_path_factory):
    cache = getattr(request.config, "cache", None)
    if cache is None:
        return tmp_path_factory.mktemp("kvbench-decode-check")
    return Path(cache.mkdir("kvbench-decode-check"))


def build(bin_dir: Path, code: str, vec: int = 16, d: int = 128, gs: int | None = None) -> Path:
    defines = {"KV_CODE": launch.KV_CODES[code], "VEC": vec, "D": d, "GS": gs or d}
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    if code in launch.TQ_CODES:  # the codebook lines the wrapper writes into the header
        book = gpu_kernels.codebook_defines(code, d).splitlines()
        flags += ["-D" + "=".join(line.split()[1:]) for line in book]
    sources = [CHECK, CHECK.with_name("sim_prelude.h"), gpu_kernels.COMMON]
    key = hashlib.sha1("".join(flags).encode() + b"".join(p.read_bytes() for p in sources))
    exe = bin_dir / f"decode-{key.hexdigest()[:12]}"
    if not exe.exists():
        part = exe.with_suffix(".part")
        cmd = [GXX, "-std=c++20", "-O1", "-Wall", "-Werror", "-Wno-unused-parameter"]
        inc = [f"-I{gpu_kernels.COMMON.parent}", f"-I{CHECK.parent}"]
        subprocess.run([*cmd, *inc, *flags, str(CHECK), "-o", str(part)], check=True)
        part.rename(exe)
    return exe


def kernel_table(bin_dir: Path, tmp_path: Path, code: str, d: int = 128) -> np.ndarray:
    out = tmp_path / f"{code}-{d}-table.bin"
    exe = build(bin_dir, code, 4, d)
    subprocess.run([str(exe), "table", str(out)], check=True, timeout=60)
    return np.fromfile(out, np.float32)


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit where want is a number (infinities included); NaN exactly where want
    is NaN (its sign and payload are not part of the format)."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    bad = np.flatnonzero(got.view(np.uint32)[~nan] != want.view(np.uint32)[~nan])
    assert bad.size == 0, (bad[:8], got[~nan][bad[:8]], want[~nan][bad[:8]])


@pytest.mark.parametrize("name", FP8)
def test_every_fp8_code_matches_kvbench_and_an_independent_decoder(bin_dir, tmp_path, name):
    got = kernel_table(bin_dir, tmp_path, name)
    assert_same_bits(got, fp8._table_np(name))  # kvbench's table (kernels/formats/fp8.py)
    codes = np.arange(256, dtype=np.uint8)
    if name == "fp8_e4m3":  # MLX's own E4M3 decoder
        oracle = np.array(mx.from_fp8(mx.array(codes), mx.float32))
    else:  # E5M2 is the top byte of an IEEE binary16: exact in float16, infinities included
        oracle = (codes.astype(np.uint16) << 8).view(np.float16).astype(np.float32)
    assert_same_bits(got, oracle)
    finite = got[np.isfinite(got)]
    assert np.max(finite) == fp8.max_value(name)  # 448 / 57344
    assert np.count_nonzero(got == 0) == 2 and np.signbit(got[0x80])  # +0 and -0


def test_every_iq4_nl_code_matches_ggml_codebook(bin_dir, tmp_path):
    got = kernel_table(bin_dir, tmp_path, "iq4_nl")
    assert got.tolist() == [float(v) for v in IQ4_NL_VALUES]  # ggml's kvalues_iq4nl


def decode_rows(exe: Path, work: Path, data: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The kernel decoders on rows data (uint8 [N, row bytes]) with float32 scales [N, n]."""
    work.mkdir()
    np.ascontiguousarray(data, np.uint8).tofile(work / "data.bin")
    np.ascontiguousarray(scales, np.float32).tofile(work / "scales.bin")
    n = data.shape[0]
    subprocess.run([str(exe), "rows", str(work), str(n)], check=True, timeout=60)
    return np.fromfile(work / "out.bin", np.float32).reshape(n, -1)


def fp8_cases(name: str, hkv: int, d: int):
    """(label, fmt, stored [1, Hkv, L, D]): every code in every head (shuffled bytes) at a
    per-tensor and a per-head scale, and encoded data (saturating and subnormal values)."""
    rng = np.random.default_rng(7)
    codes = np.stack([rng.permutation(256) for _ in range(hkv * 2 * d // 256 * 2)])
    raw = codes.astype(np.uint8).reshape(1, hkv, -1, d)  # every code, shuffled per block
    x = rng.standard_normal((1, hkv, 16, d)).astype(np.float32) * (10.0 ** np.arange(hkv))[
        None, :, None, None
    ]  # fmt: skip
    x[0, 0, 0, :4] = [1e9, -1e9, 1e-12, -0.0]  # saturates / subnormal / signed zero
    fixed = get_format(name, fp8_scale=0.37)
    head = get_format(name, fp8_scale="per_head").calibrate(mx.array(x), "k")
    yield "bytes-tensor", fixed, {"data": mx.array(raw)}
    yield "bytes-head", head, {"data": mx.array(raw)}
    yield "encoded-head", head, head.encode(mx.array(x))
    yield "encoded-one", get_format(name), get_format(name).encode(mx.array(x))


@pytest.mark.parametrize("name", FP8)
@pytest.mark.parametrize("vec", [16, 8, 4])
def test_fp8_rows_decode_as_kvbench_does(bin_dir, tmp_path, name, vec):
    d, hkv = 64, 4
    exe = build(bin_dir, name, vec, d)
    for label, fmt, stored in fp8_cases(name, hkv, d):
        data = np.array(stored["data"])  # [1, Hkv, L, D]
        heads = np.array(gpu_kernels.head_scales(fmt, hkv))  # what the wrapper passes
        scales = np.broadcast_to(heads[:, None], data.shape[1:3]).reshape(-1, 1)
        got = decode_rows(exe, tmp_path / label, data.reshape(-1, d), scales)
        want = np.array(fmt.decode(stored, mx.float32)).reshape(-1, d)
        assert_same_bits(got, want)


def iq4_nl_cases(d: int):
    rng = np.random.default_rng(11)
    fmt = get_format("iq4_nl")
    n = 48
    raw = rng.integers(0, 256, (1, 1, n, d // 2), dtype=np.uint8)  # every nibble pair
    sc = (rng.standard_normal((1, 1, n, d // 32)) * 0.05).astype(np.float16)
    sc[0, 0, 0, 0] = np.float16(0)  # a zero block
    yield "bytes", fmt, {"data": mx.array(raw), "scales": mx.array(sc)}
    x = rng.standard_normal((1, 1, n, d)).astype(np.float32) * rng.uniform(0.01, 30, (n, 1))
    x[0, 0, 1] = 0.0  # an all-zero row: d = 0
    yield "encoded", fmt, fmt.encode(mx.array(x))


@pytest.mark.parametrize("vec", [16, 8, 4])
@pytest.mark.parametrize("d", [32, 128])
def test_iq4_nl_rows_decode_as_kvbench_does(bin_dir, tmp_path, vec, d):
    exe = build(bin_dir, "iq4_nl", vec, d, 32)
    for label, fmt, stored in iq4_nl_cases(d):
        data = np.array(stored["data"]).reshape(-1, d // 2)
        scales = np.array(stored["scales"]).astype(np.float32).reshape(-1, d // 32)
        got = decode_rows(exe, tmp_path / label, data, scales)
        want = np.array(fmt.decode(stored, mx.float32)).reshape(-1, d)
        assert_same_bits(got, want)


def test_the_planner_chooses_the_widths_checked_here():
    """Every vector width the launch planner picks for FP8 and iq4_nl is one tested above."""
    seen = set()
    for code in ("fp8_e4m3", "iq4_nl"):
        for g in (1, 2, 4, 8):
            for d in (64, 128):
                problem = launch.Problem(1, 8 * g, 8, d, 100, kv_code=code)
                seen.add((code, launch.choose_vec(problem)))
    assert {v for _, v in seen} == {16, 8, 4}


TQ = ("tq4_mse", "tq2_mse")


@pytest.mark.parametrize("name", TQ)
@pytest.mark.parametrize("d", [64, 128, 256])
def test_every_turboquant_code_is_its_float32_centroid(bin_dir, tmp_path, name, d):
    """The header's decimal literals give back the float32 centroids kvbench decodes with
    (kernels/formats/turbo.py) bit for bit; those are the Lloyd-Max codebook / sqrt(d) within
    float32 rounding (kvbench divides the float32 codebook in float32: one ulp at most)."""
    got = kernel_table(bin_dir, tmp_path, name, d)
    want = np.array(turbo._mx_tables(turbo.parse_name(name)[0], d, turbo.SEED)[2])
    assert_same_bits(got, want)
    exact = np.array(lloyd_max.codebook(turbo.parse_name(name)[0], d)) / math.sqrt(d)
    np.testing.assert_allclose(got, exact, rtol=2.0**-23)
    assert np.all(np.diff(got) > 0) and np.array_equal(got, -got[::-1])  # sorted, symmetric


def tq_cases(name: str, d: int):
    rng = np.random.default_rng(5)
    fmt = get_format(name)
    bits = turbo.parse_name(name)[0]
    n = 32
    raw = rng.integers(0, 256, (1, 1, n, d * bits // 8), dtype=np.uint8)  # every code
    norms = np.abs(rng.standard_normal((1, 1, n, 1)) * 8).astype(np.float16)
    yield "bytes", fmt, {"codes": mx.array(raw), "norms": mx.array(norms)}
    x = rng.standard_normal((1, 1, n, d)).astype(np.float32) * rng.uniform(0.01, 50, (n, 1))
    x[0, 0, 2] = 0.0  # a zero row: norm 0
    yield "encoded", fmt, fmt.encode(mx.array(x))


@pytest.mark.parametrize("name", TQ)
@pytest.mark.parametrize("vec", [16, 8, 4])
def test_turboquant_rows_decode_as_kvbench_reads_them(bin_dir, tmp_path, name, vec):
    """value * norm per element, in the rotated basis, equals fmt.basis_rows (what
    kernels/attention/turbo.py attends over) bit for bit."""
    d = 128
    exe = build(bin_dir, name, vec, d)
    for label, fmt, stored in tq_cases(name, d):
        rows = gpu_kernels.kernel_rows(stored)
        data = np.array(rows["data"]).reshape(32, -1)
        scales = np.array(rows["scales"]).astype(np.float32).reshape(32, 1)
        got = decode_rows(exe, tmp_path / label, data, scales)
        want = np.array(fmt.basis_rows(stored, mx.float32)).reshape(32, d)
        assert_same_bits(got, want)
