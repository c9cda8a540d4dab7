"""kvbench's command line: parses arguments and calls library functions.

One module per command (asv's commands/ is the model): each holds NAME, `add_parser(sub)` (its
arguments, and `set_defaults(func=run)`) and `run(args) -> int`, which imports the library it
calls when it runs, so `kvbench compare` never loads what `kvbench run` needs. common.py holds
what several commands share. COMMANDS is the order `kvbench -h` lists them.

Bad input (UserError) prints one line `kvbench: <file>: <key>: <reason>` and exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from kvbench.cli import (
    calibrate,
    compare,
    env,
    gate,
    history,
    importing,
    listing,
    merge,
    model,
    plan,
    profile,
    report,
    run,
)
from kvbench.cli.common import check_blas, say
from kvbench.errors import UserError

COMMANDS = (run, listing, env, compare, history, importing, gate, calibrate, profile, report,
            merge, model, plan)  # fmt: skip


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors on one line (the usage is a `-h` away), exit 2 as argparse."""

    def error(self, message: str):
        say(f"{self.prog}: {message} (see {self.prog} -h)")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="kvbench", description="Benchmark LLM KV-cache configurations on MLX.")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_blas()
        return args.func(args)
    except UserError as e:
        say(f"kvbench: {e}")
        return 2
    except KeyboardInterrupt:
        say("kvbench: interrupted")
        return 130
    except BrokenPipeError:  # `kvbench compare ... | head`: the reader left; say nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141  # 128 + SIGPIPE, as a process the pipe killed
    except OSError as e:  # a file kvbench reads or writes failed where no check named it
        say(f"kvbench: {e.filename or '-'}: {e.strerror or e}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
