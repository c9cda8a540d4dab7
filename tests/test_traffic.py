"""The traffic model of the flash-decode kernels (kernels/attention/gpu/traffic.py), against hand
counts."""

import pytest

from kvbench.kernels.attention.gpu import launch
from kvbench.kernels.attention.gpu.launch import CUDA, LaneLayout, Problem
from kvbench.kernels.attention.gpu.traffic import scale_loads_per_row, traffic_bytes


def test_dense_fp16_by_hand():
    # B=1, Hq=32, Hkv=8 (G=4), D=128, L=4096, 132 SMs: 16 splits of 256 rows (the 256-row floor)
    problem = Problem(1, 32, 8, 128, 4096)
    plan = launch.plan(problem, 32, 128, CUDA, n_cores=132)
    assert (plan.n_splits, plan.split_len, plan.layout.n_simd) == (16, 256, 4)
    t = traffic_bytes(problem, plan)
    assert t["kv_read_bytes"] == 2 * 8 * 4096 * 128 * 2 == 16_777_216  # each row once
    assert t["scale_read_bytes"] == t["scale_min_bytes"] == 0
    assert t["q_read_bytes"] == 128 * 4 * 4 * 128 * 2 == 524_288  # per simdgroup of 128 TGs
    assert t["partial_write_bytes"] == 32 * 16 * (128 + 2) * 4 == 266_240
    assert t["partial_read_bytes"] == 32 * 16 * (128 + 2 + 4 + 1) * 4 == 276_480
    assert t["out_write_bytes"] == 32 * 128 * 2 == 8192
    assert t["global_read_bytes"] == 16_777_216 + 524_288 + 276_480
    assert t["unique_read_bytes"] == 16_777_216 + 8192 + 266_240
    assert t["global_write_bytes"] == 266_240 + 8192
    assert t["min_bytes"] == 16_777_216 + 2 * 8192
    assert t["excess"] == pytest.approx((17_051_648 + 274_432) / 16_793_600 - 1)  # 3.2 %
    assert t["request_excess"] == pytest.approx((17_577_984 + 274_432) / 16_793_600 - 1)
    # shared: 128 threadgroups x 4 heads x (4*130 written + 2*4*128 + 4*128 read) floats
    assert t["shared_bytes"] == 128 * 4 * (520 + 1024 + 512) * 4 == 4_210_688


def test_int4_grouped_scales_by_hand():
    # B=2, Hq=16, Hkv=2 (G=8), D=64, L=1000, group 32: 4-byte vectors (8 nibbles), 8 per row
    problem = Problem(2, 16, 2, 64, 1000, kv_code="int4", group_size=32)
    plan = launch.plan(problem, 32, 64, CUDA, n_splits=4)
    assert plan.layout.vec_bytes == 4 and plan.layout.vecs_per_row == 8
    assert (plan.n_splits, plan.split_len) == (4, 256)
    t = traffic_bytes(problem, plan)
    assert t["kv_read_bytes"] == 2 * 4000 * 32 == 256_000  # 64 nibbles = 32 bytes per row
    assert t["scale_read_bytes"] == t["scale_min_bytes"] == 2 * 4000 * 2 * 2 == 32_000
    assert t["q_read_bytes"] == 16 * 2 * 8 * 64 * 2 == 32_768  # 16 TGs x 2 simdgroups
    assert t["partial_write_bytes"] == 32 * 4 * 66 * 4 == 33_792
    assert t["partial_read_bytes"] == 32 * 4 * (64 + 2 + 2 + 1) * 4 == 35_328
    assert t["global_read_bytes"] == 256_000 + 32_000 + 32_768 + 35_328
    assert t["unique_read_bytes"] == 256_000 + 32_000 + 4096 + 33_792
    assert t["global_write_bytes"] == 33_792 + 4096
    assert t["min_bytes"] == 256_000 + 32_000 + 2 * 4096
    assert t["shared_bytes"] == 16 * 8 * (2 * 66 + 2 * 2 * 64 + 2 * 64) * 4 == 264_192


def test_scale_loads_per_row_by_hand():
    # 64 vectors of 8 nibbles (D = 512), 32 lanes per row, 2 vectors per lane
    lay = LaneLayout(4, 8, 64, 32, 2, 1, 1, 4)
    assert scale_loads_per_row(lay, 128) == 4  # instruction 0: groups 0, 1; then 2, 3
    assert scale_loads_per_row(lay, 512) == 2  # one group, requested by both instructions
    lay = LaneLayout(16, 32, 4, 4, 1, 8, 1, 4)  # int4 D = 128 in 16-byte vectors
    assert scale_loads_per_row(lay, 32) == 4 and scale_loads_per_row(lay, 128) == 1


def test_more_splits_cost_partials_and_q_not_kv():
    problem = Problem(1, 32, 8, 128, 32768)
    one, many = (launch.plan(problem, 32, 128, CUDA, n_splits=n) for n in (1, 64))
    a, b = traffic_bytes(problem, one), traffic_bytes(problem, many)
    assert a["kv_read_bytes"] == b["kv_read_bytes"] and a["min_bytes"] == b["min_bytes"]
    assert b["partial_write_bytes"] == 64 * a["partial_write_bytes"]
    assert b["q_read_bytes"] == 64 * a["q_read_bytes"]
    assert a["excess"] < 0.002 < b["excess"] < 0.02  # 64 splits of 512 rows: about 1.6 %


def test_a_gpu_kernel_row_records_its_planned_launch_and_traffic(monkeypatch):
    from kvbench.case import Case
    from kvbench.engines.cache import gpu_fields
    from kvbench.suite.resolved import of_case

    monkeypatch.setenv("KVBENCH_GPU_CORES", "132")  # plan for an H100's SM count
    case = Case("tiny", 2, 8, 2, 64, 1024, kernel="cuda", kv_dtype="fp16")
    f = gpu_fields(case, of_case(case).k_fmt)
    # by hand, per layer: K and V 2 x (1 x 2 x 1024 x 64) fp16 = 524288 B; q and out 8 x 64 x 2
    assert f["kernel_min_bytes"] == 2 * (524288 + 2 * 1024)
    assert f["kernel_read_bytes"] >= 2 * (524288 + 1024)
    assert f["traffic_excess"] >= 0 and f["gpu_cores"] == 132
    assert f["gpu_threads"] == launch.DEFAULT_THREADS and f["gpu_splits"] >= 1
    assert gpu_fields(Case("tiny", 2, 8, 2, 64, 1024, kernel="sdpa"), None) == {}


def test_fp8_and_iq4_nl_by_hand():
    # FP8: one byte per element, one float32 scale per KV head read once per threadgroup
    problem = Problem(1, 32, 8, 128, 4096, kv_code="fp8_e4m3")
    plan = launch.plan(problem, 32, 128, CUDA, n_splits=4)
    assert plan.layout.vec_bytes == 8 and plan.layout.elems_per_vec == 8  # G=4: 32 per lane
    t = traffic_bytes(problem, plan)
    assert t["kv_read_bytes"] == 2 * 8 * 4096 * 128 == 8_388_608
    assert t["scale_read_bytes"] == 2 * (8 * 4) * 4 == 256  # 32 threadgroups, K's and V's
    assert t["scale_min_bytes"] == 2 * 8 * 4 == 64
    # iq4_nl: ggml's 18-byte block = 16 bytes of nibbles + an fp16 scale per 32 elements,
    # group 32 whatever the case's group_size; G=1, D=128: 16-byte vectors, one block each
    problem = Problem(1, 8, 8, 128, 1000, kv_code="iq4_nl")
    assert problem.scale_group == 32
    plan = launch.plan(problem, 32, 128, CUDA, n_splits=2)
    assert plan.layout.vec_bytes == 16
    t = traffic_bytes(problem, plan)
    assert t["kv_read_bytes"] == 2 * 8 * 1000 * 64
    assert t["scale_read_bytes"] == t["scale_min_bytes"] == 2 * 8 * 1000 * 4 * 2
