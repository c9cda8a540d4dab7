"""A run of a suite: cases interleaved in rounds, rows written as cases complete.

Round r visits every case still in play (build, warm up, sample, release), so slow drift of
the machine (thermal state, other load) spreads over all cases instead of landing on the last
ones. A case that raises becomes an error row at once and the suite goes on; a case the backend
cannot run becomes a skipped row with the reason. Ctrl-C stops the run: every completed row is
already on disk, and cases with samples from finished rounds are written as status=partial.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx

from kvbench import engines
from kvbench.case import Case
from kvbench.run import runner
from kvbench.run.bandwidth import peak_read_bandwidth
from kvbench.run.context import run_context, run_id
from kvbench.run.progress import Progress
from kvbench.spec.suite import Suite
from kvbench.store.record import ResultsWriter


def unique_run_id(out_dir: str | Path, base: str) -> str:
    """base, or base-2, base-3... if a run with that id already exists in out_dir."""
    rid, n = base, 1
    while (Path(out_dir) / f"{rid}.csv").exists():
        n += 1
        rid = f"{base}-{n}"
    return rid


def common_fields(suite: Suite, out_dir: str | Path) -> dict:
    ctx = run_context()
    return {
        **ctx,
        **peak_read_bandwidth(ctx["backend"]),
        "suite": suite.name,
        "run_id": unique_run_id(out_dir, run_id(ctx["commit"])),
    }


def run_suite(
    suite: Suite, cases: list[Case], out_dir: str | Path, progress: Progress | None = None
) -> ResultsWriter:
    common = common_fields(suite, out_dir)
    writer = ResultsWriter(out_dir, common["run_id"])
    settings = suite.settings
    runs: dict[str, runner.CaseRun] = {}
    for case in cases:
        reason = engines.skip_reason(case, common["backend"])
        if reason:
            writer.add(runner.failed(case, common, "skipped", reason))
        else:
            runs[case.case_id] = runner.CaseRun(case)
    progress = progress or Progress(len(runs) * settings.rounds, stream=sys.stderr)
    try:
        for round_no in range(settings.rounds):
            for cid in list(runs):
                run = runs[cid]
                progress.start(f"round {round_no + 1}/{settings.rounds} {run.case.label()}")
                try:
                    runner.measure_round(run, settings, round_no)
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # one bad case must not end the suite
                    del runs[cid]
                    writer.add(runner.failed(run.case, common, "error", runner.error_text(exc)))
                    mx.clear_cache()
                progress.done()
                if round_no == settings.rounds - 1 and cid in runs:
                    writer.add(runner.finish(runs.pop(cid), settings, common), run.sample_rows)
    except KeyboardInterrupt:
        for run in runs.values():
            if run.rounds_done:
                note = f"interrupted after {run.rounds_done} of {settings.rounds} rounds"
                writer.add(runner.finish(run, settings, common, "partial", note), run.sample_rows)
        progress.close()
        raise
    progress.close()
    return writer
