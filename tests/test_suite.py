"""Suite loading, expansion and every validation error (file, key and reason named)."""

from __future__ import annotations

import pytest

from kvbench.errors import SuiteError
from kvbench.suite.suite import apply_filters, expand, load_suite

BASE = "fixed: {model: tiny}\nsweep: {context_len: [16, 32]}\n"


def test_product_zip_and_exclude(write_suite):
    path = write_suite("""
fixed: {model: custom, n_layers: 1, head_dim: 8}
sweep: {context_len: [16, 32, 64], kv_dtype: [fp16, fp32]}
zip:
  - {n_q_heads: [8, 16], n_kv_heads: [2, 4]}
exclude:
  - {context_len: 64, kv_dtype: fp32}
  - {n_q_heads: 16, context_len: [16, 32]}
""")
    cases = expand(load_suite(path))
    # 3 ctx x 2 dtype x 2 zip = 12; drop (64, fp32) for both zips (2) and 16-heads at 16/32 (4)
    assert len(cases) == 12 - 2 - 4
    assert {(c.n_q_heads, c.n_kv_heads) for c in cases} == {(8, 2), (16, 4)}
    assert not any(c.context_len == 64 and c.kv_dtype == "fp32" for c in cases)


def test_exclude_matches_axes_filled_by_a_preset(write_suite):
    path = write_suite("""
fixed: {model: tiny, context_len: 16}
sweep: {kv_dtype: [fp16, fp32]}
exclude:
  - {n_kv_heads: 2, kv_dtype: fp32}
""")
    assert [c.kv_dtype for c in expand(load_suite(path))] == ["fp16"]  # tiny has 2 KV heads


def test_exclude_matches_gqa_ratio_derived_from_kv_heads(write_suite):
    path = write_suite("""
fixed: {model: custom, n_layers: 1, n_q_heads: 8, head_dim: 8, context_len: 16}
sweep: {n_kv_heads: [1, 2, 8]}
exclude:
  - {gqa_ratio: [4, 8]}
""")
    assert [c.n_kv_heads for c in expand(load_suite(path))] == [8]


def test_exclude_drops_an_invalid_combination_instead_of_failing(write_suite):
    path = write_suite("""
fixed: {model: tiny, context_len: 16, kv_dtype: int4}
sweep: {gqa_ratio: [2, 3], group_size: [null, 48]}
exclude:
  - {gqa_ratio: 3}
  - {head_dim: 64, group_size: 48}
""")
    # tiny's 8 query heads do not divide by 3, and int4 has no group of 48: both rules drop them
    cases = expand(load_suite(path))
    assert [(c.gqa_ratio, c.group_size) for c in cases] == [(2, None)]


def test_preset_fills_shape_and_gqa_ratio_sets_kv_heads(write_suite):
    path = write_suite(
        "fixed: {model: llama-3-8b, context_len: 128}\nsweep: {gqa_ratio: [1, 4, 8]}\n"
    )
    cases = expand(load_suite(path))
    assert [c.n_kv_heads for c in cases] == [32, 8, 4]
    assert all(c.n_layers == 32 and c.head_dim == 128 for c in cases)
    assert [c.gqa_ratio for c in cases] == [1, 4, 8]


def test_defaults_and_filters(write_suite):
    suite = load_suite(write_suite(BASE + "settings: {budget_s: 0.5}\n"))
    assert suite.settings.budget_s == 0.5 and suite.settings.rounds == 2
    cases = expand(suite)
    assert [c.context_len for c in apply_filters(cases, ["context_len=32"])] == [32]
    with pytest.raises(SuiteError, match="KEY=VALUE"):
        apply_filters(cases, ["nonsense"])


@pytest.mark.parametrize(
    "text,key,reason",
    [
        ("bogus: 1\n" + BASE, "bogus", "unknown key"),
        (BASE + "settings: {warmup: 1}\n", "settings.warmup", "unknown setting"),
        (BASE + "settings: {budget_s: -1}\n", "settings.budget_s", "positive"),
        (BASE + "settings: {rounds: 1.5}\n", "settings.rounds", "positive int"),
        (BASE + "settings: {min_samples: 9, max_samples: 3}\n", "settings.min_samples", "larger"),
        (
            "fixed: {model: tiny}\nsweep: {context_len: [16, 0]}\n",
            "sweep.context_len[1]",
            "positive integer",
        ),
        ("fixed: {model: tiny}\nsweep: {context_len: 16}\n", "sweep.context_len", "must be a list"),
        ("fixed: {model: tiny}\nsweep: {context_len: []}\n", "sweep.context_len", "empty"),
        ("fixed: {model: tiny, context_len: '16'}\n", "fixed.context_len", "positive integer"),
        ("fixed: {model: tiny, context_len: true}\n", "fixed.context_len", "positive integer"),
        ("fixed: {model: gpt-9}\nsweep: {context_len: [16]}\n", "fixed.model", "unknown value"),
        (BASE + "fixed: {model: tiny, kv_dtype: fp7}\n", "fixed", "duplicate key (line 3)"),
        (
            "fixed: {model: tiny, context_len: 8}\nsweep: {context_len: [16]}\n",
            "sweep.context_len",
            "already set in fixed",
        ),
        ("fixed: {model: tiny, kv_dtype: fp7, context_len: 8}\n", "fixed.kv_dtype", "fp16"),
        ("fixed: {model: tiny, kernel: magic, context_len: 8}\n", "fixed.kernel", "sdpa"),
        ("fixed: {model: tiny, phase: train, context_len: 8}\n", "fixed.phase", "decode"),
        ("fixed: {model: tiny, colour: red, context_len: 8}\n", "fixed.colour", "unknown axis"),
        (
            "fixed: {model: custom, n_layers: 1, n_q_heads: 6, n_kv_heads: 4, head_dim: 8, "
            "context_len: 8}\n",
            "n_kv_heads",
            "not divisible",
        ),
        (
            "fixed: {model: tiny, context_len: 8}\nsweep: {gqa_ratio: [3]}\n",
            "gqa_ratio",
            "not divisible",
        ),
        (
            "fixed: {model: tiny, context_len: 8, n_kv_heads: 2}\nsweep: {gqa_ratio: [2]}\n",
            "gqa_ratio",
            "not both",
        ),
        (
            "fixed: {model: custom, n_layers: 1, n_q_heads: 4, n_kv_heads: 4, context_len: 8}\n",
            "head_dim",
            "missing",
        ),
        (BASE + "zip:\n  - {kv_dtype: [fp16, fp32], kernel: [ops]}\n", "zip[0]", "same length"),
        (BASE + "zip:\n  - {}\n", "zip[0]", "is empty"),
        (BASE + "exclude:\n  - {context_len: [16, 32]}\n", "exclude", "no cases left"),
        (BASE + "exclude:\n  - {kernel: nope}\n", "exclude[0].kernel", "unknown value"),
        ("- just\n- a list\n", "(top level)", "mapping"),
        ("fixed: {model: tiny\n", "line", "invalid YAML"),
    ],
)
def test_validation_errors_name_file_key_reason(write_suite, text, key, reason):
    path = write_suite(text)
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    message = str(err.value)
    assert message.startswith(path + ": ")
    assert key in message and reason in message
    assert "\n" not in message


def test_missing_file(tmp_path):
    with pytest.raises(SuiteError, match="cannot read"):
        load_suite(tmp_path / "nope.yaml")


@pytest.mark.parametrize("name", ["smoke", "default", "decode"])
def test_shipped_suites_are_valid(name):
    assert expand(load_suite(f"suites/{name}.yaml"))


def test_tile_kv_is_dropped_for_kernels_without_tiles(write_suite):
    path = write_suite(
        "fixed: {model: tiny, context_len: 64}\nsweep: {kernel: [sdpa, tiled], tile_kv: [32, 64]}\n"
    )
    cases = expand(load_suite(path))
    assert sorted((c.kernel, c.tile_kv) for c in cases) == [
        ("sdpa", None),
        ("tiled", 32),
        ("tiled", 64),
    ]
