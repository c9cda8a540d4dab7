"""`kvbench plan --shards N --shard-by context|heads`: the fullest rank's bytes and the longest
context N devices of a budget hold, against hand counts."""

import json

import pytest

from kvbench.cli import main
from kvbench.suite.plan import make_plan, resolve_shape

LLAMA3 = resolve_shape("llama-3-8b", None, None, None)  # 32 layers, 8 KV heads, D=128
FP16_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, layers, heads, D, 2 bytes = 131072 B per position


def test_context_split_fullest_rank_holds_the_ceiling_of_the_positions():
    plan = make_plan(LLAMA3, "fp16", context_len=10001, shards=4)
    assert plan.rank_bytes == 2501 * FP16_TOKEN  # 10001 = 2501 + 3 x 2500
    assert plan.model_bytes["total"] == 10001 * FP16_TOKEN


def test_heads_split_uneven():
    plan = make_plan(LLAMA3, "fp16", context_len=1000, shards=3, shard_by="heads")
    assert plan.rank_bytes == 1000 * 2 * 32 * 3 * 128 * 2  # 8 heads = 3 + 3 + 2


def test_budget_is_per_device():
    budget = 8 * 2**30
    one = make_plan(LLAMA3, "fp16", budget_bytes=budget)
    assert one.context_len == budget // FP16_TOKEN == 65536
    four = make_plan(LLAMA3, "fp16", budget_bytes=budget, shards=4)
    assert four.context_len == 4 * 65536 and four.rank_bytes <= budget
    heads = make_plan(LLAMA3, "fp16", budget_bytes=budget, shards=3, shard_by="heads")
    per_position = 2 * 32 * 3 * 128 * 2  # the fullest rank's 3 heads
    assert heads.context_len == budget // per_position == 174762
    assert heads.rank_bytes <= budget < heads.rank_bytes + per_position


def test_quantized_rank_bytes_include_scales():
    plan = make_plan(LLAMA3, "int4", context_len=4096, shards=2, shard_by="heads")
    row = 128 // 2 + 2  # 64 bytes of codes + one fp16 scale per row (int4: per-row scale)
    assert plan.rank_bytes == 4096 * 2 * 32 * 4 * row


def test_cli_json_and_text(capsys):
    args = ["plan", "--model", "llama-3-8b", "--context", "131072", "--shards", "2"]
    assert main([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["rank_bytes"] == 65536 * FP16_TOKEN and plan["shards"] == 2
    assert main(args) == 0
    assert "2 ranks by context: the fullest rank holds 8,589,934,592 B" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--shards", "9", "--shard-by", "heads", "--context", "10"], "n_kv_heads=8"),
        (["--shards", "0", "--context", "10"], "--shards: must be positive"),
        (["--shards", "2", "--shard-by", "rows", "--context", "10"], "--shard-by: unknown"),
        (["--shards", "4", "--context", "3"], "context_len=3"),
    ],
)
def test_bad_sharding_is_one_line_exit_2(extra, says, capsys):
    assert main(["plan", "--model", "llama-3-8b", *extra]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
