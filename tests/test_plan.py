"""`kvbench plan` against the hand calculations of tests/test_quant.py, budgets, bad input."""

import json

import pytest
from test_quant import HAND

from kvbench.cli import main
from kvbench.errors import UserError
from kvbench.spec.plan import make_plan, parse_size, resolve_shape


@pytest.mark.parametrize("model, ctx, seqs, name, group, want", HAND)
def test_plan_matches_hand_calculations(model, ctx, seqs, name, group, want, capsys):
    args = ["plan", "--model", model, "--context", str(ctx), "--format", name, "--json"]
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
        ["--model", "tiny", "--context", "8", "--format", "fp5"],
        ["--model", "tiny", "--context", "8", "--format", "nvfp4", "--group-size", "32"],
        ["--model", "tiny", "--context", "8", "--budget", "1GiB"],
        ["--model", "tiny", "--budget", "lots"],
        ["--model", "tiny", "--budget", "10B"],
        ["--model", "tiny", "--context", "8", "--layout", "unified"],
    ],
)
def test_bad_input_is_one_line_exit_2(args, capsys):
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvbench: ") and err.count("\n") == 1


def test_user_error_type():
    with pytest.raises(UserError):
        parse_size("-3GiB")
