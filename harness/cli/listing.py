"""`kvbench list`: presets, dtypes, kernels and what this backend runs."""

from __future__ import annotations

import argparse

NAME = "list"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="presets, dtypes, kernels and what this backend runs")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from kvbench.run.inventory import inventory

    print(inventory())
    return 0
