"""`kvbench merge RESULTS... -o DIR`: several hosts' results joined into one directory."""

from __future__ import annotations

import argparse

NAME = "merge"


def add_parser(sub) -> argparse.ArgumentParser:
    mrg = sub.add_parser(NAME, help="join several hosts' results into one results directory")
    mrg.add_argument("results", nargs="+", help="results directories or CSVs (one per host)")
    mrg.add_argument("-o", "--output", required=True, help="results directory to write")
    mrg.set_defaults(func=run)
    return mrg


def run(args) -> int:
    from kvbench.cli.common import named_dir
    from kvbench.store.merge import merge, render

    print(render(merge(args.results, named_dir(args.output, "-o"))))
    return 0
