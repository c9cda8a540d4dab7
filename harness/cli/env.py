"""`kvbench env`: device, backend, versions, measured peak bandwidth."""

from __future__ import annotations

import argparse

from kvbench.cli.common import check_blas

NAME = "env"


def add_parser(sub) -> argparse.ArgumentParser:
    env = sub.add_parser(NAME, help="device, backend, versions, measured peak bandwidth")
    env.add_argument("--device", choices=("cpu", "gpu"))
    env.set_defaults(func=run)
    return env


def run(args) -> int:
    from kvbench.run.context import set_device
    from kvbench.run.inventory import environment

    set_device(args.device)
    check_blas(say_notice=True)
    print(environment())
    return 0
