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
    """What the axis table implies a Case is (tests compare the declared Case with it, and check
    a made-up axis through it): a frozen dataclass with one field per stored axis of `table`
    and a property per derived one (a dataclass wants the fields without a default first)."""
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


_DERIVED = {a.name: a.derive for a in TABLE if a.derive is not None}


@dataclasses.dataclass(frozen=True)
class Case:
    """One case: a value for every stored axis of the axis table (kvbench.axes.TABLE, where each
    axis is documented); required axes first. tests/test_axes.py asserts these fields match
    the table (name, type, default, order), so the table stays the one place an axis is defined.
    """

    model: str
    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    context_len: int
    phase: str = "decode"
    kv_dtype: str = "fp16"
    kernel: str = "sdpa"
    n_seqs: int = 1
    tile_kv: int | None = None
    layout: str = "per-stream"
    workload: str = "none"
    prefix_frac: float = 0.0
    decode_order: str = "interleaved"
    churn: int = 0
    group_size: int | None = None
    kv_data: str = "gaussian"
    seed: int = 0
    kv_file: str | None = None
    window: int | None = None
    shards: int = 1
    shard_by: str = "context"
    combine: str = "gather"
    v_dtype: str | None = None
    k_axis: str = "token"
    sink_tokens: int = 0
    recent_tokens: int = 0
    text: str = "default"
    chunks: int = 1
    page_size: int | None = None
    page_read: str = "gather"
    kv_edit: str = "none"
    rope_theta: float = 10000.0
    rotate_k: str = "none"
    rotate_v: str = "none"
    rot_block_k: int | None = None
    rot_block_v: int | None = None
    k_order: str = "hf"
    q_quant: str = "none"
    peer_weights: str = "gguf"
    fp8_scale: str = "one"
    task: str = "none"
    depth: float = 0.5
    trials: int = 1
    gen_tokens: int = 32
    quantized_kv_start: int = 0
    context_limit: str = "trained"
    ga_n: int = 1
    ga_w: int = 2048
    n_keep: int | None = None
    div_sign: str = "exact"
    swa_cache: str = "ring"
    policy: str = "none"
    compression_ratio: float = 0.0
    kv_budget: int | None = None
    n_sink: int = 4
    obs_window: int = 64
    kernel_size: int = 5
    scorer: str = "snapkv"

    @property
    def gqa_ratio(self) -> int:
        """Derived axis: query heads per K/V head."""
        return _DERIVED["gqa_ratio"](vars(self))

    @property
    def prefix_len(self) -> int:
        """Shared-prefix tokens of a shared-prefix workload."""
        return int(self.prefix_frac * self.context_len)

    @property
    def case_id(self) -> str:
        return case_id(self)

    def label(self) -> str:
        return _label_of(vars(self) | {"gqa_ratio": self.gqa_ratio})


AXES = names(TABLE)  # every axis name a suite may set (derived ones included)


def label_of(fields) -> str:
    """A short human name for a case from its fields (kvbench.axes.label_of)."""
    return _label_of(fields)
