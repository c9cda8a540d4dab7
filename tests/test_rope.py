"""RoPE from a table (kernels/model/rope.py): bit for bit what mx.fast.rope gives on the CPU,
taken only where it should be, and a model's decode step unchanged by it."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from tiny_model import weights, write_gguf_writer

from kvbench.kernels.model import rope, seam
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.load import load_model
from kvbench.kernels.model.spec import CacheSpec


def rand(*shape, seed=0) -> mx.array:
    return mx.array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize(
    "dims, head_dim, base, scale",
    [(64, 64, 100000.0, 1.0),  # SmolLM2
     (32, 64, 10000.0, 0.25),  # part of the head rotated, linear scaling
     (256, 256, 1e6, 1.0)],  # Gemma-3's global layers
)  # fmt: skip
@pytest.mark.parametrize("offset, n", [(0, 7), (5, 1), (1023, 1), (3000, 4)])
def test_table_is_fast_rope_bit_for_bit(dims, head_dim, base, scale, offset, n):
    r = nn.RoPE(dims, base=base, scale=scale)
    x = rand(1, 9, n, head_dim)
    want = r(x, offset=offset)
    assert rope.use_table(r) == 1 and type(r) is rope.TableRoPE
    before = rope.table_calls()
    got = r(x, offset=offset)
    assert rope.table_calls() == before + 1
    assert mx.array_equal(got, want).item()


def test_the_table_grows_by_doubling_and_is_shared():
    key = (48, 5000.0, 1.0)
    rope._TABLES.pop(key, None)
    cos, _ = rope.table(*key, 10)
    assert cos.shape == (rope.MIN_POSITIONS, 24)
    assert rope.table(*key, 100)[0] is cos  # held: no new table
    assert rope.table(*key, 3 * rope.MIN_POSITIONS)[0].shape[0] == 4 * rope.MIN_POSITIONS
    angles = np.arange(4)[:, None] * 5000.0 ** (-np.arange(24) / 24)  # theta_p,i = p base^(-2i/d)
    np.testing.assert_allclose(np.array(rope.table(*key, 4)[0][:4]), np.cos(angles), atol=1e-6)


@pytest.mark.parametrize(
    "what, make, x, offset",
    [("traditional", lambda: nn.RoPE(64, traditional=True), rand(1, 2, 1, 64), 3),
     ("an array offset", lambda: nn.RoPE(64), rand(1, 2, 1, 64), mx.array(3)),
     ("fp16", lambda: nn.RoPE(64), rand(1, 2, 1, 64).astype(mx.float16), 3)],
)  # fmt: skip
def test_other_calls_run_fast_rope(what, make, x, offset):
    r = make()
    want = r(x, offset=offset)
    rope.use_table(r)
    before = rope.table_calls()
    assert mx.array_equal(r(x, offset=offset), want).item(), what
    assert rope.table_calls() == before, what


def test_a_models_decode_step_is_the_same_with_the_table(tmp_path):
    model = load_model(write_gguf_writer(tmp_path / "t.gguf", weights(seed=3)))
    assert any(type(m) is rope.TableRoPE for _, m in model.net.named_modules())
    tokens = [5, 17, 42, 299, 0, 7, 7, 123]

    def step() -> np.ndarray:
        cache = make_cache(CacheSpec("fp32"), model.config, len(tokens))
        seam.forward(model, mx.array([tokens[:-1]]), cache)
        return np.array(seam.forward(model, mx.array([tokens[-1:]]), cache)[0, -1])

    before = rope.table_calls()
    tabled = step()
    assert rope.table_calls() - before == 2 * 2 * 2  # 2 passes x 2 layers x (q, k)
    for _, m in model.net.named_modules():
        if type(m) is rope.TableRoPE:
            m.__class__ = nn.RoPE
    np.testing.assert_array_equal(tabled, step())
