"""The launch contract of the Metal / CUDA flash-decode kernels, checked from their plans.

mx.fast.metal_kernel's grid counts THREADS (dispatchThreads), and mx.fast.cuda_kernel divides
its grid by the threadgroup to get blocks (mlx/backend/cuda/custom_kernel.cpp), so for both:
grid = threadgroups x threads per threadgroup in each dimension.
"""

import pytest

from kvbench.case import Case
from kvbench.engines.cache import skip_reason
from kvbench.engines.common import problem_of
from kvbench.kernels.attention.gpu import launch
from kvbench.kernels.attention.gpu.launch import (
    CUDA,
    METAL,
    Problem,
    TileConfigError,
    plan,
    refusal,
)
from kvbench.kernels.formats.registry import get_format
from kvbench.suite.suite import expand, load_suite

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
@pytest.mark.parametrize("n_splits", [None, 1, 7, 64])
def test_splits_cover_the_sequence_once(kv_len, heads, n_splits):
    b, hkv = heads
    p = plan(Problem(b, hkv * 4, hkv, 64, kv_len), 32, n_splits=n_splits, n_cores=132)
    assert p.split_len % 32 == 0
    assert (p.n_splits - 1) * p.split_len < kv_len <= p.n_splits * p.split_len  # none empty
    assert p.params == (kv_len, p.split_len, p.n_splits, hkv)
    assert p.threadgroups == (p.n_splits, b * hkv, 1)
    if n_splits is not None:
        assert p.n_splits <= n_splits


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
        "VEC": 16,
    }


# ---- the split planner -----------------------------------------------------------------------


def test_plan_splits_fills_the_device_by_hand():
    # H100: 132 SMs x 4 threadgroups = 528 wanted; B*Hkv = 8 -> 66 splits of a 32K context:
    # 1024 tiles of 32 / 66 -> 16 tiles (512 rows) per split -> 64 splits, 512 threadgroups
    assert launch.plan_splits(32768, 8, 132, 32) == (512, 64)
    # the same on a 10-core GPU: 40 wanted -> 5 splits: 1024/5 -> 205 tiles = 6560 rows -> 5
    assert launch.plan_splits(32768, 8, 10, 32) == (6560, 5)
    # many sequences already fill the device: one split
    assert launch.plan_splits(32768, 128 * 8, 132, 32) == (32768, 1)


def test_plan_splits_keeps_splits_long_enough():
    # 4K context, B*Hkv = 8, 132 SMs wants 66 splits, but 4096 // 256 = 16 is the cap
    split_len, n = launch.plan_splits(4096, 8, 132, 32)
    assert (split_len, n) == (256, 16)
    assert launch.plan_splits(200, 1, 132, 32) == (224, 1)  # shorter than MIN_SPLIT_ROWS
    assert launch.plan_splits(5000, 1, 132, 32, min_split_rows=1)[1] == 157  # one tile each


def test_split_count_follows_the_core_count():
    small = plan(Problem(1, 32, 8, 128, 65536), 32, n_cores=10)
    big = plan(Problem(1, 32, 8, 128, 65536), 32, n_cores=132)
    assert small.n_splits < big.n_splits
    assert big.n_cores == 132 and big.config()["n_cores"] == 132
    assert plan(Problem(1, 32, 8, 128, 65536), 32, limits=CUDA).n_cores == CUDA.default_cores


def test_config_is_what_is_launched():
    p = plan(Problem(1, 32, 8, 128, 200), 32, 64, CUDA, n_splits=5)  # 7 tiles: 4 splits of 2
    assert p.config() == {
        "tile_kv": 32,
        "threads": 64,
        "n_splits": 4,
        "split_len": 64,
        "vec_bytes": 16,
        "n_cores": 132,
        "launches": 2,
    }
    assert p.output_shapes[0] == (32, 4, 128)
    assert p.combine_grid == (32, 32, 1) and p.combine_threadgroup == (32, 1, 1)
    assert p.combine_params == (4,)


# ---- lane layout, vector width and memory ----------------------------------------------------


@pytest.mark.parametrize(
    "problem,vec,layout",
    [
        # fp16 D=128: 16 vectors of 8 halves, 16 lanes per row, 2 rows per simdgroup step
        (Problem(1, 32, 8, 128, 10), 16, (16, 8, 16, 16, 1, 2)),
        (Problem(1, 32, 8, 64, 10), 16, (16, 8, 8, 8, 1, 4)),
        # fp32 D=128: 32 vectors of 4 floats, a whole simdgroup per row
        (Problem(1, 32, 8, 128, 10, dtype="float32"), 16, (16, 4, 32, 32, 1, 1)),
        # int4 G=1 D=128: a 64-byte row is 4 vectors of 32 nibbles
        (Problem(1, 8, 8, 128, 10, kv_code="int4"), 16, (16, 32, 4, 4, 1, 8)),
        # fp4 G=8: 4-byte vectors, 8 q elements per head per lane (the narrowest width)
        (Problem(1, 64, 8, 128, 10, kv_code="fp4", group_size=32), 4, (4, 8, 16, 16, 1, 2)),
        (Problem(1, 32, 8, 128, 10, kv_code="int4"), 4, (4, 8, 16, 16, 1, 2)),  # G=4
        (Problem(1, 16, 8, 128, 10, kv_code="int4"), 8, (8, 16, 8, 8, 1, 4)),  # G=2
    ],
)
def test_lane_layout_by_hand(problem, vec, layout):
    assert launch.choose_vec(problem) == vec
    lay = launch.lane_layout(problem, vec, 128, 32)
    got = (lay.vec_bytes, lay.elems_per_vec, lay.vecs_per_row, lay.lanes_per_row)
    assert got + (lay.vecs_per_lane, lay.rows_per_step) == layout
    assert lay.steps == -(-32 // (4 * lay.rows_per_step))


def test_shared_bytes_by_hand():
    # 128 threads = 4 simdgroups, D=128: sh_o 2*4*128 floats + sh_ml 2*4*2 floats
    assert launch.shared_bytes(Problem(1, 32, 4, 128, 10), 128) == 4 * (1024 + 16)
    assert launch.shared_bytes(Problem(1, 32, 4, 64, 10), 32) == 4 * (128 + 4)


def test_the_tile_costs_no_threadgroup_memory():
    p = Problem(1, 64, 8, 128, 100)  # G = 8: 4 * (2*4*128 + 2*4*2) whatever the tile
    assert plan(p, 8).shared_bytes == plan(p, 32).shared_bytes == 4160


@pytest.mark.parametrize(
    "problem,tile,threads,needle",
    [
        (Problem(1, 32, 4, 128, 100), 128, 128, "in flight"),  # 16 steps x (K, V) x 4 words
        (Problem(1, 32, 4, 128, 100), 1024, 1024, "in flight"),  # 16 steps again
        (Problem(1, 32, 4, 256, 100), 32, 1024, "threadgroup memory"),  # 66048 B > 48 KB
        (Problem(1, 8, 2, 96, 10), 32, 128, "vector width"),  # 12, 24 or 48 vectors per row
        (Problem(1, 64, 8, 128, 100), 64, 128, "registers spill"),  # 2*64 + 64 words > 160
    ],
)
def test_refusals_before_launch(problem, tile, threads, needle):
    with pytest.raises(TileConfigError, match=needle):
        plan(problem, tile, threads, CUDA)
    assert refusal(problem, tile, threads, CUDA)


@pytest.mark.parametrize("limits", [METAL, CUDA])
def test_tiny_caches_launch(limits):
    # 4 words of K (MLX would pass them as Metal `constant`: gpu_kernels pads them); D = 4
    assert refusal(Problem(1, 2, 1, 32, 1, kv_code="int4"), 32, 128, limits) is None
    assert refusal(Problem(1, 1, 1, 4, 1), 32, 128, limits) is None


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
    big = Case("small", 1, 32, 4, 128, 256, kernel="metal", tile_kv=128)  # G=8, 16 steps
    assert "in flight" in skip_reason(big, "metal")
    assert skip_reason(Case("small", 1, 32, 4, 128, 256, kernel="cuda", tile_kv=32), "cuda") is None
    assert "spill" in skip_reason(
        Case("small", 1, 32, 4, 128, 256, kernel="cuda", tile_kv=64), "cuda"
    )
    assert "decode only" in skip_reason(
        Case("small", 1, 8, 2, 64, 9, kernel="metal", phase="prefill"), "metal"
    )
    assert "no tile loader" in skip_reason(
        Case("small", 1, 8, 2, 64, 9, kernel="metal", kv_dtype="mxfp4"), "metal"
    )


def test_default_tile_fits_every_preset_shape_on_metal():
    from kvbench.suite.presets import PRESETS

    for name, s in PRESETS.items():
        problem = Problem(1, s.n_q_heads, s.n_kv_heads, s.head_dim, 4096)
        assert refusal(problem, launch.DEFAULT_TILE_KV, launch.DEFAULT_THREADS, METAL) is None, name
        vec = launch.choose_vec(problem)  # q elements per lane over the G heads fit REG_ELEMS
        lay = launch.lane_layout(problem, vec, launch.DEFAULT_THREADS, launch.DEFAULT_TILE_KV)
        assert problem.group * lay.elems_per_vec * lay.vecs_per_lane <= launch.REG_ELEMS, name


def test_cached_plan_is_the_plan_and_refusals_still_raise():
    problem = launch.Problem(1, 32, 8, 128, 4096)
    first = launch.cached_plan(problem, 32, 128, launch.CUDA, n_cores=132)
    assert first == launch.plan(problem, 32, 128, launch.CUDA, n_cores=132)
    assert launch.cached_plan(problem, 32, 128, launch.CUDA, n_cores=132) is first
    bad = launch.Problem(1, 32, 8, 96, 4096)  # D = 96: rows do not tile 32 lanes
    for _ in range(2):
        with pytest.raises(launch.TileConfigError):
            launch.cached_plan(bad, 32, 128, launch.CUDA)
