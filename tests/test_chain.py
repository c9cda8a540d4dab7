"""The cache engine chains layers: layer l+1's query is layer l's output (as in a model)."""

from __future__ import annotations

import mlx.core as mx

from kvbench.case import Case
from kvbench.engines import cache as cache_engine
from kvbench.engines.contract import carrying
from kvbench.kernels.attention import registry as attention


def test_each_layer_attends_with_the_previous_layers_output(monkeypatch):
    seen = []

    def spy(q, k, v, fmt, **kw):
        out = attention.ops(q, k, v, fmt, **kw)
        seen.append((q, out))
        return out

    monkeypatch.setitem(attention.KERNELS, "ops", attention.Kernel(spy, attention.dense_only))
    case = Case(
        model="custom",
        n_layers=3,
        n_q_heads=4,
        n_kv_heads=2,
        head_dim=8,
        context_len=16,
        kernel="ops",
        kv_dtype="fp32",
    )
    state = carrying(cache_engine.build)(case)
    seen.clear()
    mx.eval(state.stages["step"]())
    assert len(seen) == 3
    for (_, prev_out), (next_q, _) in zip(seen, seen[1:]):
        assert next_q is prev_out or mx.array_equal(next_q, prev_out).item()
