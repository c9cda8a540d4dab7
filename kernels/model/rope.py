"""RoPE from a table of cos and sin on the CPU (issue #36).

`mx.fast.rope` has no CPU kernel in MLX 0.32: on the CPU it expands into its fallback graph
every call, 29 ops (positions, frequencies, exp, cos, sin, the rotation, their broadcasts),
twice a layer (queries and keys), and MLX dispatches every op on its own (about 5 us an op on a
quiet 2-core machine, 20 us under load: docs/profile-model.md). TableRoPE keeps cos and sin of
every position seen so far (grown by doubling, shared by every layer with the same dims, base
and scale) and each call slices them and rotates (15 ops).

The table is computed by `mx.fast.rope` itself: rotating the vector (1, .., 1, 0, .., 0) by
position p gives (cos θ, sin θ) with the same positions, frequencies and float32 arithmetic as
the fallback, and the rotation repeats the fallback's (x1 cos - x2 sin, x1 sin + x2 cos), so a
call gives what `mx.fast.rope` gives (tests/test_rope.py). Only float32 inputs with an integer
offset, mlx-lm's default (non-traditional) rotation, on the CPU, take the table; anything else
runs `mx.fast.rope` as before. `table_calls` counts the calls that took it (the row's `rope`).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

_TABLES: dict[tuple, tuple[mx.array, mx.array]] = {}  # (dims, base, scale) -> (cos, sin)
_COUNT = {"table": 0}
MIN_POSITIONS = 1024


def table(dims: int, base: float, scale: float, n_positions: int) -> tuple[mx.array, mx.array]:
    """(cos, sin) [P, dims / 2] float32 for positions 0..P-1, P >= n_positions (grown by
    doubling), as mx.fast.rope computes them."""
    key = (dims, base, scale)
    held = _TABLES.get(key)
    if held is None or held[0].shape[0] < n_positions:
        size = max(MIN_POSITIONS, 2 * (held[0].shape[0] if held else 0))
        while size < n_positions:
            size *= 2
        half = dims // 2
        unit = mx.concatenate([mx.ones((half,)), mx.zeros((dims - half,))])
        basis = mx.broadcast_to(unit, (1, 1, size, dims))  # [1, 1, P, dims]
        rot = mx.fast.rope(basis, dims, traditional=False, base=base, scale=scale, offset=0)
        held = (rot[0, 0, :, :half], rot[0, 0, :, half : 2 * half])  # cos, sin [P, dims/2]
        mx.eval(held)
        _TABLES[key] = held
    return held


class TableRoPE(nn.RoPE):
    """nn.RoPE whose float32, integer-offset, non-traditional calls on the CPU read cos and
    sin from `table` (see module)."""

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        if (self.traditional or not isinstance(offset, int) or x.dtype != mx.float32
                or self.base is None or mx.default_device() != mx.cpu):  # fmt: skip
            return super().__call__(x, offset)
        n, half = x.shape[-2], self.dims // 2
        cos, sin = table(self.dims, self.base, self.scale, offset + n)
        c, s = cos[offset : offset + n], sin[offset : offset + n]  # [n, dims/2]
        x1, x2 = x[..., :half], x[..., half : 2 * half]
        parts = [x1 * c - x2 * s, x1 * s + x2 * c]
        if self.dims < x.shape[-1]:
            parts.append(x[..., self.dims :])
        _COUNT["table"] += 1
        return mx.concatenate(parts, axis=-1)


def use_table(net: nn.Module) -> int:
    """Give every plain nn.RoPE of `net` the table path (class swapped in place, same
    settings); the modules changed."""
    n = 0
    for _, m in net.named_modules():
        if type(m) is nn.RoPE:
            m.__class__ = TableRoPE
            n += 1
    return n


def table_calls() -> int:
    """RoPE calls that read the table in this process so far (a row compares two readings)."""
    return _COUNT["table"]
