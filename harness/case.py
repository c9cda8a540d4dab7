"""A Case: one fully specified configuration to measure, frozen plain data.

`case_id` hashes every field that is required or differs from its default, so adding a new
axis with a default later leaves the ids of existing cases (and their history) unchanged. It
does not include measurement settings, the device or the commit: the same case joins across
runs, commits and machines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    model: str
    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    context_len: int
    phase: str = "decode"
    n_seqs: int = 1
    kv_dtype: str = "fp16"
    layout: str = "per-stream"
    kernel: str = "sdpa"
    tile_kv: int | None = None
    group_size: int | None = None
    kv_data: str = "gaussian"
    seed: int = 0
    # many-sequence workloads (harness/engines/streams.py, docs/streams.md); the defaults are
    # the plain cache engine's case, so existing case ids do not change
    workload: str = "none"  # none | independent | shared-prefix
    prefix_frac: float = 0.0  # shared prefix = int(prefix_frac * context_len) tokens
    decode_order: str = "interleaved"  # interleaved | sequential
    churn: int = 0  # sequences that finish and are replaced before the timed step
    kv_file: str | None = None  # .npz of captured K/V, only for kv_data=file (kernels/data.py)
    window: int | None = None  # attention window (mlx_lm_rotating's max_size); None: whole context

    @property
    def gqa_ratio(self) -> int:
        return self.n_q_heads // self.n_kv_heads

    @property
    def prefix_len(self) -> int:
        return int(self.prefix_frac * self.context_len)

    @property
    def case_id(self) -> str:
        return case_id(self)

    def label(self) -> str:
        return label_of(dataclasses.asdict(self))


def identity(case: Case) -> dict:
    """The fields that define the case: required ones, and optional ones set off default."""
    out = {}
    for f in dataclasses.fields(case):
        value = getattr(case, f.name)
        if f.default is dataclasses.MISSING or value != f.default:
            out[f.name] = value
    return out


def case_id(case: Case) -> str:
    blob = json.dumps(identity(case), sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


AXES = tuple(f.name for f in dataclasses.fields(Case)) + ("gqa_ratio",)


def _given(value) -> bool:
    """Set in a row: not None, not NaN (a CSV's empty cell), not empty text."""
    return value is not None and value == value and value != ""


def label_of(fields) -> str:
    """A short human name for a case from its fields (a Case, or a result row where a missing
    or empty field means its default): the axes always shown, then the ones set off default."""
    get = fields.get
    ctx = int(get("context_len")) if _given(get("context_len")) else "?"
    parts = [str(get("model")), str(get("phase")), f"ctx{ctx}", str(get("kv_dtype"))]
    parts.append(str(get("kernel")))
    shown = (
        ("n_seqs", 1, "seqs{}"), ("tile_kv", None, "tile{}"), ("layout", "per-stream", "{}"),
        ("workload", "none", "{}"), ("prefix_frac", 0, "prefix{:g}"),
        ("decode_order", "interleaved", "{}"), ("churn", 0, "churn{}"),
        ("group_size", None, "g{}"), ("kv_data", "gaussian", "{}"), ("window", None, "win{}"),
    )  # fmt: skip
    for name, default, fmt in shown:
        v = get(name)
        if _given(v) and v != default:
            v = int(v) if isinstance(v, float) and v.is_integer() and name != "prefix_frac" else v
            parts.append(fmt.format(v))
    return " ".join(parts)
