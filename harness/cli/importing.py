"""`kvbench import FILE`: pytest-benchmark JSON -> kvbench results CSV."""

from __future__ import annotations

import argparse

NAME = "import"


def add_parser(sub) -> argparse.ArgumentParser:
    imp = sub.add_parser(NAME, help="pytest-benchmark JSON -> kvbench results CSV")
    imp.add_argument("file", help="pytest-benchmark JSON (--benchmark-json)")
    imp.add_argument("--out", default="results", help="output directory (default: results)")
    imp.set_defaults(func=run)
    return imp


def run(args) -> int:
    from kvbench.cli.common import named_dir
    from kvbench.store.importer import import_file

    csv_path, n = import_file(args.file, named_dir(args.out, "--out"))
    print(f"imported {n} benchmarks: {csv_path}")
    return 0
