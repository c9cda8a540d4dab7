"""A Case: one fully specified configuration to measure, frozen plain data.

Its fields are the axes of kvbench.axes.TABLE (required ones first, then those with a default;
derived axes such as gqa_ratio are properties). `case_id` hashes every field that is required
or differs from its default, so adding a new axis with a default later leaves the ids of
existing cases (and their history) unchanged. It does not include measurement settings, the
device or the commit: the same case joins across runs, commits and machines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from kvbench.axes import TABLE, Axis, fields_of, names
from kvbench.axes import label_of as _label_of


def identity(case) -> dict:
    """The fields that define the case: required ones, and optional ones set off default."""
    out = {}
    for f in dataclasses.fields(case):
        value = getattr(case, f.name)
        if f.default is dataclasses.MISSING or value != f.default:
            out[f.name] = value
    return out


def case_id(case) -> str:
    blob = json.dumps(identity(case), sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _derived(axis: Axis) -> property:
    return property(lambda self: axis.derive(vars(self)), doc=axis.doc)


def case_class(table: tuple[Axis, ...] = TABLE) -> type:
    """A frozen dataclass with one field per stored axis of `table` and a property per derived
    one (a dataclass wants the fields without a default first)."""
    stored = fields_of(table)
    ordered = [a for a in stored if a.required] + [a for a in stored if not a.required]
    spec = [
        (a.name, a.type) if a.required else (a.name, a.type, dataclasses.field(default=a.default))
        for a in ordered
    ]
    derived = [a.name for a in table if a.derive is not None]
    namespace = {a.name: _derived(a) for a in table if a.derive is not None}
    namespace.update(
        prefix_len=property(lambda self: int(self.prefix_frac * self.context_len)),
        case_id=property(case_id),
        label=lambda self: _label_of(vars(self) | {a: getattr(self, a) for a in derived}, table),
        __doc__="One case: a value for every axis of the axis table (kvbench.axes).",
    )
    cls = dataclasses.make_dataclass("Case", spec, namespace=namespace, frozen=True)
    cls.__module__ = __name__  # pickle finds it as kvbench.case.Case
    return cls


Case = case_class()
AXES = names(TABLE)  # every axis name a suite may set (derived ones included)


def label_of(fields) -> str:
    """A short human name for a case from its fields (kvbench.axes.label_of)."""
    return _label_of(fields)
