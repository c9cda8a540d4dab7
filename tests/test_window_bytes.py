"""Bytes of sliding-window layers (#33 item 7): every byte count (a model row's kv_bytes,
`kvbench plan`, the memory guard) counts each layer at its own positions, a window layer
min(context, window); the ring is sized by what one forward writes. Figures by hand for
gemma3-270m's shape: 18 layers, 1 KV head, head_dim 256, every 6th layer global, the other 15
a 512-position window."""

from __future__ import annotations

import pytest

from kvbench.case import Case
from kvbench.kernels.model.spec import CacheSpec, kv_bytes
from kvbench.kernels.stores.footprint import layer_cells
from kvbench.suite import plan
from kvbench.suite.cache_spec import spec_of
from kvbench.suite.presets import PRESETS

GEMMA = PRESETS["gemma3-270m"]
FP16_ROW = 256 * 2  # one position of one head's K (or V), fp16
Q4_0_ROW = 8 * 18  # 256 channels = 8 ggml blocks of 32, 18 bytes each (16 data + fp16 scale)


def test_gemma_preset_has_its_window_layers():
    assert [w is None for w in GEMMA.windows] == [(i + 1) % 6 == 0 for i in range(18)]
    assert {w for w in GEMMA.windows if w} == {(512, 0)}


@pytest.mark.parametrize("ctx,want", [(8192, [512] * 5 + [8192]), (300, [300] * 6)])
def test_layer_positions(ctx, want):
    assert layer_cells(ctx, GEMMA.windows, 18) == want * 3
    assert layer_cells(ctx, (), 4) == [ctx] * 4
    with pytest.raises(ValueError, match="3 layer windows for 4 layers"):
        layer_cells(ctx, (None,) * 3, 4)


@pytest.mark.parametrize(
    "ctx,positions", [(8192, 3 * 8192 + 15 * 512), (2048, 3 * 2048 + 15 * 512), (100, 18 * 100)]
)
def test_model_spec_bytes_count_each_layer(ctx, positions):
    # 8192: 3 global layers x 8192 + 15 window layers x 512 = 32,256 positions (not 147,456)
    got = kv_bytes(CacheSpec("fp16"), ctx, 18, 1, 256, windows=GEMMA.windows)
    assert got == 2 * positions * FP16_ROW
    assert kv_bytes(CacheSpec("fp16"), 8192, 18, 1, 256) == 2 * 18 * 8192 * FP16_ROW  # no windows


def test_plan_counts_window_layers_and_its_budget_inverts_them():
    shape = plan.resolve_shape("gemma3-270m", None, None, None)
    p = plan.make_plan(shape, "q4_0", context_len=8192)
    assert p.layer["total"] == 2 * 8192 * Q4_0_ROW == 2_359_296  # a global layer
    assert p.total_bytes == 2 * (3 * 8192 + 15 * 512) * Q4_0_ROW == 9_289_728
    assert p.layer_positions == ([512] * 5 + [8192]) * 3
    assert "15 of 18 hold 512 positions" in plan.render(p)
    # the budget search counts the same bytes: exactly 8192's bytes fit 8192 tokens, not 8193
    assert plan.make_plan(shape, "q4_0", budget_bytes=9_289_728).context_len == 8192
    # --n-layers changes the model: its windows no longer apply, every layer counted whole
    four = plan.resolve_shape("gemma3-270m", 4, None, None)
    assert plan.make_plan(four, "q4_0", context_len=8192).total_bytes == 4 * 2 * 8192 * Q4_0_ROW


def _case(phase: str, **kw) -> Case:
    return Case("gemma3-270m", 18, 4, 1, 256, 8192, phase=phase, kv_dtype="fp16", **kw)


def test_the_guard_plans_each_layers_allocation():
    """The guard plans what is allocated: a window layer's ring is window + one forward's
    positions - 1 cells (kernels/stores/window.py): 512 + 511 for every model phase's prefill
    in ubatches of 512 (quality's chunks too, as llama-perplexity's n_ubatch), not 512 + 8191
    for one forward over an 8192-token chunk."""
    from kvbench.suite.model_plan import model_plan

    def plan_of(c, *args):  # the plan of a case with its own cache spec, as of_case makes it
        return model_plan(c, spec_of(c), *args)

    task = plan_of(_case("retrieval", task="passkey"), 262144, GEMMA.windows)
    cells = 3 * 8192 + 15 * 1023
    assert task["cache"] == 2 * cells * FP16_ROW == 40_879_104
    assert task["reference"] == 2 * cells * 256 * 4  # the float32 cache, the same layers
    quality = plan_of(_case("quality"), 262144, GEMMA.windows)
    assert quality["cache"] == task["cache"] == 2 * (3 * 8192 + 15 * 1023) * FP16_ROW
    assert quality["scores"] == 2 * 4 * 512 * 8192 * 4  # 4 query heads, 512 queries, float32
    # the reference's 4,096 scored rows of 262,144 log-probabilities and one 512-row micro-batch
    # of the row's own (compared as each is computed), not a second chunk's: 4.8 GB, not 8.6
    assert quality["logits"] == (4096 + 512) * 262144 * 4 == 4_831_838_208
    # a case window makes every layer a ring of window + sinks + 511
    win = plan_of(_case("retrieval", task="passkey", window=1000, sink_tokens=24), 1, ())
    assert win["cache"] == 2 * 18 * (1024 + 511) * FP16_ROW
    # without windows (a shape whose layers differ from the model's): every layer whole
    assert plan_of(_case("retrieval", task="passkey"), 1, ())["cache"] == 2 * 18 * 8192 * FP16_ROW
    # `kvbench plan` counts what a layer holds (min(context, window)), the rows' kv_bytes too
    shape = plan.resolve_shape("gemma3-270m", None, None, None)
    assert plan.make_plan(shape, "fp16", context_len=8192).total_bytes == 2 * 32_256 * FP16_ROW


# ---- a tiny gemma3_text (tests/tiny_model.py: layers 0-2 a window of 8, layer 3 global) ------


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    from tiny_model import write_random_mlx_dir, write_tokenizer_json

    path = tmp_path_factory.mktemp("g") / "g"
    return str(write_tokenizer_json(write_random_mlx_dir(path, "gemma3_text", n_layers=4)))


def test_metadata_windows_are_the_loaded_models(tiny_gemma):
    """`kvbench plan` and the guard read the windows from the metadata (the architecture built
    with lazy weights); the loaded model reports the same through its own make_cache."""
    from kvbench.engines import common
    from kvbench.kernels.model.source import model_shape

    assert model_shape(tiny_gemma).windows == ((8, 0), (8, 0), (8, 0), None)
    assert common.model_of(tiny_gemma)[0].config.windows == model_shape(tiny_gemma).windows


def test_model_rows_count_their_layers_and_the_ring_is_one_forward(tiny_gemma):
    import mlx.core as mx

    from kvbench.engines import common
    from kvbench.kernels.model.cache import make_cache
    from kvbench.kernels.model.run import prefill
    from kvbench.run import memory

    case = Case(tiny_gemma, 4, 4, 2, 64, 40, phase="quality", kv_dtype="fp16")
    row = 2 * 2 * 64 * 2  # K and V, 2 KV heads, head_dim 64, fp16
    assert common.model_kv_bytes(case, spec_of(case)) == (3 * 8 + 40) * row  # not 4 x 40
    assert common.model_kv_bytes(case, spec_of(case), 5) == 4 * 5 * row
    # the guard plans the allocation: quality's one forward of 40 makes rings of 8 + 39
    assert memory.case_plan(case)["cache"] == (3 * 47 + 40) * row
    # the case resolved says the same cells per layer, and the cache spec the engine reads
    from kvbench.suite.resolved import of_case

    assert of_case(case).layer_cells == (47, 47, 47, 40)
    assert of_case(case).spec == CacheSpec("fp16")
    # ring: window 8 + one forward's 4 tokens - 1 = 11 cells, not 8 + capacity 40 - 1
    model = common.model_of(tiny_gemma)[0]
    cache = make_cache(CacheSpec("fp16"), model.config, 40, "sdpa", max_step=4)
    prefill(model, cache, list(range(1, 41)), 4)
    mx.eval(cache.arrays())
    assert [s.ring.size for s in cache.stores[:3]] == [11] * 3
    assert cache.stores[3].kv.capacity == 40
