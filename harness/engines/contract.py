"""The contract between the runner and an engine (the code that builds and runs one case).

An Engine declares which cases it claims, why it would skip one on a backend, and how it builds
one. `build(case)` returns a State: named timed stages (plain functions returning the arrays to
evaluate; "step" is the case's headline time, other stages such as "write", "attend" or "mask"
are timed on their own beside it), a `check()` that runs the parity gate and returns the
accuracy fields, the engine's byte model of one step (traffic, kv_bytes), the case axes as they
actually ran (`effective`, e.g. the tile a null tile_kv meant), and what it measured while
building (allocated bytes, the memory baseline for peak memory, engine-specific row fields).
The runner knows nothing engine-specific: every figure it records comes through this State.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import mlx.core as mx

from kvbench.case import Case

# parity tolerance (relative L2 error vs the float32 reference on the same stored cache), by
# the dtype the kernel computes in: rounding of q, scores and probabilities, not the format's.
# Loose enough for paths that keep scores in fp16 (quantized_matmul and mlx-lm at affine8
# measured rel_err 5.2e-3), tight enough for real bugs (a 5% error fails: tests/test_session.py)
PARITY_REL_TOL = {mx.float32: 1e-4, mx.float16: 1e-2, mx.bfloat16: 5e-2}


class ParityError(RuntimeError):
    """A kernel's output disagrees with the reference: the case gets an error row."""


@dataclass
class State:
    stages: dict[str, Callable[[], object]]  # "step" first; each returns arrays to eval
    check: Callable[[], dict]  # parity gate (raises ParityError) -> accuracy fields
    traffic: tuple[int, int]  # (bytes_read, bytes_written) of one step, all layers
    kv_bytes: int  # exact format bytes of the K/V the case holds, all layers
    alloc_bytes: int | None = None  # measured growth of active memory for the cache
    # active memory before the cache; peak memory is above this. None: the engine's arrays are
    # not MLX's (torch, numpy), so MLX's peak memory says nothing about them: not recorded
    baseline_bytes: int | None = 0
    effective: dict = field(default_factory=dict)  # case axes as run (recorded in the row)
    extra: dict = field(default_factory=dict)  # engine-specific row fields, never the runner's


class Engine(NamedTuple):
    claims: Callable[[Case], bool]  # does this engine run the case?
    skip_reason: Callable[[Case, str], str | None]  # (case, backend) -> reason, or None
    build: Callable[[Case], State]


def window_reason(case: Case) -> str | None:
    """Engines without a sliding-window cache refuse a case with a window."""
    if case.window is None:
        return None
    return "window is implemented by the mlx_lm_rotating peer only"


def compare_outputs(out: mx.array, ref: mx.array) -> dict:
    """max abs error, relative L2 error and cosine similarity of out against ref."""
    o, r = out.astype(mx.float32).reshape(-1), ref.astype(mx.float32).reshape(-1)
    diff = o - r
    stats = {
        "max_abs_err": mx.max(mx.abs(diff)),
        "rel_err": mx.linalg.norm(diff) / mx.linalg.norm(r),
        "cosine": mx.sum(o * r) / (mx.linalg.norm(o) * mx.linalg.norm(r)),
    }
    return {k: float(v.item()) for k, v in stats.items()}


def recon_err(decoded: tuple, originals: tuple) -> float:
    """Relative L2 error of decoded K and V (together, float32) against the float32 originals."""
    num = sum(mx.sum((d - x) * (d - x)).item() for d, x in zip(decoded, originals))
    den = sum(mx.sum(x * x).item() for x in originals)
    return (num / den) ** 0.5


def parity_gate(name: str, out: mx.array, ref: mx.array, compute_dtype: mx.Dtype) -> dict:
    """Raise ParityError unless out matches ref within the tolerance of compute_dtype."""
    parity = compare_outputs(out, ref)
    tol = PARITY_REL_TOL[compute_dtype]
    if not parity["rel_err"] <= tol:  # NaN fails too
        raise ParityError(
            f"kernel {name} disagrees with the float32 reference on the same "
            f"cache: rel_err {parity['rel_err']:.3g} > {tol:g}"
        )
    return parity


def memory_baseline() -> int:
    """Synchronize, empty MLX's buffer cache, take active memory as the baseline and reset the
    peak counter. Without the clear, a new array may reuse a larger cached buffer and active
    memory grows by that buffer's size, not the array's (seen as alloc_bytes > the formula)."""
    mx.synchronize()
    mx.clear_cache()
    baseline = mx.get_active_memory()
    mx.reset_peak_memory()
    return baseline
