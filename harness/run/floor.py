"""The least time a run can take, checked before it starts (issue 27: suites whose settings or
shapes could not finish were started, and the dry run claimed `budget 0.5 s per case` for a
Llama-3-8B case at 8K context that took 3 minutes on a CPU).

Two floors, both lower bounds. The settings floor (suite/suite.py time_floor_s): every case warms
up every round and samples for its budget; it is checked when the suite loads. The step floor:
a decode step reads at least the whole cache (the planner's bytes, harness/suite/plan.py), so it
takes at least cache bytes / the peak read bandwidth measured at the start of the run, and a
case takes at least (min_samples + 2 warm-up calls per round) such steps. A case whose step
floor exceeds its budget gets one warning line before anything is measured (it will overrun);
a run whose step floors add up to more than settings.max_hours is refused with the figures.
"""

from __future__ import annotations

from kvbench.case import Case
from kvbench.errors import UserError
from kvbench.run.memory import case_plan
from kvbench.suite.suite import Settings

WARMUP_CALLS = 2  # the timer's warm-up calls a step at least twice per round (harness/timer.py)


def step_floor_s(case: Case, peak_gbps: float | None) -> float:
    """The least time one step of the case can take at the measured peak read bandwidth."""
    if not peak_gbps:
        return 0.0
    return case_plan(case)["cache"] / (peak_gbps * 1e9)


def case_floor_s(case: Case, settings: Settings, peak_gbps: float | None) -> float:
    steps = settings.min_samples + WARMUP_CALLS * settings.rounds
    return steps * step_floor_s(case, peak_gbps)


def check_floors(cases: list[Case], settings: Settings, peak_gbps, path: str) -> list[str]:
    """Warning lines for the cases that will overrun their budget; UserError when the run's
    floor is over settings.max_hours."""
    floors = {c.case_id: case_floor_s(c, settings, peak_gbps) for c in cases}
    total_s = sum(max(f, settings.budget_s) + settings.rounds * settings.warmup_s
                  for f in floors.values())  # fmt: skip
    if total_s > settings.max_hours * 3600:
        raise UserError(
            f"{path}: settings.max_hours: the run needs at least {total_s / 3600:,.1f} h (each "
            f"step reads its whole cache at <= {peak_gbps:.1f} GB/s measured); over "
            f"{settings.max_hours:g} h: shrink the suite or raise settings.max_hours"
        )
    return [
        f"{c.label()}: each step reads {case_plan(c)['cache'] / 1e9:.3g} GB: at the measured "
        f"{peak_gbps:.1f} GB/s, {settings.min_samples} samples and the warm-ups take at least "
        f"{floors[c.case_id]:.3g} s, over its budget of {settings.budget_s:g} s"
        for c in cases
        if floors[c.case_id] > settings.budget_s
    ]
