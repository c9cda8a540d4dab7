"""The parity gate: a kernel's output against the float32 reference on the same stored cache,
before anything is timed (a kernel that fails it gets an error row, never a time), and the
accuracy figures of a row (against the reference over the un-quantized K/V)."""

from __future__ import annotations

import mlx.core as mx

# parity tolerance (relative L2 error vs the float32 reference on the same stored cache), by
# the dtype the kernel computes in: rounding of q, scores and probabilities, not the format's.
# Loose enough for paths that keep scores in fp16 (quantized_matmul and mlx-lm at affine8
# measured rel_err 5.2e-3), tight enough for real bugs (a 5% error fails: tests/test_session.py)
PARITY_REL_TOL = {mx.float32: 1e-4, mx.float16: 1e-2, mx.bfloat16: 5e-2}


class ParityError(RuntimeError):
    """A kernel's output disagrees with the reference: the case gets an error row."""


def compare_outputs(out: mx.array, ref: mx.array) -> dict:
    """max abs error, relative L2 error and cosine similarity of out against ref."""
    o, r = out.astype(mx.float32).reshape(-1), ref.astype(mx.float32).reshape(-1)
    diff = o - r
    stats = {
        "max_abs_err": mx.max(mx.abs(diff)),
        "rel_err": mx.linalg.norm(diff) / mx.linalg.norm(r),
        "cosine": mx.sum(o * r) / (mx.linalg.norm(o) * mx.linalg.norm(r)),
    }
    return {k: float(v.item()) for k, v in stats.items()}


def recon_err(decoded: tuple, originals: tuple) -> float:
    """Relative L2 error of decoded K and V (together, float32) against the float32 originals."""
    num = sum(mx.sum((d - x) * (d - x)).item() for d, x in zip(decoded, originals))
    den = sum(mx.sum(x * x).item() for x in originals)
    return (num / den) ** 0.5


def parity_gate(name: str, out: mx.array, ref: mx.array, compute_dtype: mx.Dtype) -> dict:
    """Raise ParityError unless out matches ref within the tolerance of compute_dtype."""
    parity = compare_outputs(out, ref)
    tol = PARITY_REL_TOL[compute_dtype]
    if not parity["rel_err"] <= tol:  # NaN fails too
        raise ParityError(
            f"kernel {name} disagrees with the float32 reference on the same "
            f"cache: rel_err {parity['rel_err']:.3g} > {tol:g}"
        )
    return parity
