"""Registers and static shared memory of a kernel, read from the cubin NVRTC returns.

A cubin is an ELF file. Its `.nv.info` section holds EIATTR records (format byte, attribute
byte, 16-bit size, payload); per function symbol (its .symtab index) EIATTR_REGCOUNT (0x2f)
gives the registers per thread and EIATTR_FRAME_SIZE (0x11) the stack frame in bytes (non-zero
when registers spill). The static __shared__ arrays of kernel `k` are the NOBITS section
`.nv.shared.<k>`, whose size is the bytes per block; for sm_90a that section also holds the
1 KB the compiler reserves (a `.nv.shared.reserved.0` section marks it), which is subtracted so
the figure is the declared shared memory `ptxas -v` prints. Cross-checked against ptxas 13.5 by
hand on three instances, both architectures (docs/kernels.md).
"""

from __future__ import annotations

import struct

from gates.elf import Elf

EIFMT_SVAL = 0x04
EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F
# sm_90a cubin: .nv.shared.<k> = 20016 B where ptxas -v reports 18992 B smem (dense fp16, G=4,
# D=128, tile 32): the reserved 1 KB of shared memory per block
RESERVED_SMEM_BYTES = 1024


def _info_records(body: bytes):
    i = 0
    while i + 4 <= len(body):
        fmt, attr, size = struct.unpack_from("<BBH", body, i)
        if fmt == EIFMT_SVAL:
            yield attr, body[i + 4 : i + 4 + size]
            i += 4 + size
        else:  # NVAL / BVAL / HVAL: the value, if any, is in the 16-bit field
            yield attr, struct.pack("<H", size)
            i += 4


def resources(cubin: bytes, mangled: str) -> dict:
    """{'registers', 'shared_bytes', 'frame_bytes'} of kernel `mangled` in `cubin`."""
    elf = Elf(cubin)
    index = elf.symbol_index(mangled)
    per_symbol = {}
    for attr, payload in _info_records(elf.body(elf.section(".nv.info"))):
        if len(payload) == 8:
            sym, value = struct.unpack("<II", payload)
            if sym == index:
                per_symbol[attr] = value
    if EIATTR_REGCOUNT not in per_symbol:
        raise KeyError(f"no register count for {mangled} in the cubin")
    shared = elf.section(f".nv.shared.{mangled}")
    reserved = RESERVED_SMEM_BYTES if elf.section(".nv.shared.reserved.0") else 0
    return {
        "registers": per_symbol[EIATTR_REGCOUNT],
        "shared_bytes": (shared.size - reserved) if shared else 0,
        "frame_bytes": per_symbol.get(EIATTR_FRAME_SIZE, 0),
    }
