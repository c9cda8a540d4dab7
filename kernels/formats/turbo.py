"""TurboQuant (Zandieh, Daliri, Hadian, Mirrokni, ICLR 2026, arXiv 2504.19874) as KV formats.

One block is one row: a K or V vector of one head at one position (d = head_dim), as in the
paper, which quantizes whole d-dimensional vectors. With x a row and n = ||x||:

* tq{b}_mse (the paper's Algorithm 1, TurboQuant_mse, b bits): u = x / n; y = u R, R the
  random-sign Hadamard rotation (diag(s) H, s in {-1, +1}^d drawn from SEED, H the orthonormal
  Sylvester matrix); each coordinate y_j goes to the nearest of the 2^b Lloyd-Max centroids of
  the sphere marginal in dimension d (kernels/formats/lloyd_max.py, z = sqrt(d) y units).
  Read back: x~ = n * (c[idx] / sqrt(d)) R^T.
* tq{b}_prod (Algorithm 2, TurboQuant_prod, b bits): the mse quantizer at b-1 bits, then a
  1-bit QJL sketch of its residual r = y - y~ (in the rotated basis): sign(S r) with S a d x d
  matrix of i.i.d. N(0, 1) drawn from SEED, and gamma = ||r||. Read back:
  x~ = n * (y~ + sqrt(pi/2) / d * gamma * S^T sign(S r)) R^T, whose inner product with any
  vector is unbiased over S (the paper's Theorem 2; tests/test_turbo.py checks it
  statistically). Sketching r in the rotated basis is the paper's S applied to r R^T with
  S' = S R, which is again i.i.d. N(0, 1): the same estimator, one rotation fewer.

Stored arrays (leading axes [B, H, L]):
  codes  uint8 [.., d*m/8]: the m-bit indices (m = b for mse, b-1 for prod) as one
         little-endian bit stream: bit t of the stream is bit t%8 of byte t//8, index j
         occupies stream bits j*m .. j*m+m-1 (lowest bit first);
  norms  float16 [.., 1]: n;
  signs  uint8 [.., d/8] (prod): bit j (same stream order) is 1 where (S r)_j >= 0;
  rnorms float16 [.., 1] (prod): gamma.
Exact bytes per row: d*b/8 + 2 (mse), d*b/8 + 4 (prod). Encoding computes in float32 and
divides by the float16 norm that is stored, so decode inverts exactly what encode did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import mlx.core as mx
import numpy as np

from kvbench.kernels.formats import lloyd_max
from kvbench.kernels.formats.protocol import Format, Stored
from kvbench.kernels.formats.rotation import sylvester

BITS = (2, 3, 4)  # the widths the issue and the paper's KV experiments use
VARIANTS = ("mse", "prod")
SEED = 2504_19874  # the arXiv number: the rotation signs and the QJL matrix derive from it
MIN_DIM = 8
NAMES = tuple(f"tq{b}_{v}" for v in VARIANTS for b in BITS)


def check_head_dim(name: str, head_dim: int) -> None:
    """ValueError unless head_dim is a power of two >= MIN_DIM (the Hadamard rotation's size:
    one block over the whole row, as the paper rotates whole vectors)."""
    if head_dim < MIN_DIM or head_dim & (head_dim - 1):
        raise ValueError(
            f"{name}: head_dim {head_dim} must be a power of two >= {MIN_DIM} (TurboQuant "
            "rotates the whole row with one Hadamard block)"
        )


def parse_name(name: str) -> tuple[int, str]:
    """'tq3_prod' -> (3, 'prod'); ValueError naming the bit width or variant it cannot use."""
    head, _, variant = name.partition("_")
    bits = head[2:]
    if not head.startswith("tq") or not bits.isdigit() or variant not in VARIANTS:
        raise ValueError(f"{name!r} is not a TurboQuant name (tq<bits>_<mse|prod>)")
    if int(bits) not in BITS:
        raise ValueError(
            f"{name}: TurboQuant bit width {int(bits)} not supported; use one of {BITS}"
        )
    return int(bits), variant


@cache
def rotation_np(seed: int, d: int) -> np.ndarray:
    """R = diag(s) H [d, d], float32: the random-sign Hadamard rotation (rows y = u R)."""
    signs = np.random.default_rng([seed, d, 0]).integers(0, 2, d) * 2 - 1
    return (signs[:, None] * sylvester(d) / math.sqrt(d)).astype(np.float32)


@cache
def qjl_np(seed: int, d: int) -> np.ndarray:
    """S [d, d], float32, i.i.d. N(0, 1): the QJL projection."""
    return np.random.default_rng([seed, d, 1]).standard_normal((d, d)).astype(np.float32)


@cache
def _mx_tables(bits: int, d: int, seed: int) -> tuple[mx.array, ...]:
    r = rotation_np(seed, d)
    return (
        mx.array(r),
        mx.array(np.ascontiguousarray(r.T)),
        mx.array(np.array(lloyd_max.codebook(bits, d), dtype=np.float32) / math.sqrt(d)),
        mx.array(np.array(lloyd_max.boundaries(bits, d), dtype=np.float32) / math.sqrt(d)),
        mx.array(qjl_np(seed, d)),
    )


def pack_bits(codes: mx.array, bits: int) -> mx.array:
    """Indices [..., d] (each < 2^bits) -> uint8 [..., d*bits/8], the stream order above."""
    *lead, d = codes.shape
    stream = (codes.astype(mx.uint32)[..., None] >> mx.arange(bits, dtype=mx.uint32)) & 1
    octets = stream.reshape(*lead, d * bits // 8, 8)  # [..., bytes, 8]
    return mx.sum(octets << mx.arange(8, dtype=mx.uint32), axis=-1).astype(mx.uint8)


def unpack_bits(data: mx.array, bits: int) -> mx.array:
    """uint8 [..., d*bits/8] -> uint32 indices [..., d] (inverse of pack_bits)."""
    *lead, n = data.shape
    stream = (data.astype(mx.uint32)[..., None] >> mx.arange(8, dtype=mx.uint32)) & 1
    per_code = stream.reshape(*lead, n * 8 // bits, bits)  # [..., d, bits]
    return mx.sum(per_code << mx.arange(bits, dtype=mx.uint32), axis=-1)


@dataclass(frozen=True)
class TurboQuant(Format):
    """tq{bits}_{variant}: one float16 norm per row, codes from a Lloyd-Max codebook."""

    name: str
    group_size: int | None = None  # the block is the whole row; no other group
    seed: int = SEED

    quantized = True
    compute_dtype = mx.float16

    def __post_init__(self):
        parse_name(self.name)
        if self.group_size is not None:
            raise ValueError(
                f"{self.name}: group_size must be left out (one block per row, as the paper "
                f"quantizes whole vectors), got {self.group_size!r}"
            )

    @property
    def bits(self) -> int:
        return parse_name(self.name)[0]

    @property
    def prod(self) -> bool:
        return parse_name(self.name)[1] == "prod"

    @property
    def mse_bits(self) -> int:
        """Width of the Lloyd-Max index: b, or b - 1 beside the 1-bit QJL sketch."""
        return self.bits - 1 if self.prod else self.bits

    @property
    def data_bits(self) -> int:
        return self.bits  # prod: b-1 index bits + 1 sketch bit per element

    def mx_quantize_args(self) -> None:
        return None  # own packing, not mx.quantize's

    def describe_scales(self, head_dim: int) -> str:
        extra = ", fp16 residual norm + 1-bit QJL sketch" if self.prod else ""
        return f"fp16 norm per row (block {head_dim}){extra}; seed {self.seed}"

    def nbytes(self, n_rows: int, head_dim: int) -> int:
        """Codes (d*m/8) + an fp16 norm; prod adds d/8 sign bytes and an fp16 residual norm."""
        check_head_dim(self.name, head_dim)
        per_row = head_dim * self.mse_bits // 8 + 2
        if self.prod:
            per_row += head_dim // 8 + 2
        return n_rows * per_row

    def alloc(self, shape: tuple[int, ...]) -> Stored:
        *lead, d = shape
        check_head_dim(self.name, d)
        out = {
            "codes": mx.zeros((*lead, d * self.mse_bits // 8), dtype=mx.uint8),
            "norms": mx.zeros((*lead, 1), dtype=mx.float16),
        }
        if self.prod:
            out["signs"] = mx.zeros((*lead, d // 8), dtype=mx.uint8)
            out["rnorms"] = mx.zeros((*lead, 1), dtype=mx.float16)
        return out

    def encode(self, x: mx.array) -> Stored:
        d = x.shape[-1]
        check_head_dim(self.name, d)
        rot, _, cents, bounds, s = _mx_tables(self.mse_bits, d, self.seed)
        x32 = x.astype(mx.float32)
        norms = mx.sqrt(mx.sum(x32 * x32, axis=-1, keepdims=True)).astype(mx.float16)
        n32 = norms.astype(mx.float32)
        y = (x32 / mx.where(n32 > 0, n32, 1.0)) @ rot  # [..., d] rotated unit rows
        idx = mx.sum(y[..., None] > bounds, axis=-1)  # nearest centroid: cells by midpoints
        out = {"codes": pack_bits(idx, self.mse_bits), "norms": norms}
        if self.prod:
            r = y - cents[idx]  # residual, rotated basis
            out["signs"] = pack_bits((r @ s.T) >= 0, 1)
            out["rnorms"] = mx.sqrt(mx.sum(r * r, axis=-1, keepdims=True)).astype(mx.float16)
        return out

    def centroid_rows(self, stored: Stored) -> mx.array:
        """The Lloyd-Max part read back, rotated basis, unit norm: float32 [..., d]."""
        d = 8 * stored["codes"].shape[-1] // self.mse_bits
        cents = _mx_tables(self.mse_bits, d, self.seed)[2]
        return cents[unpack_bits(stored["codes"], self.mse_bits)]

    def rotated_rows(self, stored: Stored) -> mx.array:
        """The read-back rows in the rotated basis, divided by the norm: float32 [..., d]."""
        y = self.centroid_rows(stored)  # [..., d]
        if not self.prod:
            return y
        d = y.shape[-1]
        s = _mx_tables(self.mse_bits, d, self.seed)[4]
        pm1 = unpack_bits(stored["signs"], 1).astype(mx.float32) * 2 - 1  # [..., d]
        gamma = stored["rnorms"].astype(mx.float32) * math.sqrt(math.pi / 2) / d
        return y + gamma * (pm1 @ s)

    def basis_rows(self, stored: Stored, dtype: mx.Dtype | None = None) -> mx.array:
        """The stored rows as kernels/attention/turbo.py reads them, never rotated back:
        mse n * c [..., d]; prod [n c | n g sign] [..., 2d] with g = sqrt(pi/2)/d * gamma,
        so that basis_query(q) . basis_rows(k) = q . decode(k) and basis_output(p @ rows) =
        p @ decode(v) (module docstring of kernels/attention/turbo.py)."""
        n = stored["norms"].astype(mx.float32)
        rows = n * self.centroid_rows(stored)  # [..., d]
        if self.prod:
            d = rows.shape[-1]
            pm1 = unpack_bits(stored["signs"], 1).astype(mx.float32) * 2 - 1  # [..., d]
            g = stored["rnorms"].astype(mx.float32) * (math.sqrt(math.pi / 2) / d)
            rows = mx.concatenate([rows, (n * g) * pm1], axis=-1)  # [..., 2d]
        return rows.astype(dtype or self.compute_dtype)

    def basis_query(self, q: mx.array) -> mx.array:
        """q [..., d] -> float32 [..., d] q R (mse) or [..., 2d] [q R | q R S^T] (prod)."""
        rot, _, _, _, s = _mx_tables(self.mse_bits, q.shape[-1], self.seed)
        qr = q.astype(mx.float32) @ rot
        return mx.concatenate([qr, qr @ s.T], axis=-1) if self.prod else qr

    def basis_output(self, o: mx.array) -> mx.array:
        """Sum of p_j basis_rows(v)_j [..., d or 2d] -> float32 [..., d] in the model's basis:
        o R^T (mse), (o[:d] + o[d:] S) R^T (prod)."""
        d = o.shape[-1] // 2 if self.prod else o.shape[-1]
        _, back, _, _, s = _mx_tables(self.mse_bits, d, self.seed)
        o = o.astype(mx.float32)
        if self.prod:
            o = o[..., :d] + o[..., d:] @ s
        return o @ back

    def decode(self, stored: Stored, dtype: mx.Dtype | None = None) -> mx.array:
        y = self.rotated_rows(stored)
        back = _mx_tables(self.mse_bits, y.shape[-1], self.seed)[1]
        x = (y @ back) * stored["norms"].astype(mx.float32)
        return x.astype(dtype or self.compute_dtype)


def turbo(name: str):
    parse_name(name)
    return lambda group_size=None: TurboQuant(name, group_size)
