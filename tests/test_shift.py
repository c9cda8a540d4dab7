"""Context shift, self-extend and defrag on the unified layout: after each, attention equals
attention over a freshly built cache at the new positions (RoPE with the case's theta)."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from conftest import numpy_attention

from kvbench.kernels.attention.registry import reference
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.stores.edits import defrag, rope, self_extend, shift
from kvbench.kernels.stores.layouts import Layout, LayoutStore

THETA, HKV, HQ, D = 500000.0, 2, 4, 16


def test_rope_rotations_compose_and_keep_norms():
    x = mx.random.normal((1, 2, 5, D), key=mx.random.key(1))
    a, b = np.arange(5) * 7, np.arange(5) - 3
    np.testing.assert_allclose(rope(rope(x, a, THETA), b, THETA), rope(x, a + b, THETA), atol=1e-5)
    np.testing.assert_allclose(
        mx.linalg.norm(rope(x, a, THETA), axis=-1), mx.linalg.norm(x, axis=-1), rtol=1e-5
    )


def filled(n_tokens: int, n_seqs: int = 1, fmt: str = "fp32"):
    """A unified layout holding seq 0's n_tokens (and seq 1's, interleaved, if n_seqs = 2);
    keys stored rotated at their positions. Returns layout, store, raw K/V tables [1,H,N,D]."""
    lay = Layout("unified", n_seqs, n_seqs * n_tokens)
    tok = iter(range(10**6))
    for p in range(n_tokens):
        lay.add([((s,), p, next(tok)) for s in range(n_seqs)])
    rng = np.random.default_rng(0)
    k_tab, v_tab = (
        rng.standard_normal((1, HKV, n_seqs * n_tokens, D)).astype(np.float32) for _ in range(2)
    )
    store = LayoutStore(lay, get_format(fmt), 2, HKV, D)
    cells = lay.streams[0]
    used = np.flatnonzero(cells.pos >= 0)
    k_rot = rope(mx.array(k_tab[:, :, cells.token[used]]), cells.pos[used], THETA)
    for layer in range(2):
        store.put(
            layer,
            (slice(0, 1), slice(None), mx.array(used)),
            k_rot,
            mx.array(v_tab[:, :, cells.token[used]]),
        )
    return lay, store, k_tab, v_tab


def attend(lay, store, seq, q_raw, q_pos, layer=1):
    """The cached path: query rotated at q_pos, over every cell through the layout's mask."""
    cells = lay.streams[0]
    mask = mx.array(cells.mask([seq], [q_pos], cells.size))[None, None]  # [1, 1, 1, size]
    q = rope(mx.array(q_raw), [q_pos], THETA)
    k, v = store.view(layer, cells.size)
    return np.array(reference(q, k, v, store.fmt, mask=mask, scale=1 / math.sqrt(D)))


def fresh(k_tab, v_tab, tokens, positions, q_raw, q_pos):
    """A freshly built cache: the raw keys rotated at the new positions."""
    k = np.array(rope(mx.array(k_tab[:, :, tokens]), positions, THETA))
    q = np.array(rope(mx.array(q_raw), [q_pos], THETA))
    return numpy_attention(q, k, v_tab[:, :, tokens], 1 / math.sqrt(D))


def own(lay, seq):
    c = lay.streams[0]
    idx = c.seq_cells(seq)
    return c.token[idx], c.pos[idx]


QRAW = np.random.default_rng(1).standard_normal((1, HQ, 1, D)).astype(np.float32)


def test_shift_equals_a_fresh_cache_at_the_new_positions():
    lay, store, k_tab, v_tab = filled(20)
    moved = shift(lay.streams[0], store, 0, keep=4, n=6, theta=THETA)
    assert moved == 10  # positions 10..19 move to 4..13
    tokens, pos = own(lay, 0)
    assert tokens.tolist() == [*range(4), *range(10, 20)] and pos.tolist() == list(range(14))
    want = fresh(k_tab, v_tab, tokens, pos, QRAW, 14)
    np.testing.assert_allclose(attend(lay, store, 0, QRAW, 14), want, atol=2e-5)


def test_shift_in_fp16_stays_within_rounding():
    lay, store, k_tab, v_tab = filled(20, fmt="fp16")
    shift(lay.streams[0], store, 0, keep=2, n=8, theta=THETA)
    tokens, pos = own(lay, 0)
    want = fresh(k_tab, v_tab, tokens, pos, QRAW, len(pos))
    np.testing.assert_allclose(attend(lay, store, 0, QRAW, len(pos)), want, atol=5e-3)


def test_self_extend_divides_the_window_positions():
    lay, store, k_tab, v_tab = filled(24)
    n = self_extend(lay.streams[0], store, 0, p0=4, p1=20, g=4, theta=THETA)
    tokens, pos = own(lay, 0)
    # 0..3 stay; 4..19 -> 4 + (p - 4) // 4 = 4,4,4,4,5,...,7 (all but position 4 move);
    # 20..23 move back by 16 - 4 = 12 to 8..11
    assert pos.tolist() == [0, 1, 2, 3, *np.repeat([4, 5, 6, 7], 4), 8, 9, 10, 11]
    assert n == 15 + 4  # every key of [5, 20) changes position, and 20..23
    want = fresh(k_tab, v_tab, tokens, pos, QRAW, 11)
    np.testing.assert_allclose(attend(lay, store, 0, QRAW, 11), want, atol=2e-5)


def test_defrag_compacts_and_keeps_every_sequences_attention():
    lay, store, k_tab, v_tab = filled(12, n_seqs=2)
    before = attend(lay, store, 1, QRAW, 11)
    lay.remove(0)  # seq 0's cells (every other cell) become holes
    c = lay.streams[0]
    assert c.used_max_p1() == 24 and c.used == 12
    moved = defrag(c, store)
    assert moved == 12  # seq 1's cells 1, 3, ..., 23 -> 0, 1, ..., 11: every one moves
    assert c.used_max_p1() == 12 and (c.pos[:12] >= 0).all() and (c.pos[12:] < 0).all()
    np.testing.assert_allclose(attend(lay, store, 1, QRAW, 11), before, atol=1e-6)


def test_a_shared_cell_refuses_a_position_edit():
    lay = Layout("unified", 2, 8)
    lay.add([((0, 1), 0, 0)])
    store = LayoutStore(lay, get_format("fp32"), 1, HKV, D)
    with pytest.raises(ValueError, match="shared"):
        shift(lay.streams[0], store, 0, keep=0, n=1, theta=THETA)
