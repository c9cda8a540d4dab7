"""One token's weight products on the CPU, as row blocks the BLAS runs fast (issue #36).

A decode step multiplies one activation row x [1, k] by every weight matrix W [n, k]. mlx-lm
writes that `x @ W.T`, and MLX's CPU backend hands every float32 product to `cblas_sgemm`
(mlx/backend/cpu/gemms/cblas.cpp: no gemv). OpenBLAS (0.3.21 SkylakeX, the library kvbench
loads: docs/blas.md) runs a product of at most 100^3 multiply-adds through its small-matrix
kernels (sgemm_small_kernel_permit: no packing) and a larger one through its packed GEMM, which
at one row read the 49152 x 576 output head at 1-2 GB/s; and of the small kernels, the one
`W @ x` lands on ran the MLP's 1536 x 576 product 2.7x faster than `x @ W.T`'s (measured here,
docs/profile-model.md). `blocked` computes the same product as `W @ x` in row blocks of at most
MAX_BLOCK_MACS multiply-adds, one batched matmul (the blocks are a free reshape of W), plus one
product for the rows left over: every output is the same dot product of k terms, summed in the
BLAS's own order (equal to x @ W.T to float32 rounding, not bit for bit).

Only dense float32 (or any float) nn.Linear without bias and a tied head (nn.Embedding's
as_linear) change, and only for one row on the CPU; a batch of rows (prefill), another device,
a bias or a quantized layer run as mlx-lm runs them. `blocked_products` counts the products
that took the blocked path, so a row records what ran (harness/engines/model.py, `matvec`).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

MAX_BLOCK_MACS = 1_000_000  # OpenBLAS's small-matrix bound: M * N * K <= 100^3
_COUNT = {"blocked": 0}


def blocks(n: int, k: int) -> tuple[int, int]:
    """(rows per block, whole blocks) of an [n, k] matrix: blocks of at most MAX_BLOCK_MACS
    multiply-adds (at least one row); the n - rows * whole rows left over go in one more."""
    rows = max(1, min(n, MAX_BLOCK_MACS // k))
    return rows, n // rows


def blocked(w: mx.array, x: mx.array) -> mx.array:
    """x @ w.T for one row x [..., k] (every leading dim 1) and w [n, k]: [..., n]."""
    n, k = w.shape
    rows, full = blocks(n, k)
    col = x.reshape(k, 1)
    _COUNT["blocked"] += 1
    if full == 1 and rows == n:  # one block: no reshape of w (each op is dispatched on its own)
        return (w @ col).reshape(*x.shape[:-1], n)
    # [full, rows, k] @ [1, k, 1] -> [full, rows, 1]: one BLAS call per block. x must be 3-D
    # here: against a 2-D [k, 1] MLX folds the batch into one [full * rows, k] product, the
    # large one this avoids (measured: the 49152 x 576 head 77 ms so, 27 ms as blocks)
    parts = [(w[: full * rows].reshape(full, rows, k) @ col.reshape(1, k, 1)).reshape(-1)]
    if n > full * rows:
        parts.append((w[full * rows :] @ col).reshape(-1))
    out = parts[0] if len(parts) == 1 else mx.concatenate(parts)
    return out.reshape(*x.shape[:-1], n)


def one_row_on_cpu(x: mx.array) -> bool:
    return x.size == x.shape[-1] and mx.default_device() == mx.cpu


class BlockedLinear(nn.Linear):
    """nn.Linear whose one-row product on the CPU runs `blocked` (see module)."""

    def __call__(self, x: mx.array) -> mx.array:
        if "bias" not in self and one_row_on_cpu(x):
            return blocked(self["weight"], x)
        return super().__call__(x)


class BlockedEmbedding(nn.Embedding):
    """nn.Embedding whose tied-head product of one row on the CPU runs `blocked`."""

    def as_linear(self, x: mx.array) -> mx.array:
        if one_row_on_cpu(x):
            return blocked(self["weight"], x)
        return super().as_linear(x)


SWAPS = {nn.Linear: BlockedLinear, nn.Embedding: BlockedEmbedding}


def use_blocked(net: nn.Module) -> int:
    """Give every plain nn.Linear / nn.Embedding of `net` the blocked one-row path (the
    module's class is swapped in place: same parameters, same state); the modules changed."""
    n = 0
    for _, m in net.named_modules():
        swap = SWAPS.get(type(m))
        if swap is not None:
            m.__class__ = swap
            n += 1
    return n


def blocked_products() -> int:
    """Products that ran `blocked` in this process so far (a row compares two readings)."""
    return _COUNT["blocked"]
