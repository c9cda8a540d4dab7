"""Older result files: data_bits and kernel_kind filled from the frozen schema-1 tables."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.kernels.formats.registry import FORMATS, get_format
from kvbench.peers.registry import PEERS, kernel_kind
from kvbench.store.migrate_v1 import V1_DATA_BITS, V1_PEER_KERNELS, with_v1_facts


def test_old_rows_get_the_facts_new_rows_record():
    old = pd.DataFrame({"kv_dtype": ["fp16", "nvfp4", "int8"], "kernel": ["sdpa", "mlx_lm", None]})
    got = with_v1_facts(old)
    assert got["data_bits"].tolist() == [16, 4, 8]
    assert got["kernel_kind"].tolist()[:2] == ["kvbench", "peer"]
    assert pd.isna(got["kernel_kind"][2])  # no kernel (an imported row): unknown
    assert "data_bits" not in old.columns  # the caller's frame is left as it was


def test_recorded_values_win_and_unknown_names_stay_empty():
    rows = pd.DataFrame(
        {
            "kv_dtype": ["fp16", "fp3", "fp3"],
            "kernel": ["sdpa", "x", "x"],
            "data_bits": [16, 3, None],
            "kernel_kind": ["kvbench", "peer", None],
        }
    )
    got = with_v1_facts(rows)
    assert got["data_bits"].tolist()[:2] == [16, 3] and pd.isna(got["data_bits"][2])
    assert got["kernel_kind"].tolist() == ["kvbench", "peer", "kvbench"]


@pytest.mark.parametrize("name", V1_DATA_BITS)
def test_frozen_table_agrees_with_what_runs_record(name):
    """The frozen tables say what the recording code says for every name they hold."""
    assert V1_DATA_BITS[name] == get_format(name).data_bits


def test_frozen_peers_are_peers():
    assert set(V1_DATA_BITS) <= set(FORMATS)
    assert all(kernel_kind(name) == "peer" for name in V1_PEER_KERNELS)
    assert set(V1_PEER_KERNELS) <= set(PEERS) and kernel_kind("sdpa") == "kvbench"
