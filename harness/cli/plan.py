"""`kvbench plan`: exact KV-cache bytes for a shape, context and format (or the longest context
a memory budget holds)."""

from __future__ import annotations

import argparse

NAME = "plan"


def add_parser(sub) -> argparse.ArgumentParser:
    plan = sub.add_parser(NAME, help="exact KV-cache bytes for a shape, context and format")
    plan.add_argument("--model", help="preset shape (see `kvbench list`)")
    plan.add_argument("--n-layers", type=int, help="layers (overrides the preset)")
    plan.add_argument("--n-kv-heads", type=int, help="KV heads (overrides the preset)")
    plan.add_argument("--head-dim", type=int, help="head dimension (overrides the preset)")
    plan.add_argument(
        "--n-q-heads", type=int, help="query heads (the guard's transients; default: GQA 1)"
    )
    plan.add_argument("--context", type=int, help="context length in tokens")
    plan.add_argument("--kv-dtype", default="fp16", help="cache format (default fp16)")
    plan.add_argument("--group-size", type=int, help="scale group size (default: per row/mode)")
    plan.add_argument(
        "--fp8-scale",
        default="one",
        help="FP8 formats: one (default), calibrated, per_head or a number: the scale's bytes",
    )
    plan.add_argument("--n-seqs", type=int, default=1, help="sequences (default 1)")
    plan.add_argument("--layout", default="per-stream", help="per-stream, unified, paged or window")
    plan.add_argument("--page-size", type=int, help="paged: slots per page (8-256)")
    plan.add_argument("--window", type=int, help="window: positions attended")
    plan.add_argument("--sinks", type=int, default=0, help="window: sink tokens kept")
    plan.add_argument("--prefix", type=int, default=0, help="unified/paged: shared prompt tokens")
    plan.add_argument("--budget", help="memory budget, e.g. 8GiB: the longest context that fits")
    plan.add_argument("--shards", type=int, default=1, help="ranks the cache is split over")
    plan.add_argument(
        "--shard-by", default="context", help="context (positions) or heads (KV heads)"
    )
    plan.add_argument("--json", action="store_true", help="print JSON for scripts")
    plan.set_defaults(func=run)
    return plan


def run(args) -> int:
    from kvbench.run.memory import available_bytes
    from kvbench.suite.plan import LayoutArgs, make_plan, parse_size, render, resolve_shape, to_json

    shape = resolve_shape(args.model, args.n_layers, args.n_kv_heads, args.head_dim, args.n_q_heads)
    budget = parse_size(args.budget) if args.budget is not None else None
    la = LayoutArgs(args.page_size, args.window, args.sinks, args.prefix)
    plan = make_plan(
        shape, args.kv_dtype, args.group_size, args.n_seqs, args.context, budget, args.layout, la,
        args.shards, args.shard_by, available_bytes(), args.fp8_scale,
    )  # fmt: skip
    print(to_json(plan) if args.json else render(plan))
    return 0
