"""`kvbench history DIR`: every case's median across commits, step changes."""

from __future__ import annotations

import argparse

from kvbench.cli.common import check_output, emit, rules_of, stats_options

NAME = "history"


def add_parser(sub) -> argparse.ArgumentParser:
    hist = sub.add_parser(NAME, help="every case's median across commits, step changes")
    hist.add_argument("dir", help="results directory")
    stats_options(hist)
    hist.add_argument("--format", choices=("terminal", "csv", "json"), default="terminal")
    hist.set_defaults(func=run)
    return hist


def run(args) -> int:
    from kvbench.analysis.history import history
    from kvbench.analysis.history_text import FORMATS

    rules = rules_of(args)
    check_output(args.output, (args.dir,))
    hist = history(args.dir, args.metric, rules)
    emit(FORMATS[args.format](hist), args.output)
    return 0
