"""`kvbench gate BASE`: BASE vs this tree, paired sample by sample (default), or in whole runs."""

from __future__ import annotations

import argparse

from kvbench.cli.common import check_output, compare_options, report, rules_of
from kvbench.errors import UserError

NAME = "gate"


def _cpu(text: str) -> int | None:
    """--pin-cpu: a CPU number, -1 (pick one) or none."""
    if text == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a CPU number, -1 or none") from None


def add_parser(sub) -> argparse.ArgumentParser:
    gate = sub.add_parser(
        NAME, help="BASE vs this tree, paired sample by sample (default), or in whole runs"
    )
    gate.add_argument("base", help="git ref to compare against")
    gate.add_argument("--suite", default="suites/gate.yaml", help="suite YAML to run")
    gate.add_argument("--device", choices=("cpu", "gpu"), help="MLX device for the runs")
    gate.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="instead of the paired gate: whole runs; N > 1 runs NEW and BASE N times each, "
        "interleaved (ABBA), and compares the pooled runs; 1 runs only what is missing",
    )
    gate.add_argument(
        "--pair-budget-s",
        type=float,
        default=2.0,
        help="paired gate: seconds of pairs per case (default 2.0; at least 20 pairs)",
    )
    gate.add_argument(
        "--pin-cpu",
        type=_cpu,
        default=-1,
        help="paired gate: the CPU both workers share (default -1: the last one allowed; "
        "none: no pinning)",
    )
    compare_options(gate)
    gate.set_defaults(func=run)
    return gate


PAIR_BUDGET_S = (0.5, 3600.0)  # the bounds of --pair-budget-s


def check_pair_budget(budget_s: float) -> None:
    """The time pairs are taken before the gate may stop on a verdict. With 0 or less it stopped
    at its first look (20 pairs), and the first pairs are biased: identical code was called
    1.16x slower, p 0.002 (issue 44). NaN compares false everywhere: refused too."""
    lo, hi = PAIR_BUDGET_S
    if not lo <= budget_s <= hi:
        raise UserError(f"--pair-budget-s: {budget_s:g} is outside {lo:g}..{hi:g} s: fewer "
                        "seconds stop on the first, biased pairs")  # fmt: skip


def run(args) -> int:
    from kvbench.analysis.gate import gate

    check_pair_budget(args.pair_budget_s)
    rules = rules_of(args)
    check_output(args.output, (args.suite,))
    if args.rounds is None:
        from kvbench.analysis.gate import paired
        from kvbench.analysis.paired import Budget

        if args.metric != "median_ms":
            raise UserError(f"--metric: {args.metric}: the paired gate judges median_ms; "
                            "use --rounds N for other metrics")  # fmt: skip
        budget = Budget(budget_s=args.pair_budget_s, cpu=args.pin_cpu)
        cmp = paired(args.base, args.suite, args.results, rules, args.device, budget)
    else:
        cmp = gate(
            args.base, args.suite, args.results, args.metric, rules, args.device, args.rounds
        )
    return report(cmp, args)
