"""A GGUF's weights dequantized to float32 (metadata and vocabulary as they are), so llama.cpp
runs the float weights kvbench's model engine runs (kernels/model/load.py dequantizes every
tensor to float32 on load): the `peer_weights: f32` rows of a llama.cpp case.

Why (issue #33, docs/peers.md "Truth"): on a quantized GGUF ggml-cpu's matrix products first
round each activation row to the weight type's vec_dot_type (q8_1 for Q4_1 weights, q8_0 for
Q5_0 / Q8_0, q8_K for the K-quants: ggml-cpu.c type_traits_cpu and ggml_compute_forward_mul_mat),
so any small change upstream, a q8_0 cache's error or just another rounding order in attention,
moves some of those roundings by a whole q8 step and llama.cpp's KL carries that noise on top
of the cache's own. With float32 weights the vec_dot_type is F32 and the products stay float32,
as kvbench's do.

    python -m kvbench.peers.llamacpp_weights IN.gguf OUT.gguf
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from kvbench.peers.llamacpp_build import cache_root

FILE_TYPE_ALL_F32 = 0  # llama_ftype LLAMA_FTYPE_ALL_F32 (include/llama.h): general.file_type
PEER_WEIGHTS = ("gguf", "f32")  # the file as it is; dequantized to float32


def float_tensor(t) -> np.ndarray:
    """One GGUFReader tensor as float32, in numpy's (reversed ggml) shape."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    a = np.asarray(t.data) if t.tensor_type == Q.F32 else dequantize(t.data, t.tensor_type)
    return np.ascontiguousarray(a, dtype=np.float32).reshape([int(n) for n in reversed(t.shape)])


def dequantize_file(src: str | Path, dst: str | Path) -> int:
    """Write src with every tensor as float32 to dst (every metadata field copied, the file
    type set to ALL_F32); returns the number of tensors."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    writer = gguf.GGUFWriter(str(dst), arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer writes these itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = FILE_TYPE_ALL_F32
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        writer.add_tensor_info(t.name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(float_tensor(t))
    writer.close()
    return len(reader.tensors)


def f32_path(gguf_path: Path) -> Path:
    """Where the float32 copy of a GGUF lives (beside llama.cpp's other cached files)."""
    return cache_root() / "llamacpp" / "f32-weights" / f"{gguf_path.stem}.f32.gguf"


def weights_file(gguf_path: Path, peer_weights: str) -> Path:
    """The file llama.cpp runs for a case: the GGUF itself, or its float32 copy (written once,
    under a temporary name renamed into place, so a half-written copy is never used)."""
    if peer_weights not in PEER_WEIGHTS:
        raise ValueError(f"peer_weights must be one of {PEER_WEIGHTS}, got {peer_weights!r}")
    if peer_weights == "gguf":
        return gguf_path
    out = f32_path(gguf_path)
    if out.is_file() and out.stat().st_mtime >= gguf_path.stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        dequantize_file(gguf_path, tmp)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m kvbench.peers.llamacpp_weights IN.gguf OUT.gguf", file=sys.stderr)
        return 2
    try:
        n = dequantize_file(argv[0], argv[1])
    except (OSError, ValueError, KeyError) as e:
        print(f"{argv[0]}: not a GGUF file this can dequantize: {e}", file=sys.stderr)
        return 2
    print(f"{argv[1]}: {n} tensors as float32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
