"""Suite checks of a cache policy (harness/suite/policy.py): every bad input of issue 42 item 7
is one line naming the file and key, before anything runs; the CLI exits 2 with it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvbench.errors import SuiteError
from kvbench.suite.suite import expand, load_suite

BASE = "fixed: {model: smollm2-135m, phase: quality, kernel: reference, context_len: 64, "


@pytest.mark.parametrize("extra, key, reason", [
    ("policy: snapkv, compression_ratio: 1.0}", "compression_ratio", "[0, 1)"),
    ("policy: snapkv, compression_ratio: -0.5}", "compression_ratio", "[0, 1)"),
    ("policy: knorm, kv_budget: 40}", "kv_budget", "larger than the 32 tokens compressed"),
    ("policy: window, kv_budget: 3}", "kv_budget", "fewer than the 4 sinks"),
    ("policy: knorm, kv_budget: 8, compression_ratio: 0.5}", "kv_budget", "not both"),
    ("policy: pyramidkv, kv_budget: 8, obs_window: 8}", "kv_budget", "compression_ratio"),
    ("policy: snapkv, compression_ratio: 0.5}", "obs_window", "not shorter than the 32"),
    ("policy: snapkv, compression_ratio: 0.5, obs_window: 16}", "obs_window", "16 tokens kept"),
    ("policy: adakv, kv_budget: 8, obs_window: 8}", "obs_window", "8 tokens kept fit"),
    ("policy: knorm, compression_ratio: 0.5, kernel_size: 3}", "kernel_size", "does not read"),
    ("compression_ratio: 0.5}", "compression_ratio", "only with a cache policy"),
    ("policy: knorm, compression_ratio: 0.5, v_dtype: int4}", "v_dtype", "one per-token"),
    ("policy: knorm, compression_ratio: 0.5, window: 16}", "window", "not both"),
    ("policy: knorm, compression_ratio: 0.5, k_order: gguf}", "k_order", "one per-token"),
    ("policy: lru}", "policy", "unknown value"),
])  # fmt: skip
def test_bad_policy_input(write_suite, extra, key, reason):
    path = write_suite(BASE + extra + "\n")
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    message = str(err.value)
    assert message.startswith(path + ": ") and key in message and reason in message
    assert "\n" not in message


def test_a_policy_on_a_synthetic_decode_case(write_suite):
    path = write_suite(
        "fixed: {model: tiny, context_len: 64, kv_dtype: fp16, policy: knorm, "
        "compression_ratio: 0.5}\n"
    )
    with pytest.raises(SuiteError, match="policy: a cache policy runs in phase quality"):
        load_suite(path)


def test_a_peer_cannot_run_a_policy(write_suite):
    base = BASE.replace("kernel: reference", "kernel: llama.cpp")
    path = write_suite(base + "policy: knorm, compression_ratio: 0.5}\n")
    with pytest.raises(SuiteError, match="kernel: llama.cpp cannot run a kvbench cache policy"):
        load_suite(path)


def test_cli_exits_2_with_one_line(write_suite):
    path = write_suite(BASE + "policy: knorm, kv_budget: 99}\n")
    r = subprocess.run([sys.executable, "-m", "kvbench", "run", path, "--dry-run"],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "kv_budget" in r.stderr


DECODE = BASE.replace("phase: quality", "phase: model_decode")


@pytest.mark.parametrize("policy", ["window", "h2o", "tova"])
def test_model_decode_refuses_a_decode_time_policy(write_suite, policy):
    path = write_suite(DECODE + f"policy: {policy}, compression_ratio: 0.5}}\n")
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    message = str(err.value)
    assert message.startswith(f"{path}: policy: {policy} selects again after every decode step")
    assert "rewinding" in message and "snapkv, knorm" in message and "\n" not in message


def test_model_decode_runs_a_prefill_time_policy_over_the_depth(write_suite):
    """The step decodes at depth context_len - 1: that is what is compressed (63 of 64)."""
    ok = write_suite(DECODE + "policy: snapkv, compression_ratio: 0.5, obs_window: 16}\n")
    (case,) = expand(load_suite(ok))
    assert case.phase == "model_decode" and case.policy == "snapkv"
    bad = write_suite(DECODE + "policy: knorm, kv_budget: 64}\n", "bad.yaml")
    with pytest.raises(SuiteError, match="kv_budget: 64: larger than the 63 tokens compressed"):
        load_suite(bad)
