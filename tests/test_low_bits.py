"""Below 4 bits: MLX's affine 2- and 3-bit modes (mlx-lm's kv_bits 2 / 3) as kvbench formats,
their exact bytes by hand, their error against a numpy min-max quantizer's step, and KIVI-2
(keys per channel, values per token, group 32, an fp16 residual) as a model cache spec."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kvbench.kernels.attention.registry import KERNELS, reference
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.model.cache import MixedCache
from kvbench.kernels.model.spec import CacheSpec, kv_bytes

# hand counts, D = 128, group 32: codes D * bits / 8 bytes, plus an fp16 scale and an fp16 bias
# per group (4 groups * 4 bytes = 16)
BYTES_128_G32 = {"affine2": 32 + 16, "affine3": 48 + 16}


@pytest.mark.parametrize("name,bits", [("affine2", 2), ("affine3", 3)])
def test_bytes_by_hand(name, bits):
    fmt = get_format(name, 32)
    assert fmt.data_bits == bits
    assert fmt.nbytes(1, 128) == BYTES_128_G32[name]
    assert fmt.bits_per_elem(128) == bits + 1.0  # + 32 bits of scale and bias per 32 values
    assert get_format(name).nbytes(1, 64) == 64 * bits // 8 + 4  # default group 64
    stored = fmt.encode(mx.zeros((2, 3, 4, 128)))
    assert sum(a.nbytes for a in stored.values()) == fmt.nbytes(24, 128)
    assert stored["data"].shape[-1] == 128 * bits // 32  # 3-bit codes straddle uint32 words


@pytest.mark.parametrize("name,bits", [("affine2", 2), ("affine3", 3)])
def test_error_within_one_step_of_numpy_min_max(name, bits):
    """Every value decodes within one step (max - min) / (2^bits - 1) of its group, as a
    min-max quantizer's would (MLX keeps zero exact, so the bound is a step, not half), and
    the mean error is about a quarter step (uniform rounding error)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 40, 128)) * rng.uniform(0.1, 5, (2, 3, 40, 1))
    x = x.astype(np.float16).astype(np.float32)
    fmt = get_format(name, 32)
    got = np.array(fmt.decode(fmt.encode(mx.array(x)), mx.float32)).reshape(2, 3, 40, 4, 32)
    xg = x.reshape(2, 3, 40, 4, 32)
    step = (xg.max(-1, keepdims=True) - xg.min(-1, keepdims=True)) / (2**bits - 1)
    ratio = np.abs(got - xg) / step
    assert ratio.max() <= 1.0 and 0.15 < ratio.mean() < 0.3


@pytest.mark.parametrize("name", ["affine2", "affine3"])
@pytest.mark.parametrize("kernel", ["quantized_matmul", "dequant_sdpa", "tiled"])
def test_kernels_run_low_bit_caches(name, kernel):
    fmt = get_format(name, 32)
    rng = np.random.default_rng(1)
    q = mx.array(rng.standard_normal((1, 8, 1, 64)).astype(np.float16))
    k, v = (fmt.encode(mx.array(rng.standard_normal((1, 2, 96, 64)))) for _ in range(2))
    out = KERNELS[kernel].fn(q, k, v, fmt, mask=None, scale=0.125, tile_kv=32)
    want = reference(q.astype(mx.float32), k, v, fmt, scale=0.125)
    np.testing.assert_allclose(np.array(out), np.array(want), atol=2e-2)


def test_kivi2_spec_bytes_and_run():
    """KIVI-2: keys quantized per channel over groups of 32 positions, values per token in
    groups of 32 channels, 2 bits, the newest positions in an fp16 residual."""
    kivi = CacheSpec("affine2", "affine2", 32, 32, "channel", recent_tokens=32)
    # after 100 tokens, D = 64: 96 quantized positions + 4 fp16 residual ones, per KV head.
    # K: 3 flushed groups * 64 channel rows * (32 codes * 2 bits = 8 bytes + 4) = 2304, + 4*128
    # V: 96 rows * (64 * 2 / 8 = 16 bytes + 2 groups * 4) = 2304, + 4 * 128
    assert kv_bytes(kivi, 100, 1, 1, 64) == 2 * (2304 + 512)
    cache = MixedCache(kivi, 1, 2, 64, 128, "reference")
    x = mx.random.normal((1, 2, 70, 64), key=mx.random.key(0))
    out = cache.attend(0, mx.random.normal((1, 6, 70, 64), key=mx.random.key(1)), x, x, 0.125)
    assert out.shape == (1, 6, 70, 64) and np.isfinite(np.array(out)).all()
    assert cache.held_bytes() == kv_bytes(kivi, 70, 1, 2, 64)
