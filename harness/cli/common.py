"""What several commands share: one-line messages, the BLAS check, output files, the statistics
options of compare / history / gate and the printing of a comparison."""

from __future__ import annotations

import argparse
import sys

from kvbench.errors import UserError


def say(line: str) -> None:
    """One line on stderr; a closed terminal (SIGHUP) must not turn it into a traceback."""
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):
        pass


def check_blas(say_notice: bool = False) -> None:
    """A KVBENCH_BLAS that names no usable library is bad input (kvbench.blas); with
    say_notice, the one line that no fast BLAS was found (run, env)."""
    from kvbench import blas

    if blas.problem():
        raise UserError(blas.problem())
    if say_notice and blas.notice():
        say(blas.notice())


def emit(text: str, out: str | None) -> None:
    """Print, and write to `out` (atomically) when given."""
    print(text)
    if out:
        from kvbench.files import write_atomic

        write_atomic(out, text if text.endswith("\n") else text + "\n")


def named_dir(value: str, key: str) -> str:
    """An output directory option as given; an empty or blank one is refused (a path of ''
    wrote into the current directory: issue 44)."""
    if not value.strip():
        raise UserError(f"{key}: empty: name a directory (default: results)")
    return value


def check_output(out: str | None, inputs=()) -> None:
    """An -o file is checked before any work (not a directory, folder writable, not one of the
    inputs, not an existing results or samples file); an empty one is refused."""
    if out is not None and not out.strip():
        raise UserError("-o: empty: name a file, or leave -o out")
    if out:
        from kvbench.store.results import check_output as check

        check(out, inputs)


def report(cmp, args) -> int:
    """Print (and write) a comparison; exit status 1 when it holds a regression."""
    from kvbench.analysis.compare_text import FORMATS

    for w in cmp.warnings:
        print(f"kvbench: warning: {w}", file=sys.stderr)
    emit(FORMATS[args.format](cmp), args.output)
    return 1 if len(cmp.regressions) else 0


def rules_of(args):
    """The statistics options as Rules, checked against the metric."""
    from kvbench.analysis.rules import Rules, check_rules

    rules = Rules(args.threshold, args.alpha, args.min_samples)
    check_rules(args.metric, rules)
    return rules


def stats_options(p: argparse.ArgumentParser) -> None:
    from kvbench.analysis.rules import Rules

    d = Rules()
    p.add_argument("--metric", default="median_ms", help="column to compare (default median_ms)")
    p.add_argument(
        "--threshold",
        type=float,
        default=d.threshold,
        help=f"ratio a change must exceed to count (default {d.threshold})",
    )
    p.add_argument(
        "--alpha", type=float, default=d.alpha, help=f"rank-test significance (default {d.alpha})"
    )
    p.add_argument(
        "--min-samples",
        type=int,
        default=d.min_samples,
        help=f"fewer raw samples on a side: inconclusive (default {d.min_samples})",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="also write the output to FILE")


def compare_options(p: argparse.ArgumentParser) -> None:
    stats_options(p)
    p.add_argument("--format", choices=("terminal", "markdown", "csv", "json"), default="terminal")
    p.add_argument(
        "--results",
        default="results",
        help="where a git ref's results are found (default: results)",
    )
