"""The Metal compile gate: the exact source MLX generates for every metal_kernel instantiation
the suites (and tiny shapes) can launch, printed by MLX itself (instances.metal_sources: a call
traced through mx.export_function with verbose=True, which MLX's CPU build allows), then
syntax- and type-checked by clang against tests/gates/msl_shim.h.

clang is not Apple's Metal compiler; two rewrites of the preprocessed text, and nothing else,
let it parse MSL (docs/kernels.md lists what the check therefore cannot catch):
- a `threadgroup` declaration statement inside a function gets `static` (clang refuses
  address-space-qualified automatic variables; MSL allows them in kernels, one per threadgroup);
- the attribute lists of the closing explicit instantiation (`template [[host_name("..")]]
  [[kernel]] decltype(f<..>) f<..>;`) are dropped (standard C++ allows none there).
Target aarch64 (+bf16): 64-bit little-endian like Apple GPUs, with _Float16 and __bf16.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gates.instances import encode_cases, metal_sources, suite_cases, tiny_cases

SHIM = Path(__file__).with_name("msl_shim.h")
FLAGS = ["--target=aarch64-linux-gnu", "-march=armv8.6-a+bf16", "-x", "c++", "-std=c++17"]
TG = r"__attribute__\(\(address_space\(3\)\)\)"
# a whole-line declaration statement (no parentheses: not a parameter, call or function)
TG_DECL = re.compile(rf"^(\s*)({TG}\s+[^;(){{}}]*;\s*)$", re.M)
INSTANTIATION_ATTRS = re.compile(r"^template\s+(?:\[\[[^\]]*\]\]\s*)+", re.M)


@dataclass(frozen=True)
class Instance:
    source: str
    labels: tuple[str, ...]
    case: object


def clang() -> str | None:
    return shutil.which("clang")


def instances() -> list[Instance]:
    found: dict[str, tuple[list[str], object]] = {}
    for label, case in suite_cases("metal") + tiny_cases("metal") + encode_cases():
        for source in metal_sources(case):
            entry = found.setdefault(source, ([], case))
            if label not in entry[0]:
                entry[0].append(label)
    return [Instance(src, tuple(labels), case) for src, (labels, case) in found.items()]


def rewrite(preprocessed: str) -> str:
    """The two rewrites above, on clang -E output."""
    text = TG_DECL.sub(lambda m: f"{m.group(1)}static {m.group(2)}", preprocessed)
    return INSTANTIATION_ATTRS.sub("template ", text)


def check(source: str) -> tuple[bool, str]:
    """(passed, clang's messages) for one generated Metal source."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.metal"
        src.write_text(source)
        pre = subprocess.run(
            [clang(), *FLAGS, "-E", "-nostdinc", "-include", str(SHIM), str(src)],
            capture_output=True, text=True,
        )  # fmt: skip
        if pre.returncode:
            return False, pre.stderr
        out = Path(tmp) / "kernel.ii"
        out.write_text(rewrite(pre.stdout))
        res = subprocess.run(
            [clang(), *FLAGS, "-fsyntax-only", "-nostdinc", "-Wno-unknown-attributes", str(out)],
            capture_output=True, text=True,
        )  # fmt: skip
        return res.returncode == 0, res.stderr
