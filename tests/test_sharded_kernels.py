"""The math of sharded decode attention (kernels/attention/sharded.py), without ranks: every rank's
partial
is computed here in one process and the partials are stacked as a collective would deliver them;
the combined output is checked against the float32 reference over the whole cache."""

import math

import mlx.core as mx
import pytest

from kvbench.engines.parity import PARITY_REL_TOL, compare_outputs
from kvbench.kernels.attention import sharded
from kvbench.kernels.attention.registry import KERNELS, reference
from kvbench.kernels.formats.registry import get_format


def make(fmt, hkv=3, group=2, lk=100, d=32, b=1, seed=0):
    kq, kk, kv = mx.random.split(mx.random.key(seed), 3)
    q = mx.random.normal((b, hkv * group, 1, d), key=kq).astype(fmt.compute_dtype)
    k = fmt.encode(mx.random.normal((b, hkv, lk, d), key=kk))
    v = fmt.encode(mx.random.normal((b, hkv, lk, d), key=kv))
    return q, k, v, 1 / math.sqrt(d)


def cut(stored, axis, start, end):
    index = [slice(None)] * 3
    index[axis] = slice(start, end)
    return {name: a[tuple(index)] for name, a in stored.items()}


def context_partials(fmt, q, k, v, scale, parts):
    lk = next(iter(k.values())).shape[2]
    pieces = [
        sharded.partial_attention(q, cut(k, 2, s, e), cut(v, 2, s, e), fmt, scale=scale)
        for s, e in sharded.split_bounds(lk, parts)
    ]
    return mx.stack([o for o, _ in pieces]), mx.stack([lse for _, lse in pieces])


def head_partials(fmt, q, k, v, scale, parts):
    hkv = next(iter(k.values())).shape[1]
    group = q.shape[1] // hkv
    bounds = sharded.split_bounds(hkv, parts)
    outs = [
        sharded.partial_attention(
            q[:, s * group : e * group], cut(k, 1, s, e), cut(v, 1, s, e), fmt, scale=scale
        )[0]
        for s, e in bounds
    ]
    return outs, [(s * group, e * group) for s, e in bounds]


def rel(out, q, k, v, fmt, scale):
    return compare_outputs(out, reference(q, k, v, fmt, scale=scale))["rel_err"]


def test_split_bounds_cover_every_item_once_as_evenly_as_possible():
    assert sharded.split_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert sharded.split_bounds(4, 2) == [(0, 2), (2, 4)]
    for n, parts in ((100, 3), (7, 7), (5, 2), (1000, 8)):
        bounds = sharded.split_bounds(n, parts)
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        sizes = [e - s for s, e in bounds]
        assert max(sizes) - min(sizes) <= 1


def test_split_reason_refuses_an_empty_rank():
    assert sharded.split_reason("heads", 2, 64, 2) is None
    assert "n_kv_heads=2" in sharded.split_reason("heads", 3, 64, 2)
    assert "context_len=2" in sharded.split_reason("context", 3, 2, 8)


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "int4"])
def test_partial_on_the_whole_cache_is_attention(kv_dtype):
    fmt = get_format(kv_dtype)
    q, k, v, scale = make(fmt)
    out = KERNELS["partial"].fn(q, k, v, fmt, scale=scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert rel(out, q, k, v, fmt, scale) <= PARITY_REL_TOL[fmt.compute_dtype]


def test_lse_is_the_log_of_the_softmax_denominator():
    fmt = get_format("fp32")
    q, k, v, scale = make(fmt, hkv=1, group=1, lk=5, d=4)
    _, lse = sharded.partial_attention(q, k, v, fmt, scale=scale)
    s = (q[0, 0, 0] * scale) @ k["data"][0, 0].T  # [5]
    assert abs(lse.reshape(-1)[0].item() - math.log(mx.sum(mx.exp(s)).item())) < 1e-5


@pytest.mark.parametrize("parts", [2, 3, 7])  # 100 positions: 3 and 7 split unevenly
@pytest.mark.parametrize("kv_dtype", ["fp32", "int4"])
def test_context_combines_are_exact(parts, kv_dtype):
    fmt = get_format(kv_dtype)
    q, k, v, scale = make(fmt, lk=100)
    outs, lses = context_partials(fmt, q, k, v, scale, parts)
    gathered = sharded.combine_lse(outs, lses)
    top = mx.max(lses, axis=0)
    summed = sharded.finish_sum(sum(sharded.sum_parts(outs[r], lses[r], top) for r in range(parts)))
    # fp32: exact up to float32 rounding; int4 computes in fp16, so the parity tolerance
    tol = 1e-5 if kv_dtype == "fp32" else PARITY_REL_TOL[fmt.compute_dtype]
    for out in (gathered, summed):
        assert rel(out, q, k, v, fmt, scale) < tol


def test_context_combine_is_exact_where_slices_differ_wildly():
    # one slice holds every large score: a naive average of partials would be far off
    fmt = get_format("fp32")
    q, k, v, scale = make(fmt, lk=64)
    k = {"data": mx.concatenate([k["data"][:, :, :32] * 8, k["data"][:, :, 32:]], axis=2)}
    outs, lses = context_partials(fmt, q, k, v, scale, 2)
    assert rel(sharded.combine_lse(outs, lses), q, k, v, fmt, scale) < 1e-5
    assert rel(mx.mean(outs, axis=0), q, k, v, fmt, scale) > 1e-2


@pytest.mark.parametrize("parts", [2, 3])  # 3 KV heads: 2 ranks split unevenly
def test_head_combines_are_exact(parts):
    fmt = get_format("fp32")
    q, k, v, scale = make(fmt, hkv=3, group=2)
    outs, heads = head_partials(fmt, q, k, v, scale, parts)
    counts = [e - s for s, e in heads]
    padded = mx.stack([sharded.pad_heads(o, max(counts)) for o in outs])
    gathered = sharded.concat_heads(padded, counts)
    summed = sum(sharded.place_heads(o, s, q.shape[1]) for o, (s, _) in zip(outs, heads))
    for out in (gathered, summed):
        assert out.shape == q.shape
        assert rel(out, q, k, v, fmt, scale) < 1e-6


@pytest.mark.parametrize("how", sharded.COMBINES)
def test_collective_combines_on_one_rank_return_the_partial(how):
    group = mx.distributed.init()  # no launcher: the singleton group
    assert group.size() == 1
    fmt = get_format("fp32")
    q, k, v, scale = make(fmt)
    out, lse = sharded.partial_attention(q, k, v, fmt, scale=scale)
    assert rel(sharded.combine_context(out, lse, how, group), q, k, v, fmt, scale) < 1e-6
    heads = [(0, q.shape[1])]
    assert rel(sharded.combine_heads(out, how, group, heads), q, k, v, fmt, scale) < 1e-6


def test_sent_bytes_by_hand():
    # B=1, Hq=8, D=64, 2 ranks; float32 payloads
    assert sharded.sent_bytes("context", "gather", 2, 1, 8, 64, 8) == 8 * 4 * 65  # [o | lse]
    assert sharded.sent_bytes("context", "sum", 2, 1, 8, 64, 8) == 8 * 4 + 8 * 4 * 65
    assert sharded.sent_bytes("heads", "gather", 2, 1, 8, 64, 4) == 4 * 64 * 4
    assert sharded.sent_bytes("heads", "sum", 2, 1, 8, 64, 4) == 8 * 64 * 4
    assert sharded.sent_bytes("heads", "gather", 4, 2, 8, 64, 2) == 3 * 2 * 2 * 64 * 4
    assert sharded.sent_bytes("context", "gather", 1, 1, 8, 64, 8) == 0
