"""NVRTC (the CUDA runtime compiler) through ctypes, from the PyPI wheels MLX's CUDA backend
depends on: `nvidia-cuda-nvrtc` (libnvrtc.so.13) and `nvidia-cuda-runtime` (cuda_fp16.h,
cuda_bf16.h, cooperative_groups.h, ... under site-packages/nvidia/cu13/include, the directory
MLX's jit_module.cpp adds with --include-path). No GPU and no CUDA driver are needed to compile.
API: https://docs.nvidia.com/cuda/nvrtc/ (nvrtcCreateProgram, nvrtcCompileProgram, ...).
"""

from __future__ import annotations

import ctypes
import site
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CU_DIR = "cu13"  # MLX 0.32's cudart_dirname() for CUDA 13 (mlx/backend/cuda/jit_module.cpp)


def _site_dirs() -> list[Path]:
    dirs = [Path(p) for p in sys.path if p.endswith("site-packages")]
    return dirs + [Path(p) for p in site.getsitepackages()]


def cuda_root() -> Path | None:
    """site-packages/nvidia/cu13 holding both libnvrtc and the runtime headers, or None."""
    for d in _site_dirs():
        root = d / "nvidia" / CU_DIR
        if (root / "lib" / "libnvrtc.so.13").exists() and (
            root / "include" / "cuda_fp16.h"
        ).exists():
            return root
    return None


@dataclass(frozen=True)
class Result:
    ok: bool
    log: str
    cubin: bytes  # empty when the compile failed
    lowered: dict[str, str]  # name expression -> mangled kernel name


@cache
def _lib() -> ctypes.CDLL:
    root = cuda_root()
    if root is None:
        raise FileNotFoundError("no nvidia/cu13 NVRTC wheel (pip install nvidia-cuda-nvrtc)")
    return ctypes.CDLL(str(root / "lib" / "libnvrtc.so.13"))


def version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(_lib().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def _check(code: int, what: str) -> None:
    if code != 0:
        err = _lib().nvrtcGetErrorString
        err.restype = ctypes.c_char_p
        raise RuntimeError(f"{what}: {err(code).decode()}")


def _strings(items: list[str]):
    return (ctypes.c_char_p * len(items))(*[s.encode() for s in items])


def _bytes(prog, size_fn: str, get_fn: str) -> bytes:
    size = ctypes.c_size_t()
    _check(getattr(_lib(), size_fn)(prog, ctypes.byref(size)), size_fn)
    buf = ctypes.create_string_buffer(size.value)
    _check(getattr(_lib(), get_fn)(prog, buf), get_fn)
    return buf.raw


def compile_program(
    source: str, name: str, headers: dict[str, str], options: list[str], expressions: list[str]
) -> Result:
    """Compile `source` with in-memory `headers` (include name -> text), as MLX does."""
    lib, prog = _lib(), ctypes.c_void_p()
    names, texts = list(headers), list(headers.values())
    _check(
        lib.nvrtcCreateProgram(
            ctypes.byref(prog),
            source.encode(),
            name.encode(),
            len(names),
            _strings(texts),
            _strings(names),
        ),
        "nvrtcCreateProgram",
    )
    try:
        for e in expressions:
            _check(lib.nvrtcAddNameExpression(prog, e.encode()), "nvrtcAddNameExpression")
        code = lib.nvrtcCompileProgram(prog, len(options), _strings(options))
        log = _bytes(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog").rstrip(b"\0")
        if code != 0:
            return Result(False, log.decode("utf-8", "replace"), b"", {})
        return Result(
            True, log.decode("utf-8", "replace"), _cubin(prog), _lowered(prog, expressions)
        )
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _cubin(prog) -> bytes:
    return _bytes(prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")


def _lowered(prog, expressions: list[str]) -> dict[str, str]:
    out = {}
    for e in expressions:
        mangled = ctypes.c_char_p()
        _check(
            _lib().nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(mangled)),
            "nvrtcGetLoweredName",
        )
        out[e] = mangled.value.decode()
    return out
