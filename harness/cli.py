"""kvbench's command line: parses arguments and calls library functions.

Bad input (UserError) prints one line `kvbench: <file>: <key>: <reason>` and exits 2.
"""

from __future__ import annotations

import argparse
import sys

from harness.errors import UserError


def cmd_run(args) -> int:
    from harness.context import set_device
    from harness.session import run_suite
    from harness.suite import apply_filters, expand, load_suite

    suite = load_suite(args.suite)
    cases = apply_filters(expand(suite), args.filter or [])
    if args.dry_run:
        for case in cases:
            print(f"{case.case_id}  {case.label()}")
        print(
            f"{len(cases)} cases, {suite.settings.rounds} rounds, budget "
            f"{suite.settings.budget_s:g} s per case"
        )
        return 0
    if not cases:
        raise UserError(f"{args.suite}: --filter: no case matches")
    set_device(args.device)
    import pandas as pd

    from harness.summary import table

    try:
        writer = run_suite(suite, cases, args.out)
    except KeyboardInterrupt:
        print("interrupted: completed rows are kept", file=sys.stderr)
        return 130
    print(table(pd.read_csv(writer.csv_path)))
    print(f"\nresults: {writer.csv_path}\nsamples: {writer.samples_path}")
    return 0


def cmd_list(args) -> int:
    from harness.inventory import inventory

    print(inventory())
    return 0


def cmd_env(args) -> int:
    from harness.context import set_device
    from harness.inventory import environment

    set_device(args.device)
    print(environment())
    return 0


def cmd_plan(args) -> int:
    from harness.plan import make_plan, parse_size, render, resolve_shape, to_json

    shape = resolve_shape(args.model, args.n_layers, args.n_kv_heads, args.head_dim)
    budget = parse_size(args.budget) if args.budget is not None else None
    plan = make_plan(
        shape, args.format, args.group_size, args.n_seqs, args.context, budget, args.layout
    )
    print(to_json(plan) if args.json else render(plan))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvbench", description="Benchmark LLM KV-cache configurations on MLX."
    )
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a suite and write results/<run-id>.csv")
    run.add_argument("suite", help="suite YAML file")
    run.add_argument("--out", default="results", help="output directory (default: results)")
    run.add_argument(
        "--filter",
        action="append",
        metavar="KEY=VALUE",
        help="keep only cases whose KEY equals VALUE (repeatable)",
    )
    run.add_argument("--dry-run", action="store_true", help="list the expanded cases and stop")
    run.add_argument("--device", choices=("cpu", "gpu"), help="MLX device (default: MLX's)")
    run.set_defaults(func=cmd_run)

    lst = sub.add_parser("list", help="presets, dtypes, kernels and what this backend runs")
    lst.set_defaults(func=cmd_list)

    env = sub.add_parser("env", help="device, backend, versions, measured peak bandwidth")
    env.add_argument("--device", choices=("cpu", "gpu"))
    env.set_defaults(func=cmd_env)

    plan = sub.add_parser("plan", help="exact KV-cache bytes for a shape, context and format")
    plan.add_argument("--model", help="preset shape (see `kvbench list`)")
    plan.add_argument("--n-layers", type=int, help="layers (overrides the preset)")
    plan.add_argument("--n-kv-heads", type=int, help="KV heads (overrides the preset)")
    plan.add_argument("--head-dim", type=int, help="head dimension (overrides the preset)")
    plan.add_argument("--context", type=int, help="context length in tokens")
    plan.add_argument("--format", default="fp16", help="kv_dtype (default fp16)")
    plan.add_argument("--group-size", type=int, help="scale group size (default: per row/mode)")
    plan.add_argument("--n-seqs", type=int, default=1, help="sequences (default 1)")
    plan.add_argument("--layout", default="per-stream", help="cache layout (per-stream)")
    plan.add_argument("--budget", help="memory budget, e.g. 8GiB: the longest context that fits")
    plan.add_argument("--json", action="store_true", help="print JSON for scripts")
    plan.set_defaults(func=cmd_plan)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        print(f"kvbench: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
