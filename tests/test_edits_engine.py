"""The edits engine: shift, self-extend and defrag on a unified workload, counted by hand and
checked against a freshly built cache at the new positions."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kvbench.engines import engine_for, metrics
from kvbench.errors import SuiteError
from kvbench.suite.suite import resolve

BASE = {"model": "tiny", "n_seqs": 3, "context_len": 60, "kv_dtype": "fp32", "layout": "unified"}
BASE |= {"workload": "shared-prefix", "prefix_frac": 0.2}  # prefix 12 tokens


def case(**kw):
    return resolve("test", BASE | kw)


@pytest.mark.parametrize(
    "kw,units",
    [
        # 48 tokens past the prefix: evict 24, the last 24 of each sequence re-rotated by -24
        ({"kv_edit": "shift"}, 3 * 24),
        # w = 24: positions 12..35 divided by 4 (all but 12 change: 23), 36..59 move back 18
        ({"kv_edit": "self-extend"}, 3 * (23 + 24)),
        ({"kv_edit": "shift", "kernel": "tiled", "rope_theta": 500000.0}, 3 * 24),
    ],
)
def test_edits_match_a_fresh_cache_and_count_their_keys(kw, units):
    c = case(**kw)
    state = engine_for(c).build(c)
    acc = state.check()  # for fp32 also gates against a freshly built cache
    assert acc["rel_err"] < 1e-5 and state.extra["edit_units"] == units
    assert state.traffic == (units * 2 * 2 * 64 * 4,) * 2  # keys: Hkv 2 x D 64 x fp32, 2 layers
    for fn in state.stages.values():
        mx.eval(fn())


def test_defrag_moves_every_cell_above_the_first_hole():
    c = case(kv_edit="defrag", churn=2, decode_order="sequential")
    state = engine_for(c).build(c)
    assert state.check()["rel_err"] < 1e-5
    # sequential churn: sequences 0 and 1 leave holes after the prefix; every used cell above
    # the first hole moves down (cells_used of them minus the ones already in place)
    assert 0 < state.extra["edit_units"] < state.extra["cells_used"]


def test_an_edit_row_has_no_flops():
    c = case(kv_edit="shift")
    assert metrics.flops(c) is None and metrics.tokens(c) is None
    rates = metrics.rates(c, None, 1.0, None, (10, 10))
    assert rates["tflops"] is None and rates["tokens_per_s"] is None and rates["gbps"] == 2e-5


@pytest.mark.parametrize(
    "kw",
    [
        {"layout": "per-stream", "kv_edit": "shift"},
        {"kv_edit": "defrag"},  # no churn: no holes
        {"kv_edit": "shift", "context_len": 15},  # 12 tokens past a prefix of 3: under 16
    ],
)
def test_bad_edit_cases_fail_naming_the_key(kw):
    with pytest.raises(SuiteError) as e:
        case(**kw)
    assert e.value.key == "kv_edit"
