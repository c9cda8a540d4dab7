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


def check_site(out: str, inputs) -> None:
    """A site's -o, checked before any work like every other output: an existing file is not
    overwritten (an input or a results file named so, any other file as not a directory), and
    a new name with a suffix is refused rather than made a directory (issue 35: `-o new.csv`
    became a directory named new.csv)."""
    from pathlib import Path

    from kvbench.errors import UserError
    from kvbench.files import check_output_dir, not_regular

    path = Path(out)
    if path.exists() and not path.is_dir():
        if path.is_file():
            check_output(out, inputs)  # an input or a results file: said so
        why = not_regular(path) or "a file"
        raise UserError(f"{path}: -o: {why}, not a directory; a report is FILE.html (a page) "
                        "or a directory (a site)")  # fmt: skip
    if not path.exists() and path.suffix:
        raise UserError(f"{path}: -o: neither FILE.html (a page) nor a directory name (a site: "
                        f"a name without the suffix {path.suffix})")  # fmt: skip
    check_output_dir(path, 0, key="-o")


def run(args) -> int:
    from kvbench.report.page import write_report

    if not args.output.endswith(".html"):  # a directory: the results site
        from kvbench.report.site import write_site

        check_site(args.output, (*args.results, args.compare))

        index, n = write_site(args.results, args.output)
        print(f"report site: {index} ({n} pages)")
        return 0
    check_output(args.output, (*args.results, args.compare))
    path, n = write_report(
        args.results, args.output, latest=args.latest, compare=args.compare, title=args.title
    )
    print(f"report: {path} ({n} figure{'' if n == 1 else 's'})")
    return 0
