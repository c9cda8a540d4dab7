"""A fast BLAS under MLX's Linux CPU backend, loaded before anything imports mlx.core.

MLX's Linux CPU wheel links the reference (netlib) BLAS it bundles (mlx_cpu.libs/libblas-*):
correct, but an fp32 matmul [2048x576]x[576x1536] ran at 1.2-2.5 GFLOP/s on the 2-core
development machine, against 42-75 GFLOP/s in the same process with Debian's OpenBLAS loaded
first and 42-59 with PyPI's MKL runtime (2026-11-25, measured under load; docs/blas.md).
libmlx.so asks the dynamic linker for plain `cblas_sgemm` (and dgemm, cgemm); a library
loaded with RTLD_GLOBAL before mlx.core is bound ahead of the bundled one. It must come first:
Python loads extension modules with RTLD_NOW, so once mlx.core is imported its BLAS is fixed.

`preload()` runs when the `kvbench` package is imported (harness/__init__.py), so every
process that runs kvbench code (the CLI, the paired gate's workers, sharded ranks, tests) picks
the same library. KVBENCH_BLAS chooses: unset or `auto` (the first fast library found:
a system OpenBLAS, then PyPI's MKL in this Python's prefix), `off` (MLX's own), or a path to a
shared library exporting cblas_sgemm. On macOS MLX uses Accelerate: nothing is loaded.
This module imports no mlx (the measured GFLOP/s are kvbench.run.context's).
"""

from __future__ import annotations

import ctypes
import os
import platform
import stat
import sys
from pathlib import Path

ENV = "KVBENCH_BLAS"
OFF = ("off", "0", "none", "bundled")
INSTALL_HINT = "apt-get install libopenblas0-pthread (or pip install mkl)"


def _system_openblas() -> list[Path]:
    """Where Debian/Ubuntu (multiarch, pthread or OpenMP build) and Fedora put OpenBLAS."""
    arch = f"{platform.machine()}-linux-gnu"
    lib = Path("/usr/lib") / arch
    return [
        lib / "openblas-pthread" / "libopenblas.so.0",
        lib / "openblas-openmp" / "libopenblas.so.0",
        lib / "libopenblas.so.0",
        Path("/usr/lib64/libopenblasp.so.0"),
        Path("/usr/lib64/libopenblas.so.0"),
    ]


def _pip_mkl() -> list[Path]:
    """`pip install mkl` puts its runtime in the environment's lib/ (the wheel's data dir)."""
    lib = Path(sys.prefix) / "lib"
    return [lib / "libmkl_rt.so.3", lib / "libmkl_rt.so.2"]


def candidates() -> list[tuple[str, Path]]:
    """(where it came from, path) in the order auto tries them."""
    return [("system", p) for p in _system_openblas()] + [("pip mkl", p) for p in _pip_mkl()]


def _version(lib: ctypes.CDLL) -> str:
    """ "openblas 0.3.21 SkylakeX", "mkl 2026.2.0" or "cblas" (a library that says neither)."""
    if hasattr(lib, "openblas_get_config"):
        lib.openblas_get_config.restype = ctypes.c_char_p
        words = lib.openblas_get_config().decode(errors="replace").split()
        core = ""
        if hasattr(lib, "openblas_get_corename"):
            lib.openblas_get_corename.restype = ctypes.c_char_p
            core = " " + lib.openblas_get_corename().decode(errors="replace")
        return f"openblas {words[1] if len(words) > 1 else '?'}{core}"
    if hasattr(lib, "MKL_Get_Version_String"):
        buf = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String(buf, len(buf))
        text = buf.value.decode(errors="replace")
        nums = [w for w in text.replace(",", " ").split() if w[:1].isdigit()]
        return f"mkl {nums[0] if nums else '?'}"
    return "cblas"


def _load(path: Path) -> tuple[ctypes.CDLL | None, str]:
    """The library loaded globally, or None and why not."""
    if path.name.startswith("libmkl_rt"):
        # MKL's default threading layer needs Intel's OpenMP; GNU's libgomp ships with gcc
        os.environ.setdefault("MKL_THREADING_LAYER", "GNU")
    if path.exists() and not path.is_file():  # a bare name is dlopen's to look up
        # dlopen of a named pipe blocks for ever (even `kvbench --help`); this module imports
        # nothing of kvbench (the paired workers load it from any tree)
        kind = "a named pipe" if stat.S_ISFIFO(os.stat(path).st_mode) else "not a regular file"
        return None, f"{kind}, not a shared library"
    try:
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        return None, f"cannot load: {e}"
    if not hasattr(lib, "cblas_sgemm"):
        return None, "exports no cblas_sgemm (a prefixed build such as scipy-openblas cannot serve)"
    return lib, ""


def _loaded(origin: str, path: Path, lib: ctypes.CDLL) -> dict:
    return {"blas": _version(lib), "blas_source": f"{origin}: {path}", "problem": "", "path": path}


def _bundled(source: str, problem: str = "") -> dict:
    return {"blas": "bundled", "blas_source": source, "problem": problem}


def choose(setting: str | None, mlx_loaded: bool, system: str) -> dict:
    """What to load for a KVBENCH_BLAS setting; loads it. `problem` is a bad setting's reason
    (the CLI turns it into a one-line error)."""
    if system != "Linux":
        return {"blas": "platform", "blas_source": f"MLX's own on {system}", "problem": ""}
    setting = (setting or "auto").strip()
    if setting.lower() in OFF:
        return _bundled(f"mlx wheel ({ENV}={setting})")
    if mlx_loaded:
        return _bundled("mlx wheel (mlx.core was imported before kvbench chose a BLAS)")
    if setting.lower() != "auto":
        lib, why = _load(Path(setting))
        if lib is None:
            return _bundled("mlx wheel", f"{ENV}: {setting}: {why}")
        return _loaded(ENV, Path(setting), lib)
    for origin, path in candidates():
        if path.exists():
            lib, _ = _load(path)
            if lib is not None:
                return _loaded(origin, path, lib)
    return _bundled(f"mlx wheel (no fast BLAS found: {INSTALL_HINT})")


_CHOSEN: dict = {}


def preload() -> dict:
    """Choose and load once per process (before mlx.core); the same answer afterwards."""
    if not _CHOSEN:
        _CHOSEN.update(choose(os.environ.get(ENV), "mlx.core" in sys.modules, platform.system()))
    return dict(_CHOSEN)


def chosen() -> dict:
    """blas and blas_source, the row columns (kvbench.run.context adds blas_gflops)."""
    info = preload()
    return {"blas": info["blas"], "blas_source": info["blas_source"]}


def problem() -> str:
    return preload()["problem"]


def notice() -> str:
    """One line for `kvbench run` / `env` when auto found no fast BLAS on Linux, else ""."""
    info = preload()
    if info["blas"] != "bundled" or "no fast BLAS" not in info["blas_source"]:
        return ""
    return (
        "kvbench: MLX's CPU backend runs on the reference BLAS of its wheel (fp32 matmuls ~30x "
        f"slower here): {INSTALL_HINT} speeds every CPU row; {ENV}=off keeps it and this quiet"
    )


def child_env(ld_preload: bool) -> dict:
    """os.environ for a process that runs another tree's kvbench (the gate's BASE, its paired
    workers), so both sides of a comparison run on the BLAS chosen here: KVBENCH_BLAS names it
    (or `off`), and with ld_preload the dynamic linker loads it first (older trees choose none).
    The paired workers load it themselves after pinning to a CPU (harness/run/worker.py): a
    library loaded before the pin starts a thread per core that the pin does not move."""
    env = dict(os.environ)
    info = preload()
    path = info.get("path")
    if path is None:
        if info["blas"] == "bundled":
            env[ENV] = "off"
        return env
    env[ENV] = str(path)
    if ld_preload:
        env["LD_PRELOAD"] = " ".join(filter(None, [str(path), env.get("LD_PRELOAD", "")]))
    return env
