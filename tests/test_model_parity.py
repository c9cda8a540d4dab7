"""SmolLM2-135M through mlx-lm (kernels/model/load.py + seam.py) against kvbench's hand-written
Llama driver (kernels/model/llama.py) on the same tokens: the same perplexity within 0.1%
(issue #24's condition for retiring the driver). Needs the fetched model (skips without it)."""

import mlx.core as mx
import numpy as np
import pytest

from kvbench.kernels.model import llama as old_driver
from kvbench.kernels.model import seam
from kvbench.kernels.model.cache import CacheSpec, PlainCache, model_cache
from kvbench.kernels.model.fetch import model_path
from kvbench.kernels.model.load import load_model
from kvbench.kernels.model.quality import chunks, default_text
from kvbench.kernels.model.tokenizer import load_tokenizer


def nll(lg: mx.array, chunk: list[int]) -> np.ndarray:
    first = len(chunk) // 2
    lp = lg[: len(chunk) - 1 - first]
    lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
    return np.array(-mx.take_along_axis(lp, mx.array(chunk[first + 1 :])[:, None], axis=-1)[:, 0])


def test_smollm2_perplexity_through_mlx_lm_equals_the_hand_written_driver():
    path = model_path()
    if path is None:
        pytest.skip("SmolLM2 not fetched (kvbench model fetch)")
    old, new = old_driver.load_model(path), load_model(path)
    c = old.config
    ids = load_tokenizer(old).encode(default_text())
    a, b = [], []
    for chunk in chunks(ids, 64, 2):
        first = len(chunk) // 2
        cache = PlainCache(CacheSpec("fp32"), c.n_layers, c.n_kv_heads, c.head_dim, 64, "reference")
        lg = old_driver.forward(old, mx.array([chunk]), cache, logits_from=first)[0]
        a.append(nll(lg, chunk))
        cache = model_cache(CacheSpec("fp32"), new, 64)
        b.append(nll(seam.forward(new, mx.array([chunk]), cache)[0, first:], chunk))
    ppl_old, ppl_new = np.exp(np.concatenate(a).mean()), np.exp(np.concatenate(b).mean())
    assert abs(ppl_new / ppl_old - 1) < 1e-3, (ppl_old, ppl_new)
