"""Paged layout: pages by hand (allocation, prefix sharing, copy-on-write, freeing and reuse),
block tables, masks, and parity of every kernel x read path against each sequence's own K/V."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from conftest import numpy_attention

from kvbench.engines import engine_for
from kvbench.engines.common import make_tables, workload_of
from kvbench.engines.paged import Run
from kvbench.errors import SuiteError
from kvbench.kernels.stores.layouts import CacheFullError
from kvbench.kernels.stores.paged import PagedLayout, gather_pages
from kvbench.kernels.stores.workloads import Workload, build_paged
from kvbench.suite.resolved import of_case
from kvbench.suite.suite import resolve
from kvbench.suite.validate import check_axis


def test_pages_by_hand_shared_prefix_with_copy_on_write():
    # 3 sequences, context 9, prefix 3, pages of 4: the prefix fills 3 slots of one page held
    # by all; sequences 0 and 1 copy it on their first own token, sequence 2 (its last holder)
    # writes in place. Each sequence then holds ceil(9 / 4) = 3 pages: 9 pages, 2 copies.
    lay, rp = build_paged(Workload(3, 9, 3), 4)
    assert lay.n_pages == 9 and lay.pages_used == 9 and lay.cow_pages == 2
    assert [len(t) for t in lay.tables] == [3, 3, 3] and lay.length == [9, 9, 9]
    assert len({t[0] for t in lay.tables}) == 3  # after copy-on-write no first page is shared
    for s in range(3):  # each first page holds the prefix (tokens 0, 1, 2) then its own token
        assert lay.token[lay.tables[s][0]].tolist() == [0, 1, 2, rp.seq_tokens[s][3]]
    # live slots: 3 pages x 4 + 3 full second pages x 4 + 3 x 1 slot = 27; 36 - 27 empty
    assert lay.live_slots == 27 and lay.frag_slots == 9


def test_full_prefix_pages_are_stored_once():
    # prefix 8 = two full pages of 4, shared by 2 sequences of 13 tokens: 2 shared pages +
    # 2 x ceil(5 / 4) = 6 pages, no copy (the sequences' own tokens start on a new page)
    lay, _ = build_paged(Workload(2, 13, 8), 4)
    assert lay.n_pages == 6 and lay.cow_pages == 0
    assert lay.tables[0][:2] == lay.tables[1][:2] and lay.ref[lay.tables[0][0]] == 2


def test_pages_freed_go_back_fifo_and_are_reused():
    lay = PagedLayout(2, 4, 4)
    lay.add([((0,), p, 100 + p) for p in range(6)])  # seq 0: pages 0, 1
    lay.add([((1,), 0, 200)])  # seq 1: page 2
    assert lay.tables == [[0, 1], [2]] and list(lay.free) == [3]
    assert lay.remove(0, 2) == 1  # keeps page 0 (positions 0, 1), frees page 1
    assert lay.token[0].tolist() == [100, 101, -1, -1] and list(lay.free) == [3, 1]
    lay.add([((0,), 2, 300), ((0,), 3, 301), ((0,), 4, 302)])  # refills page 0, then page 3
    assert lay.tables[0] == [0, 3] and list(lay.free) == [1]
    lay.add([((1,), p, 400 + p) for p in range(1, 5)])  # seq 1 fills page 2, takes page 1
    assert lay.tables[1] == [2, 1] and not lay.free
    with pytest.raises(CacheFullError, match="all 4 pages"):
        lay.add([((1,), p, 500 + p) for p in range(5, 9)])


def test_remove_of_a_shared_page_only_drops_a_reference():
    lay = PagedLayout(2, 4, 4)
    lay.add([((0, 1), p, p) for p in range(3)])  # one page, held by both
    assert lay.remove(0, 0) == 0 and lay.ref[0] == 1 and lay.token[0, 2] == 2
    assert lay.remove(1, 0) == 1 and lay.pages_used == 0


def test_churn_frees_and_reuses_pages():
    w = Workload(4, 21, 6, churn=2)
    lay, rp = build_paged(w, 4)
    # prefix 6 = page A (full, shared) + page B (2 slots). Rounds 0-9: 3 copies of B, each
    # sequence at 16 tokens = 4 pages: 1 + 4 x 3 = 13. Sequences 0, 1 finish: each frees its 2
    # pages past the prefix (9 used) and refills its copy of B from slot 2; the freed pages are
    # taken again. At the step every table starts with A: A + 2 + 2 (11 tokens: 3 pages) +
    # 5 + 5 (21 tokens: 6 pages) = 15 pages, the peak
    assert lay.n_pages == lay.pages_used == 15 and rp.freed == 4
    assert [len(t) for t in lay.tables] == [3, 3, 6, 6]
    for s, toks in enumerate(rp.seq_tokens):  # block table order = position order
        assert [lay.token[p, i] for p, i in lay.seq_slots(s)] == toks


def test_block_table_and_mask():
    lay = PagedLayout(2, 4, 5)
    lay.add([((0,), p, p) for p in range(6)] + [((1,), 0, 9)])
    assert lay.block_table([0, 1], 2).tolist() == [[0, 1], [2, 0]]
    m = lay.mask([0, 1], 2)
    assert m.shape == (2, 1, 1, 8)
    assert m[:, 0, 0].tolist() == [[True] * 6 + [False] * 2, [True] + [False] * 7]


def test_gather_pages_lays_pages_out_in_table_order():
    pool = {"data": mx.arange(3 * 2 * 4).reshape(3, 2, 4, 1)}  # [pages, Hkv, P, D]
    out = gather_pages(pool, mx.array([[2, 0]]))["data"]
    assert out.shape == (1, 2, 8, 1)
    expect = np.concatenate([np.array(pool["data"])[2], np.array(pool["data"])[0]], axis=1)
    np.testing.assert_array_equal(np.array(out)[0], expect)


def case(**kw):
    base = {"model": "tiny", "n_seqs": 3, "context_len": 45, "kv_dtype": "fp32"}
    base |= {"layout": "paged", "page_size": 8, "workload": "shared-prefix", "prefix_frac": 0.3}
    return resolve("test", base | kw)


def own_oracle(c, rp, tables) -> np.ndarray:
    q, k_tab, v_tab = (np.array(t) for t in tables)
    outs = [
        numpy_attention(q[s : s + 1], k_tab[:, :, t], v_tab[:, :, t], 1 / math.sqrt(c.head_dim))
        for s, t in enumerate(rp.seq_tokens)
    ]
    return np.concatenate(outs)


PATHS = [
    ("reference", "gather", "fp32"),
    ("sdpa", "gather", "fp32"),
    ("ops", "gather", "fp32"),
    ("tiled", "gather", "fp32"),
    ("tiled", "table", "fp32"),
    ("tiled", "table", "fp16"),
]


@pytest.mark.parametrize("order", ["interleaved", "sequential"])
@pytest.mark.parametrize("kernel,read,dtype", PATHS)
def test_every_kernel_and_read_matches_each_sequences_own_kv(kernel, read, dtype, order):
    c = case(kernel=kernel, page_read=read, kv_dtype=dtype, churn=1, decode_order=order, tile_kv=16)
    tables = make_tables(c, workload_of(c).n_tokens)
    run = Run(c, of_case(c).k_fmt, tables, n_layers=1)
    tol = 2e-5 if dtype == "fp32" else 3e-3
    out = np.array(run.output(0).astype(mx.float32))
    np.testing.assert_allclose(out, own_oracle(c, run.rp, tables), atol=tol)


@pytest.mark.parametrize(
    "kernel,read,dtype",
    [
        ("tiled", "table", "int4"),
        ("dequant_sdpa", "gather", "int4"),
        ("quantized_matmul", "gather", "affine4"),
        ("tiled", "table", "mxfp4"),
    ],
)
def test_quantized_pools_pass_the_parity_gate(kernel, read, dtype):
    c = case(kernel=kernel, page_read=read, kv_dtype=dtype)
    state = engine_for(c).build(c)
    acc = state.check()  # raises ParityError on a mismatch with the reference in int4
    assert acc["cosine"] > 0.98
    for fn in state.stages.values():
        mx.eval(fn())


def test_row_counts_and_allocation():
    c = case(n_seqs=4, context_len=100, page_size=16)
    state = engine_for(c).build(c)
    row = state.extra
    # prefix 30: one full shared page (16), the partial one copied by 3 of 4 sequences;
    # each sequence holds ceil((100 - 16) / 16) = 6 more pages: 1 + 24 = 25 pages
    assert (row["pages_alloc"], row["pages_used"], row["pages_cow"]) == (25, 25, 3)
    assert row["cells_used"] == 16 + 4 * 84 and row["block_table_bytes"] == 4 * 7 * 4
    assert row["page_frag"] == pytest.approx((25 * 16 - 352) / (25 * 16))
    per_slot = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4  # fp32, K and V, all layers
    assert row["bytes_alloc"] == 25 * 16 * per_slot == state.alloc_bytes
    assert row["bytes_touched"] == 4 * 7 * 16 * per_slot and row["bytes_needed"] == 400 * per_slot


@pytest.mark.parametrize(
    "kw,key",
    [
        ({"page_size": None}, "page_size"),
        ({"page_read": "table", "kernel": "sdpa"}, "page_read"),
        ({"workload": "none", "prefix_frac": 0.0}, "layout"),
        ({"layout": "unified"}, "page_size"),
        ({"layout": "unified", "page_size": None, "page_read": "table"}, "page_read"),
    ],
)
def test_bad_paged_cases_fail_naming_the_key(kw, key):
    with pytest.raises(SuiteError) as e:
        case(kernel="tiled", **kw) if "kernel" not in kw else case(**kw)
    assert e.value.key == key


@pytest.mark.parametrize("value", [4, 7, 257, 512, "16"])
def test_page_size_out_of_range_is_refused(value):
    with pytest.raises(SuiteError, match="from 8 to 256"):
        check_axis("test", "page_size", "page_size", value)
