"""The parts of a model step (kernels/model/parts.py, engines/model_step.py) and the model
profile's arithmetic (run/model_profile.py), on tiny models: counts of the recorded calls by
hand, replayed parts equal to what the step computed, the per-layer-kind split of a model with
sliding and global layers, and the sum / difference of the breakdown."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from tiny_model import TINY, weights, write_gguf, write_random_mlx_dir

from kvbench.engines.model_step import ModelStep
from kvbench.errors import UserError
from kvbench.kernels.model import parts
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.load import load_model
from kvbench.kernels.model.run import prefill
from kvbench.kernels.model.spec import CacheSpec
from kvbench.run import model_profile
from kvbench.run.profile import profile

TOKENS = list(np.random.default_rng(2).integers(0, TINY["vocab"], 40).tolist())


def step_of(model, spec="int8", depth=20, n_new=1, kernel="dequant_sdpa") -> ModelStep:
    cache = make_cache(CacheSpec(spec), model.config, depth + n_new, kernel)
    prefill(model, cache, TOKENS[:depth])
    return ModelStep(model, cache, TOKENS[depth : depth + n_new])


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load_model(write_gguf(tmp_path_factory.mktemp("m") / "t.gguf", weights(seed=3)))


def test_the_recorded_calls_by_hand(llama):
    """2 layers: q, k, v, o and gate, up, down per layer; 2 norms per layer and the final one;
    RoPE on q and on k; one embedding lookup and the tied head (the embedding's as_linear)."""
    step = step_of(llama)
    got = parts.capture(llama, step.cache, step.tokens)
    count = {p: sum(c.part == p for c in got.calls) for p in parts.PARTS[2:]}
    assert count == {"proj": 8, "mlp": 6, "head": 1, "norm": 5, "rope": 4, "embed": 1}
    assert [kv[0] for kv in got.kv] == [0, 1]
    assert {c.layer for c in got.calls if c.part == "mlp"} == {0, 1}


def test_replayed_parts_compute_what_the_step_computed(llama):
    """write stores the bytes the step stores; attend returns the step's attention outputs;
    the head's replay is the step's logits (no layer follows it)."""
    step = step_of(llama)
    logits = step()[0]
    mx.eval(logits, step.cache.arrays())
    after_step = [np.array(a) for a in step.cache.arrays()]
    stages = step.parts()
    assert set(parts.PARTS) <= set(stages) and "write[global]" not in stages
    mx.eval(stages["write"]())
    for a, b in zip(after_step, step.cache.arrays()):
        np.testing.assert_array_equal(a, np.array(b))
    head = stages["head"]()[0]
    np.testing.assert_allclose(np.array(head)[0, -1], np.array(logits), rtol=1e-5, atol=1e-5)
    got = parts.capture(llama, step.cache, step.tokens)  # the attention the step ran
    step.cache.rewind(step.mark)
    want = [step.cache.attend(layer, q, k, v, s) for layer, q, k, v, s in got.kv]
    for a, b in zip(stages["attend"](), want):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-6, atol=1e-6)


def test_sliding_and_global_layers_are_timed_apart(tmp_path):
    """gemma3_text, 4 layers of which 3 slide (window 8): write and attend per kind too."""
    model = load_model(write_random_mlx_dir(tmp_path / "g", "gemma3_text", n_layers=4))
    step = step_of(model, spec="fp16", depth=20, kernel="sdpa")
    stages = step.parts()
    assert {"write[sliding]", "attend[sliding]", "write[global]", "attend[global]"} <= set(stages)
    assert len(stages["attend[sliding]"]()) == 3 and len(stages["attend[global]"]()) == 1


def test_prefill_micro_batch_and_framework_stages(llama):
    step = step_of(llama, depth=16, n_new=8)
    out = step()
    assert out[0].shape == (1, 8, TINY["vocab"])  # logits of every token of the micro-batch
    assert len(step.built_ms) == 1 and step.built_ms[0] > 0
    n_ops = parts.graph_ops(step())
    assert n_ops > 8 * TINY["n_layers"]
    mx.eval(step.cache.arrays())
    fw = parts.framework(5)
    assert fw["dispatch[5 ops]"]().item() == 6.0 and fw["eval_floor"]().item() == 2.0


def test_breakdown_arithmetic_by_hand():
    """Medians: step 100; parts 30 + 20 + 10 = 60, difference 40; the framework apart."""
    samples = {"step": [100.0] * 3, "write": [30.0] * 3, "attend": [20.0] * 3,
               "mlp": [10.0] * 3, "graph_build": [5.0] * 3, "eval_floor": [0.1] * 3,
               "dispatch[400 ops]": [8.0] * 3, "write[sliding]": [12.0] * 3}  # fmt: skip
    t = model_profile.breakdown(samples)
    by = {r["stage"]: r for r in t["parts"]}
    assert by["sum"]["median_ms"] == 60.0 and by["difference"]["median_ms"] == 40.0
    assert by["write"]["pct_of_step"] == 30.0 and "proj" not in by
    assert [r["stage"] for r in t["kinds"]] == ["write[sliding]"]
    assert [r["stage"] for r in t["framework"]] == ["graph_build", "eval_floor",
                                                    "dispatch[400 ops]"]  # fmt: skip


def test_ubatch_is_refused_where_it_means_nothing(tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_text("name: s\nfixed: {model: tiny}\nsweep:\n  context_len: [64]\n")
    with pytest.raises(UserError, match="--ubatch 64: must be from 1 to context_len - 1"):
        profile(str(suite), "", ubatch=64)
    with pytest.raises(UserError, match="only a model_decode case has a prefill micro-batch"):
        profile(str(suite), "", ubatch=8)


def test_ubatch_is_refused_under_a_cache_policy(tmp_path):
    """The budget of a policy case is checked for one decode step after context_len - 1
    tokens; a micro-batch would compress a context the suite never checked."""
    gguf = write_gguf(tmp_path / "t.gguf", weights(seed=3))
    suite = tmp_path / "s.yaml"
    suite.write_text(f"name: s\nfixed: {{model: {gguf}, phase: model_decode, kernel: sdpa, "
                     "policy: knorm, compression_ratio: 0.5}\n"
                     "sweep:\n  context_len: [32]\n")  # fmt: skip
    with pytest.raises(UserError, match="--ubatch 8: a case under policy knorm"):
        profile(str(suite), "", ubatch=8)


def test_profile_of_a_model_decode_case_goes_part_by_part(tmp_path, monkeypatch):
    """`kvbench profile` hands a model_decode case (a GGUF model) to the model profile, with
    the suite's settings and --ubatch."""
    gguf = write_gguf(tmp_path / "t.gguf", weights(seed=3))
    suite = tmp_path / "s.yaml"
    suite.write_text(f"name: s\nfixed: {{model: {gguf}, phase: model_decode, kernel: sdpa}}\n"
                     "sweep:\n  context_len: [32]\n")  # fmt: skip
    seen = {}

    def fake(case, settings, backend, n_new):
        seen.update(n=n_new)
        return "parts"

    monkeypatch.setattr(model_profile, "profile_model", fake)
    assert profile(str(suite), "", ubatch=8) == "parts" and seen == {"n": 8}
