"""A run of a suite: cases interleaved in rounds, rows written as cases complete.

Round r visits every case still in play (build, warm up, sample, release), so slow drift of
the machine (thermal state, other load) spreads over all cases instead of landing on the last
ones. A case that raises becomes an error row at once and the suite goes on; a case the backend
cannot run, or whose planned memory exceeds what the device has (harness/run/memory.py), becomes
a skipped row with the reason. The output directory is checked and the run's files claimed
before anything is measured. SIGINT, SIGTERM or SIGHUP stop the run (harness/run/interrupt.py):
every completed row is already on disk, and cases with samples from finished rounds are written
as status=partial (docs/reliability.md).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import mlx.core as mx

from kvbench import engines
from kvbench.case import Case
from kvbench.files import check_output_dir
from kvbench.run import floor, inputs, interrupt, memory, runner
from kvbench.run.bandwidth import peak_read_bandwidth
from kvbench.run.context import run_context, run_id
from kvbench.run.progress import Progress
from kvbench.store.writer import ResultsWriter
from kvbench.suite.suite import Settings, Suite

ROW_BYTES = 4096  # a results row is ~2 KB of text: twice that, for the up-front space check
SAMPLE_BYTES = 64  # one raw sample's line (case id, stage, round, index, ms) is ~40 bytes


def output_bytes(cases: list[Case], settings: Settings) -> int:
    """The most the run's two files can take: a row per case and every sample it may keep
    (max_samples per timed stage; step, write, attend and mask at most)."""
    stages = 4 if settings.stages else 1
    return len(cases) * (ROW_BYTES + stages * settings.max_samples * SAMPLE_BYTES)


def prepare_output(
    out_dir: str | Path, cases: list[Case], settings: Settings, commit
) -> ResultsWriter:
    """Check the output directory (a directory, writable, room for the files) and claim a run
    id in it, before anything is measured."""
    check_output_dir(out_dir, output_bytes(cases, settings))
    return ResultsWriter.claim(out_dir, run_id(commit))


def common_fields(suite: Suite, writer: ResultsWriter, ctx: dict) -> dict:
    return {
        **ctx,
        **peak_read_bandwidth(ctx["backend"]),
        "suite": suite.name,
        "run_id": writer.run_id,
    }


def run_suite(
    suite: Suite, cases: list[Case], out_dir: str | Path, progress: Progress | None = None
) -> ResultsWriter:
    inputs.prepare_models(cases)  # once, before anything is measured
    ctx = run_context()
    writer = prepare_output(out_dir, cases, suite.settings, ctx["commit"])
    interrupt.on_hard_exit(lambda: _kept_at_hard_exit(writer, suite.settings.rounds))
    try:
        _run_cases(suite, cases, writer, ctx, progress)
    except BaseException as exc:
        writer.discard_if_empty()  # stopped before any row: leave no empty run behind
        if isinstance(exc, KeyboardInterrupt):
            exc.kept = kept_text(writer, suite.settings.rounds)  # the CLI's last line
        raise
    return writer


def _kept_at_hard_exit(writer: ResultsWriter, rounds: int) -> str:
    writer.discard_if_empty()
    return kept_text(writer, rounds)


def kept_text(writer: ResultsWriter, rounds: int) -> str:
    """What an interrupted run left on disk, for its last line."""
    if not writer.records:
        return "no round had finished: nothing was written"
    counts: dict[str, int] = {}
    left_out = [r for r in writer.records if (r.error or "").startswith("not measured: the run")]
    for r in writer.records:
        if not (r.error or "").startswith("not measured: the run"):
            counts[r.status] = counts.get(r.status, 0) + 1
    notes = [re.search(r"after (\d+) of", r.error or "") for r in writer.records]
    done = sorted({int(m.group(1)) for m in notes if m})
    what = ", ".join(f"{n} {status}" for status, n in counts.items()) + " rows"
    if done:
        k = str(done[0]) if len(done) == 1 else f"{done[0]}-{done[-1]}"
        what += f" (partial: {k} of {rounds} rounds)"
    if left_out:
        what += f"; {len(left_out)} cases not measured (skipped rows say so)"
    return f"kept {what} in {writer.csv_path}"


def _run_cases(suite: Suite, cases: list[Case], writer: ResultsWriter, ctx: dict, progress):
    common = common_fields(suite, writer, ctx)
    settings = suite.settings
    runs: dict[str, runner.CaseRun] = {}
    skipped = []
    for case in cases:
        reason = engines.skip_reason(case, common["backend"]) or memory.refusal(case)
        if reason:
            skipped.append((runner.failed(case, common, "skipped", reason), []))
        else:
            runs[case.case_id] = runner.CaseRun(case)
    with interrupt.deferred():
        writer.add_many(skipped)
    planned = [r.case for r in runs.values()]
    for line in floor.check_floors(planned, settings, common.get("peak_gbps"), suite.path):
        print(f"kvbench: warning: {line}", file=sys.stderr)  # before anything is measured
    progress = progress or _progress(runs, settings, writer)
    try:
        _rounds(runs, settings, common, writer, progress)
    except KeyboardInterrupt as exc:
        progress.close()
        _keep_partial(runs, settings, common, writer, str(exc) or "SIGINT")
        raise
    progress.close()


def _progress(runs: dict, settings: Settings, writer) -> Progress:
    """The progress line, its ETA weighted by each case's estimate (run/estimate.py; the last
    run's speed of a model in this output directory) and shown from the first case on."""
    from kvbench.run.estimate import case_seconds, estimate, pass_seconds, relative_costs

    cases = [r.case for r in runs.values()]
    out = writer.csv_path.parent
    per_pass = {c.model: pass_seconds(out, c.model) for c in cases}
    each = [case_seconds(c, settings, per_pass) for c in cases]
    if None in each:  # a model's speed unknown: its cases weighed in forward passes
        each = relative_costs(cases)
    steps = (
        [] if each is None else [s / settings.rounds for _ in range(settings.rounds) for s in each]
    )
    total_s, _ = estimate(cases, settings, out)
    return Progress(len(runs) * settings.rounds, stream=sys.stderr, weights=steps or None,
                    estimate_s=total_s)  # fmt: skip


def _rounds(runs: dict, settings: Settings, common: dict, writer, progress) -> None:
    """Every case still in play, round by round; a finished case's row is written at once."""
    for round_no in range(settings.rounds):
        for cid in list(runs):
            interrupt.check()
            run = runs[cid]
            progress.start(f"round {round_no + 1}/{settings.rounds} {run.case.label()}")
            try:
                runner.measure_round(run, settings, round_no, say=getattr(progress, "note", None))
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # one bad case must not end the suite
                del runs[cid]
                with interrupt.deferred():
                    writer.add(runner.failed(run.case, common, "error", runner.error_text(exc)))
                mx.clear_cache()
            progress.done()
            if round_no == settings.rounds - 1 and cid in runs:
                with interrupt.deferred():
                    writer.add(
                        runner.finish(runs[cid], settings, common), run.sample_rows, run.token_rows
                    )
                    del runs[cid]


NOT_MEASURED = "not measured: the run was interrupted ({}) before this case finished a round"


def _keep_partial(runs: dict, settings: Settings, common: dict, writer, signal: str) -> None:
    """Cases with finished rounds become partial rows, written together (samples first), and the
    cases not measured at all skipped rows that say so (unless nothing was measured: then no run
    is left behind); a second signal waits for them, a third cuts this short and leaves the files
    whole (harness/run/interrupt.py)."""
    items, left_out = [], []
    for run in runs.values():
        if run.rounds_done:
            note = f"interrupted after {run.rounds_done} of {settings.rounds} rounds"
            row = runner.finish(run, settings, common, "partial", note)
            items.append((row, run.sample_rows, run.token_rows))
        else:
            left_out.append(
                (runner.failed(run.case, common, "skipped", NOT_MEASURED.format(signal)), [])
            )
    if items or any(r.status == "ok" for r in writer.records):
        items += left_out  # the file says which cases the interruption left out
    with interrupt.deferred():
        writer.add_many(items)
