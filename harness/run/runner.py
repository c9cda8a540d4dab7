"""Run one case for one round and turn its measurements into a Record.

The runner is generic: an engine (harness/engines: ENGINES, chosen by `engine_for`) builds the
case into a State (harness/engines/contract.py); the runner checks it (first round only: parity
gate and accuracy), warms up each stage and samples it with the one timer, and tracks peak
memory above the engine's baseline while the stages run; every other figure comes from the
State (the engine's byte model, allocation, effective axes and own fields). The case's budget
is split over the stages: the headline stage "step" gets four times the share of each other
stage (stage_shares).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import mlx.core as mx

from kvbench import stats, timer
from kvbench.case import Case
from kvbench.engines import engine_for, metrics, residency
from kvbench.engines.contract import TOKENS, State
from kvbench.peers.registry import kernel_kind
from kvbench.run import interrupt
from kvbench.store import tokens
from kvbench.store.schema import Record, make_record
from kvbench.suite import resolved
from kvbench.suite.resolved import Resolved
from kvbench.suite.suite import Settings

STAGE_WEIGHT = {"step": 1.0}  # relative share of the case's budget; others get OTHER_WEIGHT
OTHER_WEIGHT = 0.25


def stage_shares(stages, with_stages: bool) -> dict[str, float]:
    """Each timed stage's fraction of the case's budget and warm-up; they sum to 1, so
    budget_s is the sampling time of the whole case (min_samples may still overrun it)."""
    names = [s for s in stages if s == "step" or with_stages]
    weights = {s: STAGE_WEIGHT.get(s, OTHER_WEIGHT) for s in names}
    total = sum(weights.values())
    return {s: w / total for s, w in weights.items()}


@dataclass
class CaseRun:
    """A case's measurements accumulated over rounds."""

    case: Case
    samples: dict = field(default_factory=dict)  # stage -> [ms]
    sample_rows: list = field(default_factory=list)
    token_rows: list = field(default_factory=list)  # per-token quality values (store/tokens.py)
    accuracy: dict = field(default_factory=dict)
    reported: dict = field(default_factory=dict)  # row fields the engine's State reported
    traffic: tuple | None = None  # the engine's (bytes_read, bytes_written) of one step
    flops: int | None = None  # the engine's FLOPs of one step (None: the attention default)
    bits_per_elem: float | None = None  # the engine's stored bits per element (None: format's)
    peak_mem_bytes: int | None = None
    resident: dict = field(default_factory=dict)  # the residency gate's row fields
    resolved: Resolved | None = None  # the case resolved, as the engine's State carried it
    rounds_done: int = 0


def timer_plans(stages, settings: Settings, round_no: int) -> dict[str, dict]:
    """Each timed stage's warm-up and timer.sample arguments for this round."""
    share = 1.0 / settings.rounds
    return {
        stage: {
            "warmup_s": settings.warmup_s * weight,
            "budget_s": settings.budget_s * share * weight,
            "min_samples": math.ceil(settings.min_samples * (round_no + 1) * share),
            "max_samples": math.ceil(settings.max_samples * share),
            "target_ci": settings.target_ci,
        }
        for stage, weight in stage_shares(stages, settings.stages).items()
    }


def finite_figures(fields: dict) -> dict:
    """A check's figures, every number finite: a NaN KL or an infinite perplexity is an error
    row naming it, never an ok row with an empty cell (issue 35)."""
    for key, value in fields.items():
        if isinstance(value, (int, float)) and not math.isfinite(value):
            raise ValueError(f"{key} is {value}: not a finite figure, so no row is written as ok")
    return fields


def accuracy_of(run: CaseRun, fields: dict) -> dict:
    """The check's row fields, finite; its per-token values (contract.TOKENS, where the engine
    keeps them) become the run's per-token lines."""
    fields = dict(fields)
    arrays = fields.pop(TOKENS, None)
    if arrays is not None:
        run.token_rows = tokens.token_rows(run.case.case_id, arrays)
    return finite_figures(fields)


def finite_samples(stage: str, new: list[float]) -> list[float]:
    """Timings finite and not negative (a job's samples come from other processes)."""
    for i, ms in enumerate(new):
        if not (math.isfinite(ms) and ms >= 0):
            raise ValueError(f"sample {i} of stage {stage} is {ms} ms: not a time")
    return new


def add_samples(run: CaseRun, stage: str, round_no: int, new: list[float]) -> None:
    new = finite_samples(stage, new)
    prior = run.samples.setdefault(stage, [])
    run.sample_rows += [
        (run.case.case_id, stage, round_no, len(prior) + i, ms) for i, ms in enumerate(new)
    ]
    prior.extend(new)


def overrun_note(case: Case, settings: Settings, step_ms: float) -> str | None:
    """A line when min_samples steps of step_ms cannot fit the case's budget (issue 27: the
    dry run said 0.5 s per case, a case took 3 minutes): said at once, after the warm-up."""
    need_s = settings.min_samples * step_ms / 1e3
    if need_s <= settings.budget_s:
        return None
    return (
        f"{case.label()}: a step took {step_ms / 1e3:.3g} s (the fastest warm-up call after the "
        f"first); {settings.min_samples} samples need about {need_s:.3g} s, over its budget of "
        f"{settings.budget_s:g} s: the case overruns (min_samples wins over the budget)"
    )


def measure_round(run: CaseRun, settings: Settings, round_no: int, say=None) -> None:
    """Build the case, (first round: check it), warm up and add this round's samples; `say`
    gets a line when the first round's warm-up shows the case will overrun its budget."""
    state = engine_for(run.case).build(run.case)
    plans = timer_plans(state.stages, settings, round_no)
    if state.job is not None:
        return job_round(run, state, plans, round_no)
    # the residency gate: the filled cache is resident before anything reads or writes it
    filled = residency.check(state.cache, state.baseline_bytes, "after the fill")
    if round_no == 0:
        run.accuracy = accuracy_of(run, state.check())
    # peak memory covers the timed stages (warm-up and samples) with the cache in place; the
    # build (prefill writes) and the float32 parity check are left out (engines may report the
    # build's own peak in extra, e.g. fill_peak_bytes)
    mx.synchronize()
    mx.reset_peak_memory()
    run.reported, run.traffic = reported(run.case, state), state.traffic
    run.flops, run.bits_per_elem = state.flops, state.bits_per_elem
    run.resolved = state.resolved
    new_ms: dict[str, list[float]] = {}
    for stage, plan in plans.items():
        fn = state.stages[stage]
        warm_ms: list[float] = []
        timer.warm_up(fn, plan.pop("warmup_s"), times_ms=warm_ms)
        if say and round_no == 0 and stage == "step":
            note = overrun_note(run.case, settings, min(warm_ms[1:] or warm_ms))
            if note:
                say(note)
        new_ms[stage] = timer.sample(fn, prior_ms=run.samples.get(stage, []), **plan)
    mx.synchronize()
    peak = None
    if state.baseline_bytes is not None and new_ms:  # no timed stage (quality): no peak, not 0
        peak = mx.get_peak_memory() - state.baseline_bytes
    ended = residency.check(state.cache, state.baseline_bytes, "after the timed stages")
    with interrupt.deferred():  # a round counts whole or not at all
        _commit(run, round_no, new_ms, peak, residency.row_fields(filled, ended))


def _commit(run: CaseRun, round_no: int, new_ms: dict, peak: int | None, resident: dict) -> None:
    """Add one finished round's samples (peak memory, residency) to the case's run."""
    for stage, new in new_ms.items():
        add_samples(run, stage, round_no, new)
    if peak is not None:
        run.peak_mem_bytes = max(run.peak_mem_bytes or 0, peak)
    run.resident = residency.worst(run.resident, resident)
    run.rounds_done += 1


def job_round(run: CaseRun, state: State, plans: dict, round_no: int) -> None:
    """A round whose stages ran in other processes (a sharded case's ranks, with the same
    timer and plans): record what the job measured."""
    for stage, plan in plans.items():
        plan["prior_ms"] = run.samples.get(stage, [])
    result = state.job(plans, round_no == 0)
    if round_no == 0:
        run.accuracy = accuracy_of(run, result.accuracy)
    state.alloc_bytes = result.alloc_bytes
    state.extra.update(result.extra)
    run.reported, run.traffic = reported(run.case, state), state.traffic
    run.resolved = state.resolved
    for stage, new in result.samples.items():
        add_samples(run, stage, round_no, new)
    if result.peak_mem_bytes is not None:
        run.peak_mem_bytes = max(run.peak_mem_bytes or 0, result.peak_mem_bytes)
    run.rounds_done += 1


def reported(case: Case, state: State) -> dict:
    """The row fields an engine reports: its byte model's kv_bytes, measured allocation, the
    axes as they ran (only case axes may be overridden) and its own fields (never one the
    runner fills: a clash is a bug in the engine, not something to resolve by dict order)."""
    unknown = set(state.effective) - set(case_fields(case))
    clash = set(state.extra) & set(case_fields(case))
    if unknown or clash:
        raise ValueError(f"engine reports {sorted(unknown | clash)}: not its fields to set")
    return {
        "kv_bytes": state.kv_bytes,
        "alloc_bytes": state.alloc_bytes,
        **state.effective,
        **state.extra,
    }


def case_fields(case: Case) -> dict:
    return {**dataclasses.asdict(case), "gqa_ratio": case.gqa_ratio, "case_id": case.case_id}


def finish(
    run: CaseRun, settings: Settings, common: dict, status: str = "ok", error: str | None = None
) -> Record:
    """The row for a measured case (status ok, or partial when interrupted)."""
    case = run.case
    fmt = (run.resolved or resolved.of_case(case)).k_fmt
    step = stats.summarize(run.samples.get("step", []), settings.cv_warn)
    stage_ms = {
        f"{s}_ms": stats.summarize(x)["median_ms"]
        for s, x in run.samples.items()
        if s != "step" and x
    }
    peak = common.get("peak_gbps")
    rates = metrics.rates(case, fmt, step.get("median_ms"), peak, run.traffic, run.flops)
    measured = {
        **common,
        "status": status,
        "error": error,
        **step,
        **stage_ms,
        **rates,
        "bits_per_elem": run.bits_per_elem or fmt.bits_per_elem(case.head_dim),
        "data_bits": fmt.data_bits,
        "kernel_kind": kernel_kind(case.kernel),
        "peak_mem_bytes": run.peak_mem_bytes,
        **run.resident,
        **run.accuracy,
    }
    clash = set(measured) & set(run.reported)
    if clash:
        raise ValueError(f"engine reports {sorted(clash)}: fields the runner measures")
    # the engine's effective axes (e.g. the tile a null tile_kv meant) replace the case's
    return make_record(**(case_fields(case) | measured | run.reported))


def error_text(exc: BaseException) -> str:
    """One line naming the exception (at most 500 characters), for an error row."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text[:500]


def failed(case: Case, common: dict, status: str, error: str) -> Record:
    """A row for a case that was skipped or raised: its identity, never a time."""
    kind = kernel_kind(case.kernel)
    return make_record(**common, **case_fields(case), status=status, error=error, kernel_kind=kind)
