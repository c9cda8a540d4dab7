"""The Metal / CUDA flash-decode algorithm, verified on CPU through its numpy emulation.

The kernels themselves cannot run here (no GPU): these tests check the algorithm (the same
tiling, splits, per-lane partition and reduction order, kernels/attention/gpu/emulate.py), the
loops'
coverage, the wrapper's plumbing (with the compiled kernel replaced by the emulation) and that
the two backends' sources share one body and differ only in their prelude and entry lines.
"""

import math
import re

import mlx.core as mx
import numpy as np
import pytest

from kvbench.engines.parity import PARITY_REL_TOL, compare_outputs
from kvbench.kernels.attention.gpu import emulate as gpu_emulate
from kvbench.kernels.attention.gpu import kernels as gpu_kernels
from kvbench.kernels.attention.gpu import launch
from kvbench.kernels.attention.registry import reference
from kvbench.kernels.formats.registry import get_format


def make(kv_dtype, group, d, lk, hkv=2, b=1, group_size=None, seed=0, capacity=None):
    """q and K/V stored as a cache of `capacity` positions sliced to the first lk (mx views)."""
    fmt = get_format(kv_dtype, group_size)
    kq, kk, kv = mx.random.split(mx.random.key(seed), 3)
    q = mx.random.normal((b, hkv * group, 1, d), key=kq).astype(fmt.compute_dtype)
    cap = capacity or lk
    k = fmt.encode(mx.random.normal((b, hkv, cap, d), key=kk))
    v = fmt.encode(mx.random.normal((b, hkv, cap, d), key=kv))
    cut = lambda s: {n: a[:, :, :lk] for n, a in s.items()}  # noqa: E731
    return fmt, q, cut(k), cut(v), k, v


def np_views(full: dict, lk: int) -> dict:
    """numpy views with the strides of the sliced cache (the emulation reads through them)."""
    return {n: np.array(a)[:, :, :lk] for n, a in full.items()}


def emulate(fmt, q, k, v, full_k, full_v, tile, threads=128, n_splits=None):
    problem = gpu_kernels.problem_of(q, k, fmt)
    plan = launch.plan(problem, tile, threads, launch.CUDA, n_splits=n_splits)
    scale = 1 / math.sqrt(q.shape[-1])
    lk = k["data"].shape[2]
    kn, vn = np_views(full_k, lk), np_views(full_v, lk)
    out = gpu_emulate.flash_decode(np.array(q), kn, vn, problem, plan, scale)
    return out, reference(q, k, v, fmt, scale=scale)


def close(out, ref, fmt) -> bool:
    return compare_outputs(mx.array(out), ref)["rel_err"] <= PARITY_REL_TOL[fmt.compute_dtype]


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("lk", [64, 200])  # a multiple of the tile and not
@pytest.mark.parametrize("kv_dtype", ["fp16", "fp32", "fp4", "int4"])
def test_emulated_kernel_matches_reference(group, d, lk, kv_dtype):
    fmt, q, k, v, fk, fv = make(kv_dtype, group, d, lk)
    out, ref = emulate(fmt, q, k, v, fk, fv, tile=16 if d == 128 else 32, n_splits=3)
    assert close(out, ref, fmt)


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(
    "kv_dtype", ["iq4_nl", "fp8_e4m3@per_head", "fp8_e5m2@0.5", "tq4_mse", "tq2_mse"]
)
def test_emulated_kernel_reads_fp8_iq4_nl_and_turboquant(group, d, kv_dtype):
    """FP8 (a float32 scale per KV head, as the wrapper passes it), iq4_nl (ggml's nibble
    order: the emulation sums each vector in the kernel's storage order) and TurboQuant mse
    (q rotated in and the output back around the kernel, as the wrapper does)."""
    name, _, fp8_scale = kv_dtype.partition("@")
    fmt = get_format(name, fp8_scale=fp8_scale or "one")
    kq, kk, kv = mx.random.split(mx.random.key(3), 3)
    q = mx.random.normal((1, 2 * group, 1, d), key=kq).astype(fmt.compute_dtype)
    k32 = mx.random.normal((1, 2, 100, d), key=kk) * mx.array([1.0, 20.0])[:, None, None]
    fmt = fmt.calibrate(k32, "k")
    k, v = fmt.encode(k32), fmt.encode(mx.random.normal((1, 2, 100, d), key=kv))
    kr, vr = gpu_kernels.kernel_rows(k), gpu_kernels.kernel_rows(v)
    ks, vs = gpu_kernels.scale_inputs(kr, vr, fmt)
    kn = {"data": np.array(kr["data"]), "scales": np.array(ks)}
    vn = {"data": np.array(vr["data"]), "scales": np.array(vs)}
    problem = gpu_kernels.problem_of(q, k, fmt)
    if name == "tq2_mse" and group == 8:  # 16 codes per 4-byte vector: 8 x 16 q per lane
        reason = launch.refusal(problem, 16, 128, launch.CUDA)
        assert reason is not None and "spill" in reason
        return
    plan = launch.plan(problem, 16, 128, launch.CUDA, n_splits=3)
    scale = 1 / math.sqrt(d)
    tq = problem.kv_code in launch.TQ_CODES
    q_in = fmt.basis_query(q).astype(q.dtype) if tq else q
    out = gpu_emulate.flash_decode(np.array(q_in), kn, vn, problem, plan, scale)
    out = np.array(fmt.basis_output(mx.array(out)).astype(q.dtype)) if tq else out
    assert close(out, reference(q, k, v, fmt, scale=scale), fmt)


@pytest.mark.parametrize("kv_dtype", ["fp16", "fp4", "int4"])
@pytest.mark.parametrize("lk,capacity", [(77, 128), (1, 8), (33, 40)])
def test_emulated_sliced_cache_is_read_in_place(kv_dtype, lk, capacity):
    """A cache view with n_kv < capacity (strides of the full buffer), as KVCache.view gives."""
    fmt, q, k, v, fk, fv = make(kv_dtype, 4, 64, lk, b=2, group_size=32, capacity=capacity)
    assert np_views(fk, lk)["data"].strides[1] == capacity * np_views(fk, lk)["data"].strides[2]
    out, ref = emulate(fmt, q, k, v, fk, fv, tile=8, threads=64, n_splits=4)
    assert close(out, ref, fmt)


@pytest.mark.parametrize(
    "b,hkv,lk,tile",
    [(1, 1, 1, 32), (1, 2, 3, 32), (2, 1, 3, 8), (1, 7, 1, 16)],  # B*Hkv*L < 8, L < tile
)
def test_emulated_tiny_shapes(b, hkv, lk, tile):
    for kv_dtype in ("fp16", "int4"):
        fmt, q, k, v, fk, fv = make(kv_dtype, 2, 64, lk, hkv=hkv, b=b)
        out, ref = emulate(fmt, q, k, v, fk, fv, tile=tile)
        assert close(out, ref, fmt)


def test_a_view_the_kernel_cannot_vector_load_gives_nan():
    """A non-unit last-axis stride: the kernel writes NaN, so the parity gate fails the row."""
    fmt, q, k, v, fk, fv = make("fp16", 4, 64, 40)
    problem = gpu_kernels.problem_of(q, k, fmt)
    plan = launch.plan(problem, 16)
    kn = {"data": np.array(fk["data"]).transpose(0, 1, 3, 2).copy().transpose(0, 1, 3, 2)}
    out = gpu_emulate.flash_decode(np.array(q), kn, np_views(fv, 40), problem, plan, 0.125)
    assert np.isnan(out).all()


def test_fp32_emulation_is_tight():
    """In float32 the only differences left are summation order: far below the fp16 gate."""
    fmt, q, k, v, fk, fv = make("fp32", 4, 128, 300)
    out, ref = emulate(fmt, q, k, v, fk, fv, tile=16, n_splits=4)
    assert compare_outputs(mx.array(out), ref)["rel_err"] < 1e-5


def test_grid_in_threadgroups_is_caught():
    """The known trap: a grid counted in threadgroups launches 1/THREADS of the work."""
    fmt, q, k, v, fk, fv = make("fp32", 4, 64, 300)
    problem = gpu_kernels.problem_of(q, k, fmt)
    good = launch.plan(problem, 16)
    bad = launch.LaunchPlan(**{**good.__dict__, "grid": good.threadgroups})
    as_np = lambda s: {n: np.array(a) for n, a in s.items()}  # noqa: E731
    with pytest.raises(ValueError, match="whole number of threadgroups"):
        gpu_emulate.flash_decode(np.array(q), as_np(k), as_np(v), problem, bad, 0.125)


@pytest.mark.parametrize(
    "problem,tile,threads",
    [
        (launch.Problem(1, 2, 2, 64, 100), 16, 128),
        (launch.Problem(1, 16, 2, 128, 100), 32, 128),
        (launch.Problem(1, 8, 2, 64, 100), 64, 256),
        (launch.Problem(1, 16, 2, 64, 100, kv_code="fp4"), 16, 32),
        (launch.Problem(1, 4, 2, 128, 100, dtype="float32"), 8, 64),
        (launch.Problem(1, 4, 2, 128, 100, kv_code="int4"), 24, 96),  # tile < slots
    ],
)
def test_every_loop_covers_its_range_exactly_once(problem, tile, threads):
    p = launch.plan(problem, tile, threads, launch.CUDA)
    for split_len in (p.split_len, tile, 3 * tile):
        for name, count in gpu_emulate.ownership(p, split_len).items():
            assert (count == 1).all(), name


def test_fp4_and_int4_nibbles_match_the_format():
    codes = np.arange(16, dtype=np.uint32)
    fp4 = gpu_emulate.nibble_value(codes, "fp4") / 2  # the kernel's table holds 2*value
    assert fp4.tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert gpu_emulate.nibble_value(codes, "int4").tolist() == [*range(8), *range(-8, 0)]
    from kvbench.kernels.formats.quant import FP4_MAGNITUDES

    table = [(0xC8643210 >> (4 * c)) & 0xF for c in range(8)]  # FP4_MAG2_TABLE in the header
    assert [t / 2 for t in table] == list(FP4_MAGNITUDES)
    assert "#define FP4_MAG2_TABLE 0xC8643210u" in gpu_kernels.COMMON.read_text()


class EmulatedKernels:
    """Stand in for the two compiled mx.fast kernels: same calls, numpy emulation inside."""

    def __init__(self):
        self.calls = []

    def split(self, code):
        def call(*, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
            q, k, v, ks, vs, params, scale = (np.array(a) for a in inputs)
            t = dict(template)
            dtype = {mx.float16: "float16", mx.float32: "float32"}[t["T"]]
            b, hkv = k.shape[:2]
            gs = t["GS"] if code != "dense" else None
            problem = launch.Problem(b, hkv * t["G"], hkv, t["D"], int(params[0]), dtype, code, gs)
            plan = launch.plan(problem, t["TILE_KV"], t["THREADS"], n_splits=int(params[2]))
            assert (plan.grid, plan.threadgroup) == (grid, threadgroup)
            assert plan.template == tuple((n, dtype if n == "T" else x) for n, x in template)
            assert [tuple(s) for s in output_shapes] == list(plan.output_shapes)
            self.calls.append(("split", grid))
            stored = lambda d, s: {"data": d} | ({"scales": s} if code != "dense" else {})  # noqa: E731
            parts = gpu_emulate.partials(q, stored(k, ks), stored(v, vs), problem, plan, scale[0])
            return [mx.array(a) for a in parts]

        return call

    def combine(self, backend):
        def call(*, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
            o, m, l_, params = (np.array(a) for a in inputs)
            assert grid == (32, m.shape[0], 1) and threadgroup == (32, 1, 1)
            assert int(params[0]) == m.shape[1] and list(output_shapes[0]) == [
                m.shape[0],
                o.shape[2],
            ]
            self.calls.append(("combine", grid))
            dtype = {mx.float16: np.float16, mx.float32: np.float32}[output_dtypes[0]]
            return [mx.array(gpu_emulate.combine(o, m, l_, dtype))]

        return call


@pytest.mark.parametrize("backend", ["metal", "cuda"])
@pytest.mark.parametrize("kv_dtype", ["fp16", "int4"])
def test_wrapper_plumbing_with_emulated_kernels(monkeypatch, backend, kv_dtype):
    fake = EmulatedKernels()
    monkeypatch.setattr(
        gpu_kernels,
        "compiled",
        lambda be, code, *_: fake.combine(be) if code == gpu_kernels.COMBINE else fake.split(code),
    )
    fmt, q, k, v, _, _ = make(kv_dtype, 4, 64, 150, b=2, capacity=160)
    fn = gpu_kernels.metal if backend == "metal" else gpu_kernels.cuda
    out = fn(q, k, v, fmt, mask=None, scale=0.125, tile_kv=32, n_splits=3)
    ref = reference(q, k, v, fmt, scale=0.125)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert compare_outputs(out, ref)["rel_err"] <= PARITY_REL_TOL[mx.float16]
    assert [c[0] for c in fake.calls] == ["split", "combine"]  # two launches
    assert fake.calls[0][1][0] == 128 * 3  # grid counts threads: 3 splits x 128


@pytest.mark.parametrize("kv_dtype,d", [("fp16", 4), ("fp32", 4), ("int4", 8), ("fp4", 32)])
def test_wrapper_pads_kv_of_fewer_than_8_elements(monkeypatch, kv_dtype, d):
    """MLX would pass such K/V to Metal as `constant`; the wrapper pads them with unread rows."""
    fake = EmulatedKernels()
    monkeypatch.setattr(
        gpu_kernels,
        "compiled",
        lambda be, code, *_: fake.combine(be) if code == gpu_kernels.COMBINE else fake.split(code),
    )
    fmt, q, k, v, _, _ = make(kv_dtype, 1, d, 1, hkv=1)
    assert k["data"].size < 8
    inputs = gpu_kernels.launch_inputs(q, k, v, gpu_kernels.plan_for("metal", q, k, fmt), 0.5)
    assert inputs[1].size >= 8 and inputs[2].size >= 8 and inputs[1].shape[3] == k["data"].shape[3]
    out = gpu_kernels.metal(q, k, v, fmt, scale=0.5)
    assert (
        compare_outputs(out, reference(q, k, v, fmt, scale=0.5))["rel_err"]
        <= PARITY_REL_TOL[fmt.compute_dtype]
    )


def test_wrapper_does_not_copy_real_caches():
    fmt, q, k, v, _, _ = make("fp16", 4, 64, 3, capacity=16)
    inputs = gpu_kernels.launch_inputs(q, k, v, gpu_kernels.plan_for("cuda", q, k, fmt), 0.5)
    assert inputs[1] is k["data"] and inputs[2] is v["data"]  # the views themselves


def test_wrapper_refuses_before_launch(monkeypatch):
    monkeypatch.setattr(gpu_kernels, "compiled", lambda *a: pytest.fail("launched"))
    fmt, q, k, v, _, _ = make("fp16", 8, 128, 10)
    with pytest.raises(launch.TileConfigError, match="in flight"):
        gpu_kernels.metal(q, k, v, fmt, scale=0.1, tile_kv=128)
    with pytest.raises(NotImplementedError):
        gpu_kernels.cuda(q, k, v, fmt, mask=mx.array([True]), scale=0.1, tile_kv=16)


def test_plan_for_records_the_launched_configuration(monkeypatch):
    monkeypatch.setenv("KVBENCH_GPU_CORES", "10")
    fmt, q, k, v, _, _ = make("fp16", 4, 64, 5000)
    plan = gpu_kernels.plan_for("cuda", q, k, fmt, tile_kv=64, threads=256)
    assert plan.config()["n_cores"] == 10 and plan.config()["threads"] == 256
    # 10 cores x 4 threadgroups / 2 kv heads = 20 wanted; 5000 // 256 = 19 allowed; 79 tiles
    # of 64 / 19 -> 5 tiles = 320 rows per split -> 16 splits
    assert (plan.n_splits, plan.split_len) == (16, 320)


# ---- the sources -----------------------------------------------------------------------------


def test_backends_share_one_body_and_differ_only_in_prelude_and_entry():
    defined = {}
    for backend in ("metal", "cuda"):
        header, source = gpu_kernels.kernel_source(backend, "int4")
        assert header.startswith("#define KV_CODE 2\n")
        body = gpu_kernels.compact(gpu_kernels.BODY.read_text())
        assert gpu_kernels.compact(gpu_kernels.COMMON.read_text()) in header
        assert source.endswith(body)
        entry = source[: -len(body)]
        defined[backend] = re.findall(r"const int (\w+) =", entry)
        c_header, c_source = gpu_kernels.combine_source(backend)
        c_body = gpu_kernels.compact(gpu_kernels.COMBINE_BODY.read_text())
        assert c_source.endswith(c_body) and "#define KV_CODE" not in c_header
        c_entry = c_source[: -len(c_body)]
        defined[backend + " combine"] = re.findall(r"const int (\w+) =", c_entry)
        prelude = gpu_kernels._parts(backend)[0]
        defined[backend + " macros"] = sorted(re.findall(r"#define (\w+)", prelude))
        defined[backend + " functions"] = sorted(re.findall(r"KV_FN \w+ (\w+)\(", prelude))
    assert defined["metal"] == defined["cuda"] == ["tid", "lane", "sg", "split", "bh"]
    assert defined["metal combine"] == defined["cuda combine"] == ["lane", "row"]
    assert defined["metal macros"] == defined["cuda macros"]
    assert defined["metal functions"] == defined["cuda functions"]
    assert set(defined["cuda functions"]) == {"bits_to_float", "elem_of", "lane_xor"} | {
        "float_bits", "div_rn", "mul_rn", "add_rn", "half_of", "half_value"  # quantize-on-write
    }  # fmt: skip


def test_compact_keeps_every_code_line_and_drops_comments():
    text = 'int a = 1;  // one\n\n  // only a comment\n#define S _Pragma("x//y") // c\n  b();\n'
    assert gpu_kernels.compact(text) == 'int a = 1;\n#define S _Pragma("x//y")\nb();\n'
    for path in (gpu_kernels.BODY, gpu_kernels.COMMON, *gpu_kernels.SOURCES.values()):
        kept = gpu_kernels.compact(path.read_text())
        code = [re.sub(r"\s*//.*", "", x).strip() for x in path.read_text().splitlines()]
        assert kept.splitlines() == [x for x in code if x]  # the same code, in order
        assert len(kept) < 0.7 * len(path.read_text())


def test_shared_helpers_take_no_pointers():
    """Metal passes an input of < 8 elements as `constant`, larger ones as `device`: a helper
    taking a typed pointer stops matching (the defect of issue 12). Helpers take values."""
    common = gpu_kernels.COMMON.read_text()
    signatures = re.findall(r"KV_FN [\w ]+\(([^)]*)\)", common)
    assert signatures and not any("*" in s for s in signatures)
    for backend in ("metal", "cuda"):
        prelude = gpu_kernels._parts(backend)[0]
        assert not any("*" in s for s in re.findall(r"KV_FN [\w ]+\(([^)]*)\)", prelude))


def test_no_barrier_or_threadgroup_memory_in_the_main_loop():
    body = gpu_kernels.BODY.read_text()
    loop = body[body.index("for (int t0 = start;") : body.index("// 5. merge the RPS slots")]
    assert "BARRIER" not in loop and "TG_MEM" not in loop and "sh_" not in loop
    assert body.count("BARRIER()") == 1  # once per head in the final merge
    assert "BARRIER" not in gpu_kernels.COMBINE_BODY.read_text()


def test_cuda_source_defines_no_inf_identifier():
    """MLX >= 0.32 injects no `inf`: the CUDA prelude builds -inf from its bits."""
    header, source = gpu_kernels.kernel_source("cuda", "dense")
    code = re.sub(r"//[^\n]*", "", header + source)  # comments may name it
    assert "KV_NEG_INF" in code and not re.search(r"(?<![\w.])inf\b", code)


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


def test_body_names_every_input_output_and_the_strides_it_reads():
    _, source = gpu_kernels.kernel_source("cuda", "fp4")
    for name in gpu_kernels.INPUTS + gpu_kernels.OUTPUTS:
        assert re.search(rf"\b{name}\b", source), name
    for name in ("q", "k", "v", "k_scales", "v_scales"):  # MLX passes <name>_strides if named
        assert f"{name}_strides" in source, name
    for name in ("params", "scale", "o_part"):  # and nothing else: no stray _shape/_strides
        assert f"{name}_strides" not in source and f"{name}_shape" not in source
    template_names = [n for n, _ in launch.plan(launch.Problem(1, 8, 2, 64, 10), 16).template]
    for name in template_names:
        assert re.search(rf"\b{name}\b", source), name
    _, combine = gpu_kernels.combine_source("cuda")
    for name in gpu_kernels.COMBINE_INPUTS + gpu_kernels.COMBINE_OUTPUTS + ["T", "D"]:
        assert re.search(rf"\b{name}\b", combine), name


def test_shared_arrays_match_the_planner_formula():
    """The TG_MEM declarations in the body are exactly what launch.shared_bytes counts."""
    decls = re.findall(r"TG_MEM (\w+) \w+\[([^\]]+)\];", gpu_kernels.BODY.read_text())
    assert decls
    for threads, d in ((128, 128), (32, 64), (256, 64)):
        env = {"N_SIMD": threads // 32, "D": d}
        total = sum({"float": 4}[t] * eval(n, env) for t, n in decls)
        assert total == launch.shared_bytes(launch.Problem(1, 8, 2, d, 10), threads)


def test_body_constants_match_the_planner_layout():
    """The constexpr lane layout of the body, evaluated in Python, equals launch.lane_layout."""
    body = gpu_kernels.BODY.read_text()
    exprs = dict(re.findall(r"constexpr int (\w+) = ([^;]+);", body))
    for problem, threads, tile in [
        (launch.Problem(1, 32, 8, 128, 10), 128, 32),
        (launch.Problem(1, 64, 8, 128, 10, kv_code="fp4", group_size=32), 64, 16),
        (launch.Problem(1, 8, 8, 64, 10, dtype="float32"), 256, 64),
    ]:
        vec = launch.choose_vec(problem)
        dense = problem.kv_code == "dense"
        env = {"THREADS": threads, "TILE_KV": tile, "D": problem.head_dim, "VEC": vec}
        env["EPW"] = 4 // launch.ELEM_BYTES[problem.dtype] if dense else 8
        for name in ("N_SIMD", "WORDS", "EPV", "VPR", "LPR", "VPL", "RPS", "STEPS"):
            expr = exprs[name].replace("/", "//")
            expr = re.sub(r"(\w+) < (\w+) \? (\w+) : (\w+)", r"(\3 if \1 < \2 else \4)", expr)
            env[name] = eval(expr, {}, env)
        lay = launch.lane_layout(problem, vec, threads, tile)
        assert (env["EPV"], env["VPR"], env["LPR"], env["VPL"]) == (
            lay.elems_per_vec,
            lay.vecs_per_row,
            lay.lanes_per_row,
            lay.vecs_per_lane,
        )
        assert (env["RPS"], env["STEPS"], env["N_SIMD"]) == (
            lay.rows_per_step,
            lay.steps,
            lay.n_simd,
        )


# ---- issue 45 item 3: one program per KV head serves its G query heads -----------------------


@pytest.mark.parametrize("g", [1, 4, 8])
def test_each_kv_row_is_read_once_for_the_whole_gqa_group(g):
    """The grid's y axis is (sequence x KV head), never the query heads, and over the whole grid
    every K/V row of every (sequence, KV head) is loaded once whatever G: the G heads of a group
    share each load (their q and accumulators are a register dimension of the lane)."""
    b, hkv, n_kv = 2, 2, 1000
    problem = launch.Problem(b, hkv * g, hkv, 128, n_kv)
    plan = launch.plan(problem, 32, 128, launch.CUDA, n_cores=8)
    assert plan.threadgroups[1] == b * hkv  # one program row per KV head, not per query head
    loads = np.zeros(n_kv, int)  # per (sequence, KV head): the body's loads over every split
    starts = np.arange(plan.n_splits) * plan.split_len
    ends = np.minimum(starts + plan.split_len, n_kv)
    for it in range(-(-plan.split_len // 32)):
        rows, ok = gpu_emulate.tile_rows(plan, starts + it * 32, ends)
        np.add.at(loads, rows[ok], 1)
    assert (loads == 1).all()
    body = gpu_kernels.BODY.read_text()
    issue = body[body.index("// 1. issue every load") : body.index("// 2. scores")]
    assert "kr[st][i] = *(" in issue and "vr[st][i] = *(" in issue  # the K and V loads ...
    assert "for (int g" not in issue  # ... outside every loop over the G heads
    assert body.count("kr[st][i] = *(") == 1 and body.count("vr[st][i] = *(") == 1
