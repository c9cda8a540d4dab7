"""Lloyd-Max codebooks for TurboQuant (kernels/formats/turbo.py), computed here in numpy.

TurboQuant (Zandieh et al., ICLR 2026, arXiv 2504.19874) quantizes a unit vector u of R^d after
a random rotation. Each rotated coordinate x then has the marginal of one coordinate of a point
uniform on the sphere S^(d-1) (the paper's Lemma 1):

    f(x) = Gamma(d/2) / (sqrt(pi) Gamma((d-1)/2)) * (1 - x^2)^((d-3)/2),   -1 <= x <= 1,

which tends to N(0, 1/d) as d grows. The codebook is the Lloyd-Max quantizer of that law: 2^b
centroids minimizing E[(x - c(x))^2], found by Lloyd's iteration (boundaries at the midpoints
of neighbouring centroids, each centroid the conditional mean of its cell). It is computed in
units of z = sqrt(d) x (variance 1, so the numbers read like the Gaussian table) on a fine grid
with cumulative trapezoid integrals of f and z f, interpolated at the boundaries.
tests/test_turbo.py checks the conditions with an independent quadrature (Gauss-Legendre per
cell), the large-d limit against Max's (1960) Gaussian table, and the distortion against the
paper's Theorem 1 values.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

GRID_POINTS = 400_001  # grid of the integrals over the support |z| <= sqrt(d)
TOL = 1e-12  # stop when no centroid moves more than this (z units)
MAX_ITERS = 20_000


def log_norm_const(d: int) -> float:
    """log of Gamma(d/2) / (sqrt(pi) Gamma((d-1)/2)): the density's constant in x units."""
    return math.lgamma(d / 2) - 0.5 * math.log(math.pi) - math.lgamma((d - 1) / 2)


def density_z(z: np.ndarray, d: int) -> np.ndarray:
    """Density of z = sqrt(d) x, x one coordinate of a uniform point on S^(d-1) (d >= 3)."""
    x2 = np.asarray(z, dtype=np.float64) ** 2 / d
    inside = x2 < 1.0
    log_f = log_norm_const(d) + 0.5 * (d - 3) * np.log1p(-np.where(inside, x2, 0.0))
    return np.where(inside, np.exp(log_f), 0.0) / math.sqrt(d)  # 0 on and beyond |x| = 1


@cache
def _cumulative(d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grid z and cumulative integrals of f and z f from -sqrt(d) (trapezoid rule)."""
    z = np.linspace(-math.sqrt(d), math.sqrt(d), GRID_POINTS)
    f = density_z(z, d)
    dz = z[1] - z[0]
    cum0 = np.concatenate([[0.0], np.cumsum((f[1:] + f[:-1]) * dz / 2)])
    zf = z * f
    cum1 = np.concatenate([[0.0], np.cumsum((zf[1:] + zf[:-1]) * dz / 2)])
    return z, cum0, cum1


def _cell_moments(d: int, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mass and first moment of each cell between consecutive `edges`."""
    z, cum0, cum1 = _cumulative(d)
    m0, m1 = np.interp(edges, z, cum0), np.interp(edges, z, cum1)
    return np.diff(m0), np.diff(m1)


def check_dim(d: int) -> None:
    if d < 3:
        raise ValueError(f"Lloyd-Max codebook: dimension {d} < 3 has no bounded density")


@cache
def codebook(bits: int, d: int) -> tuple[float, ...]:
    """The 2^bits Lloyd-Max centroids (ascending, z = sqrt(d) x units) of the sphere marginal
    in dimension d. Symmetric by construction (the law is)."""
    check_dim(d)
    k = 1 << bits
    half = math.sqrt(d)
    c = np.linspace(-2.5, 2.5, k) if k > 1 else np.zeros(1)  # a spread start, inside support
    for _ in range(MAX_ITERS):
        edges = np.concatenate([[-half], (c[1:] + c[:-1]) / 2, [half]])
        mass, first = _cell_moments(d, edges)
        new = first / mass
        new = (new - new[::-1]) / 2  # the law is symmetric: remove grid asymmetry
        moved = np.max(np.abs(new - c))
        c = new
        if moved < TOL:
            break
    return tuple(float(v) for v in c)


def boundaries(bits: int, d: int) -> tuple[float, ...]:
    """The 2^bits - 1 decision boundaries: midpoints of neighbouring centroids."""
    c = codebook(bits, d)
    return tuple((a + b) / 2 for a, b in zip(c, c[1:]))


def distortion(bits: int, d: int) -> float:
    """E[(z - c(z))^2] in z units: the expected squared error of a unit vector's whole
    quantized rotation (d coordinates of variance 1/d), the paper's D_mse."""
    c = np.array(codebook(bits, d))
    edges = np.concatenate([[-math.sqrt(d)], np.array(boundaries(bits, d)), [math.sqrt(d)]])
    z, cum0, _ = _cumulative(d)
    zz = z * z * density_z(z, d)
    dz = z[1] - z[0]
    cum2 = np.concatenate([[0.0], np.cumsum((zz[1:] + zz[:-1]) * dz / 2)])
    mass, first = _cell_moments(d, edges)
    second = np.diff(np.interp(edges, z, cum2))
    return float(np.sum(second - 2 * c * first + c * c * mass))
