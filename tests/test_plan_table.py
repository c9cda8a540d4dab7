"""`kvbench plan` of several formats side by side, context suffixes and the trained length
(harness/suite/plan_table.py; issue 44 item 1). Bytes against hand counts."""

from __future__ import annotations

import pytest

from kvbench.cli import main
from kvbench.errors import UserError
from kvbench.suite.plan_table import formats_of, tokens_of, trained_note


def test_several_formats_side_by_side_with_the_saving(capsys):
    argv = ["plan", "--model", "llama-3-8b", "--kv-dtype", "fp16,q8_0,q4_0", "--context", "32k"]
    assert main(argv) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    # 32 layers x K and V x 8 heads x 128 channels: fp16 2 B each; q8_0 34 B per 32; q4_0 18 B
    assert rows["fp16"][2] == f"{32 * 2 * 8 * 128 * 2:,}"
    assert rows["q8_0"][2] == f"{32 * 2 * 8 * 4 * 34:,}"  # 69,632 B per token
    assert rows["q4_0"][2] == f"{32 * 2 * 8 * 4 * 18:,}"
    assert rows["q8_0"][3] == f"{32768 * 69632 / 2**30:.3f}"  # 2.125 GiB at 32,768 tokens
    assert rows["q8_0"][5] == f"{100 * 34 / 64:.1f}%"  # of fp16's 64 B per 32 values
    assert rows["q4_0"][5] == f"{100 * 18 / 64:.1f}%"


def test_budget_names_the_trained_length_it_passes(capsys):
    argv = ["plan", "--model", "llama-3-8b", "--kv-dtype", "fp16,q4_0", "--budget", "8GiB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"{8 * 2**30 // (32 * 2 * 8 * 4 * 18):,}" in out  # q4_0's longest context: 233,016
    assert "trained for 8,192 tokens" in out and "past it" in out


def test_one_format_plan_says_its_guard_block_is_not_deployment_memory(capsys):
    assert main(["plan", "--model", "llama-3-8b", "--context", "8k"]) == 0
    out = capsys.readouterr().out
    assert "context 8,192" in out and "not what a deployment needs" in out


@pytest.mark.parametrize("text, want", [("8192", 8192), ("8k", 8192), ("1M", 2**20), (None, None)])
def test_context_takes_suffixes(text, want):
    assert tokens_of(text) == want


@pytest.mark.parametrize("text", ["8q", "1.5k", "-1"])
def test_a_bad_context_is_one_line_naming_the_option(text):
    with pytest.raises(UserError, match="^--context: .*not a whole number"):
        tokens_of(text)


def test_formats_are_a_list_named_once():
    assert formats_of("fp16, q8_0") == ["fp16", "q8_0"]
    with pytest.raises(UserError, match="twice"):
        formats_of("fp16,fp16")
    with pytest.raises(UserError, match="empty"):
        formats_of("fp16,")


def test_trained_note_within_and_past():
    assert "within" in trained_note("llama-2-7b", 4096)
    assert "2.0x past" in trained_note("llama-2-7b", 8192)
    assert trained_note("tiny", 64) == "tiny: trained length not recorded here"


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_registered_presets_trained_length_is_the_gguf_metadata(model):
    from kvbench.kernels.model.fetch import MODELS
    from kvbench.kernels.model.source import model_shape
    from kvbench.suite.presets import PRESETS

    if model not in MODELS:
        pytest.skip(f"{model} is not a registered model")
    try:
        real = model_shape(model).trained_context
    except Exception as e:  # noqa: BLE001 - not fetched here
        pytest.skip(f"{model} not fetched: {e}")
    assert PRESETS[model].trained_context == real
