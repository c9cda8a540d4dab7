"""`kvbench plan` against the hand calculations of tests/test_quant.py, budgets, bad input."""

import json

import pytest
from test_quant import HAND

from kvbench.cli import main
from kvbench.engines import engine_for
from kvbench.errors import UserError
from kvbench.suite.plan import LayoutArgs, make_plan, parse_size, resolve_shape
from kvbench.suite.suite import resolve


@pytest.mark.parametrize("model, ctx, seqs, name, group, want", HAND)
def test_plan_matches_hand_calculations(model, ctx, seqs, name, group, want, capsys):
    args = ["plan", "--model", model, "--context", str(ctx), "--kv-dtype", name, "--json"]
    args += ["--n-seqs", str(seqs)] + (["--group-size", str(group)] if group else [])
    assert main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["model_bytes"]["total"] == want
    assert plan["layer"]["total"] * plan["n_layers"] == want
    assert plan["bytes_per_token"] * ctx == want


def test_plan_splits_data_scales_biases():
    plan = make_plan(resolve_shape("llama-3-8b", None, None, None), "affine4", 64, 1, 8192)
    rows = 8 * 8192  # kv heads x positions, one layer
    assert plan.layer == {
        "k_data": rows * 64,  # 128 4-bit codes
        "v_data": rows * 64,
        "scales": 2 * rows * 2 * 2,  # K and V, 2 groups of 64, float16
        "biases": 2 * rows * 2 * 2,
        "total": rows * 144,
    }
    assert plan.scales == "group 64"


@pytest.mark.parametrize(
    "name, data, scales, biases",
    [
        ("q4_1", 64, 2 * 4, 2 * 4),  # 4 blocks of 32: fp16 d (scale) and fp16 m (min) each
        ("q5_0", 64 + 16, 2 * 4, 0),  # the fifth bits are code data: 4 bytes per block
        ("tq3_prod", 32 + 16, 2 + 2, 0),  # 2-bit codes + QJL signs; norm and residual norm
        ("tq4_mse", 64, 2, 0),
    ],
)
def test_plan_counts_every_stored_array(name, data, scales, biases):
    """Bytes per row of D = 128 by hand, split by role; the layer total is every stored array
    (q4_1's mins and q5's fifth bits were once left out of it)."""
    plan = make_plan(resolve_shape("llama-3-8b", None, None, None), name, None, 1, 8192)
    rows = 8 * 8192  # kv heads x positions, one layer
    assert plan.layer == {"k_data": rows * data, "v_data": rows * data,
                          "scales": 2 * rows * scales, "biases": 2 * rows * biases,
                          "total": 2 * rows * (data + scales + biases)}  # fmt: skip
    assert plan.bytes_per_token * 8192 == plan.model_bytes["total"]


def test_text_output(capsys):
    assert main(["plan", "--model", "llama-3-8b", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "1,073,741,824 B" in out and "1.000 GiB" in out and "536,870,912 B" in out


def test_budget_gives_longest_context_that_fits():
    shape = resolve_shape("llama-3-8b", None, None, None)
    plan = make_plan(shape, "fp16", budget_bytes=parse_size("8GiB"))
    assert plan.context_len == 65536  # 8 GiB / 131072 B per token (2*32*8*128*2)
    fp4 = make_plan(shape, "fp4", budget_bytes=parse_size("8GiB"))
    assert fp4.context_len == 8 * 2**30 // (2 * 32 * 8 * 66)  # 254,200
    assert fp4.model_bytes["total"] <= 8 * 2**30
    assert fp4.model_bytes["total"] + fp4.bytes_per_token > 8 * 2**30


def test_explicit_shape_and_sizes():
    shape = resolve_shape(None, 2, 4, 64)
    assert make_plan(shape, "int8", 32, 3, 10).model_bytes["total"] == 2 * 2 * 3 * 4 * 10 * 68
    assert parse_size("16GB") == 16 * 10**9 and parse_size("512MiB") == 2**29
    assert parse_size("1000") == 1000


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "nope", "--context", "8"],
        ["--n-layers", "2", "--context", "8"],
        ["--model", "tiny"],
        ["--model", "tiny", "--context", "0"],
        ["--model", "tiny", "--context", "8", "--kv-dtype", "fp5"],
        ["--model", "tiny", "--context", "8", "--kv-dtype", "nvfp4", "--group-size", "32"],
        ["--model", "tiny", "--budget", "lots"],
        ["--model", "tiny", "--budget", "10B"],
        ["--model", "tiny", "--context", "8", "--layout", "paged"],
        ["--model", "tiny", "--context", "8", "--layout", "paged", "--page-size", "4"],
        ["--model", "tiny", "--context", "8", "--layout", "window"],
        ["--model", "tiny", "--context", "8", "--layout", "ring"],
        ["--model", "tiny", "--context", "8", "--sinks", "4"],
        ["--model", "tiny", "--context", "8", "--prefix", "4"],
        ["--model", "tiny", "--context", "8", "--layout", "unified", "--prefix", "8"],
        # a budget that holds more than the search's limit (#27: was a TypeError)
        ["--model", "llama-3-8b", "--budget", "1000000000TiB"],
        ["--model", "tiny", "--budget", "1000000000TiB", "--layout", "paged", "--page-size", "16"],
        # query heads: positive, and a multiple of the KV heads
        ["--n-layers", "2", "--n-kv-heads", "4", "--head-dim", "64", "--n-q-heads", "0",
         "--context", "8"],
        ["--n-layers", "2", "--n-kv-heads", "4", "--head-dim", "64", "--n-q-heads", "6",
         "--context", "8"],
        # an FP8 scale that is no mode and no positive finite number, or on another format
        *(["--model", "tiny", "--context", "8", "--kv-dtype", "fp8_e4m3", "--fp8-scale", bad]
          for bad in ("0", "-1", "inf", "nan", "big")),
        ["--model", "tiny", "--context", "8", "--kv-dtype", "q4_0", "--fp8-scale", "per_head"],
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2(args, capsys):
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvbench: ") and err.count("\n") == 1


@pytest.mark.parametrize(
    "scale, per_k, shown",
    [("one", 4, "float32 per tensor (1)"), ("0.25", 4, "float32 per tensor (0.25)"),
     ("calibrated", 4, "calibrated on the first prefill"), ("per_head", 32, "per KV head")],
)  # fmt: skip
def test_fp8_scale_bytes_per_mode_by_hand(scale, per_k, shown, capsys):
    """Llama-3-8B (32 layers, 8 KV heads, D 128), context 1024, fp8_e4m3: K and V 1024 x 8 x
    128 = 1,048,576 B a layer each; one float32 scale for a layer's K and one for its V (4 B
    each), or one per KV head (8 x 4 = 32 B each): scales 8 or 64 B a layer, 256 or 2,048 B
    for the model."""
    argv = ["plan", "--model", "llama-3-8b", "--context", "1024", "--kv-dtype", "fp8_e4m3"]
    assert main([*argv, "--fp8-scale", scale, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["layer"] == {"k_data": 1048576, "v_data": 1048576, "scales": 2 * per_k,
                            "biases": 0, "total": 2 * 1048576 + 2 * per_k}  # fmt: skip
    assert got["model_bytes"]["scales"] == 32 * 2 * per_k
    assert got["total_bytes"] == 32 * (2 * 1048576 + 2 * per_k)
    assert got["tensor_scale_bytes"] == per_k and got["fp8_scale"] == scale
    assert main([*argv, "--fp8-scale", scale]) == 0
    text = capsys.readouterr().out
    assert shown in text.splitlines()[0]
    assert f"fp8_scale {scale}: {per_k} B for each layer's K" in text
    assert f"{32 * 2 * per_k:,} B for the model" in text


def test_user_error_type():
    with pytest.raises(UserError):
        parse_size("-3GiB")


TINY = resolve_shape("tiny", None, None, None)  # 2 layers, 2 KV heads, D 64


def test_layout_bytes_by_hand():
    # fp16 tiny: one cell (one position of one sequence), K and V, all layers = 2*2*2*64*2 B
    cell = 1024
    paged = make_plan(
        TINY, "fp16", None, 4, 100, None, "paged", LayoutArgs(page_size=16, prefix=30)
    )
    # one full prefix page + 4 x ceil(84 / 16) = 25 pages; tables 4 x ceil(100 / 16) x 4 B
    assert (paged.pages, paged.cells, paged.block_table_bytes) == (25, 400, 112)
    assert paged.model_bytes["total"] == 400 * cell and paged.total_bytes == 400 * cell + 112
    uni = make_plan(TINY, "fp16", None, 4, 100, None, "unified", LayoutArgs(prefix=30))
    assert uni.cells == 512  # 30 + 4 x 70 = 310, padded to 256
    win = make_plan(TINY, "fp16", None, 2, 10**6, None, "window", LayoutArgs(window=64, sinks=4))
    assert win.cells == 136 and win.model_bytes["total"] == 136 * cell


def test_budget_search_by_layout():
    la = LayoutArgs(page_size=16)
    plan = make_plan(TINY, "fp16", None, 2, None, 100 * 1024 + 64, "paged", la)
    # 2 sequences: 50 cells each = ceil(ctx / 16) pages; 3 pages (48) fit with 2 x 3 x 4 B of
    # tables: 96 cells x 1024 + 24 <= budget; 4 pages would need 128 cells
    assert plan.context_len == 48 and plan.total_bytes <= 100 * 1024 + 64
    ring = make_plan(TINY, "fp16", None, 1, None, 2**20, "window", LayoutArgs(window=8))
    assert ring.context_len is None  # the ring fits, whatever the context
    with pytest.raises(UserError, match="smallest cache"):
        make_plan(TINY, "fp16", None, 1, None, 1000, "unified")


@pytest.mark.parametrize("dtype", ["fp16", "int4"])
@pytest.mark.parametrize(
    "axes,layout,la",
    [
        ({"page_size": 16}, "paged", LayoutArgs(page_size=16, prefix=30)),
        ({"page_size": 8}, "paged", LayoutArgs(page_size=8, prefix=30)),
        ({}, "unified", LayoutArgs(prefix=30)),
    ],
)
def test_plan_bytes_equal_the_measured_allocation(dtype, axes, layout, la):
    base = {"model": "tiny", "n_seqs": 4, "context_len": 100, "kv_dtype": dtype}
    c = resolve(
        "t", base | {"layout": layout, "workload": "shared-prefix", "prefix_frac": 0.3} | axes
    )
    state = engine_for(c).build(c)
    plan = make_plan(TINY, dtype, None, 4, 100, None, layout, la)
    assert state.alloc_bytes == plan.model_bytes["total"]
    assert state.extra.get("block_table_bytes", 0) == plan.block_table_bytes


@pytest.mark.parametrize("dtype", ["fp16", "int4"])
def test_window_plan_equals_the_measured_allocation(dtype):
    base = {"model": "tiny", "n_seqs": 2, "context_len": 300, "kv_dtype": dtype}
    c = resolve("t", base | {"layout": "window", "window": 64, "sink_tokens": 4})
    state = engine_for(c).build(c)
    plan = make_plan(TINY, dtype, None, 2, 300, None, "window", LayoutArgs(window=64, sinks=4))
    assert state.alloc_bytes == plan.model_bytes["total"]


GUARD_CASES = [
    ({"layout": "paged", "page_size": 16, "workload": "shared-prefix", "prefix_frac": 0.3},
     "paged", LayoutArgs(page_size=16, prefix=30)),
    ({"layout": "unified", "workload": "shared-prefix", "prefix_frac": 0.3},
     "unified", LayoutArgs(prefix=30)),
    ({"layout": "window", "window": 64, "sink_tokens": 4, "n_seqs": 1}, "window",
     LayoutArgs(window=64, sinks=4)),
    ({}, "per-stream", LayoutArgs()),
]  # fmt: skip


@pytest.mark.parametrize("axes,layout,la", GUARD_CASES)
def test_the_memory_guard_counts_what_plan_counts(axes, layout, la):
    from kvbench.run.memory import case_plan

    base = {"model": "tiny", "n_seqs": 4, "context_len": 100, "kv_dtype": "int4"}
    c = resolve("t", base | axes)
    plan = make_plan(TINY, "int4", None, c.n_seqs, 100, None, layout, la)
    assert case_plan(c)["cache"] == plan.total_bytes


def test_the_guard_counts_a_window_as_its_ring():
    # a 1M-token window case holds sinks + window cells, not a million: the old guard counted
    # n_seqs x context_len cells (1,024 B each: ~1 GB of cache)
    from kvbench.run.memory import case_plan

    c = resolve("t", {"model": "tiny", "context_len": 10**6, "kv_dtype": "fp16",
                      "layout": "window", "window": 64, "sink_tokens": 4})  # fmt: skip
    plan = make_plan(TINY, "fp16", None, 1, 10**6, None, "window", LayoutArgs(window=64, sinks=4))
    assert plan.total_bytes == 68 * 1024 == case_plan(c)["cache"]


def test_context_and_budget_together_answer_how_many_sequences_fit(capsys):
    """Llama-3-8B fp16: 32 layers x 8 KV heads x 128 x 2 B x 2 (K, V) = 131,072 B a token;
    8,192 tokens a sequence = 1 GiB, so 8 GiB holds 8 sequences per-stream (issue 53)."""
    argv = ["plan", "--model", "llama-3-8b", "--context", "8192", "--budget", "8GiB"]
    assert main(argv) == 0
    assert "8 sequences of 8,192 tokens fit in 8,192.0 MiB (per-stream; 8 hold" in (
        capsys.readouterr().out
    )
    assert main([*argv[:-1], "1GiB", "--kv-dtype", "fp16,q8_0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split(":")[0].strip() == "fp16" and " 1 sequences" in out[0]
    assert " 1 sequences" in out[1]  # q8_0: 1.0625 bytes an element, 1.88 sequences -> 1
