"""`kvbench calibrate SUITE`: A/A runs here, the between-run noise compare allows for."""

from __future__ import annotations

import argparse

NAME = "calibrate"


def add_parser(sub) -> argparse.ArgumentParser:
    cal = sub.add_parser(
        NAME, help="A/A runs of SUITE here: the between-run noise compare allows for"
    )
    cal.add_argument("suite", help="suite YAML file")
    cal.add_argument("--runs", type=int, default=3, help="separate runs (default 3)")
    cal.add_argument("--results", default="results", help="results directory (default results)")
    cal.add_argument("--device", choices=("cpu", "gpu"), help="MLX device for the runs")
    cal.set_defaults(func=run)
    return cal


def run(args) -> int:
    from kvbench.analysis.calibrate import FILE, calibrate

    got = calibrate(args.suite, args.results, args.runs, args.device)
    print(
        f"calibrated {len(got['noise'])} cases over {args.runs} runs: median between-run noise "
        f"±{got['median']:.1%}; stored in {args.results}/{FILE}"
    )
    return 0
