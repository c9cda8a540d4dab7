"""One resolved case (harness/suite/resolved.py): `kvbench plan` and the memory guard agree on
every layout x preset and custom shape x format over a seeded grid, the two disagreements of
issue #32 by their figures, a planted mismatch caught, and the planned bytes by hand."""

from __future__ import annotations

import ast
import dataclasses
import random
import shutil
from pathlib import Path

import pytest

from kvbench.case import Case
from kvbench.kernels.formats.registry import FORMATS, get_format
from kvbench.run import memory
from kvbench.suite import resolved
from kvbench.suite.plan import LayoutArgs, make_plan, resolve_shape
from kvbench.suite.presets import PRESETS

ROOT = Path(__file__).resolve().parents[1]

CUSTOM = [(32, 32, 8, 128), (2, 6, 2, 64), (3, 4, 4, 96)]  # layers, q heads, kv heads, D
LAYOUTS = {
    "per-stream": ({}, LayoutArgs()),
    "unified": ({"workload": "shared-prefix", "prefix_frac": 0.25}, None),
    "paged": ({"page_size": 16, "workload": "shared-prefix", "prefix_frac": 0.25}, None),
    "window": ({"window": 64, "sink_tokens": 4}, None),
}


def dims(name: str) -> tuple[int, int, int, int]:
    p = PRESETS[name]
    return p.n_layers, p.n_q_heads, p.n_kv_heads, p.head_dim


def shapes():
    for name in PRESETS:
        yield name, dims(name)
    for shape in CUSTOM:
        yield "custom", shape


def case_of(model, dims, layout, fmt, ctx, n_seqs) -> Case:
    layers, hq, hkv, d = dims
    axes = LAYOUTS[layout][0]
    return Case(model=model, n_layers=layers, n_q_heads=hq, n_kv_heads=hkv, head_dim=d,
                context_len=ctx, kv_dtype=fmt, n_seqs=n_seqs, layout=layout, **axes)  # fmt: skip


def plan_of(case: Case):
    """`kvbench plan` for the case, from the arguments a user gives it."""
    if case.model == "custom":
        shape = resolve_shape(None, case.n_layers, case.n_kv_heads, case.head_dim, case.n_q_heads)
    else:  # a decode case's engine holds every layer whole: the model's sliding-window layers
        # are the model phases' (tests/test_window_bytes.py)
        shape = dataclasses.replace(resolve_shape(case.model, None, None, None), windows=())
    la = LayoutArgs()
    if case.layout != "per-stream":
        la = LayoutArgs(case.page_size, case.window, case.sink_tokens, case.prefix_len)
    return make_plan(shape, case.kv_dtype, None, case.n_seqs, case.context_len, None,
                     case.layout, la)  # fmt: skip


def mismatch(case: Case, plan) -> str | None:
    """Where plan and guard disagree on the case, or None."""
    guard = memory.case_plan(case)
    if plan.run_bytes != guard:
        return f"planned {plan.run_bytes} against the guard's {guard}"
    if plan.total_bytes != guard["cache"]:
        return f"cache {plan.total_bytes} against the guard's {guard['cache']}"
    return None


def fits(fmt: str, head_dim: int) -> bool:
    try:
        get_format(fmt).nbytes(1, head_dim)
    except ValueError:
        return False
    return True


def grid(seed: int = 32):
    rng = random.Random(seed)
    for model, shape in shapes():
        for layout in LAYOUTS:
            for fmt in FORMATS:
                if fits(fmt, shape[3]):
                    ctx = rng.choice([100, 257, 1000, 4096, 32768])
                    yield case_of(model, shape, layout, fmt, ctx, rng.choice([1, 2, 4]))


def test_plan_and_guard_agree_over_the_grid():
    cases = list(grid())
    assert len(cases) > 1000  # every shape x layout x format that the head_dim allows
    bad = [(c.label(), why) for c in cases if (why := mismatch(c, plan_of(c)))]
    assert bad == []


def test_the_custom_shape_of_issue_32():
    # 32 layers, 32 query / 8 KV heads, D 128, ctx 32768, fp16: the guard planned
    # 5,779,750,912 B while plan, setting the query heads to 8, printed 4,968,153,088 B
    c = case_of("custom", (32, 32, 8, 128), "per-stream", "fp16", 32768, 1)
    plan = plan_of(c)
    assert plan.run_bytes["total"] == memory.case_plan(c)["total"] == 5_779_750_912
    # by hand: cache 2 x 32 x 32768 x 8 x 128 x 2 B; source 2 x (32768 x 8 x 128) x (4 + 2);
    # transient 2 x (32 x 32768 x 128) x 4 + 2 x (32 x 32768) x 4
    cache = 2 * 32 * 32768 * 8 * 128 * 2
    source = 2 * 32768 * 8 * 128 * 6
    transient = 2 * 32 * 32768 * 128 * 4 + 2 * 32 * 32768 * 4
    assert plan.run_bytes == {"cache": cache, "source": source, "transient": transient,
                              "total": cache + source + transient}  # fmt: skip


def test_a_paged_plan_counts_its_block_tables_in_the_planned_cache():
    c = case_of("llama-3-8b", dims("llama-3-8b"), "paged", "fp16", 1000, 4)
    plan = plan_of(c)
    assert plan.block_table_bytes == 4 * 63 * 4  # 4 seqs x ceil(1000 / 16) pages x int32
    assert plan.run_bytes["cache"] == plan.model_bytes["total"] + plan.block_table_bytes
    assert mismatch(c, plan) is None


def test_a_planted_mismatch_is_caught():
    c = case_of("custom", (32, 32, 8, 128), "per-stream", "fp16", 32768, 1)
    gqa1 = resolve_shape(None, 32, 8, 128)  # the old plan: query heads = KV heads
    assert mismatch(c, make_plan(gqa1, "fp16", None, 1, 32768)) is not None
    p = case_of("llama-3-8b", dims("llama-3-8b"), "paged", "fp16", 1000, 4)
    plan = plan_of(p)
    dropped = {**plan.run_bytes, "cache": plan.model_bytes["total"]}  # the old plan's cache
    dropped["total"] = sum(v for k, v in dropped.items() if k != "total")
    assert mismatch(p, dataclasses.replace(plan, run_bytes=dropped)) is not None


def test_a_case_resolves_once_to_one_frozen_object():
    c = case_of("tiny", dims("tiny"), "paged", "int4", 100, 4)
    r = resolved.of_case(c)
    assert resolved.of_case(c) is r
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.cells = 0
    assert r.k_fmt is r.v_fmt and r.k_fmt.name == "int4"
    # 4 seqs of 100 with a 25-token prefix, pages of 16: one full prefix page stored once,
    # then ceil((100 - 16) / 16) = 6 pages a sequence: 25 pages, 400 slots
    assert (r.pages, r.cells, r.block_table_bytes) == (25, 400, 4 * 7 * 4)
    assert r.cache_bytes == 2 * 2 * get_format("int4").nbytes(400 * 2, 64) + 112


def test_a_v_format_is_its_own_half_of_the_cache():
    c = case_of("tiny", dims("tiny"), "per-stream", "int8", 128, 1)
    c = dataclasses.replace(c, v_dtype="int4")
    r = resolved.of_case(c)
    assert (r.k_fmt.name, r.v_fmt.name) == ("int8", "int4")
    rows = 128 * 2  # positions x KV heads, one layer
    k, v = get_format("int8").nbytes(rows, 64), get_format("int4").nbytes(rows, 64)
    assert r.cache_bytes == 2 * (k + v)


@pytest.mark.parametrize(
    "axes",
    [{}, {"layout": "paged", "page_size": 16, "n_seqs": 2}, {"layout": "window", "window": 16}],
)
def test_every_engine_state_carries_the_case_resolved(axes):
    from kvbench.engines import engine_for

    c = dataclasses.replace(case_of("tiny", dims("tiny"), "per-stream", "int8", 64, 1), **axes)
    state = engine_for(c).build(c)
    assert state.resolved is resolved.of_case(c)
    assert state.resolved.k_fmt.name == "int8"
    # the engine's declared allocation is the resolved cells' exact bytes (no block table)
    assert state.alloc_bytes == state.resolved.cache_bytes - state.resolved.block_table_bytes


# Where a format's nbytes may be called: the formula itself, one-row checks, the formats, and a
# real model's cache (fp16 sinks and residual windows: its own structure, kernels/model/spec.py)
NBYTES_CALLS = {
    "kernels/stores/footprint.py": "the row byte formula, once",
    "kernels/formats/protocol.py": "bits per element from one row",
    "harness/suite/validate.py": "one row: does the format take this head_dim",
    "harness/suite/plan.py": "one row: the format's check and its split into data and scales",
    "kernels/model/spec.py": "a real model's cache: fp16 sinks and residual beside the format",
    "kernels/model/cache.py": "a real model's residual window, flushed in groups",
    "kernels/model/evicting.py": "a cache policy's kept cells, each in its format",
    "harness/engines/common.py": "a cache policy's planned kept cells (policy_kv_bytes), each in "
    "its format",
}


def nbytes_callers(root) -> set[str]:
    import re

    found = set()
    for top in ("harness", "kernels", "scripts"):
        for path in (root / top).rglob("*.py"):
            if re.search(r"\.nbytes\(", path.read_text()):
                found.add(str(path.relative_to(root)))
    return found


def test_the_row_byte_formula_is_written_once(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    assert nbytes_callers(root) <= set(NBYTES_CALLS)
    # planted: an engine that writes the formula again is caught
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "x.py").write_text("b = 2 * L * fmt.nbytes(cells * hkv, d)\n")
    assert nbytes_callers(tmp_path) == {"harness/x.py"}


# ---- of_case is the only resolver (#41) ------------------------------------------------------
# A call that turns a case into its formats or its model cache's spec by another route than
# suite/resolved.py of_case, with the reason it may: anything else the scan finds fails the test
ROUTES = ("format_of", "v_format_of", "spec_of", "formats")
OTHER_ROUTES = {
    ("harness/suite/resolved.py", "of_case"): "the resolver itself",
    ("harness/suite/cache_spec.py", "v_format_of"): "V's format is K's unless v_dtype is set",
    ("harness/suite/validate.py", "check_case"): "a suite's check: the format resolves",
    ("harness/suite/validate.py", "check_model"): "a suite's check: the spec's formats resolve",
    ("harness/suite/validate.py", "check_serve"): "a suite's check: phase serve stores one plain "
                                                  "format",
    ("harness/suite/suite.py", "model_kernel"): "a model case's default kernel, chosen before the "
                                                "case exists",
    ("harness/suite/shard.py", "case_cost"): "shard costs are counted before any model file is "
                                             "fetched (of_case reads a model's metadata)",
    ("kernels/model/spec.py", "kv_bytes"): "kernels/ cannot import the harness: the exact bytes of "
                                           "a CacheSpec, from its formats",
    ("kernels/model/cache.py", "__init__"): "the model caches built from a CacheSpec (make_cache)",
    ("kernels/model/evicting.py", "kept_bytes"): "kernels/ cannot import the harness: an evicting "
                                                 "cache's kept bytes from its CacheSpec",
}  # fmt: skip


def resolver_calls(root: Path) -> list[tuple[str, str]]:
    """(file, function) of every call of a route from a case to its formats or spec (ROUTES, or
    get_format of a case's or a spec's field), found by walking the tree's modules."""
    found = set()
    for folder in ("harness", "kernels"):
        for path in sorted((root / folder).rglob("*.py")):
            for fn in ast.walk(ast.parse(path.read_text())):
                if isinstance(fn, ast.FunctionDef):
                    found |= {(str(path.relative_to(root)), fn.name) for c in ast.walk(fn)
                              if isinstance(c, ast.Call) and _routes(c)}  # fmt: skip
    return sorted(found)


def _routes(call: ast.Call) -> bool:
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    first = ast.unparse(call.args[0]) if call.args else ""
    if name == "formats":
        return isinstance(f, ast.Attribute) and not call.args  # spec.formats()
    return name in ROUTES or (name == "get_format" and first.startswith(("case.", "spec.")))


def test_of_case_is_the_only_resolver():
    assert [c for c in resolver_calls(ROOT) if c not in OTHER_ROUTES] == []
    # a listed route that is gone leaves the list, so the list stays the truth
    assert set(OTHER_ROUTES) <= set(resolver_calls(ROOT))


def test_a_planted_resolver_is_caught(tmp_path):
    skip = shutil.ignore_patterns("__pycache__", "*.metal", "*.cu", "*.h")
    for folder in ("harness", "kernels"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=skip)
    plants = {"harness/engines/cache.py": "format_of(case)",
              "harness/engines/model.py": "spec_of(case).formats()",
              "harness/run/runner.py": "get_format(case.kv_dtype)"}  # fmt: skip
    for path, call in plants.items():
        with (tmp_path / path).open("a") as f:
            f.write(f"\n\ndef planted(case):\n    return {call}\n")
    new = [c for c in resolver_calls(tmp_path) if c not in OTHER_ROUTES]
    assert new == sorted((p, "planted") for p in plants)
