"""Axes on the command line: `kvbench run --kv-dtype fp16,q8_0 --context 2k` (issue 44).

Every axis of the axis table (kvbench.axes) is an option named after it (`--kv-dtype` for
kv_dtype) taking one value or a comma list, as llama-bench takes `-ctk f16,q8_0`; whole numbers
take the suffixes k, M and G (powers of 1024: `--context 32k` is 32,768 tokens). Shorthands:
`--context` for context_len, `--rotate` for rotate_k and rotate_v together (one list, zipped).

Without a suite file the options are the suite: one value is `fixed`, a list a `sweep` axis.
Beside a suite file they override or narrow it: an axis the suite fixes or sweeps takes the
command line's values; an axis in one of its zip groups keeps the group's columns whose value is
among them (a value the group lacks is an error that lists what it has). The result goes through
the same loader and checks as a file (suite.suite_from_raw), so errors are the same one line.
"""

from __future__ import annotations

import argparse
import copy

from kvbench.axes import TABLE, Axis
from kvbench.errors import SuiteError

# kvbench.suite.validate and cache_spec read kernels/ registries (and so import mlx): imported
# where values are checked, so that the CLI's parser (every command's, `kvbench merge` on a
# machine without MLX included) builds without them

WHERE = "command line"
SUFFIX = {"k": 2**10, "m": 2**20, "g": 2**30}
NONE_WORDS = ("", "none", "null", "default")
SHORTHANDS = {"context": ("context_len",), "rotate": ("rotate_k", "rotate_v")}
# a suite of model phases only: one pass per case (a quality row is one measurement, not a
# timed sample), as suites/truth.yaml
MODEL_SETTINGS = {"warmup_s": 0.0, "min_samples": 1, "max_samples": 1, "budget_s": 1.0,
                  "rounds": 1}  # fmt: skip


def option(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_axis_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "axes (each one value or a comma list; whole numbers take k/M/G: 2k = 2048)"
    )
    g.add_argument("--context", dest="axis_context", metavar="N[,N]", help="= --context-len")
    g.add_argument("--rotate", dest="axis_rotate", metavar="R[,R]",
                   help="--rotate-k and --rotate-v together (none or hadamard)")  # fmt: skip
    for axis in TABLE:
        g.add_argument(option(axis.name), dest=f"axis_{axis.name}", metavar="V[,V]",
                       help=axis.doc.split(";")[0])  # fmt: skip


def parse_value(axis: Axis, text: str, key: str):
    """One command-line value as the axis's type (SuiteError naming the option if it is none)."""
    text = text.strip()
    if "None" in axis.type and text.lower() in NONE_WORDS:
        return None
    if axis.is_int:
        mult = SUFFIX.get(text[-1:].lower(), 1)
        digits = text[:-1] if mult > 1 else text
        if not digits.isdigit():
            raise SuiteError(WHERE, key, f"{text!r} is not a whole number (k/M/G: 2k = 2048)")
        return int(digits) * mult
    if axis.type.startswith("float"):
        try:
            return float(text)
        except ValueError:
            raise SuiteError(WHERE, key, f"{text!r} is not a number") from None
    return text


def given_axes(args) -> dict[str, list]:
    """axis -> its values from the parsed options, each checked as a suite's value would be."""
    from kvbench.suite.validate import check_axis

    by_name = {a.name: a for a in TABLE}
    out: dict[str, list] = {}
    set_by: dict[str, str] = {}
    for dest, text in sorted(vars(args).items()):
        if not dest.startswith("axis_") or text is None:
            continue
        name = dest[len("axis_") :]
        for axis_name in SHORTHANDS.get(name, (name,)):
            if axis_name in out:
                key = f"{set_by[axis_name]} and {option(name)}"
                raise SuiteError(WHERE, key, "both set the same axis: give one")
            set_by[axis_name] = option(name)
            axis, key = by_name[axis_name], option(name)
            values = [parse_value(axis, t, key) for t in text.split(",")]
            for v in values:
                check_axis(WHERE, key, axis_name, v)
            if len(set(map(str, values))) < len(values):
                raise SuiteError(WHERE, key, f"a value is given twice: {text}")
            out[axis_name] = values
    return out


def _narrow_zip(path: str, group: dict, axis: str, values: list) -> dict:
    keep = [i for i, v in enumerate(group[axis]) if str(v) in {str(x) for x in values}]
    missing = [v for v in values if str(v) not in {str(x) for x in group[axis]}]
    if missing:
        have = ", ".join(dict.fromkeys(str(v) for v in group[axis]))
        raise SuiteError(path, option(axis), f"{missing[0]} is not in the suite's zip of "
                         f"{axis} (it has: {have})")  # fmt: skip
    return {a: [col[i] for i in keep] for a, col in group.items()}


def _tied(args) -> tuple[str, ...]:
    """The axes one shorthand set together with a list (--rotate a,b): zipped, not crossed."""
    text = getattr(args, "axis_rotate", None)
    return SHORTHANDS["rotate"] if text and "," in text else ()


def merge(raw: dict | None, given: dict[str, list], tied: tuple = (), path: str = WHERE) -> dict:
    """A suite's mapping with the command line's axes applied (module docstring); `tied` axes
    (from one shorthand) move together in one zip group unless the suite zips them already."""
    raw = copy.deepcopy(raw or {"name": "command-line"})
    fixed, sweep = dict(raw.get("fixed") or {}), dict(raw.get("sweep") or {})
    groups = [dict(g) for g in raw.get("zip") or []]
    tie = {}
    for axis, values in given.items():
        zipped = [g for g in groups if axis in g]
        fixed.pop(axis, None)
        sweep.pop(axis, None)
        if zipped:
            groups = [_narrow_zip(path, g, axis, values) if g in zipped else g for g in groups]
        elif len(values) == 1:
            fixed[axis] = values[0]
        elif axis in tied:
            tie[axis] = values
        else:
            sweep[axis] = values
    if tie:
        groups.append(tie)
    raw.update(fixed=fixed, sweep=sweep, zip=groups)
    if not raw.get("settings") and _model_phases_only(fixed, sweep, groups):
        raw["settings"] = dict(MODEL_SETTINGS)
    return raw


def suite_of(args):
    """The Suite a `run` or `plan` command line names: its file (if any) with its axis options."""
    from kvbench.suite.suite import load_suite, read_raw, suite_from_raw

    given = given_axes(args)
    if not given:
        if not args.suite:
            raise SuiteError(WHERE, "-", "name a suite file or set axes (--model ... --kv-dtype"
                             " fp16,q8_0 --context 2k; kvbench run -h lists them)")  # fmt: skip
        return load_suite(args.suite)
    raw = read_raw(args.suite) if args.suite else None
    return suite_from_raw(args.suite or WHERE, merge(raw, given, _tied(args), args.suite or WHERE))


def _model_phases_only(fixed: dict, sweep: dict, groups: list) -> bool:
    from kvbench.suite.cache_spec import MODEL_PHASES

    phases = {fixed.get("phase", "decode")} if "phase" not in sweep else set(sweep["phase"])
    for g in groups:
        phases = set(g["phase"]) if "phase" in g else phases
    return bool(phases) and phases <= set(MODEL_PHASES) - {"model_decode"}
