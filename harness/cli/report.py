"""`kvbench report RESULTS...`: one self-contained HTML page of plots, or a results site."""

from __future__ import annotations

import argparse

from kvbench.cli.common import check_output

NAME = "report"


def add_parser(sub) -> argparse.ArgumentParser:
    rep = sub.add_parser(NAME, help="one self-contained HTML page of plots from result CSVs")
    rep.add_argument("results", nargs="+", help="result CSV files or directories of them")
    rep.add_argument(
        "-o",
        "--output",
        default="report.html",
        help="HTML file to write, or a directory: a site (index, a page per suite, history)",
    )
    rep.add_argument(
        "--latest",
        action="store_true",
        help="figures from the newest run only (history still uses every run given)",
    )
    rep.add_argument("--compare", metavar="FILE", help="a compare CSV to plot (kvbench compare)")
    rep.add_argument("--title", help="page title (default: the suites' names)")
    rep.set_defaults(func=run)
    return rep


def run(args) -> int:
    from kvbench.report.page import write_report

    if not args.output.endswith(".html"):  # a directory: the results site
        from kvbench.report.site import write_site

        index, n = write_site(args.results, args.output)
        print(f"report site: {index} ({n} pages)")
        return 0
    check_output(args.output, (*args.results, args.compare))
    path, n = write_report(
        args.results, args.output, latest=args.latest, compare=args.compare, title=args.title
    )
    print(f"report: {path} ({n} figure{'' if n == 1 else 's'})")
    return 0
