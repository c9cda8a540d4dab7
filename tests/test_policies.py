"""Cache policies (kernels/model/policies/) on hand-made observations: each policy's scores
against an independent numpy transcription of its kvpress press (float64), budgets and layer
budgets by hand, the kept sets, and bad budgets as one-line errors."""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from kvbench.kernels.model import policies as P
from kvbench.kernels.model.policies import adakv, pyramidkv, tova
from kvbench.kernels.model.policies.common import Budget, top
from kvbench.kernels.model.protocol import CachePolicy, Observation

RNG = np.random.default_rng(3)
HQ, HKV, D, N = 4, 2, 16, 40


def obs(n=N, q_n=None, layer=0, rope=None, seed=0):
    rng = np.random.default_rng(seed)
    q_n = q_n or n
    q = rng.standard_normal((1, HQ, q_n, D)).astype(np.float32)
    k = rng.standard_normal((1, HKV, n, D)).astype(np.float32)
    v = rng.standard_normal((1, HKV, n, D)).astype(np.float32)
    pos = np.broadcast_to(np.arange(n), (HKV, n)).copy()
    return Observation(layer, 4, mx.array(q), n - q_n, mx.array(k), mx.array(v), pos, rope)


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_attention(o, first):
    """[Hq, nq, m] float64, causal by position, scale 1/sqrt(D)."""
    q, k = np.array(o.q[0], np.float64)[:, first:], np.array(o.k[0], np.float64)
    k = np.repeat(k, HQ // HKV, axis=0)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(D)
    qpos = np.arange(o.q_start + first, o.n_positions)
    s = np.where(np.arange(k.shape[1])[None, :] <= qpos[:, None], s, -np.inf)
    return softmax(s)


def test_every_policy_is_a_cache_policy():
    for name in P.POLICIES:
        pol = P.make(name, Budget(compression_ratio=0.5))
        assert isinstance(pol, CachePolicy), name


def test_budget_as_kvpress_rounds_it():
    assert Budget(compression_ratio=0.25).kept(1000) == 750
    assert Budget(compression_ratio=0.8).kept(100) == 19  # 100 * 0.2 = 19.999..., truncated
    assert Budget(kv_budget=7).kept(40) == 7


@pytest.mark.parametrize("kw, msg", [
    ({"compression_ratio": 1.0}, "must be in [0, 1)"),
    ({"compression_ratio": -0.1}, "must be in [0, 1)"),
    ({}, "set one of"),
    ({"compression_ratio": 0.5, "kv_budget": 3}, "set one of"),
    ({"kv_budget": 0}, ">= 1"),
])  # fmt: skip
def test_bad_budgets(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace(")", r"\)")):
        Budget(**kw)


def test_budget_larger_than_context_and_sinks_larger_than_budget():
    with pytest.raises(ValueError, match="larger than the context"):
        Budget(kv_budget=50).kept(40)
    with pytest.raises(ValueError, match="smaller than the 4 sinks"):
        P.make("window", Budget(kv_budget=3)).select(obs())


def test_unknown_policy_and_parameter():
    with pytest.raises(ValueError, match="unknown policy 'lru'"):
        P.make("lru", Budget(kv_budget=3))
    with pytest.raises(ValueError, match="policy knorm takes no kernel_size"):
        P.make("knorm", Budget(kv_budget=3), kernel_size=3)


def test_top_breaks_ties_to_the_lower_cell():
    keep = top(np.array([[1.0, 2.0, 2.0, 0.5]]), 2)
    assert keep.tolist() == [[False, True, True, False]]
    keep = top(np.array([[1.0, 1.0, 1.0, 1.0]]), 2)
    assert keep.tolist() == [[True, True, False, False]]


def test_window_keeps_sinks_and_the_newest_as_streamingllm_press():
    o = obs()
    keep = P.make("window", Budget(compression_ratio=0.5), sinks=4).select(o)
    # kvpress: n_pruned = 40 - int(40 * 0.5) = 20 positions after the 4 sinks go
    want = np.r_[0:4, 24:40]
    for h in range(HKV):
        assert np.flatnonzero(keep[h]).tolist() == want.tolist()


def test_knorm_keeps_the_smallest_key_norms():
    o = obs()
    keep = P.make("knorm", Budget(kv_budget=10)).select(o)
    norms = np.linalg.norm(np.array(o.k[0]), axis=-1)
    for h in range(HKV):
        assert set(np.flatnonzero(keep[h])) == set(np.argsort(norms[h])[:10])


def np_snapkv(o, window, kernel):
    attn = np_attention(o, o.q.shape[2] - window)[..., : N - window]  # [Hq, w, N - w]
    s = attn.mean(axis=1)  # [Hq, N - w]
    p = kernel // 2
    padded = np.pad(s, ((0, 0), (p, p)))
    s = np.stack([padded[:, i : i + N - window] for i in range(kernel)]).sum(0) / kernel
    s = s.reshape(HKV, HQ // HKV, -1).mean(axis=1)
    return np.concatenate([s, np.full((HKV, window), s.max() + 1)], axis=1)


def test_snapkv_scores_against_numpy():
    o = obs()
    pol = P.make("snapkv", Budget(compression_ratio=0.5), window=8, kernel_size=5)
    pol.observe(o)
    got = np.array(pol.score(o))
    want = np_snapkv(o, 8, 5)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
    keep = pol.select(o)
    assert keep[:, -8:].all() and (keep.sum(axis=1) == 20).all()


def test_snapkv_window_spans_passes():
    """The observation window joins the last queries of two passes."""
    full = obs()
    pol = P.make("snapkv", Budget(compression_ratio=0.5), window=8, kernel_size=3)
    q = full.q
    for a, b in ((0, 36), (36, 40)):
        part = Observation(0, 4, q[:, :, a:b], a, full.k[:, :, :b], full.v[:, :, :b],
                           full.positions[:, :b], None)  # fmt: skip
        pol.observe(part)
    np.testing.assert_allclose(np.array(pol.score(full)), np_snapkv(full, 8, 3), rtol=2e-5)


def test_snapkv_context_must_exceed_window():
    o = obs(n=8)
    pol = P.make("snapkv", Budget(compression_ratio=0.5), window=8)
    pol.observe(o)
    with pytest.raises(ValueError, match="not longer than window 8"):
        pol.select(o)


def test_tova_last_query_head_averaged():
    o = obs()
    s = np.array(tova.scores(o))
    attn = np_attention(o, N - 1)[:, 0, :-1].mean(axis=0)  # [N - 1]
    want = np.concatenate([attn, [attn.max() + 1]])
    for h in range(HKV):
        np.testing.assert_allclose(s[h], want, rtol=2e-5, atol=1e-7)


def np_rope(x, positions, base=10000.0):
    """HF's rotate_half RoPE in float64: x [H, n, D] at positions."""
    inv = 1.0 / base ** (np.arange(0, D, 2) / D)
    ang = np.asarray(positions)[:, None] * inv[None]
    cos, sin = np.cos(np.r_["-1", ang, ang]), np.sin(np.r_["-1", ang, ang])
    half = np.concatenate([-x[..., D // 2 :], x[..., : D // 2]], axis=-1)
    return x * cos + half * sin


def test_expected_attention_against_numpy():
    rope = nn.RoPE(D, base=10000.0)
    rng = np.random.default_rng(5)
    q_pre = rng.standard_normal((HQ, N, D))
    q_post = np_rope(q_pre, np.arange(N))
    o = obs(rope=rope)
    o = Observation(0, 4, mx.array(q_post[None].astype(np.float32)), 0, o.k, o.v, o.positions, rope)
    pol = P.make("expected_attention", Budget(compression_ratio=0.5), n_sink=4, n_future=32)
    pol.observe(o)
    got = np.array(pol.score(o))
    # kvpress: statistics of queries n_sink.., averaged rotation over N .. N + 31
    q = q_pre[:, 4:]
    mu = q.mean(axis=1)
    cov = np.einsum("hsi,hsj->hij", q - mu[:, None], q - mu[:, None]) / q.shape[1]
    r = np.mean([np_rope(np.eye(D)[None], [p] * D)[0].T for p in range(N, N + 32)], axis=0)
    mu, cov = mu @ r.T, r @ cov @ r.T
    k = np.repeat(np.array(o.k[0], np.float64)[:, 4:], HQ // HKV, axis=0)
    s = np.einsum("hnd,hd->hn", k, mu) / math.sqrt(D)
    s += np.einsum("hni,hij,hnj->hn", k, cov, k) / D / 2
    s = softmax(s).reshape(HKV, HQ // HKV, -1).mean(axis=1)
    s = s * np.linalg.norm(np.array(o.v[0], np.float64)[:, 4:], axis=-1)
    want = np.concatenate([np.full((HKV, 4), s.max() + 1), s], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def test_pyramidkv_layer_budgets_by_hand():
    # n 1000, ratio 0.5, window 64, beta 20: max_capacity 564, min 25, max 975 -> clipped to
    # 936 (n - window), min 64; 4 layers: 936, 645.33 -> 645, 354.67 -> 355, 64
    got = [pyramidkv.layer_budget(1000, 0.5, 64, 20, i, 4) for i in range(4)]
    assert got == [936, 645, 355, 64]
    assert sum(got) == 4 * 500
    # too short for the pyramid: every layer round(n (1 - ratio))
    assert pyramidkv.layer_budget(100, 0.5, 64, 20, 0, 4) == 50


def test_adakv_budgets_sum_and_safeguard():
    s = np.array([[9, 8, 7, 6, 5, 4, 3, 2], [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]], np.float32)
    keep = adakv.select(s, 4, 0.5)  # safeguard int(4 * 0.5) = 2 per head; 8 removed in all
    assert keep.sum() == 8
    assert keep[1, :2].all()  # the low head keeps its safeguard
    assert keep.sum(axis=1).tolist() == [6, 2]


def test_h2o_keeps_recent_and_heaviest():
    o = obs(n=12)
    pol = P.make("h2o", Budget(kv_budget=6), recent_share=0.5)
    pol.observe(o)
    keep = pol.select(o)
    acc = np_attention(o, 0).sum(axis=1).reshape(HKV, HQ // HKV, -1).sum(axis=1)
    for h in range(HKV):
        heavy = np.argsort(-acc[h, :9], kind="stable")[:3]
        assert set(np.flatnonzero(keep[h])) == set(heavy) | {9, 10, 11}
