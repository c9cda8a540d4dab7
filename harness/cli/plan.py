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
    plan.add_argument("--context", help="context length in tokens (k/M/G: 32k = 32,768)")
    plan.add_argument(
        "--kv-dtype",
        default="fp16",
        help="cache format, or a comma list side by side with the saving (default fp16)",
    )
    plan.add_argument("--group-size", type=int, help="scale group size (default: per row/mode)")
    plan.add_argument(
        "--fp8-scale",
        default="one",
        help="FP8 formats: one (default), calibrated, per_head or a number: the scale's bytes",
    )
    plan.add_argument("--n-seqs", type=int, default=1, help="sequences (default 1)")
    plan.add_argument("--layout", default="per-stream", help="a layout (`kvbench list`)")
    plan.add_argument("--page-size", type=int, help="paged: slots per page (8-256)")
    plan.add_argument("--window", type=int, help="window: positions attended")
    plan.add_argument("--sinks", type=int, default=0, help="window: sink tokens kept")
    plan.add_argument("--prefix", type=int, default=0, help="unified/paged: shared prompt tokens")
    plan.add_argument(
        "--budget",
        help="memory budget, e.g. 8GiB: the longest context that fits "
        "(with --context: the most sequences of it that fit)",
    )
    plan.add_argument("--shards", type=int, default=1, help="ranks the cache is split over")
    plan.add_argument(
        "--shard-by", default="context", help="context (positions) or heads (KV heads)"
    )
    plan.add_argument("--json", action="store_true", help="print JSON for scripts")
    plan.set_defaults(func=run)
    return plan


def run(args) -> int:
    from kvbench.run.memory import available_bytes
    from kvbench.suite.plan import (
        LayoutArgs,
        fitting_line,
        make_plan,
        parse_size,
        render,
        resolve_shape,
        to_json,
    )
    from kvbench.suite.plan_table import (
        BASE,
        formats_of,
        header,
        side_by_side,
        tokens_of,
        trained_note,
    )

    shape = resolve_shape(args.model, args.n_layers, args.n_kv_heads, args.head_dim, args.n_q_heads)
    budget = parse_size(args.budget) if args.budget is not None else None
    la = LayoutArgs(args.page_size, args.window, args.sinks, args.prefix)
    context, formats = tokens_of(args.context), formats_of(args.kv_dtype)

    def plan_of(kv_dtype: str):
        return make_plan(
            shape, kv_dtype, args.group_size, args.n_seqs, context, budget, args.layout, la,
            args.shards, args.shard_by, available_bytes(), args.fp8_scale,
        )  # fmt: skip

    if context is not None and budget is not None and args.shards == 1:  # how many sequences
        for f in formats:
            print(fitting_line(shape, f, args.group_size, args.layout, context, la, budget,
                               args.fp8_scale))  # fmt: skip
        return 0
    plans = [plan_of(f) for f in formats]
    if args.json:
        print(to_json(plans[0]) if len(plans) == 1 else "[" + ",\n".join(map(to_json, plans)) + "]")
        return 0
    if len(plans) == 1:
        print(render(plans[0]))
    else:
        base = next((p for p in plans if p.kv_dtype == BASE), None) or plan_of(BASE)
        print(header(plans[0]) + "\n" + side_by_side(plans, base))
    longest = max((p.context_len or 0 for p in plans), default=0)
    note = trained_note(shape.model, longest) if budget is not None else None
    if note:
        print(note)
    return 0
