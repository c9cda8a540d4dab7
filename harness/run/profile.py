"""`kvbench profile SUITE --case ID`: one case, its per-stage time breakdown.

The case runs exactly as in `kvbench run` (same engine, parity gate, warm-up, adaptive sampling
and rounds), with every stage timed: step (the headline: all layers' write + attend), write
(the cache writes alone, quantizing on write), attend (attention alone) and any other stage the
engine defines. Each stage is timed on its own, so the stages need not add up to the step (MLX
overlaps lazy work); the `rest` line shows the difference. On Apple silicon `--metal-capture`
writes a Metal GPU trace (.gputrace, for Xcode) of one step after the measurement.
"""

from __future__ import annotations

import dataclasses
import os

import mlx.core as mx

from kvbench import engines, stats
from kvbench.case import Case
from kvbench.engines import model as model_engine
from kvbench.errors import UserError
from kvbench.run import model_profile, runner
from kvbench.run.context import backend_name
from kvbench.suite.suite import expand, load_suite


def find_case(cases: list[Case], case_id: str, path: str) -> Case:
    """The case whose id is `case_id` (or starts with it, if that is unique)."""
    hits = [c for c in cases if c.case_id == case_id] or [
        c for c in cases if c.case_id.startswith(case_id)
    ]
    if len(hits) != 1:
        what = "no case has" if not hits else f"{len(hits)} cases match"
        raise UserError(f"{path}: --case: {what} id {case_id!r} (list them with run --dry-run)")
    return hits[0]


def capture_problem(path: str, backend: str) -> str | None:
    """Why a Metal capture to `path` cannot be written here, or None."""
    if backend != "metal":
        return f"needs Apple silicon with MLX's Metal backend; this backend is {backend}"
    if os.environ.get("MTL_CAPTURE_ENABLED") != "1":
        return "set MTL_CAPTURE_ENABLED=1 in the environment before starting kvbench"
    if not path.endswith(".gputrace"):
        return f"the capture path must end in .gputrace, got {path}"
    if os.path.exists(path):
        return f"{path} already exists (Metal will not overwrite a capture)"
    return None


def breakdown(samples: dict[str, list[float]]) -> list[dict]:
    """Per stage: n, median, 95% CI of the median, and % of the step's median."""
    step = stats.summarize(samples["step"])["median_ms"]
    rows = []
    for stage, xs in samples.items():
        s = stats.summarize(xs)
        rows.append(
            {
                "stage": stage,
                "n": s["n_samples"],
                "median_ms": s["median_ms"],
                "ci_low_ms": s["ci_low_ms"],
                "ci_high_ms": s["ci_high_ms"],
                "pct_of_step": 100 * s["median_ms"] / step,
            }
        )
    parts = sum(r["median_ms"] for r in rows if r["stage"] != "step")
    if len(rows) > 1:
        rest = step - parts
        rows.append({"stage": "rest", "median_ms": rest, "pct_of_step": 100 * rest / step})
    return rows


def format_breakdown(case: Case, backend: str, rows: list[dict]) -> str:
    lines = [f"{case.case_id}  {case.label()}  (backend {backend})"]
    lines.append(f"{'stage':<10} {'n':>4} {'median ms':>11} {'95% CI ms':>21} {'% of step':>10}")
    for r in rows:
        ci = f"{r['ci_low_ms']:.4g} - {r['ci_high_ms']:.4g}" if "ci_low_ms" in r else ""
        n = r.get("n", "")
        lines.append(
            f"{r['stage']:<10} {n:>4} {r['median_ms']:>11.4g} {ci:>21} {r['pct_of_step']:>9.1f}%"
        )
    lines.append("stages are timed on their own; rest = step - sum of the other stages")
    return "\n".join(lines)


def write_capture(case: Case, path: str) -> None:
    """One step of `case` recorded into a Metal GPU trace at `path` (after a warm-up step)."""
    state = engines.engine_for(case).build(case)
    step = state.stages["step"]
    mx.eval(step())
    mx.synchronize()
    mx.metal.start_capture(path)
    try:
        mx.eval(step())
        mx.synchronize()
    finally:
        mx.metal.stop_capture()


def profile(
    suite_path: str, case_id: str, metal_capture: str | None = None, ubatch: int | None = None
) -> str:
    """Run one case of a suite with every stage timed; the breakdown as text. A model_decode
    case is profiled part by part (run/model_profile.py); `ubatch`: a prefill micro-batch of
    that many tokens instead of its decode step."""
    suite = load_suite(suite_path)
    case = find_case(expand(suite), case_id, suite_path)
    backend = backend_name()
    reason = engines.skip_reason(case, backend)
    if reason:
        raise UserError(f"{suite_path}: --case {case.case_id}: cannot run here: {reason}")
    if metal_capture is not None:
        problem = capture_problem(metal_capture, backend)
        if problem:
            raise UserError(f"--metal-capture: {problem}")
    if ubatch not in (None, 1) and case.policy != "none":  # its budget was checked for one
        raise UserError(f"{suite_path}: --ubatch {ubatch}: a case under policy {case.policy} "
                        "compresses the context before a decode step; no micro-batch")  # fmt: skip
    if ubatch is not None and not 1 <= ubatch < case.context_len:
        raise UserError(f"{suite_path}: --ubatch {ubatch}: must be from 1 to context_len - 1 "
                        f"({case.context_len - 1}) of case {case.case_id}")  # fmt: skip
    if engines.engine_for(case).claims is model_engine.claims and case.phase == "model_decode":
        text = model_profile.profile_model(case, suite.settings, backend, ubatch or 1)
        if metal_capture is not None:
            write_capture(case, metal_capture)
            text += f"\nMetal GPU capture of one step: {metal_capture} (open in Xcode)"
        return text
    if ubatch is not None:
        raise UserError(
            f"{suite_path}: --ubatch: only a model_decode case has a prefill micro-batch to "
            f"profile; case {case.case_id} is phase {case.phase}"
        )
    settings = dataclasses.replace(suite.settings, stages=True)
    run = runner.CaseRun(case)
    for round_no in range(settings.rounds):
        try:
            runner.measure_round(run, settings, round_no)
        except Exception as exc:  # `run` records it as an error row; here it is the answer
            text = runner.error_text(exc)
            raise UserError(f"{suite_path}: --case {case.case_id}: {text}") from exc
    text = format_breakdown(case, backend, breakdown(run.samples))
    if metal_capture is not None:
        write_capture(case, metal_capture)
        text += f"\nMetal GPU capture of one step: {metal_capture} (open in Xcode)"
    return text
