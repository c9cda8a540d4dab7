"""The MLX model driver against an independent numpy forward pass on a tiny model with known
random weights, written by the test as a GGUF (Q/K rows permuted as llama.cpp writes them) and
as an mlx-lm directory."""

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from tiny_model import (
    TINY,
    dequantized,
    np_forward,
    permute,
    weights,
    write_gguf,
    write_mlx_dir,
)

from kvbench.kernels.model import llama as M
from kvbench.kernels.model.cache import CacheSpec, make_cache
from kvbench.kernels.model.quality import decode_step

TOKENS = [5, 17, 42, 299, 0, 7, 7, 123, 64, 1, 250, 33]


def mlx_logits(model, tokens, spec=None, kernel="reference"):
    spec = spec or CacheSpec("fp32")
    cache = make_cache(spec, model.config, len(tokens), kernel)
    out = M.forward(model, mx.array([tokens]), cache)[0]
    return np.array(out.astype(mx.float32))


def test_gguf_matches_numpy_forward(tmp_path):
    wts = weights(seed=1, tied=False)
    model = M.load_model(write_gguf(tmp_path / "tiny.gguf", wts))
    assert model.config.n_kv_heads == 2 and model.config.head_dim == 64
    ref = np_forward(wts, TOKENS)
    got = mlx_logits(model, TOKENS)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_unpermutation_is_what_makes_it_match(tmp_path):
    """Negative control: the same permuted GGUF read without undoing the permutation (as if
    the arch were not permuted) does not match, so the test above can fail."""
    wts = weights(seed=1)
    model = M.load_model(write_gguf(tmp_path / "tiny.gguf", wts))
    for lp, raw in zip(model.params["layers"], wts["layers"]):
        lp["q"] = {"weight": mx.array(permute(raw["q"], TINY["n_heads"]))}
        lp["k"] = {"weight": mx.array(permute(raw["k"], TINY["n_kv_heads"]))}
    err = np.abs(mlx_logits(model, TOKENS) - np_forward(wts, TOKENS)).max()
    assert err > 1e-2


def test_qwen2_biases_and_unpermuted_rows(tmp_path):
    wts = weights(seed=2, qkv_bias=True)
    model = M.load_model(write_gguf(tmp_path / "q.gguf", wts, arch="qwen2"))
    assert "bias" in model.params["layers"][0]["q"]
    np.testing.assert_allclose(mlx_logits(model, TOKENS), np_forward(wts, TOKENS), atol=1e-4)


def test_mlx_dir_matches_gguf(tmp_path):
    wts = weights(seed=3)
    a = M.load_model(write_gguf(tmp_path / "t.gguf", wts))
    b = M.load_model(write_mlx_dir(tmp_path / "dir", wts))
    assert a.config == replace(b.config, norm_eps=a.config.norm_eps)  # GGUF stores float32
    np.testing.assert_allclose(mlx_logits(a, TOKENS), mlx_logits(b, TOKENS), atol=1e-5)


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_mlx_dir_matches_numpy_on_dequantized_weights(tmp_path, bits):
    """mx.quantized_matmul and the quantized embedding against numpy on the same values."""
    wts = weights(seed=6)
    model = M.load_model(write_mlx_dir(tmp_path / "q", wts, bits=bits))
    assert model.params["layers"][0]["gate"]["bits"] == bits
    ref = np_forward(dequantized(wts, bits), TOKENS)
    np.testing.assert_allclose(mlx_logits(model, TOKENS), ref, rtol=1e-3, atol=1e-3)


def test_incremental_decode_equals_full_prefill(tmp_path):
    """Prefill then one-token decode steps give the logits of one full forward pass."""
    wts = weights(seed=4)
    model = M.load_model(write_gguf(tmp_path / "t.gguf", wts))
    full = mlx_logits(model, TOKENS)
    cache = make_cache(CacheSpec("fp32"), model.config, len(TOKENS), "reference")
    M.forward(model, mx.array([TOKENS[:5]]), cache)
    for i in range(5, len(TOKENS)):
        step = np.array(decode_step(model, cache, TOKENS[i]))
        np.testing.assert_allclose(step, full[i], atol=1e-4)
    assert cache.offset == len(TOKENS)


@pytest.mark.parametrize("kernel", ["sdpa", "ops", "tiled"])
def test_fp16_cache_kernels_agree_with_reference(tmp_path, kernel):
    wts = weights(seed=5)
    model = M.load_model(write_gguf(tmp_path / "t.gguf", wts))
    ref = mlx_logits(model, TOKENS, CacheSpec("fp16"), "reference")
    got = mlx_logits(model, TOKENS, CacheSpec("fp16"), kernel)
    np.testing.assert_allclose(got, ref, atol=2e-2)


def test_not_a_model_file(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"0")
    with pytest.raises(ValueError, match="x.bin"):
        M.load_model(p)
