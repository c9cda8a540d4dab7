"""The launch contract of the Metal / CUDA flash-decode kernels, checked from their plans.

mx.fast.metal_kernel's grid counts THREADS (dispatchThreads), and mx.fast.cuda_kernel divides
its grid by the threadgroup to get blocks (mlx/backend/cuda/custom_kernel.cpp), so for both:
grid = threadgroups x threads per threadgroup in each dimension.
"""

import math

import pytest

from kvbench.case import Case
from kvbench.engines.cache import problem_of, skip_reason
from kvbench.kernels import launch
from kvbench.kernels.formats import get_format
from kvbench.kernels.launch import CUDA, METAL, Problem, TileConfigError, plan, refusal
from kvbench.spec.suite import expand, load_suite

SUITE = load_suite("suites/tiles.yaml")
GPU_CASES = [c for c in expand(SUITE) if c.kernel in ("metal", "cuda")]


def suite_plan(case: Case) -> launch.LaunchPlan:
    fmt = get_format(case.kv_dtype, case.group_size)
    return plan(problem_of(case, fmt), case.tile_kv, limits=launch.LIMITS[case.kernel])


def test_suite_has_gpu_cases():
    assert {c.kernel for c in GPU_CASES} == {"metal", "cuda"}
    assert {c.tile_kv for c in GPU_CASES} == {32, 64}


@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.label())
def test_suite_configs_fit_and_grid_counts_threads(case):
    p = suite_plan(case)
    assert p.shared_bytes <= METAL.shared_bytes  # Apple: 32 KB, for Metal and CUDA alike
    tg = p.threadgroup
    assert tg == (dict(p.template)["THREADS"], 1, 1)
    n_tg = (p.n_splits, case.n_seqs * case.n_kv_heads, 1)  # one per (split, sequence x kv head)
    assert p.grid == tuple(n * t for n, t in zip(n_tg, tg))  # threads, not threadgroups
    assert p.threadgroups == n_tg


def test_grid_is_threads_times_threadgroups_not_threadgroups():
    p = plan(Problem(2, 32, 8, 128, 5000), 32, 256)
    assert p.grid[0] == 256 * p.n_splits and p.grid[1] == 2 * 8
    assert p.grid[0] != p.n_splits


@pytest.mark.parametrize("kv_len", [1, 31, 32, 33, 1000, 4096, 100_003])
@pytest.mark.parametrize("heads", [(1, 1), (2, 8), (4, 32)])
def test_splits_cover_the_sequence_once(kv_len, heads):
    b, hkv = heads
    p = plan(Problem(b, hkv * 4, hkv, 64, kv_len), 32)
    assert p.split_len % 32 == 0
    assert (p.n_splits - 1) * p.split_len < kv_len <= p.n_splits * p.split_len  # none empty
    assert p.params == (kv_len, p.split_len, p.n_splits)


def test_sequence_length_is_an_input_not_a_template_arg():
    a = plan(Problem(1, 32, 8, 128, 1000), 32)
    b = plan(Problem(1, 32, 8, 128, 9000), 32)
    assert a.template == b.template  # one compile serves every length
    assert a.params[0] == 1000 and b.params[0] == 9000
    assert dict(a.template) == {
        "T": "float16",
        "G": 4,
        "D": 128,
        "TILE_KV": 32,
        "THREADS": 128,
        "GS": 128,
    }


def test_shared_bytes_by_hand():
    # G=8, D=128, fp16, tile 32: q 8*128*4 + K,V 2*32*128*2 + p 8*32*4 + m,l,alpha 3*8*4
    assert launch.shared_bytes(Problem(1, 32, 4, 128, 10), 32) == 4096 + 16384 + 1024 + 96


@pytest.mark.parametrize(
    "problem,tile,limits",
    [
        (Problem(1, 32, 4, 128, 100), 64, METAL),  # 39008 B > 32768 B
        (Problem(1, 32, 4, 128, 100, dtype="float32"), 32, METAL),  # float tiles double it
        (Problem(1, 32, 4, 128, 100), 128, CUDA),  # 73824 B > 49152 B
    ],
)
def test_too_large_tiles_are_refused_before_launch(problem, tile, limits):
    with pytest.raises(TileConfigError, match=f"tile_kv {tile} needs .* {limits.name} .*>"):
        plan(problem, tile, limits=limits)


def test_limits_are_the_documented_ones():
    assert METAL.shared_bytes == 32 * 1024 and CUDA.shared_bytes == 48 * 1024


@pytest.mark.parametrize(
    "problem,threads,needle",
    [
        (Problem(1, 8, 2, 64, 10, q_len=10), 128, "decode only"),
        (Problem(1, 8, 2, 64, 10), 100, "multiple of 32"),
        (Problem(1, 8, 2, 64, 10), 2048, "multiple of 32"),
        (Problem(1, 8, 2, 60, 10, kv_code="int4"), 128, "multiples of 8"),
        (Problem(1, 8, 2, 64, 10, kv_code="int8"), 128, "not supported"),
    ],
)
def test_other_refusals(problem, threads, needle):
    assert needle in refusal(problem, 16, threads, METAL)


def test_four_bit_template_carries_the_scale_group():
    p = plan(Problem(1, 8, 2, 128, 10, kv_code="fp4", group_size=32), 16)
    assert dict(p.template)["GS"] == 32


def test_gpu_kernels_are_skipped_on_cpu_with_the_reason():
    case = Case("small", 1, 16, 2, 64, 256, kernel="metal", tile_kv=32)
    assert skip_reason(case, "cpu") == "kernel metal runs on metal, not cpu"
    assert skip_reason(case.__class__(**{**case.__dict__, "kernel": "cuda"}), "cpu") == (
        "kernel cuda runs on cuda, not cpu"
    )


def test_refusal_is_a_skip_reason_on_the_gpu_backend():
    big = Case("small", 1, 32, 4, 128, 256, kernel="metal", tile_kv=64)
    assert "threadgroup memory" in skip_reason(big, "metal")
    assert skip_reason(Case("small", 1, 32, 4, 128, 256, kernel="cuda", tile_kv=64), "cuda") is None
    assert "decode only" in skip_reason(
        Case("small", 1, 8, 2, 64, 9, kernel="metal", phase="prefill"), "metal"
    )
    assert "no tile loader" in skip_reason(
        Case("small", 1, 8, 2, 64, 9, kernel="metal", kv_dtype="mxfp4"), "metal"
    )


def test_default_tile_fits_every_preset_shape_on_metal():
    from kvbench.spec.presets import PRESETS

    for name, s in PRESETS.items():
        problem = Problem(1, s.n_q_heads, s.n_kv_heads, s.head_dim, 4096)
        assert refusal(problem, launch.DEFAULT_TILE_KV, launch.DEFAULT_THREADS, METAL) is None, name
        assert math.ceil(s.n_q_heads / s.n_kv_heads) * s.head_dim <= 1024 * 8  # ACC registers
