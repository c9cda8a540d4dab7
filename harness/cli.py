"""kvbench's command line: parses arguments and calls library functions.

Bad input (UserError) prints one line `kvbench: <file>: <key>: <reason>` and exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from kvbench.errors import UserError


def cmd_run(args) -> int:
    from kvbench.run.interrupt import Interrupted, handling

    # signals are ours before the slow imports: an early Ctrl-C is a clean exit, never lost
    with handling():
        try:
            return _run(args)
        except Interrupted as e:
            _say(f"interrupted ({e}): {getattr(e, 'kept', 'completed rows are kept')}")
            return e.exit_code


def _say(line: str) -> None:
    """One line on stderr; a closed terminal (SIGHUP) must not turn it into a traceback."""
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):
        pass


def _check_blas(say_notice: bool = False) -> None:
    """A KVBENCH_BLAS that names no usable library is bad input (kvbench.blas); with
    say_notice, the one line that no fast BLAS was found (run, env)."""
    from kvbench import blas

    if blas.problem():
        raise UserError(blas.problem())
    if say_notice and blas.notice():
        _say(blas.notice())


def _run(args) -> int:
    from kvbench.run.context import set_device
    from kvbench.run.session import run_suite
    from kvbench.spec.suite import apply_filters, expand, load_suite

    suite = load_suite(args.suite)
    cases = apply_filters(expand(suite), args.filter or [])
    if args.shard:
        from kvbench.spec.shard import parse_shard, shard_cases

        cases = shard_cases(cases, *parse_shard(args.shard))
    if args.dry_run:
        for case in cases:
            print(f"{case.case_id}  {case.label()}")
        from kvbench.spec.suite import time_floor_s

        st = suite.settings
        print(
            f"{len(cases)} cases, {st.rounds} rounds, budget {st.budget_s:g} s per case; at "
            f"least {time_floor_s(st, len(cases)):,.1f} s in all (cases x (rounds x warmup_s + "
            "budget_s); a case whose steps are slow overruns its budget: `kvbench run` measures "
            "the read bandwidth and warns, before measuring, of each case that will)"
        )
        return 0
    if not cases:
        raise UserError(f"{args.suite}: --filter: no case matches")
    set_device(args.device)
    _check_blas(say_notice=True)
    import pandas as pd

    from kvbench.analysis.summary import table

    writer = run_suite(suite, cases, args.out)
    print(table(pd.read_csv(writer.csv_path)))
    print(f"\nresults: {writer.csv_path}\nsamples: {writer.samples_path}")
    return 0


def cmd_list(args) -> int:
    from kvbench.run.inventory import inventory

    print(inventory())
    return 0


def cmd_env(args) -> int:
    from kvbench.run.context import set_device
    from kvbench.run.inventory import environment

    set_device(args.device)
    _check_blas(say_notice=True)
    print(environment())
    return 0


def _emit(text: str, out: str | None) -> None:
    """Print, and write to `out` (atomically) when given."""
    print(text)
    if out:
        from kvbench.files import write_atomic

        write_atomic(out, text if text.endswith("\n") else text + "\n")


def _check_output(out: str | None, inputs=()) -> None:
    """An -o file is checked before any work (not a directory, folder writable, not one of the
    inputs, not an existing results or samples file)."""
    if out:
        from kvbench.store.results import check_output

        check_output(out, inputs)


def cmd_compare(args) -> int:
    from kvbench.analysis.calibrate import load_noise
    from kvbench.analysis.compare import compare
    from kvbench.analysis.rules import Rules, check_rules
    from kvbench.store.results import load

    rules = Rules(args.threshold, args.alpha, args.min_samples)
    check_rules(args.metric, rules)
    _check_output(args.output, (args.base, args.new))
    base = load(args.base, args.results, pool=args.pool)
    new = load(args.new, args.results, pool=args.pool)
    noise = load_noise(args.results)  # this host's A/A between-run noise, if calibrated
    return _report(compare(base, new, args.metric, rules, noise), args)


def cmd_calibrate(args) -> int:
    from kvbench.analysis.calibrate import FILE, calibrate

    got = calibrate(args.suite, args.results, args.runs, args.device)
    print(
        f"calibrated {len(got['noise'])} cases over {args.runs} runs: median between-run noise "
        f"±{got['median']:.1%}; stored in {args.results}/{FILE}"
    )
    return 0


def _report(cmp, args) -> int:
    """Print (and write) a comparison; exit status 1 when it holds a regression."""
    from kvbench.analysis.compare_text import FORMATS

    for w in cmp.warnings:
        print(f"kvbench: warning: {w}", file=sys.stderr)
    _emit(FORMATS[args.format](cmp), args.output)
    return 1 if len(cmp.regressions) else 0


def cmd_history(args) -> int:
    from kvbench.analysis.history import history
    from kvbench.analysis.history_text import FORMATS
    from kvbench.analysis.rules import Rules, check_rules

    rules = Rules(args.threshold, args.alpha, args.min_samples)
    check_rules(args.metric, rules)
    _check_output(args.output, (args.dir,))
    hist = history(args.dir, args.metric, rules)
    _emit(FORMATS[args.format](hist), args.output)
    return 0


def cmd_import(args) -> int:
    from kvbench.store.importer import import_file

    csv_path, n = import_file(args.file, args.out)
    print(f"imported {n} benchmarks: {csv_path}")
    return 0


def cmd_gate(args) -> int:
    from kvbench.analysis.gate import gate
    from kvbench.analysis.rules import Rules, check_rules

    rules = Rules(args.threshold, args.alpha, args.min_samples)
    check_rules(args.metric, rules)
    _check_output(args.output, (args.suite,))
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
    return _report(cmp, args)


def _cpu(text: str) -> int | None:
    """--pin-cpu: a CPU number, -1 (pick one) or none."""
    if text == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a CPU number, -1 or none") from None


def _stats_options(p: argparse.ArgumentParser) -> None:
    from kvbench.analysis.rules import Rules

    d = Rules()
    p.add_argument("--metric", default="median_ms", help="column to compare (default median_ms)")
    p.add_argument(
        "--threshold",
        type=float,
        default=d.threshold,
        help=f"ratio a change must exceed to count (default {d.threshold})",
    )
    p.add_argument(
        "--alpha", type=float, default=d.alpha, help=f"rank-test significance (default {d.alpha})"
    )
    p.add_argument(
        "--min-samples",
        type=int,
        default=d.min_samples,
        help=f"fewer raw samples on a side: inconclusive (default {d.min_samples})",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="also write the output to FILE")


def _compare_options(p: argparse.ArgumentParser) -> None:
    _stats_options(p)
    p.add_argument("--format", choices=("terminal", "markdown", "csv", "json"), default="terminal")
    p.add_argument(
        "--results",
        default="results",
        help="where a git ref's results are found (default: results)",
    )


def cmd_profile(args) -> int:
    from kvbench.run.context import set_device
    from kvbench.run.profile import profile

    set_device(args.device)
    print(profile(args.suite, args.case, args.metal_capture))
    return 0


def cmd_report(args) -> int:
    from kvbench.report.page import write_report

    if not args.output.endswith(".html"):  # a directory: the results site
        from kvbench.report.site import write_site

        index, n = write_site(args.results, args.output)
        print(f"report site: {index} ({n} pages)")
        return 0
    _check_output(args.output, (*args.results, args.compare))
    path, n = write_report(
        args.results, args.output, latest=args.latest, compare=args.compare, title=args.title
    )
    print(f"report: {path} ({n} figure{'' if n == 1 else 's'})")
    return 0


def cmd_model_fetch(args) -> int:
    from kvbench.kernels.model.fetch import ModelFetchError, fetch_model

    try:
        print(fetch_model(args.name))
    except (ModelFetchError, KeyError) as e:  # a KeyError's str() is the repr of its text
        raise UserError(f"kvbench model fetch: {e.args[0] if e.args else e}") from None
    return 0


def cmd_plan(args) -> int:
    from kvbench.run.memory import available_bytes
    from kvbench.spec.plan import LayoutArgs, make_plan, parse_size, render, resolve_shape, to_json

    shape = resolve_shape(args.model, args.n_layers, args.n_kv_heads, args.head_dim)
    budget = parse_size(args.budget) if args.budget is not None else None
    la = LayoutArgs(args.page_size, args.window, args.sinks, args.prefix)
    plan = make_plan(
        shape, args.kv_dtype, args.group_size, args.n_seqs, args.context, budget, args.layout, la,
        args.shards, args.shard_by, available_bytes(),
    )  # fmt: skip
    print(to_json(plan) if args.json else render(plan))
    return 0


def cmd_merge(args) -> int:
    from kvbench.store.merge import merge, render

    print(render(merge(args.results, args.output)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="kvbench", description="Benchmark LLM KV-cache configurations on MLX.")
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
    run.add_argument(
        "--shard",
        metavar="I/N",
        help="run part I of N (cost-balanced; every case in exactly one part: docs/distributed.md)",
    )
    run.add_argument("--device", choices=("cpu", "gpu"), help="MLX device (default: MLX's)")
    run.set_defaults(func=cmd_run)

    lst = sub.add_parser("list", help="presets, dtypes, kernels and what this backend runs")
    lst.set_defaults(func=cmd_list)

    env = sub.add_parser("env", help="device, backend, versions, measured peak bandwidth")
    env.add_argument("--device", choices=("cpu", "gpu"))
    env.set_defaults(func=cmd_env)

    cmp = sub.add_parser(
        "compare", help="compare two result sets (CSV, directory or git ref); exit 1 on regression"
    )
    cmp.add_argument("base", help="results CSV, results directory, or git ref")
    cmp.add_argument("new", help="results CSV, results directory, or git ref")
    cmp.add_argument(
        "--pool",
        action="store_true",
        help="pool the raw samples of every run of a case on a side (default: latest run)",
    )
    _compare_options(cmp)
    cmp.set_defaults(func=cmd_compare)

    hist = sub.add_parser("history", help="every case's median across commits, step changes")
    hist.add_argument("dir", help="results directory")
    _stats_options(hist)
    hist.add_argument("--format", choices=("terminal", "csv", "json"), default="terminal")
    hist.set_defaults(func=cmd_history)

    imp = sub.add_parser("import", help="pytest-benchmark JSON -> kvbench results CSV")
    imp.add_argument("file", help="pytest-benchmark JSON (--benchmark-json)")
    imp.add_argument("--out", default="results", help="output directory (default: results)")
    imp.set_defaults(func=cmd_import)

    gate = sub.add_parser(
        "gate", help="BASE vs this tree, paired sample by sample (default), or in whole runs"
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
    _compare_options(gate)
    gate.set_defaults(func=cmd_gate)

    cal = sub.add_parser(
        "calibrate", help="A/A runs of SUITE here: the between-run noise compare allows for"
    )
    cal.add_argument("suite", help="suite YAML file")
    cal.add_argument("--runs", type=int, default=3, help="separate runs (default 3)")
    cal.add_argument("--results", default="results", help="results directory (default results)")
    cal.add_argument("--device", choices=("cpu", "gpu"), help="MLX device for the runs")
    cal.set_defaults(func=cmd_calibrate)

    prof = sub.add_parser("profile", help="per-stage time breakdown of one case of a suite")
    prof.add_argument("suite", help="suite YAML file")
    prof.add_argument("--case", required=True, help="case id (or a unique prefix; see --dry-run)")
    prof.add_argument(
        "--metal-capture",
        metavar="PATH.gputrace",
        help="also write a Metal GPU capture of one step (Apple silicon; MTL_CAPTURE_ENABLED=1)",
    )
    prof.add_argument("--device", choices=("cpu", "gpu"))
    prof.set_defaults(func=cmd_profile)

    rep = sub.add_parser("report", help="one self-contained HTML page of plots from result CSVs")
    rep.add_argument("results", nargs="+", help="result CSV files or directories of them")
    rep.add_argument(
        "-o",
        "--output",
        default="report.html",
        help="HTML file to write, or a directory: a site (index, a page per suite, history)",
    )
    rep.add_argument(
        "--latest",
        action="store_true",
        help="figures from the newest run only (history still uses every run given)",
    )
    rep.add_argument("--compare", metavar="FILE", help="a compare CSV to plot (kvbench compare)")
    rep.add_argument("--title", help="page title (default: the suites' names)")
    rep.set_defaults(func=cmd_report)

    mrg = sub.add_parser("merge", help="join several hosts' results into one results directory")
    mrg.add_argument("results", nargs="+", help="results directories or CSVs (one per host)")
    mrg.add_argument("-o", "--output", required=True, help="results directory to write")
    mrg.set_defaults(func=cmd_merge)

    model = sub.add_parser("model", help="real models for the quality and model_decode phases")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    fetch = model_sub.add_parser("fetch", help="download a model into the kvbench cache")
    fetch.add_argument("name", nargs="?", default="smollm2-135m", help="(default smollm2-135m)")
    fetch.set_defaults(func=cmd_model_fetch)

    plan = sub.add_parser("plan", help="exact KV-cache bytes for a shape, context and format")
    plan.add_argument("--model", help="preset shape (see `kvbench list`)")
    plan.add_argument("--n-layers", type=int, help="layers (overrides the preset)")
    plan.add_argument("--n-kv-heads", type=int, help="KV heads (overrides the preset)")
    plan.add_argument("--head-dim", type=int, help="head dimension (overrides the preset)")
    plan.add_argument("--context", type=int, help="context length in tokens")
    plan.add_argument("--kv-dtype", default="fp16", help="cache format (default fp16)")
    plan.add_argument("--group-size", type=int, help="scale group size (default: per row/mode)")
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
    plan.set_defaults(func=cmd_plan)
    return p


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors on one line (the usage is a `-h` away), exit 2 as argparse."""

    def error(self, message: str):
        _say(f"{self.prog}: {message} (see {self.prog} -h)")
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _check_blas()
        return args.func(args)
    except UserError as e:
        _say(f"kvbench: {e}")
        return 2
    except KeyboardInterrupt:
        _say("kvbench: interrupted")
        return 130
    except BrokenPipeError:  # `kvbench compare ... | head`: the reader left; say nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141  # 128 + SIGPIPE, as a process the pipe killed
    except OSError as e:  # a file kvbench reads or writes failed where no check named it
        _say(f"kvbench: {e.filename or '-'}: {e.strerror or e}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
