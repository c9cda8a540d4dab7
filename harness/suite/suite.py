"""Suites: YAML file -> Suite (validated) -> expand() -> [Case].

Grammar (every top-level key optional except the axes needed to define a case):
    name, description
    settings: {warmup_s, min_samples, max_samples, budget_s, target_ci, rounds, cv_warn, stages,
               max_hours}
    fixed:   {axis: value}                      one value for every case
    sweep:   {axis: [values]}                   cartesian product
    zip:     [{axis: [values], axis2: [...]}]   axes that move together (same length)
    exclude: [{axis: value or [values]}]        drop cases matching every key of a rule
             (rules match the resolved case: preset shape and gqa_ratio included)
Everything is checked before anything runs; a problem raises SuiteError(file, key, reason).
The checks of values and of combinations of axes are in harness/suite/validate.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kvbench.case import AXES, Case
from kvbench.errors import SuiteError
from kvbench.files import not_regular, read_text
from kvbench.kernels.attention.registry import KERNELS
from kvbench.kernels.model.fetch import MODELS
from kvbench.suite.cache_spec import MODEL_PHASES, SERVE_PHASE, spec_of
from kvbench.suite.presets import PRESETS
from kvbench.suite.validate import (
    check_axis,
    check_case,
    check_model,
    check_shards,
    check_streams,
    is_int,
)

MAX_COMBINATIONS = 100_000  # a sweep product beyond this is a typo, not a benchmark
SETTING_MAX = 1e9  # any setting: anything larger never finishes
# a setting past its limit names a run that cannot finish (issue 27: rounds 1e9, min_samples 1e6,
# warmup_s 1e9 were accepted and ran on for ever); max_hours bounds the whole run's time floor
SETTING_LIMITS = {"rounds": 1000, "min_samples": 100_000, "max_samples": 100_000,
                  "warmup_s": 3600.0, "budget_s": 86400.0, "max_hours": 1e4}  # fmt: skip
TOP_KEYS = ("name", "description", "settings", "fixed", "sweep", "zip", "exclude")


@dataclass(frozen=True)
class Settings:
    warmup_s: float = 0.1  # warm-up time per case and round (compilation lands here)
    min_samples: int = 5
    max_samples: int = 200
    budget_s: float = 1.0  # sampling time per case, all rounds and stages together
    target_ci: float = 0.05  # stop once the median's 95% CI half-width <= this x median
    rounds: int = 2  # cases are interleaved in rounds to spread drift over all of them
    cv_warn: float = 0.10  # rows with a higher coefficient of variation are flagged unstable
    stages: bool = True  # also time the write and attend stages on their own
    max_hours: float = 24.0  # a suite whose time floor (time_floor_s) is longer is refused


@dataclass(frozen=True)
class Suite:
    path: str
    name: str
    description: str = ""
    settings: Settings = field(default_factory=Settings)
    fixed: dict = field(default_factory=dict)
    sweep: dict = field(default_factory=dict)
    zip: list = field(default_factory=list)
    exclude: list = field(default_factory=list)


def _need(path: str, key: str, value, kind: type, what: str):
    if not isinstance(value, kind):
        raise SuiteError(path, key, f"must be {what}, got {type(value).__name__}")
    return value


# ---- loading ---------------------------------------------------------------------------


class _DuplicateKey(Exception):
    def __init__(self, key, line: int):
        super().__init__(key)
        self.key, self.line = key, line


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep)


# YAML 1.1 reads 1e-3 as text (its floats need a dot); a person writing a setting means a number
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _load_settings(path: str, raw) -> Settings:
    raw = _need(path, "settings", raw or {}, dict, "a mapping")
    known = {f.name: f for f in dataclasses.fields(Settings)}
    for key, value in raw.items():
        where = f"settings.{key}"
        if key not in known:
            raise SuiteError(path, where, f"unknown setting; known: {', '.join(known)}")
        default = known[key].default
        least = 0 if key == "warmup_s" else 1e-12  # only the warm-up may be zero
        kind = "non-negative" if key == "warmup_s" else "positive"
        if isinstance(default, bool):
            ok, kind = isinstance(value, bool), "a"
        elif isinstance(default, int):
            ok = is_int(value) and least <= value <= SETTING_MAX
        else:  # finite: warmup_s: .inf would warm up forever, NaN compares false everywhere
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = ok and math.isfinite(value) and least <= value <= SETTING_MAX
        kind += f" {type(default).__name__}" + ("" if kind == "a" else f" <= {SETTING_MAX:g}")
        if not ok:
            raise SuiteError(path, where, f"must be {kind}, got {value!r}")
        if key in SETTING_LIMITS and value > SETTING_LIMITS[key]:
            limit = SETTING_LIMITS[key]
            raise SuiteError(path, where, f"{value!r} is more than {limit:g}: the run would not "
                             "finish")  # fmt: skip
    settings = Settings(**raw)
    if settings.min_samples > settings.max_samples:
        raise SuiteError(path, "settings.min_samples", "is larger than settings.max_samples")
    return settings


def time_floor_s(settings: Settings, n_cases: int) -> float:
    """The least time a run of n_cases can take: each case warms up every round and samples
    for its budget (the time to build caches and min_samples of slow steps come on top)."""
    return n_cases * (settings.rounds * settings.warmup_s + settings.budget_s)


def check_time(suite: Suite, n_cases: int) -> None:
    floor_s = time_floor_s(suite.settings, n_cases)
    if floor_s > suite.settings.max_hours * 3600:
        raise SuiteError(
            suite.path, "settings", f"the run needs at least {floor_s / 3600:,.1f} h ({n_cases} "
            f"cases x (rounds x warmup_s + budget_s)), over max_hours "
            f"{suite.settings.max_hours:g}; shrink the suite or raise settings.max_hours",
        )  # fmt: skip


def _regular_file(path: str) -> None:
    """A suite is a regular file: a named pipe would block for ever, a device never ends."""
    why = not_regular(path)
    if why is not None:  # key "-": the file itself (SuiteError says no key)
        raise SuiteError(path, "-", why if why.startswith("cannot") else f"{why}, not a suite file")


def _load_axes(path: str, section: str, raw: dict, as_lists: bool) -> dict:
    for axis, values in raw.items():
        if as_lists:
            values = _need(path, f"{section}.{axis}", values, list, "a list")
            if not values:
                raise SuiteError(path, f"{section}.{axis}", "is an empty list")
            for i, v in enumerate(values):
                check_axis(path, f"{section}.{axis}[{i}]", axis, v)
        else:
            check_axis(path, f"{section}.{axis}", axis, values)
    return raw


def _load_zip(path: str, raw) -> list:
    groups = _need(path, "zip", raw or [], list, "a list of mappings")
    for i, group in enumerate(groups):
        _need(path, f"zip[{i}]", group, dict, "a mapping of axis to list")
        if not group:
            raise SuiteError(path, f"zip[{i}]", "is empty")
        _load_axes(path, f"zip[{i}]", group, as_lists=True)
        if len({len(v) for v in group.values()}) > 1:
            raise SuiteError(path, f"zip[{i}]", "lists must all have the same length")
    return groups


def _load_exclude(path: str, raw) -> list:
    rules = _need(path, "exclude", raw or [], list, "a list of mappings")
    for i, rule in enumerate(rules):
        _need(path, f"exclude[{i}]", rule, dict, "a mapping of axis to value(s)")
        for axis, value in rule.items():
            for v in value if isinstance(value, list) else [value]:
                check_axis(path, f"exclude[{i}].{axis}", axis, v)
    return rules


def load_suite(path: str | Path) -> Suite:
    return suite_from_raw(str(path), read_raw(str(path)))


def read_raw(path: str) -> dict:
    """A suite file's YAML as a mapping (SuiteError, one line, for anything else)."""
    _regular_file(path)
    text = read_text(
        path, error=SuiteError
    )  # capped, strict UTF-8: one-line errors for binary or huge files
    try:
        raw = yaml.load(text, Loader=_StrictLoader) or {}
    except RecursionError:
        raise SuiteError(path, "-", "nested too deeply to be a suite") from None
    except _DuplicateKey as e:
        raise SuiteError(path, str(e.key), f"duplicate key (line {e.line})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "-"
        raise SuiteError(path, where, f"invalid YAML: {getattr(e, 'problem', e)}") from None
    return _need(path, "(top level)", raw, dict, "a mapping")


def suite_from_raw(path: str, raw: dict) -> Suite:
    """A checked Suite from a suite's mapping (a file's, or the command line's: cli_axes.py)."""
    if not any(raw.get(k) for k in ("fixed", "sweep", "zip")):  # else: n_layers of model=custom
        raise SuiteError(path, "fixed", "the suite names no axes (fixed, sweep or zip): empty")
    for key in raw:
        if key not in TOP_KEYS:
            raise SuiteError(path, key, f"unknown key; known: {', '.join(TOP_KEYS)}")
    for key in ("name", "description"):
        if key in raw and not isinstance(raw[key], (str, int, float)):
            raise SuiteError(path, key, f"must be text, got {type(raw[key]).__name__}")
    suite = Suite(
        path=path,
        name=str(raw.get("name", Path(path).stem)),
        description=str(raw.get("description", "")),
        settings=_load_settings(path, raw.get("settings")),
        fixed=_load_axes(
            path,
            "fixed",
            _need(path, "fixed", raw.get("fixed") or {}, dict, "a mapping"),
            as_lists=False,
        ),
        sweep=_load_axes(
            path,
            "sweep",
            _need(path, "sweep", raw.get("sweep") or {}, dict, "a mapping"),
            as_lists=True,
        ),
        zip=_load_zip(path, raw.get("zip")),
        exclude=_load_exclude(path, raw.get("exclude")),
    )
    _check_overlaps(suite)
    check_time(suite, len(expand(suite)))  # every combination must resolve before anything runs
    return suite


def _check_overlaps(suite: Suite) -> None:
    seen: dict[str, str] = {}
    sections = [("fixed", suite.fixed), ("sweep", suite.sweep)]
    sections += [(f"zip[{i}]", g) for i, g in enumerate(suite.zip)]
    for section, axes in sections:
        for axis in axes:
            if axis in seen:
                raise SuiteError(suite.path, f"{section}.{axis}", f"already set in {seen[axis]}")
            seen[axis] = section


# ---- expansion -------------------------------------------------------------------------


def _combinations(suite: Suite) -> list[dict]:
    dims = [[{axis: v} for v in values] for axis, values in suite.sweep.items()]
    for group in suite.zip:
        n = len(next(iter(group.values())))
        dims.append([{axis: values[i] for axis, values in group.items()} for i in range(n)])
    total = math.prod(len(d) for d in dims)  # counted before anything is built
    if total > MAX_COMBINATIONS:
        raise SuiteError(
            suite.path, "sweep", f"{total:,} combinations; at most {MAX_COMBINATIONS:,}"
        )
    combos = []
    for picks in itertools.product(*dims):
        combo = dict(suite.fixed)
        for pick in picks:
            combo.update(pick)
        combos.append(combo)
    return combos


def _excluded(values: dict, rules: list) -> bool:
    def matches(rule: dict) -> bool:
        return all(
            values.get(axis) in (v if isinstance(v, list) else [v]) for axis, v in rule.items()
        )

    return any(matches(rule) for rule in rules)


def resolve(path: str, combo: dict) -> Case:
    """One combination of axis values -> a checked Case (preset shape filled in, GQA resolved)."""
    case = _shape(path, combo)
    check_streams(path, case)  # first: workload + file data fails on kv_data
    check_model(path, case)
    check_case(path, case)
    check_shards(path, case)
    return case


def model_kernel(shape: dict) -> str:
    """The kernel of a model-phase case that names none: the format's reference path for the
    quality and task phases (the row measures the format alone); for model_decode and serve,
    sdpa where the kernel sees a dense cache (a dense format, or any spec with options, which
    attends over a dense view), tiled over a plain quantized format's packed data."""
    if shape["phase"] not in ("model_decode", SERVE_PHASE):  # serve times its steps too
        return "reference"
    try:
        spec = spec_of(Case(model="custom", **{**shape, "kernel": "reference"}))
        quantized = spec.plain and spec.formats()[0].quantized
    except (TypeError, ValueError, KeyError):
        return "sdpa"  # a bad format or axis: the checks that follow name it
    return "tiled" if quantized else "sdpa"


def real_model_shape(path: str, model: str) -> dict:
    """The shape axes of a real model from its metadata (SuiteError, one line, if it is none)."""
    from kvbench.kernels.model.load import ModelError
    from kvbench.kernels.model.source import model_shape

    try:
        s = model_shape(model)
    except ModelError as e:
        raise SuiteError(path, "model", str(e)) from None
    return {"n_layers": s.n_layers, "n_q_heads": s.n_heads, "n_kv_heads": s.n_kv_heads,
            "head_dim": s.head_dim}  # fmt: skip


SHAPE_AXES = ("n_layers", "n_q_heads", "n_kv_heads", "head_dim", "gqa_ratio")


def _runs_real_model(model: str, phase) -> bool:
    """The case runs a real model's weights: a file, directory or repo id in any phase, or a
    registered model in a model phase. Its metadata decides its shape."""
    if model == "custom":
        return False
    return model not in PRESETS or (phase in MODEL_PHASES and model in MODELS)


def _refuse_shape_axes(path: str, model: str, combo: dict) -> None:
    """A shape axis beside a real model would label the row with a shape that never ran (the
    2-layer head_dim-128 row of a 30-layer head_dim-64 model, issue 35): refused."""
    given = [a for a in SHAPE_AXES if a in combo]
    if not given:
        return
    if model in PRESETS:  # a registered model: its preset is its metadata's shape, no fetch
        real = {k: getattr(PRESETS[model], k) for k in SHAPE_AXES[:4]}
    else:
        real = real_model_shape(path, model)
    real["gqa_ratio"] = real["n_q_heads"] // real["n_kv_heads"]
    axis = given[0]
    raise SuiteError(path, axis, f"{model}'s metadata sets its shape ({axis} {real[axis]}); "
                     "leave the shape axes out beside a real model")  # fmt: skip


def _shape(path: str, combo: dict) -> Case:
    """The Case of a combination, shape resolved; the combination checks are not run yet."""
    combo = dict(combo)
    model = combo.pop("model", "custom")
    shape = {}
    if _runs_real_model(model, combo.get("phase")):
        _refuse_shape_axes(path, model, combo)
    if model in PRESETS:
        preset = PRESETS[model]
        shape = {k: getattr(preset, k) for k in ("n_layers", "n_q_heads", "n_kv_heads", "head_dim")}
    elif model != "custom":  # a GGUF file, an mlx-lm directory, a Hugging Face repo id
        shape = real_model_shape(path, model)
    gqa = combo.pop("gqa_ratio", None)
    if gqa is not None:
        if "n_kv_heads" in combo:
            raise SuiteError(path, "gqa_ratio", "give n_kv_heads or gqa_ratio, not both")
        shape.update(combo)
        q_heads = shape.get("n_q_heads")
        if q_heads is None:
            raise SuiteError(path, "n_q_heads", f"missing (model={model} does not define it)")
        if q_heads % gqa:
            raise SuiteError(
                path, "gqa_ratio", f"n_q_heads={q_heads} is not divisible by gqa_ratio={gqa}"
            )
        combo["n_kv_heads"] = q_heads // gqa
    shape.update(combo)
    for needed in ("n_layers", "n_q_heads", "n_kv_heads", "head_dim", "context_len"):
        if needed not in shape:
            raise SuiteError(path, needed, f"missing (model={model} does not define it)")
    if shape["n_q_heads"] % shape["n_kv_heads"]:
        raise SuiteError(
            path,
            "n_kv_heads",
            f"n_q_heads={shape['n_q_heads']} is not divisible by n_kv_heads={shape['n_kv_heads']}",
        )
    if shape.get("kv_data", "gaussian") != "file":
        shape.pop("kv_file", None)  # only file data reads it; keeps other cases' ids stable
    if shape.get("shards", 1) == 1:
        # one rank neither splits nor combines: one case, not one per shard_by x combine
        for axis in ("shard_by", "combine"):
            shape.pop(axis, None)
    if "kernel" not in shape and shape.get("phase") in MODEL_PHASES:
        shape["kernel"] = model_kernel(shape)
    kernel = KERNELS.get(shape.get("kernel", "sdpa"))  # None: a peer, which has no tiles
    if kernel is None or kernel.default_tile is None:
        # a kernel without tiles ignores tile_kv: one case, not one mislabelled case per tile
        shape.pop("tile_kv", None)
    return Case(model=model, **shape)


def expand(suite: Suite) -> list[Case]:
    cases, seen = [], set()
    for combo in _combinations(suite):
        # rules match the resolved case (axes a preset fills, gqa_ratio) and the raw values;
        # a combination a rule drops is never checked, so it may be one that cannot run
        try:
            case = _shape(suite.path, combo)
        except SuiteError:
            if _excluded(combo, suite.exclude):
                continue
            raise
        if _excluded({**{a: getattr(case, a) for a in AXES}, **combo}, suite.exclude):
            continue
        check_streams(suite.path, case)
        check_model(suite.path, case)
        check_case(suite.path, case)
        check_shards(suite.path, case)
        if case.case_id not in seen:
            seen.add(case.case_id)
            cases.append(case)
    if not cases:
        raise SuiteError(suite.path, "exclude", "no cases left to run")
    return cases


def apply_filters(cases: list[Case], filters: list[str], path: str = "--filter") -> list[Case]:
    """Keep cases whose field KEY equals VALUE (compared as text) for every KEY=VALUE; a filter
    that leaves none names the values the cases have (with a did-you-mean)."""
    from kvbench.suite.validate import did_you_mean

    for item in filters:
        key, sep, value = item.partition("=")
        if not sep or key not in AXES:
            hint = did_you_mean(key, AXES) if sep else ""
            raise SuiteError(path, item, f"expected KEY=VALUE; {hint}KEY one of {', '.join(AXES)}")
        kept = [c for c in cases if str(getattr(c, key)) == value]
        if cases and not kept:
            have = list(dict.fromkeys(str(getattr(c, key)) for c in cases))
            raise SuiteError(path, item, f"no case matches; {did_you_mean(value, have)}the cases "
                             f"have {key} {', '.join(have)}")  # fmt: skip
        cases = kept
    return cases
