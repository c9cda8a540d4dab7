"""What MLX's CUDA JIT compiles custom kernels against, taken from the `mlx-cuda-13` wheel of
the installed MLX version (downloaded once with `pip download --no-deps` into the cache
${KVBENCH_CACHE:-~/.cache/kvbench}/gates, never into the repository):

- mlx/include/ (with CCCL under mlx/include/cccl): the --include-path directories MLX adds;
- the device headers (mlx/backend/cuda/device/*.cuh): not files in the wheel but strings in
  libmlx.so, the arrays g_include_names / g_headers that mlx/backend/cuda/jit_module.cpp hands
  to nvrtcCreateProgram; read from the binary through its symbol table and relocations;
- a fingerprint of the wrapper: literal strings of mlx/backend/cuda/custom_kernel.cpp's
  build_kernel() and jit_module.cpp's options that cuda_wrap.py reproduces. A new MLX whose
  wrapper text changed fails the gate here instead of passing on a stale reconstruction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from gates.elf import Elf

# Literal strings of MLX 0.32's cuda custom kernel wrapper (custom_kernel.cpp, jit_module.cpp)
# that cuda_wrap.py reproduces; each must be a C string (or a string's tail) in libmlx.so.
WRAPPER_FRAGMENTS = (
    '\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n',
    "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n",
    "    const __grid_constant__ Shape ",
    "    const __grid_constant__ Strides ",
    "    const __grid_constant__ int ",
    "  constexpr int {} = {};\n",
    "  constexpr bool {} = {};\n",
    "\n}\n\n} // namespace mlx::core::cu\n",
    "--device-as-default-execution-space",
    "--gpu-architecture={}_{}{}{}",
)
INCLUDE_NAMES = "_ZN3mlx4core2cu12_GLOBAL__N_1L15g_include_namesE"
HEADERS = "_ZN3mlx4core2cu12_GLOBAL__N_1L9g_headersE"


def cache_dir() -> Path:
    root = os.environ.get("KVBENCH_CACHE") or Path.home() / ".cache" / "kvbench"
    return Path(root) / "gates"


def download(version: str) -> Path:
    """The mlx-cuda-13 wheel of `version` in the cache (downloaded when absent)."""
    dest = cache_dir() / "wheels"
    found = sorted(dest.glob(f"mlx_cuda_13-{version}-*x86_64.whl"))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--platform",
        "manylinux_2_35_x86_64",
        "--python-version",
        "3.12",
        "-d",
        str(dest),
        f"mlx-cuda-13=={version}",
    ]  # the wheel is py3-none: any Python version selects it
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return sorted(dest.glob(f"mlx_cuda_13-{version}-*x86_64.whl"))[0]


def _extract(wheel: Path, out: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            if n.startswith("mlx/include/") and not n.endswith("/"):
                z.extract(n, out)
        so = z.read("mlx/lib/libmlx.so")
    elf = Elf(so)
    names, texts = elf.pointer_array(INCLUDE_NAMES), elf.pointer_array(HEADERS)
    missing = [f for f in WRAPPER_FRAGMENTS if f.encode() + b"\0" not in so]
    jit = out / "jit"
    jit.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts):
        (jit / f"{i:02d}.h").write_text(text)
    return {"include_names": names, "missing_fragments": missing}


def toolchain(version: str) -> dict:
    """{'include': dir, 'headers': {name: text}, 'missing_fragments': [...]} for `version`."""
    out = cache_dir() / f"mlx-cuda-13-{version}"
    meta = out / "meta.json"
    if not meta.exists():
        info = _extract(download(version), out)
        meta.write_text(json.dumps(info))  # written last: a partial extraction is redone
    info = json.loads(meta.read_text())
    texts = [(out / "jit" / f"{i:02d}.h").read_text() for i in range(len(info["include_names"]))]
    return {
        "include": out / "mlx" / "include",
        "headers": dict(zip(info["include_names"], texts)),
        "missing_fragments": info["missing_fragments"],
    }
