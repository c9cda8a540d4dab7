"""`kvbench run SUITE`: run a suite and write results/<run-id>.csv (--dry-run lists the cases)."""

from __future__ import annotations

import argparse

from kvbench.cli.common import check_blas, named_dir, say
from kvbench.errors import UserError
from kvbench.suite.cli_axes import add_axis_options

NAME = "run"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        help="run a suite and write results/<run-id>.csv",
        epilog="e.g. kvbench run --model smollm2-135m --phase quality --kv-dtype fp16,q8_0,q4_0 "
        "--rotate none,hadamard --context 2k",
    )
    p.add_argument("suite", nargs="?", help="suite YAML file (optional with axis options)")
    p.add_argument("--out", default="results", help="output directory (default: results)")
    p.add_argument(
        "--filter",
        action="append",
        metavar="KEY=VALUE",
        help="keep only cases whose KEY equals VALUE (repeatable)",
    )
    p.add_argument("--dry-run", action="store_true", help="list the expanded cases and stop")
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="run part I of N (cost-balanced; every case in exactly one part: docs/distributed.md)",
    )
    p.add_argument("--device", choices=("cpu", "gpu"), help="MLX device (default: MLX's)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=1.0,
        metavar="PCT",
        help="the answer's pick: the smallest cache whose Δppl is within PCT%% of the baseline's "
        "perplexity at 95%% (default 1)",
    )
    add_axis_options(p)
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from kvbench.run.interrupt import Interrupted, deferred, handling

    # signals are ours before the slow imports: an early Ctrl-C is a clean exit, never lost.
    # It waits for the imports to end: raised inside MLX's native start-up (nanobind building
    # its enums runs Python code) it aborted the process (exit -6, "Critical nanobind error")
    with handling():
        try:
            with deferred():
                _load_native()
            return _run(args)
        except Interrupted as e:
            say(f"interrupted ({e}): {getattr(e, 'kept', 'completed rows are kept')}")
            return e.exit_code


def _load_native() -> None:
    """The run's native libraries (MLX through kvbench.run.context, numpy, pandas), loaded at
    once so that no signal lands inside their start-up."""
    import pandas  # noqa: F401

    import kvbench.run.context  # noqa: F401


def model_passes(cases) -> int:
    """Forward passes of the model the task and quality cases run at least (suite/model_plan.py)."""
    from kvbench.suite.model_plan import forward_passes

    phases = ("quality", "retrieval", "generate")
    return sum(forward_passes(c) for c in cases if c.phase in phases)


def _run(args) -> int:
    from kvbench.run.context import set_device
    from kvbench.run.session import run_suite
    from kvbench.suite.cli_axes import suite_of
    from kvbench.suite.suite import apply_filters, expand

    named_dir(args.out, "--out")
    if not 0 < args.tolerance < 100:  # NaN fails both
        raise UserError(f"--tolerance: a percentage above 0 and under 100, got {args.tolerance}")
    suite = suite_of(args)
    cases = apply_filters(expand(suite), args.filter or [])
    if args.shard:
        from kvbench.suite.shard import parse_shard, shard_cases

        cases = shard_cases(cases, *parse_shard(args.shard))
    if args.dry_run:
        for case in cases:
            print(f"{case.case_id}  {case.label()}")
        from kvbench.suite.suite import time_floor_s

        st = suite.settings
        print(
            f"{len(cases)} cases, {st.rounds} rounds, budget {st.budget_s:g} s per case; at "
            f"least {time_floor_s(st, len(cases)):,.1f} s in all (cases x (rounds x warmup_s + "
            "budget_s); a case whose steps are slow overruns its budget: `kvbench run` measures "
            "the read bandwidth and warns, before measuring, of each case that will)"
        )
        from kvbench.run.estimate import estimate

        total_s, notes = estimate(cases, st, args.out)
        if total_s is not None and notes:  # notes: model phases (timed ones: the floor above)
            print(f"estimated {total_s / 60:,.1f} min in all (timed cases at their floor; model "
                  "phases at the last run's speed):")  # fmt: skip
        for note in notes:
            print(f"  {note}")
        passes = model_passes(cases)
        if passes:
            print(
                f"the model phases run at least {passes:,} forward passes of the model "
                "(prefill pieces and decode steps; the float32 references come on top)"
            )
        return 0
    if not cases:
        raise UserError(f"{suite.path}: --filter: no case matches")
    set_device(args.device)
    check_blas(say_notice=True)
    writer = run_suite(suite, cases, args.out)
    import pandas as pd

    from kvbench.analysis.summary import run_summary  # after the run: its rows, then the answer

    print(run_summary(pd.read_csv(writer.csv_path), args.tolerance))
    print(f"\nresults: {writer.csv_path}\nsamples: {writer.samples_path}")
    return 0
