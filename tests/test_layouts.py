"""Cell metadata, slot finding, sharing, freeing, masks and n_kv; hand-worked workloads."""

from __future__ import annotations

import numpy as np
import pytest

from kvbench.kernels.stores.layouts import CacheFullError, Cells, Layout, pad_to
from kvbench.kernels.stores.workloads import Workload, build_layout


def occupy(cells: Cells, idxs, seq: int, pos0: int = 0) -> None:
    idxs = np.asarray(idxs)
    rows = np.zeros((len(idxs), cells.seq.shape[1]), bool)
    rows[:, seq] = True
    cells.apply(idxs, np.arange(pos0, pos0 + len(idxs)), rows, np.arange(len(idxs)))


def test_pad_to():
    assert [pad_to(n, 256) for n in (1, 256, 257, 1000)] == [256, 256, 512, 1024]


def test_find_slot_from_head_then_next():
    c = Cells(8, 2)
    assert c.find_slot(3).tolist() == [0, 1, 2]
    occupy(c, [0, 1, 2], seq=0)
    assert c.head == 3 and c.used == 3
    assert c.find_slot(2).tolist() == [3, 4]


def test_find_slot_wraps_around():
    c = Cells(8, 2)
    occupy(c, [2, 3, 4, 5], seq=0)  # head moves to 6
    # from the head: 6, 7, then wrap to 0, 1 (used 4, head 6 <= 4 + 2*4: no early reset)
    assert c.find_slot(4).tolist() == [6, 7, 0, 1]


def test_find_slot_gathers_holes_and_resets_head():
    c = Cells(8, 2)
    occupy(c, [0, 2, 4, 7], seq=0)  # head 8
    # head 8 > used 4 + 2*1: llama.cpp restarts the search at 0, finding the hole at 1
    assert c.find_slot(1).tolist() == [1]
    c.head = 3
    assert c.find_slot(3).tolist() == [3, 5, 6]  # not contiguous: holes are gathered


def test_full_cache_fails_clearly():
    c = Cells(4, 1)
    occupy(c, [0, 1, 2], seq=0)
    with pytest.raises(CacheFullError, match="1 of 4 cells free"):
        c.find_slot(2)
    with pytest.raises(CacheFullError, match="do not fit"):
        c.find_slot(5)


def test_shared_prefix_is_stored_once_in_unified_and_per_stream_copies_it():
    prefix = [((0, 1, 2), p, p) for p in range(3)]
    uni = Layout("unified", 3, 8, pad=4)
    uni.add(prefix)
    assert uni.cells_used == 3  # one cell per prefix token, held by all three sequences
    assert uni.streams[0].seq[:3].all()
    per = Layout("per-stream", 3, 8, pad=4)
    per.add(prefix)
    assert per.cells_used == 9  # each stream holds its own copy
    assert [per.seq_cells(s)[1].tolist() for s in range(3)] == [[0, 1, 2]] * 3


def test_removing_a_sequence_frees_only_cells_nobody_else_holds():
    lay = Layout("unified", 2, 8, pad=4)
    lay.add([((0, 1), 0, 0), ((0, 1), 1, 1)])  # shared prefix: cells 0, 1
    lay.add([((0,), 2, 2), ((1,), 2, 3)])  # diverged at pos 2: cells 2 (seq 0), 3 (seq 1)
    assert lay.remove(0) == 1  # only cell 2 was seq 0's alone
    cells = lay.streams[0]
    assert cells.pos.tolist()[:4] == [0, 1, -1, 2] and cells.used == 3
    assert cells.head == 2  # the head moves back to the freed cell
    assert lay.remove(1) == 3  # now the prefix cells are nobody's
    assert cells.used == 0


def test_remove_from_position_keeps_the_prefix():
    lay = Layout("unified", 2, 8, pad=4)
    lay.add([((0, 1), p, p) for p in range(2)])
    lay.add([((0,), 2, 2), ((0,), 3, 3)])
    assert lay.remove(0, p0=2) == 2  # positions 2 and 3 go, the shared 0 and 1 stay
    assert lay.seq_cells(0)[1].tolist() == [0, 1]


def test_mask_by_sequence_and_position():
    # cells: 0 pos0 {0,1} | 1 pos1 {0,1} | 2 pos2 {0} | 3 pos2 {1} | 4 pos3 {1} | 5.. empty
    lay = Layout("unified", 2, 8, pad=4)
    lay.add([((0, 1), 0, 0), ((0, 1), 1, 1)])
    lay.add([((0,), 2, 2), ((1,), 2, 3)])
    lay.add([((1,), 3, 4)])
    m = lay.mask([(0, [0, 1, 1], [2, 3, 2])], n_kv=8)
    assert m.shape == (1, 1, 3, 8)
    expect = [
        [1, 1, 1, 0, 0, 0, 0, 0],  # seq 0 at pos 2: prefix + its own pos 2
        [1, 1, 0, 1, 1, 0, 0, 0],  # seq 1 at pos 3: prefix + its pos 2 and 3
        [1, 1, 0, 1, 0, 0, 0, 0],  # seq 1 at pos 2: its future (pos 3) is hidden
    ]
    assert m[0, 0].astype(int).tolist() == expect


def test_n_kv_is_last_used_cell_padded():
    lay = Layout("unified", 1, 12, pad=4)
    assert lay.size == 12 and lay.n_kv() == 4  # empty: at least one pad
    lay.add([((0,), p, p) for p in range(5)])
    assert lay.n_kv() == 8  # last used cell 4 -> 5 -> padded to 8
    lay.add([((0,), p, p) for p in range(5, 11)])
    assert lay.n_kv() == 12  # 11 -> 12, never beyond the size


def test_hand_worked_shared_prefix_counts():
    # 3 sequences, context 9 (the step decodes position 8), prefix 3: each sequence generates
    # T = 9 - 1 - 3 = 5 tokens, then the step adds 1.
    w = Workload(n_seqs=3, context_len=9, prefix_len=3)
    per, _ = build_layout(w, "per-stream", pad=4)
    # per-stream: every stream 3 + 5 + 1 = 9 cells; size pad(9, 4) = 12 per stream
    assert (per.cells_used, per.cells_alloc) == (27, 36)
    uni, rp = build_layout(w, "unified", pad=4)
    # unified: prefix once (3) + 3 x (5 + 1) own = 21; peak 21 -> size pad(21, 4) = 24
    assert (uni.cells_used, uni.cells_alloc) == (21, 24)
    # interleaved: round r puts seq s at cell 3 + 3r + s; the step at 18, 19, 20
    assert rp.step_slots == [(0, 18), (0, 19), (0, 20)]
    assert uni.seq_cells(1)[1].tolist() == [0, 1, 2, 4, 7, 10, 13, 16, 19]


def test_hand_worked_churn_counts_interleaved():
    # as above with churn 1: seq 0 finishes after 3*5//4 = 3 tokens; its replacement generates
    # the other 2, then the step.
    w = Workload(n_seqs=3, context_len=9, prefix_len=3, churn=1)
    per, rp = build_layout(w, "per-stream", pad=4)
    # stream 0: 3 prefix + 2 + 1 = 6; streams 1, 2: 9 each -> 24 used of 3 x 12
    assert (per.cells_used, per.cells_alloc, rp.freed) == (24, 36, 3)
    uni, rp = build_layout(w, "unified", pad=4)
    # 3 prefix + 3 rounds x 3 = 12; free seq 0's 3 (cells 3, 6, 9) -> 9; rounds 3, 4 refill
    # 3, 6, 9 then 12, 13, 14 -> 15; step 15, 16, 17 -> 18. Peak 18 -> size 20.
    assert (uni.cells_used, uni.cells_alloc, rp.freed) == (18, 20, 3)
    assert rp.step_slots == [(0, 15), (0, 16), (0, 17)]
    assert uni.seq_cells(0)[1].tolist() == [0, 1, 2, 3, 12, 15]
    assert [len(t) for t in rp.seq_tokens] == [6, 9, 9]


def test_hand_worked_churn_sequential_leaves_a_hole():
    # sequential: seq 0 (3 tokens, cells 3-5), seq 1 (6-10), seq 2 (11-15): 16 used; seq 0
    # finishes (3-5 free, head 3); its replacement takes 3, 4; the step batch takes 5, 16, 17.
    w = Workload(n_seqs=3, context_len=9, prefix_len=3, order="sequential", churn=1)
    uni, rp = build_layout(w, "unified", pad=4)
    assert rp.step_slots == [(0, 5), (0, 16), (0, 17)]
    assert (uni.cells_used, uni.cells_alloc) == (18, 20)


def test_only_the_true_prefix_shares_tokens():
    w = Workload(n_seqs=2, context_len=8, prefix_len=3)
    _, rp = build_layout(w, "unified", pad=4)
    a, b = rp.seq_tokens
    assert a[:3] == b[:3]  # the prefix: same tokens, same K/V
    assert not set(a[3:]) & set(b[3:])  # after divergence: never the same token, even at
    # the same position


def test_workload_rejects_impossible_settings():
    with pytest.raises(ValueError, match="prefix_len"):
        Workload(2, 8, prefix_len=8)
    with pytest.raises(ValueError, match="churn"):
        Workload(2, 8, churn=3)


def test_n_kv_per_stream_is_per_call():
    # churn example above: stream 0 holds 6 cells (n_kv pad(6, 4) = 8), streams 1, 2 hold 9
    # (pad(9, 4) = 12). A call over all streams uses the largest; a call over one its own.
    w = Workload(n_seqs=3, context_len=9, prefix_len=3, churn=1)
    per, _ = build_layout(w, "per-stream", pad=4)
    assert (per.n_kv(), per.n_kv([0]), per.n_kv([1])) == (12, 8, 12)
