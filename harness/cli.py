"""kvbench's command line: parses arguments and calls library functions.

Bad input (UserError) prints one line `kvbench: <file>: <key>: <reason>` and exits 2.
"""

from __future__ import annotations

import argparse
import sys

from harness.errors import UserError


def cmd_run(args) -> int:
    from harness.context import set_device
    from harness.session import run_suite
    from harness.suite import apply_filters, expand, load_suite

    suite = load_suite(args.suite)
    cases = apply_filters(expand(suite), args.filter or [])
    if args.dry_run:
        for case in cases:
            print(f"{case.case_id}  {case.label()}")
        print(
            f"{len(cases)} cases, {suite.settings.rounds} rounds, budget "
            f"{suite.settings.budget_s:g} s per case"
        )
        return 0
    if not cases:
        raise UserError(f"{args.suite}: --filter: no case matches")
    set_device(args.device)
    import pandas as pd

    from harness.summary import table

    try:
        writer = run_suite(suite, cases, args.out)
    except KeyboardInterrupt:
        print("interrupted: completed rows are kept", file=sys.stderr)
        return 130
    print(table(pd.read_csv(writer.csv_path)))
    print(f"\nresults: {writer.csv_path}\nsamples: {writer.samples_path}")
    return 0


def cmd_list(args) -> int:
    from harness.inventory import inventory

    print(inventory())
    return 0


def cmd_env(args) -> int:
    from harness.context import set_device
    from harness.inventory import environment

    set_device(args.device)
    print(environment())
    return 0


def cmd_report(args) -> int:
    from harness.report import write_report

    path, n = write_report(
        args.results, args.output, latest=args.latest, compare=args.compare, title=args.title
    )
    print(f"report: {path} ({n} figure{'' if n == 1 else 's'})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvbench", description="Benchmark LLM KV-cache configurations on MLX."
    )
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a suite and write results/<run-id>.csv")
    run.add_argument("suite", help="suite YAML file")
    run.add_argument("--out", default="results", help="output directory (default: results)")
    run.add_argument(
        "--filter",
        action="append",
        metavar="KEY=VALUE",
        help="keep only cases whose KEY equals VALUE (repeatable)",
    )
    run.add_argument("--dry-run", action="store_true", help="list the expanded cases and stop")
    run.add_argument("--device", choices=("cpu", "gpu"), help="MLX device (default: MLX's)")
    run.set_defaults(func=cmd_run)

    lst = sub.add_parser("list", help="presets, dtypes, kernels and what this backend runs")
    lst.set_defaults(func=cmd_list)

    env = sub.add_parser("env", help="device, backend, versions, measured peak bandwidth")
    env.add_argument("--device", choices=("cpu", "gpu"))
    env.set_defaults(func=cmd_env)

    rep = sub.add_parser("report", help="one self-contained HTML page of plots from result CSVs")
    rep.add_argument("results", nargs="+", help="result CSV files or directories of them")
    rep.add_argument("-o", "--output", default="report.html", help="HTML file to write")
    rep.add_argument(
        "--latest",
        action="store_true",
        help="figures from the newest run only (history still uses every run given)",
    )
    rep.add_argument("--compare", metavar="FILE", help="a compare CSV to plot (kvbench compare)")
    rep.add_argument("--title", help="page title (default: the suites' names)")
    rep.set_defaults(func=cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        print(f"kvbench: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
