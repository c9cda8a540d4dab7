"""Window layout: ring cells by hand at every wrap, multi-token steps against attention over
the explicitly materialised last-window K/V (+ sinks), the engine's parity and counts, and the
same case run by mlx-lm's RotatingKVCache."""

from __future__ import annotations

import importlib.util
import math

import mlx.core as mx
import numpy as np
import pytest
from conftest import numpy_attention

from kvbench.engines import engine_for
from kvbench.engines.window import filled_ring
from kvbench.errors import SuiteError
from kvbench.kernels.attention.registry import KERNELS
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.stores.window import Ring
from kvbench.suite.suite import resolve


def test_cells_by_hand_across_wraps():
    # 2 sinks, window 4: cells 0, 1 hold positions 0, 1 for ever; positions 2.. cycle 2-5
    r = Ring(window=4, sinks=2)
    cells = [int(r.write(1)[0]) for _ in range(11)]
    assert cells == [0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 2]
    assert r.pos.tolist() == [0, 1, 10, 7, 8, 9]
    # position 10 sees sinks 0, 1 and 7, 8, 9, 10; cell order is not position order
    assert r.visible(10).tolist() == [0, 1, 7, 8, 9, 10]
    assert r.mask([10])[0].tolist() == [True] * 6


def test_before_the_first_wrap_and_short_contexts():
    r = Ring(window=4, sinks=2)
    r.write(1)
    assert r.visible(0).tolist() == [0] and r.mask([0])[0].tolist() == [True] + [False] * 5
    for _ in range(4):
        r.write(1)
    assert r.visible(4).tolist() == [0, 1, 2, 3, 4]  # 5 positions, all still visible


def test_multi_token_steps_grow_the_ring_by_step_minus_one():
    r = Ring(window=4, sinks=1, max_step=3)
    assert r.size == 1 + 4 + 2
    assert r.write(3).tolist() == [0, 1, 2] and r.write(3).tolist() == [3, 4, 5]
    assert r.write(3).tolist() == [6, 1, 2]  # positions 6, 7, 8: the wrap inside the step
    # the first query of the step (6) still sees 3, 4, 5: a ring of 4 would have lost 3 and 4
    assert r.visible(6).tolist() == [0, 3, 4, 5, 6]
    assert r.mask([6, 7, 8]).sum(axis=1).tolist() == [5, 5, 5]
    with pytest.raises(ValueError, match="1 to 3"):
        r.write(4)


def materialised(k, v, ring: Ring, q: int):
    idx = ring.visible(q)
    return k[:, :, idx], v[:, :, idx]


STEPS = [(0, 5, [1, 2, 3, 1, 3, 3, 2, 1, 3, 3]), (2, 4, [3, 3, 1, 2, 3, 3, 3, 1, 2, 3])]


@pytest.mark.parametrize("kernel", ["reference", "sdpa", "ops", "tiled"])
@pytest.mark.parametrize("sinks,window,steps", STEPS)
def test_every_step_matches_attention_over_the_materialised_window(kernel, sinks, window, steps):
    rng = np.random.default_rng(0)
    ctx, hq, hkv, d = sum(steps), 4, 2, 16
    k, v = (rng.standard_normal((1, hkv, ctx, d)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((1, hq, ctx, d)).astype(np.float32)
    ring, fmt = Ring(window, sinks, max_step=max(steps)), get_format("fp32")
    cells_k = np.zeros((1, hkv, ring.size, d), np.float32)
    cells_v = np.zeros_like(cells_k)
    wraps = 0
    for n in steps:
        p0 = ring.next
        cells = ring.write(n)
        wraps += int((np.diff(cells) < 0).any() or cells[0] == sinks and p0 > sinks)
        cells_k[:, :, cells], cells_v[:, :, cells] = k[:, :, p0 : p0 + n], v[:, :, p0 : p0 + n]
        mask = mx.array(ring.mask(range(p0, p0 + n)))[None, None]  # [1, 1, n, cells]
        out = KERNELS[kernel].fn(
            mx.array(q[:, :, p0 : p0 + n]), {"data": mx.array(cells_k)},
            {"data": mx.array(cells_v)}, fmt, mask=mask, scale=1 / math.sqrt(d), tile_kv=2,
        )  # fmt: skip
        for i in range(n):
            kk, vv = materialised(k, v, ring, p0 + i)
            want = numpy_attention(q[:, :, p0 + i : p0 + i + 1], kk, vv, 1 / math.sqrt(d))
            np.testing.assert_allclose(np.array(out)[:, :, i : i + 1], want, atol=3e-5)
    assert wraps >= 3  # the steps crossed the ring's end several times


def case(**kw):
    base = {"model": "tiny", "n_seqs": 2, "kv_dtype": "fp32", "layout": "window", "window": 8}
    return resolve("test", base | kw)


# contexts placing the step before, at, just after and well after wraps of a 2 + 8 ring
@pytest.mark.parametrize("ctx", [3, 10, 11, 12, 18, 19, 37])
@pytest.mark.parametrize("kernel", ["sdpa", "tiled"])
def test_engine_matches_the_materialised_window_at_each_wrap(ctx, kernel):
    c = case(context_len=ctx, sink_tokens=2, kernel=kernel, tile_kv=4)
    state = engine_for(c).build(c)
    acc = state.check()  # parity against the float32 reference over the visible K/V
    assert acc["rel_err"] < 1e-5
    ring = filled_ring(c)
    assert ring.next == ctx - 1 and ring.held() == min(ctx - 1, 10)


@pytest.mark.parametrize("kernel,dtype", [("dequant_sdpa", "int4"), ("tiled", "affine4")])
def test_quantized_rings_pass_the_parity_gate(kernel, dtype):
    c = case(context_len=45, sink_tokens=2, kernel=kernel, kv_dtype=dtype)
    state = engine_for(c).build(c)
    assert state.check()["cosine"] > 0.95  # the gate raises on a mismatch in the format


def test_counts_by_hand():
    # tiny: 2 layers, 2 KV heads, D 64, fp32: one cell of one sequence, K and V, all layers =
    # 2 x 2 x 2 x 64 x 4 = 2048 B. 2 sequences x (4 sinks + 64) cells = 136 cells = 278528 B
    c = case(context_len=300, window=64, sink_tokens=4)
    state = engine_for(c).build(c)
    row = state.extra
    assert row["cells_alloc"] == 136 and row["bytes_alloc"] == 136 * 2048 == state.alloc_bytes
    assert row["bytes_needed"] == 136 * 2048 == state.kv_bytes


@pytest.mark.skipif(importlib.util.find_spec("mlx_lm") is None, reason="mlx-lm not installed")
@pytest.mark.parametrize("ctx", [40, 70, 71])
def test_the_same_case_runs_on_mlx_lm_rotating(ctx):
    outs = {}
    for kernel in ("sdpa", "mlx_lm_rotating"):
        c = case(context_len=ctx, window=32, sink_tokens=4, kernel=kernel)
        state = engine_for(c).build(c)
        acc = state.check()
        # both against the float32 reference over the same materialised sinks + window
        assert acc["rel_err"] < 1e-5
        outs[kernel] = state.alloc_bytes
    assert outs["sdpa"] == outs["mlx_lm_rotating"] == 2 * 2 * 2 * 36 * 2 * 64 * 4  # 36 cells


@pytest.mark.parametrize(
    "kw,key",
    [
        ({"window": None}, "window"),
        ({"layout": "per-stream", "window": None, "sink_tokens": 2}, "sink_tokens"),
        ({"workload": "independent"}, "workload"),
        ({"phase": "prefill"}, "phase"),
    ],
)
def test_bad_window_cases_fail_naming_the_key(kw, key):
    with pytest.raises(SuiteError) as e:
        case(context_len=40, **kw)
    assert e.value.key == key
