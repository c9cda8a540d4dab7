"""Print the compile gates' results as markdown (the tables in docs/kernels.md): registers and
static shared memory per CUDA instantiation for sm_80 and sm_90a (NVRTC cubin, read as
tests/gates/cubin.py does), and the clang check of each Metal instantiation. Runs the same code
as tests/test_compile_gates.py (compiles what its cache does not hold)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the gates package; never the root (issue 51)

import mlx.core as mx  # noqa: E402
from gates import cuda_gate, metal_gate, nvrtc  # noqa: E402

CODE = {"dense": "dense", "fp4": "fp4", "int4": "int4"}


def cuda_table() -> list[str]:
    items = cuda_gate.instances()
    results = cuda_gate.run_gate(items)
    rows = [
        f"CUDA: {len(items)} distinct instantiations, MLX {mx.__version__}, NVRTC "
        f"{'.'.join(map(str, nvrtc.version()))}",
        "",
        "| kernel | T | G | D | TILE_KV | THREADS | GS | from | sm_80 regs | sm_80 smem B "
        "| sm_90a regs | sm_90a smem B |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = sorted(
        range(len(items)), key=lambda i: str(items[i].call.template) + items[i].call.name
    )
    for i in order:
        t = dict(items[i].call.template)
        a, h = results["sm_80"][i], results["sm_90a"][i]
        # the combine kernel has no G, tile, threads or GS template arguments
        keys = ("T", "G", "D", "TILE_KV", "THREADS", "GS")
        cells = [items[i].call.name.rsplit("_", 1)[-1], *(t.get(k, "-") for k in keys)]
        cells += [", ".join(items[i].labels)]
        cells += [a.get("registers", "FAIL"), a.get("shared_bytes", "")]
        cells += [h.get("registers", "FAIL"), h.get("shared_bytes", "")]
        rows.append("| " + " | ".join(map(str, cells)) + " |")
    return rows


def metal_table() -> list[str]:
    items = metal_gate.instances()
    passed = sum(metal_gate.check(i.source)[0] for i in items)
    return [f"Metal: {passed} of {len(items)} distinct generated sources pass clang"]


if __name__ == "__main__":
    t0 = time.monotonic()
    print("\n".join(cuda_table() + [""] + metal_table()))
    print(f"\n({time.monotonic() - t0:.0f} s)")
