"""The CUDA compile gate: every cuda_kernel instantiation the suites can launch, wrapped as MLX
wraps it (cuda_wrap.py) and compiled by NVRTC 13 for each target architecture, no GPU needed.

Speed: NVRTC spends ~6-8 s per program on MLX's headers (cuda/std, cooperative_groups). Each
architecture compiles in its own process with NVRTC's automatic precompiled headers (`-pch`,
the one option added to MLX's list: it caches the parsed header prefix within a process and
changes no code; tests/test_compile_gates.py checks the cubin is the same without it), the two
architectures in parallel, each distinct source once. Results of successful compiles are kept
in the cache keyed by the source, options and toolchain (skipped when CI=true: CI compiles).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from importlib import metadata

import mlx.core as mx

from gates import cubin, cuda_wrap, mlx_wheel, nvrtc
from gates.cuda_wrap import ARCHS, Call
from gates.instances import encode_cases, record_cuda, suite_cases, tiny_cases

PCH_HEAP_BYTES = 512 << 20  # the automatic PCH of MLX's headers needs ~320 MB
RESULTS_FORMAT = 2  # bump when what a cached result holds (cubin.resources) changes


@dataclass(frozen=True)
class Instance:
    call: Call
    labels: tuple[str, ...]  # the suites (or "tiny") whose cases launch it
    case: object  # the first case that launches it

    @property
    def source(self) -> str:
        return cuda_wrap.build_source(self.call)

    @property
    def expression(self) -> str:
        return "mlx::core::cu::" + cuda_wrap.kernel_name(self.call)


def instances() -> list[Instance]:
    """Distinct generated sources over every launchable case of the suites and tiny shapes."""
    found: dict[str, tuple[Call, list[str], object]] = {}
    for label, case in suite_cases("cuda") + tiny_cases("cuda") + encode_cases():
        for call in record_cuda(case):
            entry = found.setdefault(cuda_wrap.build_source(call), (call, [], case))
            if label not in entry[1]:
                entry[1].append(label)
    return [Instance(call, tuple(labels), case) for call, labels, case in found.values()]


def include_dirs(toolchain: dict) -> list[str]:
    inc = toolchain["include"]
    return [str(inc), str(inc / "cccl"), str(nvrtc.cuda_root() / "include")]


def _toolchain_versions() -> str:
    """The wheels a compile depends on besides MLX: NVRTC and the runtime headers."""
    found = []
    for dist in ("nvidia-cuda-nvrtc", "nvidia-cuda-runtime"):
        try:
            found.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist}: not installed as a distribution")
    return ",".join(found)


def _key(source: str, options: list[str]) -> str:
    tools = f"{mx.__version__}|{nvrtc.version()}|{_toolchain_versions()}"
    stamp = f"{RESULTS_FORMAT}|{tools}|{options}|{source}"
    return hashlib.sha256(stamp.encode()).hexdigest()[:32]


def compile_one(
    source: str, expression: str, arch: str, pch: bool = True, pch_dir: str | None = None
) -> dict:
    """{'ok', 'log', and on success 'registers', 'shared_bytes', 'frame_bytes'}. With `pch_dir`
    NVRTC keeps its automatic precompiled headers there (else in its own temporary directory)."""
    tc = mlx_wheel.toolchain(mx.__version__)
    opts = cuda_wrap.options(arch, include_dirs(tc)) + (["-pch"] if pch else [])
    if pch and pch_dir:
        opts.append(f"--pch-dir={pch_dir}")
    if pch:
        nvrtc._lib().nvrtcSetPCHHeapSize(ctypes.c_size_t(PCH_HEAP_BYTES))
    r = nvrtc.compile_program(source, "kernel.cu", tc["headers"], opts, [expression])
    out = {"ok": r.ok, "log": r.log}
    if r.ok:
        out.update(cubin.resources(r.cubin, r.lowered[expression]))
        out["cubin_sha"] = hashlib.sha256(r.cubin).hexdigest()
    return out


def _compile_arch(arch: str, jobs: list[tuple[str, str]], use_cache: bool) -> list[dict]:
    """One architecture's compiles, in a pool worker. The precompiled headers go to a directory
    of ours, removed here: NVRTC removes its own (/tmp/__nvrtc_auto_pch_<pid>_0, 3.3 GB) only
    at a normal exit, and a pool worker ends by os._exit; fifteen left by earlier gate runs
    filled this machine's disk and broke a test run."""
    store = mlx_wheel.cache_dir() / "results"
    store.mkdir(parents=True, exist_ok=True)
    pch_dir = tempfile.mkdtemp(prefix="kvbench-nvrtc-pch-")
    out = []
    try:
        for source, expression in jobs:
            path = store / f"{_key(source, [arch, expression])}.json"
            if use_cache and path.exists():
                out.append(json.loads(path.read_text()))
                continue
            res = compile_one(source, expression, arch, pch_dir=pch_dir)
            if res["ok"]:
                path.write_text(json.dumps(res))
            out.append(res)
    finally:
        shutil.rmtree(pch_dir, ignore_errors=True)
    return out


def run_gate(items: list[Instance], archs=tuple(ARCHS)) -> dict[str, list[dict]]:
    """arch -> one result per instance (same order); one process per architecture."""
    use_cache = os.environ.get("CI", "").lower() != "true"
    jobs = [(i.source, i.expression) for i in items]
    with ProcessPoolExecutor(max_workers=len(archs)) as pool:
        futures = {a: pool.submit(_compile_arch, a, jobs, use_cache) for a in archs}
        return {a: f.result() for a, f in futures.items()}


def failures(results: dict[str, list[dict]], items: list[Instance]) -> list[str]:
    out = []
    for arch, rows in results.items():
        for item, row in zip(items, rows):
            if not row["ok"]:
                errors = [ln for ln in row["log"].splitlines() if "error" in ln]
                out.append(f"{arch} {cuda_wrap.kernel_name(item.call)}: {'; '.join(errors[:3])}")
    return out
