"""Many sequences through one model cache (kernels/model/batched.py SeqCache).

Each sequence's logits through the shared cache, per-stream or unified, with its own prompt or
a prompt shared by all, must equal that sequence's own single-sequence run through PlainCache
(kernels/model/cache.py) with the same format and kernel; the cells in use are counted by hand
as llama-batched-bench's N_KV (npl * (pp + tg); a shared prompt: pp + npl * tg unified,
npl * pp + npl * tg per-stream)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from tiny_model import TINY, weights, write_gguf

from kvbench.kernels.model import seam
from kvbench.kernels.model.batched import SeqCache
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.load import load_model
from kvbench.kernels.model.spec import CacheSpec
from kvbench.kernels.stores.layouts import Layout

PP, TG, NPL = 20, 3, 2
RNG = np.random.default_rng(11)
PROMPTS = RNG.integers(0, TINY["vocab"], (NPL, PP))
GEN = RNG.integers(0, TINY["vocab"], (NPL, TG))  # the tokens each sequence decodes (forced)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(write_gguf(tmp_path_factory.mktemp("b") / "t.gguf", weights(seed=5)))


def own_run(tiny, spec, prompt, gen) -> np.ndarray:
    """[pp + tg, vocab]: one sequence alone through PlainCache."""
    cache = make_cache(spec, tiny.config, PP + TG, "reference")
    outs = [seam.forward(tiny, mx.array([[int(t) for t in prompt]]), cache)[0]]
    for t in gen:
        outs.append(seam.forward(tiny, mx.array([[int(t)]]), cache)[0])
    return np.array(mx.concatenate(outs).astype(mx.float32))


def batched_run(tiny, spec, kind: str, shared: bool):
    """(per sequence [pp + tg, vocab] logits (the prompt's when not shared), the cache)."""
    cache = SeqCache(spec, tiny.config, Layout(kind, NPL, PP + TG), "reference")
    if shared:  # one row carries every sequence: PROMPTS[0] is everyone's prompt
        cache.plan([tuple(range(NPL))], PROMPTS[:1])
        first = seam.forward(tiny, mx.array(PROMPTS[:1]), cache)
        outs = [[first[0]] for _ in range(NPL)]
    else:
        cache.plan([(s,) for s in range(NPL)], PROMPTS)
        first = seam.forward(tiny, mx.array(PROMPTS), cache)
        outs = [[first[s]] for s in range(NPL)]
    for t in range(TG):
        cache.plan([(s,) for s in range(NPL)], GEN[:, t : t + 1])
        step = seam.forward(tiny, mx.array(GEN[:, t : t + 1]), cache)
        for s in range(NPL):
            outs[s].append(step[s])
    return [np.array(mx.concatenate(o).astype(mx.float32)) for o in outs], cache


@pytest.mark.parametrize("kind", ["per-stream", "unified"])
@pytest.mark.parametrize("fmt", ["fp32", "q8_0"])
def test_each_sequence_through_the_shared_cache_equals_its_own_run(tiny, kind, fmt):
    spec = CacheSpec(fmt)
    got, cache = batched_run(tiny, spec, kind, shared=False)
    for s in range(NPL):
        want = own_run(tiny, spec, PROMPTS[s], GEN[s])
        np.testing.assert_allclose(got[s], want, atol=2e-4, rtol=1e-4)
    assert cache.layout.cells_used == NPL * (PP + TG)  # N_KV without a shared prompt


@pytest.mark.parametrize("kind", ["per-stream", "unified"])
def test_a_shared_prompt_is_stored_once_unified_and_once_a_stream_per_stream(tiny, kind):
    spec = CacheSpec("q8_0")
    got, cache = batched_run(tiny, spec, kind, shared=True)
    for s in range(NPL):
        want = own_run(tiny, spec, PROMPTS[0], GEN[s])
        np.testing.assert_allclose(got[s], want, atol=2e-4, rtol=1e-4)
    cells = PP + NPL * TG if kind == "unified" else NPL * PP + NPL * TG
    assert cache.layout.cells_used == cells
    # the shared prompt's cells: one cell per token holds both sequences when unified
    held_by_all = sum(int(c.seq.all(axis=1).sum()) for c in cache.layout.streams)
    assert held_by_all == (PP if kind == "unified" else 0)


def test_rewind_restores_the_cells_and_the_same_step_gives_the_same_logits(tiny):
    spec = CacheSpec("q8_0")
    cache = SeqCache(spec, tiny.config, Layout("unified", NPL, PP + TG), "reference")
    cache.plan([(0,), (1,)], PROMPTS)
    mx.eval(seam.forward(tiny, mx.array(PROMPTS), cache), cache.arrays())
    mark = cache.mark()
    outs = []
    for _ in range(2):
        cache.plan([(0,), (1,)], GEN[:, :1])
        outs.append(np.array(seam.forward(tiny, mx.array(GEN[:, :1]), cache)))
        assert cache.layout.cells_used == NPL * (PP + 1)
        cache.rewind(mark)
    assert cache.layout.cells_used == NPL * PP and cache.offset == PP
    np.testing.assert_array_equal(outs[0], outs[1])


def test_refusals_name_the_reason(tiny):
    with pytest.raises(ValueError, match="plain format"):
        SeqCache(CacheSpec("q4_0", "fp16"), tiny.config, Layout("unified", 2, 64), "reference")


def test_without_a_plan_batch_row_b_is_sequence_b(tiny):
    planned = SeqCache(CacheSpec("fp32"), tiny.config, Layout("unified", NPL, 64), "reference")
    planned.plan([(s,) for s in range(NPL)], PROMPTS)
    bare = SeqCache(CacheSpec("fp32"), tiny.config, Layout("unified", NPL, 64), "reference")
    a = seam.forward(tiny, mx.array(PROMPTS.tolist()), planned)
    b = seam.forward(tiny, mx.array(PROMPTS.tolist()), bare)
    np.testing.assert_array_equal(np.array(a), np.array(b))
    assert bare.layout.cells_used == NPL * PP


def test_the_bytes_resident_after_the_fill_are_every_layer_s_own(tiny):
    """After a prefill of both prompts, every layer holds its own K and V store of the layout's
    cells (no layer aliasing another's buffer: MLX hands back a whole-array update itself), and
    MLX's active memory grew by at least all layers' bytes."""
    mx.eval(mx.zeros(1))
    before = mx.get_active_memory()
    cache = SeqCache(CacheSpec("q8_0"), tiny.config, Layout("per-stream", NPL, PP), "reference")
    cache.plan([(s,) for s in range(NPL)], PROMPTS)
    mx.eval(seam.forward(tiny, mx.array(PROMPTS.tolist()), cache), cache.arrays())
    per_layer = 256 * NPL * TINY["n_kv_heads"] * 34 * 2 * 2  # cells, heads, 2 q8_0 blocks, K+V
    for layer in range(TINY["n_layers"]):
        arrays = cache.store.layer_arrays(layer)
        assert sum(a.nbytes for a in arrays) == per_layer
        assert all(np.array(a).any() for a in arrays[:1])  # the fill reached this layer's K
    ids = {id(a) for layer in range(TINY["n_layers"]) for a in cache.store.layer_arrays(layer)}
    assert len(ids) == len(cache.arrays())
    assert mx.get_active_memory() - before >= TINY["n_layers"] * per_layer
