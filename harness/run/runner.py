"""Run one case for one round and turn its measurements into a Record.

The runner is generic: an engine (ENGINES, chosen by `engine_for`) builds the case into a State
(harness/state.py); the runner checks it (first round only: parity gate and accuracy), warms up
each stage and samples it with the one timer, and tracks peak memory above the engine's
baseline while the stages run. The case's budget is split over the stages: the headline stage
"step" gets four times the share of each other stage (stage_shares).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import mlx.core as mx
from kvbench.analysis import stats
from kvbench.case import Case
from kvbench.engines import cache as cache_engine
from kvbench.engines import peers as peers_engine
from kvbench.engines import streams as streams_engine
from kvbench.kernels.attention import KERNELS, effective_tile
from kvbench.kernels.formats import get_format
from kvbench.kernels.peers import PEERS, kernel_kind
from kvbench.run import metrics, timer
from kvbench.spec.suite import Settings
from kvbench.store.record import Record, make_record


class Engine(NamedTuple):
    build: Callable  # Case -> State
    skip_reason: Callable  # (Case, backend) -> reason or None


ENGINES = {
    "cache": Engine(cache_engine.build, cache_engine.skip_reason),
    "peers": Engine(peers_engine.build, peers_engine.skip_reason),
    "streams": Engine(streams_engine.build, streams_engine.skip_reason),
}


def engine_for(case: Case) -> Engine:
    """The peers engine for peer kernels; the streams engine for many-sequence workloads and the
    unified layout; else the cache engine."""
    if case.kernel in PEERS:
        return ENGINES["peers"]
    if case.layout == "unified" or case.workload != "none":
        return ENGINES["streams"]
    return ENGINES["cache"]


STAGE_WEIGHT = {"step": 1.0}  # relative share of the case's budget; others get OTHER_WEIGHT
OTHER_WEIGHT = 0.25


def stage_shares(stages, with_stages: bool) -> dict[str, float]:
    """Each timed stage's fraction of the case's budget and warm-up; they sum to 1, so
    budget_s is the sampling time of the whole case (min_samples may still overrun it)."""
    names = [s for s in stages if s == "step" or with_stages]
    weights = {s: STAGE_WEIGHT.get(s, OTHER_WEIGHT) for s in names}
    total = sum(weights.values())
    return {s: w / total for s, w in weights.items()}


def skip_reason(case: Case, backend: str) -> str | None:
    if case.window is not None and case.kernel not in PEERS:
        return peers_engine.WINDOW_REASON  # only a sliding-window peer has a window
    return engine_for(case).skip_reason(case, backend)


@dataclass
class CaseRun:
    """A case's measurements accumulated over rounds."""

    case: Case
    samples: dict = field(default_factory=dict)  # stage -> [ms]
    sample_rows: list = field(default_factory=list)
    accuracy: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    traffic: tuple | None = None
    alloc_bytes: int | None = None
    peak_mem_bytes: int | None = None
    rounds_done: int = 0


def measure_round(run: CaseRun, settings: Settings, round_no: int) -> None:
    """Build the case, (first round: check it), warm up and add this round's samples."""
    state = engine_for(run.case).build(run.case)
    if round_no == 0:
        run.accuracy = state.check()
    # peak memory covers the timed stages (warm-up and samples) with the cache in place; the
    # build (prefill writes) and the float32 parity check are left out (engines may report the
    # build's own peak in extra, e.g. fill_peak_bytes)
    mx.synchronize()
    mx.reset_peak_memory()
    run.alloc_bytes, run.extra, run.traffic = state.alloc_bytes, state.extra, state.traffic
    share = 1.0 / settings.rounds
    for stage, weight in stage_shares(state.stages, settings.stages).items():
        fn = state.stages[stage]
        timer.warm_up(fn, settings.warmup_s * weight)
        prior = run.samples.setdefault(stage, [])
        new = timer.sample(
            fn,
            budget_s=settings.budget_s * share * weight,
            min_samples=math.ceil(settings.min_samples * (round_no + 1) * share),
            max_samples=math.ceil(settings.max_samples * share),
            target_ci=settings.target_ci,
            prior_ms=prior,
        )
        run.sample_rows += [
            (run.case.case_id, stage, round_no, len(prior) + i, ms) for i, ms in enumerate(new)
        ]
        prior.extend(new)
    mx.synchronize()
    if state.baseline_bytes is not None:
        peak = mx.get_peak_memory() - state.baseline_bytes
        run.peak_mem_bytes = max(run.peak_mem_bytes or 0, peak)
    run.rounds_done += 1


def case_fields(case: Case) -> dict:
    return {**dataclasses.asdict(case), "gqa_ratio": case.gqa_ratio, "case_id": case.case_id}


def finish(
    run: CaseRun, settings: Settings, common: dict, status: str = "ok", error: str | None = None
) -> Record:
    """The row for a measured case (status ok, or partial when interrupted)."""
    case = run.case
    fmt = get_format(case.kv_dtype, case.group_size)
    step = stats.summarize(run.samples["step"], settings.cv_warn)
    stage_ms = {
        f"{s}_ms": stats.summarize(x)["median_ms"]
        for s, x in run.samples.items()
        if s != "step" and x
    }
    rates = metrics.rates(case, fmt, step["median_ms"], common.get("peak_gbps"), run.traffic)
    fields = {
        **common,
        **case_fields(case),
        "status": status,
        "error": error,
        **step,
        **stage_ms,
        **rates,
        "kv_bytes": metrics.kv_bytes(case, fmt),
        "bits_per_elem": fmt.bits_per_elem(case.head_dim),
        "data_bits": fmt.data_bits,
        "kernel_kind": kernel_kind(case.kernel),
        "alloc_bytes": run.alloc_bytes,
        "peak_mem_bytes": run.peak_mem_bytes,
        **run.accuracy,
    }
    if case.kernel in KERNELS:  # the tile the kernel used (a null tile_kv means its default)
        fields["tile_kv"] = effective_tile(case.kernel, case.tile_kv)
    # an engine's extra fields win (e.g. streams kv_bytes: the occupied cells)
    return make_record(**{**fields, **run.extra})


def error_text(exc: BaseException) -> str:
    """One line naming the exception (at most 500 characters), for an error row."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text[:500]


def failed(case: Case, common: dict, status: str, error: str) -> Record:
    """A row for a case that was skipped or raised: its identity, never a time."""
    return make_record(**common, **case_fields(case), status=status, error=error)
