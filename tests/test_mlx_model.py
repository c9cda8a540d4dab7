"""mlx-lm's models with kvbench's cache and kernels inside (kernels/model/load.py, cache.py,
seam.py): tiny random models written as GGUF (gguf.GGUFWriter, Q/K rows permuted as llama.cpp
writes them) and as mlx-lm directories (Llama, Qwen2, and gemma3_text with sliding-window
layers), checked against an independent numpy forward pass (Llama, Qwen2) and against mlx-lm's
own forward with its own caches (every architecture)."""

from __future__ import annotations

import json
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from tiny_model import (
    TINY,
    dequantized,
    np_forward,
    weights,
    write_gguf_writer,
    write_mlx_dir,
    write_random_mlx_dir,
)

from kvbench.kernels.model import load as L
from kvbench.kernels.model import seam
from kvbench.kernels.model.cache import LayeredCache, WindowCache, make_cache
from kvbench.kernels.model.spec import CacheSpec

TOKENS = [5, 17, 42, 299, 0, 7, 7, 123, 64, 1, 250, 33]
LONG = np.random.default_rng(7).integers(0, TINY["vocab"], 30).tolist()


def logits(model, tokens, spec=None, kernel="reference", step=None) -> np.ndarray:
    """kvbench's cache in `spec`, fed `step` tokens per forward call (default all at once)."""
    cache = make_cache(spec or CacheSpec("fp32"), model.config, len(tokens), kernel, max_step=step)
    step = step or len(tokens)
    outs = [seam.forward(model, mx.array([tokens[s : s + step]]), cache)[0]
            for s in range(0, len(tokens), step)]  # fmt: skip
    return np.array(mx.concatenate(outs).astype(mx.float32))


def native(model, tokens, step=None) -> np.ndarray:
    """mlx-lm's own forward with its own caches (make_prompt_cache), same feeding."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model.net)
    step = step or len(tokens)
    outs = [model.net(mx.array([tokens[s : s + step]]), cache=cache)[0]
            for s in range(0, len(tokens), step)]  # fmt: skip
    return np.array(mx.concatenate(outs))


def test_gguf_matches_numpy_forward(tmp_path):
    wts = weights(seed=1, tied=False)
    model = L.load_model(write_gguf_writer(tmp_path / "tiny.gguf", wts))
    assert model.config.n_kv_heads == 2 and model.config.head_dim == 64
    assert model.config.trained_context == 256
    np.testing.assert_allclose(logits(model, TOKENS), np_forward(wts, TOKENS), atol=1e-4)


def test_unpermutation_is_what_makes_it_match(tmp_path, monkeypatch):
    """Negative control: the same permuted GGUF read as if llama.cpp had not permuted it."""
    wts = weights(seed=1)
    monkeypatch.setattr(L, "PERMUTED_ARCHS", ())
    model = L.load_model(write_gguf_writer(tmp_path / "tiny.gguf", wts))
    assert np.abs(logits(model, TOKENS) - np_forward(wts, TOKENS)).max() > 1e-2


def test_qwen2_gguf_biases_and_unpermuted_rows(tmp_path):
    wts = weights(seed=2, qkv_bias=True, head_dim=32)  # mlx-lm's qwen2: hidden / n_heads
    model = L.load_model(write_gguf_writer(tmp_path / "q.gguf", wts, arch="qwen2"))
    assert model.config.arch == "qwen2"
    np.testing.assert_allclose(logits(model, TOKENS), np_forward(wts, TOKENS), atol=1e-4)


def test_mlx_dir_matches_numpy(tmp_path):
    wts = weights(seed=3)
    model = L.load_model(write_mlx_dir(tmp_path / "dir", wts))
    np.testing.assert_allclose(logits(model, TOKENS), np_forward(wts, TOKENS), atol=1e-4)


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_mlx_dir_matches_numpy_on_dequantized_weights(tmp_path, bits):
    wts = weights(seed=6)
    model = L.load_model(write_mlx_dir(tmp_path / "q", wts, bits=bits))
    ref = np_forward(dequantized(wts, bits), TOKENS)
    np.testing.assert_allclose(logits(model, TOKENS), ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3_text"])
def test_every_arch_matches_mlx_lms_own_cache(tmp_path, arch):
    """kvbench's float32 cache and reference kernel inside the model give mlx-lm's own logits,
    prefilled at once and fed 4 tokens at a time past the sliding window (gemma3's window 8)."""
    model = L.load_model(write_random_mlx_dir(tmp_path / arch, arch, n_layers=4))
    np.testing.assert_allclose(logits(model, LONG), native(model, LONG), atol=2e-4)
    np.testing.assert_allclose(logits(model, LONG, step=4), native(model, LONG, step=4), atol=2e-4)


def test_sliding_window_layers_get_kvbench_window_layout(tmp_path):
    model = L.load_model(write_random_mlx_dir(tmp_path / "g", "gemma3_text", n_layers=4))
    assert model.config.windows == ((8, 0), (8, 0), (8, 0), None)
    cache = make_cache(CacheSpec("fp16"), model.config, 30, "sdpa", max_step=1)
    assert isinstance(cache, LayeredCache)
    for t in LONG:
        seam.forward(model, mx.array([[t]]), cache)
    assert [type(s) is WindowCache for s in cache.stores] == [True, True, True, False]
    assert cache.stores[0].kv.size == 8  # window 8, one token per step: 8 cells, any context
    # the window is what makes it match mlx-lm: full caches on the sliding layers do not
    full = make_cache(CacheSpec("fp32"), replace(model.config, windows=()), 30)
    wrong = np.array(seam.forward(model, mx.array([LONG]), full)[0])
    assert np.abs(wrong - logits(model, LONG)).max() > 1e-3


def test_incremental_decode_equals_full_prefill(tmp_path):
    model = L.load_model(write_gguf_writer(tmp_path / "t.gguf", weights(seed=4)))
    full = logits(model, TOKENS)
    cache = make_cache(CacheSpec("fp32"), model.config, len(TOKENS))
    seam.forward(model, mx.array([TOKENS[:5]]), cache)
    for i in range(5, len(TOKENS)):
        step = np.array(seam.forward(model, mx.array([[TOKENS[i]]]), cache)[0, -1])
        np.testing.assert_allclose(step, full[i], atol=1e-4)
    assert cache.offset == len(TOKENS)


@pytest.mark.parametrize("kernel", ["sdpa", "ops", "tiled"])
def test_fp16_cache_kernels_agree_with_reference(tmp_path, kernel):
    model = L.load_model(write_gguf_writer(tmp_path / "t.gguf", weights(seed=5)))
    ref = logits(model, TOKENS, CacheSpec("fp16"), "reference")
    np.testing.assert_allclose(logits(model, TOKENS, CacheSpec("fp16"), kernel), ref, atol=2e-2)


def test_quantized_kernels_run_inside_the_model(tmp_path):
    model = L.load_model(write_gguf_writer(tmp_path / "t.gguf", weights(seed=5)))
    ref = logits(model, TOKENS, CacheSpec("int8"), "reference")
    for kernel in ("tiled", "dequant_sdpa"):
        got = logits(model, TOKENS, CacheSpec("int8"), kernel)
        np.testing.assert_allclose(got, ref, atol=3e-2)


def test_the_seam_leaves_mlx_lms_own_caches_alone(tmp_path):
    model = L.load_model(write_mlx_dir(tmp_path / "d", weights(seed=3)))
    logits(model, TOKENS)  # routes the module
    want = np_forward(weights(seed=3), TOKENS)
    np.testing.assert_allclose(native(model, TOKENS), want, atol=1e-4)


# ---- bad input: one line --------------------------------------------------------------------


def test_missing_path(tmp_path):
    with pytest.raises(L.ModelError, match="no such file"):
        L.load_model(tmp_path / "nope.gguf")


def test_dir_without_config(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(L.ModelError, match="config.json"):
        L.load_model(tmp_path / "d")


def test_unknown_architecture(tmp_path):
    d = write_mlx_dir(tmp_path / "d", weights(seed=3))
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "no_such_arch"}))
    with pytest.raises(L.ModelError, match="mlx-lm has no such architecture"):
        L.load_model(d)


def test_gguf_of_unknown_arch(tmp_path):
    p = write_gguf_writer(tmp_path / "x.gguf", weights(seed=1), arch="bert")
    with pytest.raises(L.ModelError, match="GGUF architecture 'bert'"):
        L.load_model(p)


def test_not_a_model_file(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"0")
    with pytest.raises(L.ModelError, match="x.bin"):
        L.load_model(p)
    g = tmp_path / "bad.gguf"
    g.write_bytes(b"not a gguf at all")
    with pytest.raises(L.ModelError, match="bad.gguf"):
        L.load_model(g)


def test_a_gemma3_gguf_is_the_same_model_as_its_mlx_dir(tmp_path, monkeypatch):
    """A tiny gemma3_text written as llama.cpp's converter writes Gemma 3 (norm weights + 1,
    window and head metadata under gemma3.*, the window pattern 6 and local RoPE base 10000
    left to the reader) gives the logits of the mlx-lm directory it came from."""
    import gguf
    from mlx.utils import tree_flatten

    d = write_random_mlx_dir(tmp_path / "g", "gemma3_text", n_layers=6,
                             sliding_window_pattern=6, rope_local_base_freq=10000.0)  # fmt: skip
    ref = L.load_model(d)
    cfg = ref.hf_config
    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gemma3")
    w.add_block_count(6)
    w.add_context_length(256)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_theta", 1_000_000.0))
    w.add_sliding_window(cfg["sliding_window"])
    w.add_vocab_size(cfg["vocab_size"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, 6)
    for name, a in tree_flatten(ref.net.parameters()):
        a = np.array(a, dtype=np.float32)
        dst = names.get_name(name, try_suffixes=(".weight", ".bias"))
        w.add_tensor(dst, a + 1 if dst.endswith("norm.weight") else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = L.load_model(tmp_path / "g.gguf")
    assert got.config.windows == ref.config.windows == ((8, 0),) * 5 + (None,)
    np.testing.assert_allclose(logits(got, LONG), logits(ref, LONG), atol=1e-4)
    monkeypatch.setattr(L, "NORM_SHIFT", {})  # negative control: llama.cpp's + 1 left in
    off = L.load_model(tmp_path / "g.gguf")
    assert np.abs(logits(off, LONG) - logits(ref, LONG)).max() > 1e-2
