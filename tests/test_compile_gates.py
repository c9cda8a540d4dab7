"""Compile gates: the Metal and CUDA kernels compiled as MLX would compile them, without a GPU.

CUDA (tests/gates/cuda_gate.py): every cuda_kernel instantiation the suites can launch, wrapped
exactly as MLX's cuda_kernel wraps it (checked against the mlx-cuda-13 wheel of the installed
MLX version) and compiled by NVRTC 13 for sm_80 and sm_90a; registers and shared memory read
from the cubin. Metal (tests/gates/metal_gate.py): the source MLX itself prints for every
metal_kernel instantiation, tiny shapes included, checked by clang against an MSL shim.

Without NVRTC (pip install -e .[gates]), clang (apt-get install clang) or the wheel download,
the gates skip with the reason; with CI=true they fail instead (CI must run them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import mlx.core as mx
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the gates package beside this file

from gates import cuda_gate, metal_gate, mlx_wheel, nvrtc  # noqa: E402
from gates.instances import call_problem  # noqa: E402

from kvbench.kernels.attention.gpu import encode, launch  # noqa: E402
from kvbench.kernels.formats.registry import get_format  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() == "true"


def need(ok: bool, reason: str) -> None:
    if ok:
        return
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the compile gates must run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def toolchain():
    need(nvrtc.cuda_root() is not None, "no NVRTC 13 wheel (pip install -e '.[gates]')")
    try:
        return mlx_wheel.toolchain(mx.__version__)
    except (subprocess.CalledProcessError, OSError) as e:
        need(False, f"cannot fetch mlx-cuda-13=={mx.__version__}: {e}")


@pytest.fixture(scope="module")
def cuda_items(toolchain):
    return cuda_gate.instances()


@pytest.fixture(scope="module")
def cuda_results(cuda_items):
    return cuda_gate.run_gate(cuda_items)


def test_mlx_wrapper_text_is_what_we_rebuild(toolchain):
    assert toolchain["missing_fragments"] == []  # else MLX changed its cuda_kernel wrapper
    utils = toolchain["headers"]["mlx/backend/cuda/device/utils.cuh"]
    assert "#pragma once" in utils and "namespace mlx::core::cu" in utils


def test_cuda_instances_cover_formats_dtypes_and_tiny_shapes(cuda_items):
    names = {re.sub(r"_d\d+$", "", i.call.name) for i in cuda_items}  # TurboQuant: per head_dim
    assert names >= {f"kvbench_flash_decode_{c}" for c in launch.KV_CODES}  # FP8, iq4_nl, tq too
    assert names >= {f"kvbench_kv_encode_{c}" for c in encode.ENCODE_CODES}  # quantize-on-write
    dtypes = {dict(i.call.template)["T"] for i in cuda_items}
    assert dtypes >= {"float16", "bfloat16", "float32"}
    assert any("tiny" in i.labels for i in cuda_items)


def test_every_cuda_instantiation_compiles(cuda_items, cuda_results):
    assert set(cuda_results) == {"sm_80", "sm_90a"}
    assert cuda_gate.failures(cuda_results, cuda_items) == []


def test_compiled_shared_memory_is_what_the_planner_refuses_on(cuda_items, cuda_results):
    for arch, rows in cuda_results.items():
        for item, row in zip(cuda_items, rows):
            # the combine and the encode kernels declare no shared memory
            if item.call.name.endswith("_combine") or "_kv_encode_" in item.call.name:
                assert row["shared_bytes"] == 0 and row["frame_bytes"] == 0, (arch, item.labels)
                continue
            fmt = get_format(item.case.kv_dtype, item.case.group_size)
            tile = item.case.tile_kv or launch.DEFAULT_TILE_KV
            planned = launch.plan(call_problem(item.case, fmt), tile, limits=launch.CUDA)
            assert row["shared_bytes"] == planned.shared_bytes, (arch, item.labels)
            assert row["frame_bytes"] == 0, (arch, item.labels)  # no register spills


def test_cuda_gate_fails_when_minus_inf_is_planted_back(cuda_items, cuda_results):
    item = cuda_items[0]
    header, n = re.subn(r"#define KV_NEG_INF .*", "#define KV_NEG_INF (-inf)", item.call.header)
    assert n == 1
    planted = cuda_gate.Instance(item.call.__class__(**{**item.call.__dict__, "header": header}),
                                 item.labels, item.case)  # fmt: skip
    res = cuda_gate.compile_one(planted.source, planted.expression, "sm_90a", pch=False)
    assert not res["ok"] and 'identifier "inf" is undefined' in res["log"]
    assert cuda_gate.failures({"sm_90a": [res]}, [planted])  # the gate reports it
    # and the same source, unplanted, with MLX's options exactly (no -pch): the cubin the gate
    # compiled with precompiled headers is byte for byte the same
    exact = cuda_gate.compile_one(item.source, item.expression, "sm_80", pch=False)
    assert exact["ok"] and exact["cubin_sha"] == cuda_results["sm_80"][0]["cubin_sha"]


def test_a_gate_worker_leaves_no_precompiled_headers_behind(cuda_items):
    # NVRTC's automatic PCH directory (3.3 GB) outlived every pool worker (os._exit skips
    # NVRTC's clean-up) until the gate gave it a directory of its own and removed it
    tmp = Path(tempfile.gettempdir())

    def left() -> set[Path]:
        return {*tmp.glob("__nvrtc_auto_pch_*"), *tmp.glob("kvbench-nvrtc-pch-*")}

    before = left()
    item = cuda_items[0]
    with ProcessPoolExecutor(max_workers=1) as pool:
        job = pool.submit(cuda_gate._compile_arch, "sm_80", [(item.source, item.expression)], False)
        assert job.result()[0]["ok"]
    assert left() <= before


@pytest.fixture(scope="module")
def metal_items():
    need(metal_gate.clang() is not None, "no clang (apt-get install clang)")
    return metal_gate.instances()


def test_every_metal_instantiation_passes_clang(metal_items):
    failed = {}
    for item in metal_items:
        ok, log = metal_gate.check(item.source)
        if not ok:
            failed[item.labels] = [ln for ln in log.splitlines() if "error" in ln][:3]
    assert failed == {}


CONSTANT_INPUT = re.compile(r"const constant (\w+)\* (\w+) \[\[buffer\(\d+\)\]\]")


def test_metal_instances_include_constant_inputs(metal_items):
    # MLX passes an input of fewer than 8 elements as `constant` (the wrapper pads tiny K/V,
    # but small q, scales and the combine's partials still arrive that way)
    sources = "\n".join(i.source for i in metal_items)
    assert CONSTANT_INPUT.search(sources), "no tiny-shape instance with a constant input"
    assert re.search(r"const device float16_t\* k \[\[buffer\(\d+\)\]\]", sources)


def test_metal_gate_fails_on_a_device_only_helper(metal_items):
    """A helper taking `const device T*`, given an input MLX passes as `constant`, fails."""
    item = next(i for i in metal_items if CONSTANT_INPUT.search(i.source))
    ctype, name = CONSTANT_INPUT.search(item.source).groups()
    helper = f"inline float kvbench_first(const device {ctype}* p) {{ return float(p[0]); }}\n"
    head, sep, tail = item.source.partition("template <typename T")
    body_end = tail.rindex("\n}\n")
    planted = (
        head + helper + sep + tail[:body_end] + f"\n  (void)kvbench_first({name});"
        + tail[body_end:]
    )  # fmt: skip
    ok, log = metal_gate.check(planted)
    assert not ok and "cannot pass pointer to address space '2'" in log  # constant -> device
