"""`kvbench profile SUITE --case ID`: per-stage time breakdown of one case of a suite."""

from __future__ import annotations

import argparse

NAME = "profile"


def add_parser(sub) -> argparse.ArgumentParser:
    prof = sub.add_parser(NAME, help="per-stage time breakdown of one case of a suite")
    prof.add_argument("suite", help="suite YAML file")
    prof.add_argument("--case", required=True, help="case id (or a unique prefix; see --dry-run)")
    prof.add_argument(
        "--metal-capture",
        metavar="PATH.gputrace",
        help="also write a Metal GPU capture of one step (Apple silicon; MTL_CAPTURE_ENABLED=1)",
    )
    prof.add_argument(
        "--ubatch",
        type=int,
        metavar="N",
        help="a model_decode case: profile a prefill micro-batch of N tokens, not a decode step",
    )
    prof.add_argument("--device", choices=("cpu", "gpu"))
    prof.set_defaults(func=run)
    return prof


def run(args) -> int:
    from kvbench.run.context import set_device
    from kvbench.run.profile import profile

    set_device(args.device)
    print(profile(args.suite, args.case, args.metal_capture, args.ubatch))
    return 0
