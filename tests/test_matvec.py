"""One token's weight products in row blocks (kernels/model/matvec.py): the same product as
x @ W.T to float tolerance (checked in float64 by numpy), the blocked path taken only where it
should be, and a whole model's decode step unchanged by it."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from tiny_model import weights, write_gguf_writer

from kvbench.kernels.model import matvec, seam
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.load import load_model
from kvbench.kernels.model.spec import CacheSpec


def rand(*shape, seed=0) -> mx.array:
    return mx.array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize(
    "n, k, limit",
    [(1536, 576, 1_000_000),  # one block (884,736 multiply-adds)
     (4096, 576, 1_000_000),  # blocks of 1736 rows: two whole ones and 624 rows left over
     (3072, 512, 512 * 1024),  # blocks of 1024 rows, none left over
     (7, 5, 1)],  # a block of one row each
)  # fmt: skip
def test_blocked_is_x_times_w_transposed(monkeypatch, n, k, limit):
    monkeypatch.setattr(matvec, "MAX_BLOCK_MACS", limit)
    w, x = rand(n, k), rand(1, 1, k, seed=1)
    got = matvec.blocked(w, x)
    assert got.shape == (1, 1, n)
    want = np.array(x, np.float64).reshape(k) @ np.array(w, np.float64).T
    np.testing.assert_allclose(np.array(got).reshape(n), want, rtol=1e-5, atol=1e-4)


def test_blocks_hold_at_most_the_limit():
    assert matvec.blocks(49152, 576) == (1736, 28)  # 1736 x 576 = 999,936 <= 10^6; 544 left
    assert matvec.blocks(1536, 576) == (1536, 1)  # 884,736: one block
    assert matvec.blocks(2048, 640) == (1562, 1)  # Gemma's MLP: 1562 rows, 486 left over
    assert matvec.blocks(10, 2_000_000) == (1, 10)  # a row over the limit: one row a block


def test_linear_takes_the_blocked_path_for_one_row_only():
    lin = nn.Linear(64, 96, bias=False)
    want_one, want_two = lin(rand(1, 1, 64)), lin(rand(1, 2, 64))
    assert matvec.use_blocked(lin) == 1 and type(lin) is matvec.BlockedLinear
    before = matvec.blocked_products()
    np.testing.assert_allclose(np.array(lin(rand(1, 1, 64))), np.array(want_one), atol=1e-5)
    assert matvec.blocked_products() == before + 1
    np.testing.assert_allclose(np.array(lin(rand(1, 2, 64))), np.array(want_two), atol=1e-5)
    assert matvec.blocked_products() == before + 1  # two rows: x @ W.T as mlx-lm runs it


def test_bias_quantized_and_other_devices_keep_mlx_lms_product():
    biased = nn.Linear(64, 96, bias=True)
    quant = nn.QuantizedLinear(64, 96, bias=False)
    assert matvec.use_blocked(biased) == 1 and matvec.use_blocked(quant) == 0
    before = matvec.blocked_products()
    biased(rand(1, 64))
    quant(rand(1, 64))
    assert matvec.blocked_products() == before
    lin = nn.Linear(64, 96, bias=False)
    matvec.use_blocked(lin)
    with mx.stream(mx.gpu) if mx.metal.is_available() or mx.cuda.is_available() else _cpu_off():
        lin(rand(1, 64))
    assert matvec.blocked_products() == before


class _cpu_off:
    """No GPU here: pretend the default device is not the CPU for one call."""

    def __enter__(self):
        self.real = mx.default_device
        mx.default_device = lambda: mx.Device(mx.gpu)

    def __exit__(self, *exc):
        mx.default_device = self.real


def test_tied_head_of_one_row_is_blocked():
    emb = nn.Embedding(300, 128)
    want = emb.as_linear(rand(1, 1, 128))
    matvec.use_blocked(emb)
    before = matvec.blocked_products()
    np.testing.assert_allclose(np.array(emb.as_linear(rand(1, 1, 128))), np.array(want),
                               atol=1e-5)  # fmt: skip
    assert matvec.blocked_products() == before + 1
    assert emb(mx.array([[3]])).shape == (1, 1, 128)  # the lookup itself unchanged


@pytest.mark.parametrize("tied", [True, False])
def test_a_models_decode_step_is_the_same_blocked_or_not(tmp_path, monkeypatch, tied):
    """Every linear and the head of a loaded model are blocked; a decode step's logits equal
    the ones mlx-lm's x @ W.T gives (the classes swapped back), with several blocks per
    matrix (a small limit) and with one."""
    model = load_model(write_gguf_writer(tmp_path / "t.gguf", weights(seed=2, tied=tied)))
    kinds = {type(m) for _, m in model.net.named_modules()}
    assert nn.Linear not in kinds and matvec.BlockedLinear in kinds
    tokens = [5, 17, 42, 299, 0, 7, 7, 123]

    def step() -> np.ndarray:
        cache = make_cache(CacheSpec("fp32"), model.config, len(tokens))
        seam.forward(model, mx.array([tokens[:-1]]), cache)
        return np.array(seam.forward(model, mx.array([tokens[-1:]]), cache)[0, -1])

    before = matvec.blocked_products()
    blocked_one = step()
    assert matvec.blocked_products() - before == 2 * 7 + 1  # 2 layers x 7 linears + the head
    monkeypatch.setattr(matvec, "MAX_BLOCK_MACS", 5000)  # blocks of 39 rows of 128
    blocked_many = step()
    for _, m in model.net.named_modules():
        back = {v: k for k, v in matvec.SWAPS.items()}.get(type(m))
        if back is not None:
            m.__class__ = back
    plain = step()
    np.testing.assert_allclose(blocked_one, plain, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(blocked_many, plain, rtol=1e-5, atol=1e-5)
