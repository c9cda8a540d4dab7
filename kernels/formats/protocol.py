"""What every KV-cache format declares (kernels/formats/registry.py, kernels/formats/quant.py).

A format turns float K/V rows (last axis = head_dim) into the named arrays a cache stores, and
back. Every stored array's leading axes are [n_buffers, n_kv_heads, positions], so a cache can
write and slice positions without knowing the format. Members that only some formats have are
declared here too, with a stated "not applicable" value, so callers never test for attributes.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

import mlx.core as mx

Stored = dict[str, mx.array]


@runtime_checkable
class Format(Protocol):
    name: str  # the kv_dtype name in suites and results
    group_size: int | None  # as the case gives it; None: per row, the mode's default, or n/a
    quantized: ClassVar[bool]  # False: dense floating-point storage
    compute_dtype: mx.Dtype  # dtype queries, outputs and incoming K/V travel in
    data_bits: int  # width of one element's code, scales and biases excluded (16 for fp16)

    def alloc(self, shape: tuple[int, ...]) -> Stored:
        """Zeroed storage for float rows of `shape` [..., head_dim]."""
        ...

    def encode(self, x: mx.array) -> Stored:
        """The stored arrays of float rows x [..., head_dim]."""
        ...

    def decode(self, stored: Stored, dtype: mx.Dtype | None = None) -> mx.array:
        """Float rows [..., head_dim] in `dtype` (None: compute_dtype) of stored arrays."""
        ...

    def nbytes(self, n_rows: int, head_dim: int) -> int:
        """Exact bytes to store `n_rows` rows of `head_dim` values (data + scales + biases)."""
        ...

    def mx_quantize_args(self) -> dict | None:
        """The keyword arguments (group_size, bits, mode) of mx.quantize / mx.dequantize /
        mx.quantized_matmul when the stored arrays are exactly what mx.quantize returns;
        None for every other format (not applicable)."""
        ...

    def describe_scales(self, head_dim: int) -> str:
        """The scale granularity in words, e.g. "no scales", "per row (group 128)"."""
        ...

    def calibrate(self, x: mx.array, role: str) -> Format:
        """The format with its scale fixed from the first rows x [B, H, L, D] of one layer's K
        (role "k") or V ("v"): FP8's calibrated / per_head scales. Every other format: itself."""
        return self

    def tensor_scale(self) -> tuple[float, ...]:
        """The factor every decoded value of a tensor carries, one or one per KV head (FP8's
        scale): a kernel may read the rows at scale 1 and fold it into q and the output
        (kernels/attention/registry.py kv_scaled). (1.0,) for every other format."""
        return (1.0,)

    def saturated(self, x: mx.array) -> mx.array | None:
        """How many elements of rows x the format stores as its largest value instead of
        their own (FP8 saturates: an int32 scalar); None where nothing saturates."""
        return None

    def tensor_bytes(self, n_kv_heads: int) -> int:
        """Bytes one layer's K (or V) stores once, whatever its length: a per-tensor scale
        (FP8, kernels/formats/fp8.py). 0 for every format whose scales are per row or group."""
        return 0

    def bits_per_elem(self, head_dim: int) -> float:
        """Exact stored bits per K/V element at `head_dim`, scales and biases included."""
        return 8 * self.nbytes(1, head_dim) / head_dim


# the role of each stored array that is not data, by its name (any other array is data: codes,
# ggml's high bits, TurboQuant's signs); `kvbench plan` and the format tests read it
PART_ROLE = {"scales": "scales", "norms": "scales", "rnorms": "scales", "biases": "biases",
             "mins": "biases"}  # fmt: skip


def row_parts(fmt: Format, head_dim: int) -> dict:
    """Bytes of one row (one position x one head) by role: data, scales, biases (every stored
    array counted once: their sum is the format's nbytes)."""
    parts = {"data": 0, "scales": 0, "biases": 0}
    for name, a in fmt.alloc((1, 1, 1, head_dim)).items():  # lazy: nothing is allocated
        parts[PART_ROLE.get(name, "data")] += a.nbytes
    assert sum(parts.values()) == fmt.nbytes(1, head_dim), "alloc disagrees with nbytes"
    return parts
