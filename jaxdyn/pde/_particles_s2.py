"""Particles ↔ density on S²: sampling, kernel densities, the W2 check against particles.

On the latitude–longitude grid of :class:`SphereDensity`: sampling from cell averages, a kernel
density of a cloud on the grid, and the W2 check against particles. These are host functions
(NumPy, float64; the grid comes from the model's static sizes).

The W2 check uses :func:`jaxdyn.w2_exact` (optimal assignment: no ε bias), which takes two clouds of
equal size and uniform weights. The density is therefore represented by i.i.d. samples of it
(exact: cell by mass, then uniform by area inside the cell), and the particle cloud x(t) is
compared with the *null level* of two independent samples of ρ(t):

    d_pρ = W2(x(t), Y(t)),   d_ρρ = W2(Y(t), Y'(t)),   Y, Y' ~ ρ(t) i.i.d., |Y| = |Y'| = N.

If the particles follow the density, x(t) is (to O(1/N) correlations, propagation of chaos) an
i.i.d. sample of ρ(t) and d_pρ has the law of d_ρρ; a density that is off by W2 = δ makes
d_pρ → δ while d_ρρ → 0 as N grows. At t = 0 the two have the same law exactly.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ..distances import w2_exact
from ._sphere2 import SphereDensity

__all__ = ["sample_sphere_density", "kde_sphere", "sphere_cell_centres", "w2_sphere_check",
           "sphere_cell_averages"]


def _edges(model: SphereDensity):
    te = np.arange(model.n_lat + 1) * math.pi / model.n_lat
    pe = np.arange(model.n_lon + 1) * 2 * math.pi / model.n_lon
    return te, pe


def _areas(model: SphereDensity):
    te, _ = _edges(model)
    return (2 * math.pi / model.n_lon) * (np.cos(te[:-1]) - np.cos(te[1:]))


def sphere_cell_centres(model: SphereDensity):
    """Cell centres: colatitude (i + 1/2)π/n_lat, longitude (j + 1/2)2π/n_lon.

    Args:
      model: a :class:`SphereDensity` (its grid).

    Returns:
      (n_lat, n_lon, 3) NumPy float64 points.
    """
    tc = (np.arange(model.n_lat) + 0.5) * math.pi / model.n_lat
    pc = (np.arange(model.n_lon) + 0.5) * 2 * math.pi / model.n_lon
    T, P = np.meshgrid(tc, pc, indexing="ij")
    return np.stack([np.sin(T) * np.cos(P), np.sin(T) * np.sin(P), np.cos(T)], -1)


def sphere_cell_averages(model: SphereDensity, f, q: int = 8):
    """Cell averages of a function on S² on the model's grid, by Gauss–Legendre quadrature.

    Gauss–Legendre in cos ϑ and in φ, q × q nodes a cell (exact for polynomials of degree
    2q − 1 in (cos ϑ, φ)).

    Args:
      model: a :class:`SphereDensity` (its grid).
      f: a function of points (..., 3) on S², returning (...,) values.
      q: nodes per cell and direction.

    Returns:
      (n_lat, n_lon) NumPy float64 cell averages.
    """
    te, pe = _edges(model)
    x, w = np.polynomial.legendre.leggauss(q)
    c0, c1 = np.cos(te[:-1]), np.cos(te[1:])
    out = np.zeros((model.n_lat, model.n_lon))
    for xa, wa in zip(x, w):
        ct = (c0 + c1) / 2 + xa * (c1 - c0) / 2
        st = np.sqrt(np.maximum(1 - ct * ct, 0))
        for xb, wb in zip(x, w):
            ph = (pe[:-1] + pe[1:]) / 2 + xb * (pe[1] - pe[0]) / 2
            pts = np.stack([st[:, None] * np.cos(ph)[None], st[:, None] * np.sin(ph)[None],
                            np.broadcast_to(ct[:, None], (model.n_lat, model.n_lon))], -1)
            out += wa * wb / 4 * np.asarray(f(pts))
    return out


def sample_sphere_density(key, model: SphereDensity, rho, n: int):
    """Draw n i.i.d. points from the density with cell averages ``rho`` on the model's grid.

    The density is piecewise constant on the cells: a cell with probability ρ_ij A_i, then a
    point uniform by area in it (cos ϑ uniform between the cell's edges, φ uniform).

    Args:
      key: a ``jax.random`` key.
      model: a :class:`SphereDensity` (its grid).
      rho: (n_lat, n_lon) cell averages (finite, ≥ 0, positive mass).
      n: the number of points.

    Returns:
      (n, 3) NumPy float64 points.

    Raises:
      ValueError: ``rho`` of the wrong shape, not finite, negative, or without mass.
    """
    rho = np.asarray(rho, float)
    if rho.shape != (model.n_lat, model.n_lon) or not np.all(np.isfinite(rho)) or np.any(rho < 0):
        raise ValueError(f"rho must be finite, >= 0, of shape {(model.n_lat, model.n_lon)}, got "
                         f"shape {rho.shape}")
    mass = (rho * _areas(model)[:, None]).ravel()
    if not mass.sum() > 0:
        raise ValueError("rho has no mass")
    k1, k2, k3 = jax.random.split(key, 3)
    cdf = np.cumsum(mass) / mass.sum()
    u = np.asarray(jax.random.uniform(k1, (n,), dtype=jnp.float64), float)
    cell = np.minimum(np.searchsorted(cdf, u, side="right"), cdf.size - 1)
    i, j = np.divmod(cell, model.n_lon)
    te, pe = _edges(model)
    a = np.asarray(jax.random.uniform(k2, (n,), dtype=jnp.float64), float)
    b = np.asarray(jax.random.uniform(k3, (n,), dtype=jnp.float64), float)
    ct = np.cos(te[i]) + a * (np.cos(te[i + 1]) - np.cos(te[i]))
    st = np.sqrt(np.maximum(1 - ct * ct, 0))
    ph = pe[j] + b * (pe[1] - pe[0])
    return np.stack([st * np.cos(ph), st * np.sin(ph), ct], -1)


def kde_sphere(x, model: SphereDensity, bandwidth: float, chunk: int = 4096):
    """Kernel density of a cloud at the cell centres: the von Mises–Fisher mixture (1/n) Σ_i c_κ e^{κ⟨y, x_i⟩}.

    κ = 1/bandwidth², c_κ = κ/(4π sinh κ) (each kernel a probability density on S²; evaluated as
    κ e^{κ(⟨y,x_i⟩−1)}/(2π(1 − e^{−2κ}))).

    Args:
      x: (n, 3) points.
      model: a :class:`SphereDensity` (its grid).
      bandwidth: the kernel's width 1/√κ (> 0).
      chunk: points per block of the sum (memory).

    Returns:
      (n_lat, n_lon) NumPy float64 densities.

    Raises:
      ValueError: bandwidth ≤ 0.
    """
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    x = np.asarray(x, float)
    kappa = 1.0 / bandwidth ** 2
    y = sphere_cell_centres(model).reshape(-1, 3)
    out = np.zeros(len(y))
    for s in range(0, len(x), chunk):
        out += np.exp(kappa * (y @ x[s:s + chunk].T - 1)).sum(1)
    c = kappa / (2 * math.pi * -np.expm1(-2 * kappa))
    return (c * out / len(x)).reshape(model.n_lat, model.n_lon)


def w2_sphere_check(key, x, model: SphereDensity, rho):
    """The pair (d_pρ, d_ρρ): W2 from a cloud to samples of the density, and the null level.

    W2 (exact assignment) from the cloud x to N i.i.d. samples Y of the density ``rho`` on the
    model's grid, and between Y and a second independent sample Y' (module docstring).

    Args:
      key: a ``jax.random`` key (both samples).
      x: (N, 3) points.
      model: a :class:`SphereDensity` (its grid).
      rho: (n_lat, n_lon) cell averages.

    Returns:
      (d_pρ, d_ρρ) as Python floats.
    """
    x = np.asarray(x, float)
    k1, k2 = jax.random.split(key)
    y = sample_sphere_density(k1, model, rho, len(x))
    y2 = sample_sphere_density(k2, model, rho, len(x))
    return float(w2_exact(x, y).value), float(w2_exact(y, y2).value)
