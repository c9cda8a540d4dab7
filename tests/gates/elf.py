"""A minimal ELF64 little-endian reader: sections, symbols, RELA relocations, C strings.

Used twice by the compile gates: to read the device headers MLX embeds in its libmlx.so (the
arrays MLX hands to nvrtcCreateProgram), and to read registers / shared memory of a kernel
from the cubin NVRTC returns (an ELF whose section names follow NVIDIA's conventions).
Layout facts from the System V ABI (ELF-64 Object File Format, version 1.5).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SHDR = struct.Struct("<IIQQQQIIQQ")  # name, type, flags, addr, offset, size, link, info, align, es
SYM = struct.Struct("<IBBHQQ")  # name, info, other, shndx, value, size
RELA = struct.Struct("<QQq")  # offset, info, addend
SHT_NOBITS = 8


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    addr: int
    offset: int
    size: int
    info: int


class Elf:
    def __init__(self, data) -> None:
        if bytes(data[:5]) != b"\x7fELF\x02" or data[5] != 1:
            raise ValueError("not a little-endian ELF64 file")
        self.data = data
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shnum, shstrndx = struct.unpack_from("<HH", data, 0x3C)
        raw = [SHDR.unpack_from(data, shoff + i * SHDR.size) for i in range(shnum)]
        names_off = raw[shstrndx][4]
        self.sections = [
            Section(self.cstr(names_off + r[0]), r[1], r[3], r[4], r[5], r[7]) for r in raw
        ]

    def cstr(self, offset: int) -> str:
        end = self.data.find(b"\0", offset)
        return bytes(self.data[offset:end]).decode("utf-8", "replace")

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def body(self, sec: Section) -> bytes:
        return (
            b"" if sec.type == SHT_NOBITS else bytes(self.data[sec.offset : sec.offset + sec.size])
        )

    def symbols(self) -> dict[str, tuple[int, int]]:
        """name -> (value, size) from .symtab (empty when the file is stripped)."""
        symtab, strtab = self.section(".symtab"), self.section(".strtab")
        if symtab is None or strtab is None:
            return {}
        out = {}
        for name, _, _, _, value, size in SYM.iter_unpack(self.body(symtab)):
            if name:
                out[self.cstr(strtab.offset + name)] = (value, size)
        return out

    def symbol_index(self, name: str) -> int:
        """Position of `name` in .symtab (what per-symbol records such as a cubin's refer to)."""
        symtab, strtab = self.section(".symtab"), self.section(".strtab")
        for i, (off, *_) in enumerate(SYM.iter_unpack(self.body(symtab))):
            if off and self.cstr(strtab.offset + off) == name:
                return i
        raise KeyError(name)

    def relative_relocs(self) -> dict[int, int]:
        """Address of each pointer slot the loader fills -> the address it points to."""
        sec = self.section(".rela.dyn")
        return {} if sec is None else {o: a for o, _, a in RELA.iter_unpack(self.body(sec))}

    def offset_of(self, addr: int) -> int:
        """File offset of a virtual address inside an allocated section."""
        for s in self.sections:
            if s.addr and s.addr <= addr < s.addr + s.size and s.type != SHT_NOBITS:
                return s.offset + addr - s.addr
        raise ValueError(f"address {addr:#x} is in no section")

    def string_at(self, addr: int) -> str:
        return self.cstr(self.offset_of(addr))

    def pointer_array(self, symbol: str) -> list[str]:
        """The C strings a relocated `const char* x[]` array named `symbol` points to."""
        value, size = self.symbols()[symbol]
        relocs = self.relative_relocs()
        return [self.string_at(relocs[value + 8 * i]) for i in range(size // 8)]
