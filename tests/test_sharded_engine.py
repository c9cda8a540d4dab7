"""The sharded engine (harness/engines/sharded.py, sharded_rank.py): suite checks, the byte
model by hand, the job's error mapping, and two real local ranks over loopback (mlx.launch,
ring backend) with uneven splits: context 101 over 2 ranks, 3 KV heads over 2 ranks."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvbench.case import Case
from kvbench.engines import engine_for, sharded
from kvbench.engines.contract import carrying
from kvbench.engines.parity import ParityError
from kvbench.errors import SuiteError
from kvbench.run.session import run_suite
from kvbench.suite.cache_spec import format_of
from kvbench.suite.suite import expand, load_suite

# 2 layers, 6 q heads, 3 KV heads (not divisible by 2), D=32, 101 positions (odd)
SHAPE = dict(model="custom", n_layers=2, n_q_heads=6, n_kv_heads=3, head_dim=32)
LIMIT_S = "60"  # each launch of the ranks, start-up included


def case(**kw) -> Case:
    base = dict(SHAPE, context_len=101, kernel="partial", kv_dtype="fp32", shards=2)
    return Case(**{**base, **kw})


def test_claims_only_more_than_one_rank():
    assert engine_for(case()).claims is sharded.claims
    assert engine_for(case(shards=1)).claims is not sharded.claims


def test_rank_bytes_by_hand():
    row = 32 * 4  # fp32 row of D=32
    assert sharded.rank_bytes(case(), format_of(case(kv_dtype="fp32"))) == 2 * 2 * 51 * 3 * row
    heads = case(shard_by="heads")
    assert sharded.rank_bytes(heads, format_of(case(kv_dtype="fp32"))) == 2 * 2 * 2 * 101 * row


def test_sent_bytes_per_step_by_hand():
    # per layer: context gather sends [o | lse] of 6 q heads: 6 * 33 floats; 2 layers
    assert sharded.step_sent_bytes(case()) == 2 * 6 * 33 * 4
    # heads gather: the largest rank's 2 KV heads = 4 q heads of 32 floats
    assert sharded.step_sent_bytes(case(shard_by="heads")) == 2 * 4 * 32 * 4


SUITE = """
name: t
settings: {warmup_s: 0.0, min_samples: 3, max_samples: 4, budget_s: 0.05, rounds: 1}
fixed: {model: custom, n_layers: 2, n_q_heads: 6, n_kv_heads: 3, head_dim: 32, kv_dtype: fp32}
"""


@pytest.mark.parametrize(
    "sweep, key, says",
    [
        ("{shards: [2], kernel: [sdpa], context_len: [64]}", "kernel", "shards > 1 runs kernel"),
        ("{shards: [4], shard_by: [heads], kernel: [partial], context_len: [64]}", "shards",
         "n_kv_heads=3"),
        ("{shards: [2], phase: [prefill], kernel: [partial], context_len: [64]}", "phase",
         "decode only"),
        ("{shards: [3], kernel: [partial], context_len: [2]}", "shards", "context_len=2"),
        ("{shards: [2], shard_by: [rows], kernel: [partial], context_len: [64]}", "shard_by",
         "unknown value"),
    ],
)  # fmt: skip
def test_suite_refuses_what_ranks_cannot_run(write_suite, sweep, key, says):
    with pytest.raises(SuiteError) as e:
        load_suite(write_suite(SUITE + f"sweep: {sweep}\n"))
    assert key in str(e.value) and says in str(e.value)


def test_one_rank_is_one_case_whatever_the_split(write_suite):
    sweep = "{shards: [1, 2], shard_by: [context, heads], kernel: [partial], context_len: [64]}"
    text = SUITE + f"sweep: {sweep}\n"
    cases = expand(load_suite(write_suite(text)))
    assert [c.shards for c in cases] == [1, 2, 2]
    assert cases[0].case_id == case(shards=1, context_len=64).case_id


def test_skip_reasons(monkeypatch):
    monkeypatch.setattr(sharded, "launcher", lambda: None)
    assert "mlx.launch" in sharded.skip_reason(case(), "cpu")
    monkeypatch.setenv("KVBENCH_LAUNCH_BACKEND", "carrier-pigeon")
    assert "KVBENCH_LAUNCH_BACKEND" in sharded.skip_reason(case(), "cpu")


def test_a_hostfile_must_name_one_host_per_shard(monkeypatch, tmp_path):
    monkeypatch.setattr(sharded, "launcher", lambda: "mlx.launch")
    hosts = tmp_path / "hosts.json"
    hosts.write_text('{"backend": "ring", "hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}]}')
    monkeypatch.setenv("KVBENCH_LAUNCH_HOSTFILE", str(hosts))
    assert "has 1 hosts, the case 2 shards" in sharded.skip_reason(case(), "cpu")
    hosts.write_text('{"hosts": [{"ssh": "a"}, {"ssh": "b"}]}')
    assert sharded.skip_reason(case(), "cpu") is None
    monkeypatch.setenv("KVBENCH_LAUNCH_HOSTFILE", str(tmp_path / "missing.json"))
    assert "no readable host list" in sharded.skip_reason(case(), "cpu")


def test_rank_errors_raise_in_the_parent():
    with pytest.raises(ParityError, match="rank 0: off"):
        sharded.job_result({"error": "off", "kind": "ParityError", "rank": 0})
    with pytest.raises(RuntimeError, match="rank 1: boom"):
        sharded.job_result({"error": "boom", "kind": "ValueError", "rank": 1})


def test_launch_command_names_the_ranks_and_a_free_port(monkeypatch, tmp_path):
    monkeypatch.delenv("KVBENCH_LAUNCH_HOSTFILE", raising=False)
    cmd = sharded.launch_command(case(), tmp_path / "s.json", tmp_path / "o.json")
    assert cmd[cmd.index("-n") + 1] == "2" and cmd[cmd.index("--backend") + 1] == "ring"
    assert int(cmd[cmd.index("--starting-port") + 1]) >= 20000
    assert cmd[-3:-1] == ["kvbench.engines.sharded_rank", str(tmp_path / "s.json")]
    monkeypatch.setenv("KVBENCH_LAUNCH_HOSTFILE", "hosts.json")
    cmd = sharded.launch_command(case(), tmp_path / "s.json", tmp_path / "o.json")
    assert "--hostfile" in cmd and "-n" not in cmd and "--starting-port" not in cmd


@pytest.fixture
def ranks(monkeypatch):
    """Two local ranks are possible here: the launcher exists and loopback ports bind."""
    if sharded.launcher() is None:
        pytest.skip("mlx.launch is not installed")
    try:
        sharded.free_port(2)
    except RuntimeError as e:
        pytest.skip(f"loopback ports unavailable: {e}")
    monkeypatch.delenv("KVBENCH_LAUNCH_HOSTFILE", raising=False)
    monkeypatch.setenv("KVBENCH_LAUNCH_BACKEND", "ring")
    monkeypatch.setenv("KVBENCH_LAUNCH_TIMEOUT_S", LIMIT_S)


def test_two_ranks_by_context_through_the_runner(ranks, write_suite, tmp_path, quiet):
    """A real row: 2 ranks, 101 positions split 51 + 50, gathered partials and lse."""
    text = SUITE + "sweep: {shards: [2], kernel: [partial], context_len: [101]}\n"
    suite = load_suite(write_suite(text))
    writer = run_suite(suite, expand(suite), tmp_path / "out", quiet)
    row = pd.read_csv(writer.csv_path).iloc[0]
    assert row["status"] == "ok", row["error"]
    assert row["rel_err"] < 1e-5  # rank 0's combined output against the float32 reference
    for col in ("median_ms", "attend_ms", "comm_ms", "write_ms", "peak_mem_bytes"):
        assert math.isfinite(row[col]) and row[col] >= 0, col
    assert row["rank_kv_bytes"] == 2 * 2 * 51 * 3 * 32 * 4
    assert row["alloc_bytes"] >= row["rank_kv_bytes"]  # rank 0 allocated its share
    # rank 0's residency gate: its whole buffer filled (51 positions), every layer resident
    assert row["cache_bytes"] == row["rank_kv_bytes"] <= row["resident_bytes"]
    assert row["cache_bytes"] <= row["resident_end_bytes"]
    assert row["kv_bytes"] == 2 * 2 * 101 * 3 * 32 * 4
    assert row["sent_bytes"] == 2 * 6 * 33 * 4 and row["launch_backend"] == "ring"
    samples = pd.read_csv(writer.samples_path)
    assert set(samples["stage"]) == {"step", "write", "attend", "comm"}
    assert (samples.groupby("stage").size() >= 3).all()


def test_two_ranks_by_uneven_heads_summed(ranks):
    """3 KV heads over 2 ranks (2 + 1), the all_sum combine, int4 stored on the ranks."""
    c = case(shard_by="heads", combine="sum", kv_dtype="int4")
    state = carrying(sharded.build)(c)
    plan = {"warmup_s": 0.0, "budget_s": 0.02, "min_samples": 2, "max_samples": 3}
    result = state.job({"step": {**plan, "target_ci": 0.05}}, True)
    assert 2 <= len(result.samples["step"]) <= 3
    # int4 computes in fp16: the parity gate passed on rank 0, accuracy vs un-quantized K/V
    assert result.accuracy["cosine"] > 0.98 and result.accuracy["kv_recon_err"] > 0


def test_rank_that_does_not_own_the_new_token_holds_every_layer():
    """Rank 0 of a context split fills its whole buffer (it writes no new token): every layer
    must hold its own bytes (the store's write, no rank-side copy; issue #28)."""
    import mlx.core as mx

    from kvbench.engines.residency import measure
    from kvbench.engines.sharded_rank import Rank

    group = mx.distributed.init()  # a single process: a group of one, rank 0
    rank = Rank(case(), group)
    assert not rank.part.owns_new and rank.pos == 51  # the whole buffer was filled
    m = measure(rank.cache.arrays(), rank.baseline)
    assert m["declared"] == 2 * 2 * 51 * 3 * 32 * 4  # layers x (K, V) x 51 positions x 3 heads
    assert m["resident"] >= m["declared"] and m["shared"] == 0
