"""The Metal / CUDA flash-decode algorithm, verified on CPU through its numpy emulation.

The kernels themselves cannot run here (no GPU): these tests check the algorithm (the same
tiling, splits, per-lane partition and reduction order, kernels/gpu_emulate.py), the loops'
coverage, the wrapper's plumbing (with the compiled kernel replaced by the emulation) and that
the two backends' sources share one body and differ only in their prelude and entry lines.
"""

import math
import re

import mlx.core as mx
import numpy as np
import pytest

from kvbench.engines.parity import PARITY_REL_TOL, compare_outputs
from kvbench.kernels import gpu_emulate, gpu_kernels, launch
from kvbench.kernels.attention import reference
from kvbench.kernels.formats import get_format


def make(kv_dtype, group, d, lk, hkv=2, b=1, group_size=None, seed=0):
    fmt = get_format(kv_dtype, group_size)
    kq, kk, kv = mx.random.split(mx.random.key(seed), 3)
    q = mx.random.normal((b, hkv * group, 1, d), key=kq).astype(fmt.compute_dtype)
    k = fmt.encode(mx.random.normal((b, hkv, lk, d), key=kk))
    v = fmt.encode(mx.random.normal((b, hkv, lk, d), key=kv))
    return fmt, q, k, v


def emulate(fmt, q, k, v, tile, threads=128):
    problem = gpu_kernels.problem_of(q, k, fmt)
    plan = launch.plan(problem, tile, threads)
    as_np = lambda s: {n: np.array(a) for n, a in s.items()}  # noqa: E731
    scale = 1 / math.sqrt(q.shape[-1])
    out = gpu_emulate.flash_decode(np.array(q), as_np(k), as_np(v), problem, plan, scale)
    return out, reference(q, k, v, fmt, scale=scale)


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("lk", [64, 200])  # a multiple of the tile and not
@pytest.mark.parametrize("kv_dtype", ["fp16", "fp32", "fp4", "int4"])
def test_emulated_kernel_matches_reference(group, d, lk, kv_dtype):
    fmt, q, k, v = make(kv_dtype, group, d, lk)
    out, ref = emulate(fmt, q, k, v, tile=16 if d == 128 else 32)
    assert compare_outputs(mx.array(out), ref)["rel_err"] <= PARITY_REL_TOL[fmt.compute_dtype]


@pytest.mark.parametrize("kv_dtype", ["fp4", "int4"])
def test_emulated_grouped_scales_and_batch(kv_dtype):
    fmt, q, k, v = make(kv_dtype, 4, 64, 77, b=2, group_size=32)
    out, ref = emulate(fmt, q, k, v, tile=8, threads=64)
    assert compare_outputs(mx.array(out), ref)["rel_err"] <= PARITY_REL_TOL[mx.float16]


def test_fp32_emulation_is_tight():
    """In float32 the only differences left are summation order: far below the fp16 gate."""
    fmt, q, k, v = make("fp32", 4, 128, 300)
    out, ref = emulate(fmt, q, k, v, tile=16)
    assert compare_outputs(mx.array(out), ref)["rel_err"] < 1e-5


def test_grid_in_threadgroups_is_caught():
    """The known trap: a grid counted in threadgroups launches 1/THREADS of the work."""
    fmt, q, k, v = make("fp32", 4, 64, 300)
    problem = gpu_kernels.problem_of(q, k, fmt)
    good = launch.plan(problem, 16)
    bad = launch.LaunchPlan(**{**good.__dict__, "grid": good.threadgroups})
    as_np = lambda s: {n: np.array(a) for n, a in s.items()}  # noqa: E731
    with pytest.raises(ValueError, match="whole number of threadgroups"):
        gpu_emulate.flash_decode(np.array(q), as_np(k), as_np(v), problem, bad, 0.125)


@pytest.mark.parametrize(
    "g,d,tile,threads",
    [(1, 64, 16, 128), (8, 128, 32, 128), (4, 64, 64, 256), (8, 64, 16, 32), (2, 128, 8, 64)],
)
def test_every_loop_covers_its_range_exactly_once(g, d, tile, threads):
    p = launch.plan(launch.Problem(1, g * 2, 2, d, 100), tile, threads)
    for name, count in gpu_emulate.ownership(p).items():
        assert (count == 1).all(), name


def test_fp4_and_int4_nibbles_match_the_format():
    codes = np.arange(16, dtype=np.uint32)
    fp4 = gpu_emulate.decode_nibble(codes, "fp4")
    assert fp4.tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert gpu_emulate.decode_nibble(codes, "int4").tolist() == [*range(8), *range(-8, 0)]


class EmulatedKernel:
    """Stands in for the compiled mx.fast kernel: same call, numpy emulation inside."""

    def __init__(self, code):
        self.code, self.calls = code, []

    def __call__(self, *, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
        self.calls.append(dict(template=template, grid=grid, threadgroup=threadgroup))
        q, k, v, ks, vs, params, scale = (np.array(a) for a in inputs)
        t = dict(template)
        dtype = {mx.float16: "float16", mx.float32: "float32"}[t["T"]]
        b_hkv, kv_len = k.shape[0] * k.shape[1], int(params[0])
        problem = launch.Problem(
            1,
            b_hkv * t["G"],
            b_hkv,
            t["D"],
            kv_len,
            dtype,
            self.code,
            t["GS"] if self.code != "dense" else None,
        )
        plan = launch.plan(problem, t["TILE_KV"], t["THREADS"])
        assert (plan.grid, plan.threadgroup) == (grid, threadgroup)
        assert [tuple(s) for s in output_shapes] == list(plan.output_shapes)
        stored = lambda d, s: {"data": d} if self.code == "dense" else {"data": d, "scales": s}  # noqa: E731
        parts = gpu_emulate.partials(q, stored(k, ks), stored(v, vs), problem, plan, scale[0])
        return [mx.array(a) for a in parts]


@pytest.mark.parametrize("backend", ["metal", "cuda"])
@pytest.mark.parametrize("kv_dtype", ["fp16", "int4"])
def test_wrapper_plumbing_with_emulated_kernel(monkeypatch, backend, kv_dtype):
    fakes = {}
    monkeypatch.setattr(
        gpu_kernels, "compiled", lambda be, code: fakes.setdefault(code, EmulatedKernel(code))
    )
    fmt, q, k, v = make(kv_dtype, 4, 64, 150, b=2)
    fn = gpu_kernels.metal if backend == "metal" else gpu_kernels.cuda
    out = fn(q, k, v, fmt, mask=None, scale=0.125, tile_kv=32)
    ref = reference(q, k, v, fmt, scale=0.125)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert compare_outputs(out, ref)["rel_err"] <= PARITY_REL_TOL[mx.float16]
    # (the emulated problem folds the batch into kv heads; same flat layout)


def test_wrapper_refuses_before_launch(monkeypatch):
    monkeypatch.setattr(gpu_kernels, "compiled", lambda *a: pytest.fail("launched"))
    fmt, q, k, v = make("fp16", 8, 128, 10)
    with pytest.raises(launch.TileConfigError, match="threadgroup memory"):
        gpu_kernels.metal(q, k, v, fmt, scale=0.1, tile_kv=128)
    with pytest.raises(NotImplementedError):
        gpu_kernels.cuda(q, k, v, fmt, mask=mx.array([True]), scale=0.1, tile_kv=16)


# ---- the sources -----------------------------------------------------------------------------


def test_backends_share_one_body_and_differ_only_in_prelude_and_entry():
    defined = {}
    for backend in ("metal", "cuda"):
        header, source = gpu_kernels.kernel_source(backend, "int4")
        assert header.startswith("#define KV_CODE 2\n")
        assert gpu_kernels.COMMON.read_text() in header
        assert source.endswith(gpu_kernels.BODY.read_text())
        entry = source[: -len(gpu_kernels.BODY.read_text())]
        defined[backend] = re.findall(r"const int (\w+) =", entry)
        prelude = header.split("\n", 1)[1]
        defined[backend + " macros"] = sorted(re.findall(r"#define (\w+)", prelude))
        defined[backend + " functions"] = sorted(re.findall(r"float (lane_\w+)\(", prelude))
    assert defined["metal"] == defined["cuda"] == ["tid", "lane", "sg", "split", "bh"]
    assert defined["metal macros"] == defined["cuda macros"]
    assert defined["metal functions"] == defined["cuda functions"] == ["lane_max", "lane_sum"]


def test_metal_entry_uses_builtins_mlx_recognises():
    _, source = gpu_kernels.kernel_source("metal", "dense")
    for name in (
        "thread_index_in_threadgroup",
        "thread_index_in_simdgroup",
        "simdgroup_index_in_threadgroup",
        "threadgroup_position_in_grid",
    ):
        assert name in source  # metal_kernel adds an attribute only if the source names it
    assert "thread_position_in_grid" not in source.replace("threadgroup_position_in_grid", "")


def test_body_names_every_input_and_output():
    _, source = gpu_kernels.kernel_source("cuda", "fp4")
    for name in gpu_kernels.INPUTS + gpu_kernels.OUTPUTS:
        assert re.search(rf"\b{name}\b", source), name
    template_names = [n for n, _ in launch.plan(launch.Problem(1, 8, 2, 64, 10), 16).template]
    for name in template_names:
        assert re.search(rf"\b{name}\b", source), name


def test_shared_arrays_match_the_planner_formula():
    """The TG_MEM declarations in the body are exactly what launch.shared_bytes counts."""
    decls = re.findall(r"TG_MEM (\w+) \w+\[([^\]]+)\];", gpu_kernels.BODY.read_text())
    g, d, tile, elem = 4, 128, 32, 2
    sizes = {"float": 4, "T": elem}
    total = sum(sizes[t] * eval(n, {"G": g, "D": d, "TILE_KV": tile}) for t, n in decls)
    assert total == launch.shared_bytes(launch.Problem(1, 8, 2, d, 10), tile)
