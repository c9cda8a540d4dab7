"""kv_saturated in the many-sequence engines (harness/engines/streams.py unified and
per-stream, paged.py, window.py): the FP8 E4M3 elements of layer 0's K and V past 464 after the
scale (stored as 448), counted by hand here from the same K/V data and the tokens each layout
holds, worked out from the workload (not from the layout's cells)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kvbench.engines import engine_for
from kvbench.engines.common import make_tables, workload_of
from kvbench.kernels.data import make_qkv
from kvbench.kernels.stores.layouts import KV_PAD
from kvbench.kernels.stores.workloads import build_layout, build_paged
from kvbench.suite.suite import resolve

SCALE = 0.01  # |x| > 4.64 saturates: the outlier key channels (x10) and V's tails
FP8 = {"model": "tiny", "kv_dtype": "fp8_e4m3", "fp8_scale": SCALE, "kv_data": "outliers"}


def past_bound(x: np.ndarray) -> int:
    """E4M3 elements of x stored saturated at the scale: |x / s| > 464 (tests/test_fp8.py)."""
    return int(np.sum(np.abs(x.astype(np.float32) / np.float32(SCALE)) > 464))


def token_counts(c) -> dict:
    """Per token id, its K and V elements stored saturated."""
    _, k_tab, v_tab = (np.array(t) for t in make_tables(c, workload_of(c).n_tokens))
    return {t: past_bound(k_tab[:, :, t]) + past_bound(v_tab[:, :, t])
            for t in range(k_tab.shape[2])}  # fmt: skip


@pytest.mark.parametrize("layout", ["unified", "per-stream"])
def test_streams_count_what_each_layout_stores(layout):
    """3 sequences of 40 tokens, a 10-token prompt shared: unified stores it once, per-stream in
    every stream, so the counts differ by exactly the prefix's count twice."""
    c = resolve("test", FP8 | {"n_seqs": 3, "context_len": 40, "layout": layout,
                               "workload": "shared-prefix", "prefix_frac": 0.25,
                               "kernel": "tiled"})  # fmt: skip
    per_token, seqs = token_counts(c), build_layout(workload_of(c), layout, KV_PAD)[1].seq_tokens
    prefix = sum(per_token[t] for t in seqs[0][: c.prefix_len])
    every = sum(per_token[t] for toks in seqs for t in toks)
    assert c.prefix_len == 10 and prefix > 0
    want = every - 2 * prefix if layout == "unified" else every
    got = engine_for(c).build(c).check()["kv_saturated"]
    assert got == want


def test_paged_counts_each_sequences_tokens():
    """Independent sequences in pages of 8: every live slot once, empty slots zero."""
    c = resolve("test", FP8 | {"n_seqs": 2, "context_len": 45, "layout": "paged",
                               "page_size": 8, "workload": "independent",
                               "kernel": "tiled"})  # fmt: skip
    per_token, seqs = token_counts(c), build_paged(workload_of(c), 8)[1].seq_tokens
    want = sum(per_token[t] for toks in seqs for t in toks)
    assert want > 0
    assert engine_for(c).build(c).check()["kv_saturated"] == want


def test_window_counts_the_ring_after_the_step():
    """Context 45, 2 sinks + 8 window: the ring holds positions 0, 1 and 37..44 of each
    sequence (the step's 44 included); the positions that fell out are not counted."""
    c = resolve("test", FP8 | {"n_seqs": 2, "context_len": 45, "layout": "window",
                               "window": 8, "sink_tokens": 2, "kernel": "tiled"})  # fmt: skip
    _, k, v = make_qkv("outliers", (2, c.n_q_heads, 1, 64), (2, 2, 45, 64), c.seed, None)
    held = [0, 1, *range(37, 45)]
    kv = [np.array(x.astype(mx.float16), dtype=np.float32)[:, :, held] for x in (k, v)]
    want = past_bound(kv[0]) + past_bound(kv[1])
    every = sum(past_bound(np.array(x.astype(mx.float16), dtype=np.float32)) for x in (k, v))
    assert 0 < want < every
    assert engine_for(c).build(c).check()["kv_saturated"] == want


def test_formats_that_do_not_saturate_leave_the_column_empty():
    axes = {"n_seqs": 2, "context_len": 20, "layout": "unified", "workload": "independent"}
    c = resolve("test", {"model": "tiny", "kv_dtype": "int4", "kernel": "tiled"} | axes)
    assert "kv_saturated" not in engine_for(c).build(c).check()
