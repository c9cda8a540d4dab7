"""The axis table (kvbench.axes): Case, Record, checks, labels, summary and report columns all
derive from it; case ids of existing cases do not move; one entry adds an axis everywhere."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from kvbench.analysis.summary import HIDE_IF_ALL, SHOW, show_columns
from kvbench.axes import REQUIRED, TABLE, Axis, label_of, names
from kvbench.case import AXES, Case, case_class, case_id
from kvbench.report.common import SERIES_AXES, series_axes
from kvbench.store.schema import COLUMNS, record_class
from kvbench.suite.suite import expand, load_suite
from kvbench.suite.validate import CHECKS, checks_for

# Real values: computed with `expand(load_suite(...))` and `.case_id` on main at commit bfa0cb3,
# before the axis table existed (Case was a hand-written dataclass then). If one changes, stored
# results stop joining with new runs.
SMOKE_IDS = [
    "9f3dd6d4e253",  # tiny ctx64 fp16 sdpa
    "36f89795f3a4",  # tiny ctx64 fp16 ops
    "705e59610c9b",  # tiny ctx64 fp32 sdpa
    "05e3e19f216a",  # tiny ctx64 fp32 ops
    "11079db3977c",  # tiny ctx200 fp16 sdpa
    "7fe192bcf308",  # tiny ctx200 fp16 ops
    "615fa3a30589",  # tiny ctx200 fp32 sdpa
    "eef5c728ef15",  # tiny ctx200 fp32 ops
]
STREAMS_CHURN_IDS = [  # every many-sequence axis off its default somewhere
    "fb4769a40eb8",
    "64a56b7cb8e9",
    "a0196bd93578",
    "e55fee8527ad",
    "0e9d8341a224",
    "522db5701ebb",
    "e8c41f5ab788",
    "acfe4f9fd4f0",
]
TINY = dict(model="tiny", n_layers=2, n_q_heads=8, n_kv_heads=2, head_dim=64, context_len=64)
# hand-built cases for the axes no shipped suite sets off default (same provenance as above)
HAND_IDS = {
    "3d2e54e121ff": dict(phase="prefill"),
    "95669db50d5e": dict(kv_dtype="int4", group_size=32, kernel="dequant_sdpa"),
    "23093da2d92f": dict(kv_data="file", kv_file="x.npz", seed=3),
    "4e9bdbad4b73": dict(kernel="mlx_lm_rotating", window=32),
}


def test_case_ids_of_existing_cases_do_not_move():
    assert [c.case_id for c in expand(load_suite("suites/smoke.yaml"))] == SMOKE_IDS
    churn = expand(load_suite("suites/streams-churn.yaml"))
    assert [c.case_id for c in churn] == STREAMS_CHURN_IDS
    assert {Case(**TINY, **extra).case_id: extra for extra in HAND_IDS.values()} == HAND_IDS


def test_everything_derives_from_the_table():
    assert AXES == names(TABLE)
    stored = [f.name for f in dataclasses.fields(Case)]
    assert sorted(stored) == sorted(a.name for a in TABLE if a.derive is None)
    assert COLUMNS[COLUMNS.index("model") : COLUMNS.index("median_ms")] == names(TABLE)
    assert set(CHECKS) == set(AXES)
    assert [c for c in SHOW if c in AXES] == [a.name for a in TABLE if a.column]
    assert HIDE_IF_ALL["kv_data"] == "gaussian" and HIDE_IF_ALL["layout"] == "per-stream"
    assert "fmt" in SERIES_AXES and "kv_dtype" not in SERIES_AXES and "window" in SERIES_AXES


def test_required_axes_have_no_default_and_defaults_match_the_case():
    case = Case(**TINY)
    for axis in TABLE:
        if axis.derive is not None:
            assert getattr(case, axis.name) == axis.derive(vars(case))
        elif axis.required:
            with pytest.raises(TypeError):
                Case(**{k: v for k, v in TINY.items() if k != axis.name})
        else:
            assert getattr(case, axis.name) == axis.default
    assert Case(**TINY).gqa_ratio == 4


def test_labels_come_from_the_table():
    case = Case(**TINY, n_seqs=2, prefix_frac=0.5, workload="shared-prefix", group_size=32)
    assert case.label() == "tiny decode ctx64 fp16 sdpa seqs2 shared-prefix prefix0.5 g32"
    # a result row: floats from a CSV column with empty cells, NaN for an unset axis
    row = {**TINY, "phase": "decode", "kv_dtype": "fp16", "kernel": "sdpa", "n_seqs": 1.0}
    row.update(context_len=64.0, tile_kv=float("nan"), window=512.0, churn=0.0)
    assert label_of(row) == "tiny decode ctx64 fp16 sdpa win512"
    assert label_of({"model": "tiny"}) == "tiny ? ctx? ? ?"


def test_the_checks_named_by_the_table_resolve():
    assert CHECKS["context_len"](0) and CHECKS["context_len"](64) is None
    assert CHECKS["kv_dtype"]("fp16") is None and "unknown value" in CHECKS["kv_dtype"]("fp5")
    bad = (Axis("x", "int", 0, "no_such_check"),)
    with pytest.raises(KeyError):
        checks_for(bad)


ROPE = Axis(
    "rope_scale", "float", 1.0, "fraction", label="rope{:g}", column="rope", series="rope {}",
    doc="a made-up axis: proves one entry reaches every derived place",
)  # fmt: skip


def test_one_table_entry_adds_an_axis_everywhere():
    table = (*TABLE, ROPE)
    Case2 = case_class(table)
    base, scaled = Case2(**TINY), Case2(**TINY, rope_scale=0.5)
    assert base.rope_scale == 1.0 and case_id(base) == Case(**TINY).case_id  # default: same id
    assert case_id(scaled) != case_id(base)
    assert scaled.label() == "tiny decode ctx64 fp16 sdpa rope0.5"
    Record2 = record_class(table)
    columns = [f.name for f in dataclasses.fields(Record2)]
    assert columns.index("window") < columns.index("rope_scale") < columns.index("median_ms")
    assert Record2(rope_scale=0.5).rope_scale == 0.5
    checks = checks_for(table)
    assert checks["rope_scale"](0.5) is None and checks["rope_scale"](2)
    assert show_columns(table)["rope_scale"] == "rope"
    assert "rope_scale" in series_axes(table)


def test_a_required_axis_goes_before_the_defaults():
    Case2 = case_class((*TABLE, Axis("vocab", "int", REQUIRED, "positive_int", doc="vocab")))
    with pytest.raises(TypeError):
        Case2(**TINY)
    assert case_id(Case2(**TINY, vocab=10)) != Case(**TINY).case_id


def test_the_table_imports_neither_mlx_nor_kernels():
    # store/, analysis/ and report/ read the table; they must run where mlx cannot load
    code = (
        "import sys; sys.modules['mlx'] = None; import kvbench.axes, kvbench.store.schema; "
        "bad = [m for m, x in sys.modules.items() if x and m.startswith(('mlx', 'kvbench.kern'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _shape(cls) -> list[tuple]:
    return [(f.name, f.type, f.default) for f in dataclasses.fields(cls)]


def test_the_declared_case_is_what_the_table_says():
    # Case is written out for readers and type checkers; the table stays the definition
    assert _shape(Case) == _shape(case_class())


def test_the_declared_record_is_what_the_table_says():
    from kvbench.store.schema import Record

    assert _shape(Record) == _shape(record_class())


def test_a_declared_case_that_drifts_from_the_table_is_caught():
    drifted = case_class((*TABLE, ROPE))  # the table grew an axis, the declaration did not
    assert _shape(Case) != _shape(drifted)
