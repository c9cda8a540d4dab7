"""Issue 35, reliability of the model phases: no row claims what it did not measure, and nothing
in a model's files crashes, hangs or tracebacks. One test (or table) per class of failure the
probe found (scripts/probe_models.py feeds the whole set), each failing before its fix. Models
are the tiny ones of tests/tiny_model.py, written per test."""

from __future__ import annotations

import pytest
from test_fault_inputs import one_line_error
from tiny_model import weights, write_gguf_writer

from kvbench.errors import SuiteError
from kvbench.spec.suite import resolve

QUALITY = {"phase": "quality", "context_len": 32, "kv_dtype": "int8", "kernel": "reference"}


@pytest.fixture()
def gguf(tmp_path):
    return write_gguf_writer(tmp_path / "tiny.gguf", weights(seed=1), context_len=256)


# ---- a: a real model's shape is its metadata's, never a suite's override ----------------------

SHAPE_OVERRIDES = {"n_layers": 1, "head_dim": 128, "n_q_heads": 8, "n_kv_heads": 1, "gqa_ratio": 4}


@pytest.mark.parametrize("axis", SHAPE_OVERRIDES)
def test_a_shape_axis_beside_a_real_model_is_refused(gguf, axis):
    # used to: the row said n_layers 1 / head_dim 128 while the 2-layer head_dim-64 model ran
    with pytest.raises(SuiteError, match=f"{axis}: .*metadata") as e:
        resolve("s.yaml", {**QUALITY, "model": str(gguf), axis: SHAPE_OVERRIDES[axis]})
    assert str(gguf) in str(e.value)


def test_a_registered_model_in_a_model_phase_takes_no_shape_axes_either():
    with pytest.raises(SuiteError, match="n_layers: .*metadata"):
        resolve("s.yaml", {**QUALITY, "model": "smollm2-135m", "n_layers": 2})
    # a synthetic phase on the preset's shape may still cut it down (suites/rotation.yaml)
    case = resolve("s.yaml", {"model": "smollm2-135m", "context_len": 64, "n_layers": 4})
    assert case.n_layers == 4


def test_the_format_checks_use_the_real_head_dim(gguf):
    # head_dim 48 with q4_0 was refused as "not a multiple of 32" though the model's is 64
    with pytest.raises(SuiteError, match="head_dim: .*metadata.*64"):
        resolve("s.yaml", {**QUALITY, "model": str(gguf), "kv_dtype": "q4_0", "head_dim": 48})


def test_the_suite_cli_refuses_the_override_in_one_line(tmp_path, capsys, gguf):
    suite = tmp_path / "s.yaml"
    suite.write_text(f"fixed: {{model: {gguf}, phase: quality, context_len: 32, n_layers: 1}}\n")
    one_line_error(capsys, ["run", suite, "--dry-run"], f"{suite}: n_layers", "metadata")


def test_plan_refuses_a_shape_beside_a_real_model(capsys, gguf):
    one_line_error(capsys, ["plan", "--model", gguf, "--head-dim", "48", "--context", "64"],
                   "--head-dim", "metadata")  # fmt: skip


# ---- b: a cache setting that never takes effect is refused -----------------------------------

GENERATE = {"phase": "generate", "context_len": 32, "gen_tokens": 4, "kv_dtype": "int4"}


def test_a_quantized_kv_start_past_the_last_position_is_refused(gguf):
    # used to: an int4 row equal to the fp16 row to the last digit, saying bits_per_elem 4.25
    with pytest.raises(SuiteError, match="quantized_kv_start: 100000 .*never") as e:
        resolve("s.yaml", {**GENERATE, "model": str(gguf), "quantized_kv_start": 100000})
    assert "32 + 4 - 2 = 34" in str(e.value)
    with pytest.raises(SuiteError, match="quantized_kv_start: 35 "):
        resolve("s.yaml", {**GENERATE, "model": str(gguf), "quantized_kv_start": 35})
    resolve("s.yaml", {**GENERATE, "model": str(gguf), "quantized_kv_start": 34})


def test_the_last_start_accepted_still_switches_before_the_last_step(gguf):
    """The bound is exact: at start = context_len + gen_tokens - 2 the spec's cache attends in
    the last decode step; one more and it never would."""
    from kvbench.kernels.model import generate
    from kvbench.kernels.model.cache import CacheSpec
    from kvbench.kernels.model.load import load_model

    class Watched(generate.DeferredCache):
        def attend(self, layer, *args):
            if layer == 0:
                self.seen.append(self.switched)
            return super().attend(layer, *args)

    model = load_model(gguf)
    for start, late_steps in ((34, 1), (35, 0)):
        cache = Watched(CacheSpec("int4"), model.config, 36, start=start)
        cache.seen = []
        generate.free_run(model, cache, list(range(1, 33)), 4)
        assert sum(cache.seen[1:]) == late_steps  # seen[0]: the prefill; then one a step
