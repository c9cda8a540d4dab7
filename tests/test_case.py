"""case_id: stable across commits and machines, blind to defaults added later."""

from __future__ import annotations

import dataclasses

from kvbench.case import Case, case_id, identity

CASE = Case(model="tiny", n_layers=2, n_q_heads=8, n_kv_heads=2, head_dim=64, context_len=128)


def test_case_id_is_a_golden_value():
    # sha1 of {"context_len":128,"head_dim":64,"model":"tiny","n_kv_heads":2,"n_layers":2,
    # "n_q_heads":8} (sha1sum). If this changes, stored results stop joining with new runs.
    assert CASE.case_id == "3e984c26bac1"


def test_identity_holds_required_fields_and_non_defaults_only():
    assert "kv_dtype" not in identity(CASE)
    changed = dataclasses.replace(CASE, kv_dtype="fp32")
    assert identity(changed)["kv_dtype"] == "fp32"
    assert changed.case_id != CASE.case_id


def test_a_new_axis_at_its_default_keeps_the_id():
    @dataclasses.dataclass(frozen=True)
    class Later(Case):
        new_axis: str = "off"

    later = Later(**dataclasses.asdict(CASE))
    assert case_id(later) == CASE.case_id
    assert case_id(dataclasses.replace(later, new_axis="on")) != CASE.case_id
