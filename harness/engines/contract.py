"""The contract between the runner and an engine (the code that builds and runs one case).

An Engine declares which cases it claims, why it would skip one on a backend, and how it builds
one. `build(case, resolved)` (handed the case resolved once: `carrying`) returns a State:
named timed stages (plain functions returning the arrays to evaluate; "step" is the case's
headline time, other stages such as "write", "attend" or "mask"
are timed on their own beside it), a `check()` that runs the parity gate and returns the
accuracy fields, the engine's byte model of one step (traffic, kv_bytes), the case axes as they
actually ran (`effective`, e.g. the tile a null tile_kv meant), and what it measured while
building (allocated bytes, the memory baseline for peak memory, engine-specific row fields).
The runner knows nothing engine-specific: every figure it records comes through this State.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import mlx.core as mx

from kvbench.case import Case
from kvbench.suite import resolved
from kvbench.suite.resolved import Resolved

# the key under which a check's (or a job's) accuracy dict may hand over per-token values: a dict
# of equal-length arrays chunk, position, token, nll, kl (store/tokens.py); the runner takes it
# out of the row's fields and writes it to the run's per-token file
TOKENS = "per_token"


@dataclass
class JobResult:
    """What a job measured in its own processes (every field what its rank 0 saw)."""

    samples: dict[str, list[float]]  # stage -> new samples of this round, ms
    accuracy: dict  # the check's fields; empty when no check was asked for
    alloc_bytes: int | None = None
    peak_mem_bytes: int | None = None  # peak above the job's own pre-cache baseline
    extra: dict = field(default_factory=dict)  # more engine-specific row fields


@dataclass
class State:
    # "step" first; each returns arrays to eval. No stages: a case that measures no time
    # (the quality phase), whose row holds what check() returns
    stages: dict[str, Callable[[], object]]
    check: Callable[[], dict]  # parity gate (raises ParityError) -> accuracy fields
    traffic: tuple[int, int]  # (bytes_read, bytes_written) of one step, all layers
    kv_bytes: int  # exact format bytes of the K/V the case holds, all layers
    flops: int | None = None  # matmul FLOPs of one step; None: the attention-only default
    bits_per_elem: float | None = None  # stored bits per K/V element; None: the case format's
    alloc_bytes: int | None = None  # measured growth of active memory for the cache
    # active memory before the cache; peak memory is above this. None: the engine's arrays are
    # not MLX's (torch, numpy), so MLX's peak memory says nothing about them: not recorded
    baseline_bytes: int | None = 0
    # the arrays the case's cache holds, for the residency gate (engines/residency.py): their
    # declared bytes must be resident above baseline_bytes. None: no MLX cache in this process
    cache: Callable[[], list[mx.array]] | None = None
    effective: dict = field(default_factory=dict)  # case axes as run (recorded in the row)
    extra: dict = field(default_factory=dict)  # engine-specific row fields, never the runner's
    # stages timed in other processes (the ranks of a sharded case, engines/sharded.py): called
    # with each stage's timer arguments and whether to run the parity check; the stages then
    # map to None. None: the runner times the stages here.
    job: Callable[[dict, bool], JobResult] | None = None
    # the case resolved once (suite/resolved.py: formats, cells, exact and planned bytes); the
    # runner's row reads its formats. None: the runner resolves the case itself
    resolved: Resolved | None = None
    # what `kvbench profile` reads beyond the stages: a model step's parts
    # (engines/model_step.py ModelStep); None for every other engine
    profile: object | None = None


class Engine(NamedTuple):
    claims: Callable[[Case], bool]  # does this engine run the case?
    skip_reason: Callable[[Case, str], str | None]  # (case, backend) -> reason, or None
    build: Callable[[Case], State]  # carrying(the engine's build(case, resolved))


def carrying(build: Callable[[Case, Resolved], State]) -> Callable[[Case], State]:
    """An engine's `build(case, resolved)` handed the case resolved once (suite/resolved.py
    of_case: formats, the model cache's spec, cells, bytes), which the engine reads instead of
    resolving anything itself; its State carries it for the runner's row."""

    @functools.wraps(build)
    def built(case: Case) -> State:
        r = resolved.of_case(case)
        state = build(case, r)
        state.resolved = r
        return state

    return built


def window_reason(case: Case) -> str | None:
    """Engines without a sliding-window cache refuse a case with a window."""
    if case.window is None:
        return None
    return "a window runs with layout: window (or the mlx_lm_rotating peer)"


def memory_baseline() -> int:
    """Collect garbage, synchronize, empty MLX's buffer cache, take active memory as the
    baseline and reset the peak counter. Without the clear, a new array may reuse a larger
    cached buffer and active memory grows by that buffer's size, not the array's (seen as
    alloc_bytes > the formula)."""
    gc.collect()  # an earlier case's arrays held in reference cycles would go after this
    mx.synchronize()
    mx.clear_cache()
    baseline = mx.get_active_memory()
    mx.reset_peak_memory()
    return baseline


def active_above(baseline: int) -> int:
    """Active memory above `baseline`, after everything queued has run: the one measurement of
    what a case holds (alloc_bytes here, resident bytes in engines/residency.py)."""
    mx.synchronize()
    return mx.get_active_memory() - baseline


Made = TypeVar("Made")


def allocated(make: Callable[[], Made]) -> tuple[Made, int, int]:
    """(make()'s store, the baseline taken before it, alloc_bytes): the store's arrays
    evaluated (zeroed, not yet filled) and the growth of active memory they caused. Every
    engine's alloc_bytes comes from here; `make` returns an object with `arrays()`."""
    baseline = memory_baseline()
    made = make()
    mx.eval(made.arrays())
    return made, baseline, active_above(baseline)
