"""`kvbench compare BASE NEW`: two result sets (CSV, directory or git ref); exit 1 on regression."""

from __future__ import annotations

import argparse

from kvbench.cli.common import check_output, compare_options, report, rules_of

NAME = "compare"


def add_parser(sub) -> argparse.ArgumentParser:
    cmp = sub.add_parser(
        NAME, help="compare two result sets (CSV, directory or git ref); exit 1 on regression"
    )
    cmp.add_argument("base", help="results CSV, results directory, or git ref")
    cmp.add_argument("new", help="results CSV, results directory, or git ref")
    cmp.add_argument(
        "--pool",
        action="store_true",
        help="pool the raw samples of every run of a case on a side (default: latest run)",
    )
    compare_options(cmp)
    cmp.set_defaults(func=run)
    return cmp


def run(args) -> int:
    from kvbench.analysis.calibrate import load_noise
    from kvbench.analysis.compare import compare
    from kvbench.store.results import load

    rules = rules_of(args)
    check_output(args.output, (args.base, args.new))
    base = load(args.base, args.results, pool=args.pool)
    new = load(args.new, args.results, pool=args.pool)
    noise = load_noise(args.results)  # this host's A/A between-run noise, if calibrated
    return report(compare(base, new, args.metric, rules, noise), args)
