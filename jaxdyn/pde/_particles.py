"""Particles ↔ density on S¹: sampling, kernel densities, the exact circular W1 distance.

Sampling from cell averages, a kernel density of a cloud on the grid, and the exact circular
Wasserstein-1 distance between a grid density and a cloud. These are host functions (NumPy,
float64): inverse CDFs, sorting and a bisection on data-dependent knots; they take and return
concrete arrays.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_cloud, check_density, check_dtype, check_host, check_integer

__all__ = ["sample_density", "quantile_points", "angles", "kde_circle", "w1_circle", "w1_circle_densities",
           "empirical_modes", "histogram_circle"]


def _points(name, x, fn):
    """Points of S¹ (..., N, 2), N >= 1, finite: as a float64 NumPy array (refused by name)."""
    check_host(fn, **{name: x})
    check_dtype(name, x, half=True, fn=fn)
    check_cloud(name, x)
    if np.shape(x)[-1] != 2:
        raise ValueError(f"{name} must hold points of S¹ in the plane, shape (..., N, 2), got "
                         f"shape {tuple(np.shape(x))}")
    return np.asarray(x, float)


def _cells(m):
    """The number of cells M, an integer >= 1 (a ValueError otherwise)."""
    return check_integer("m (number of cells)", m, minimum=1, integral_floats=True)


def _cdf_nodes(rho, name="rho"):
    """Cumulative mass at the cell edges θ_j − h/2 (j = 0..M), normalised to 1.

    Returns:
      (the (M + 1,) cumulative masses, the cell width h).

    Raises:
      ValueError: ``rho`` not 1-D, not finite, negative somewhere or of zero mass.
    """
    rho = check_density(name, rho)
    if rho.ndim != 1:
        raise ValueError(f"{name} must be the (M,) cell averages of one density, got shape "
                         f"{rho.shape}")
    m = rho.shape[-1]
    h = 2 * math.pi / m
    cum = np.concatenate([[0.0], np.cumsum(rho) * h])
    return cum / cum[-1], h


def sample_density(key, rho, n: int):
    """Draw n i.i.d. points on S¹ from the density with cell averages ``rho``, by the exact inverse CDF.

    The density is piecewise constant on the cells [θ_j − h/2, θ_j + h/2].

    Args:
      key: a ``jax.random`` key.
      rho: (M,) cell averages (finite, ≥ 0, any positive mass).
      n: the number of points (an integer ≥ 0).

    Returns:
      (n, 2) NumPy float64 points.

    A ValueError (from the shared checks, :mod:`jaxdyn._checks`) refuses a ``rho`` that is not
    finite, negative somewhere or of zero mass, and an ``n`` that is not an integer ≥ 0.
    """
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    return _inverse_cdf_points(
        rho, n, lambda k: np.asarray(jax.random.uniform(key, (k,), dtype=dtype), float))


def _inverse_cdf_points(rho, n, levels):
    """The n points F⁻¹(u) on S¹, u = ``levels(n)``, of the exact CDF F of ``rho``; n and rho checked."""
    n = check_integer("n", n, minimum=0)
    cdf, h = _cdf_nodes(rho)
    u = levels(n)
    j = np.clip(np.searchsorted(cdf, u, side="right") - 1, 0, len(cdf) - 2)
    frac = (u - cdf[j]) / np.maximum(cdf[j + 1] - cdf[j], 1e-300)
    theta = (j + np.clip(frac, 0, 1) - 0.5) * h
    return np.stack([np.cos(theta), np.sin(theta)], -1)


def quantile_points(rho, n: int):
    """Place n stratified points on S¹ for the density with cell averages ``rho``: θ_j = F⁻¹((j + ½)/n).

    F is the exact piecewise-linear CDF (from θ = −h/2). The points' empirical measure carries
    the density's own Fourier modes (up to O(1/n) and aliasing at k ≥ n − k_max), not the
    O(n^{-1/2}) noise of i.i.d. samples: a perturbation of size ε ≪ n^{-1/2} survives.

    Args:
      rho: the cell averages, as for :func:`sample_density`.
      n: the number of points, as there.

    Returns:
      (n, 2) NumPy float64 points.

    The checks of ``rho`` and ``n`` (and their ValueErrors) are those of :func:`sample_density`.
    """
    return _inverse_cdf_points(rho, n, lambda k: (np.arange(k) + 0.5) / k)


def empirical_modes(x, ks):
    """The amplitudes |(1/N) Σ_j e^{ikθ_j}| of the modes ``ks`` of clouds on S¹.

    The amplitude of mode k of the empirical measure (1 for every k on one point; for a density,
    the same quantity is |∫ e^{ikθ} ρ dθ|).

    Args:
      x: (..., N, 2) clouds.
      ks: the modes (integers).

    Returns:
      (..., len(ks)) NumPy float64 amplitudes.

    A ValueError (from the shared checks, :mod:`jaxdyn._checks`) refuses an ``x`` that is not
    (..., N, 2) with N ≥ 1, or not finite; a TypeError a traced ``x`` (host-only).

    Dtypes: float32 or float64, float16 or bfloat16 (computed in float64 on the host);
    integers are converted to float; complex is refused (a TypeError naming ``x``).
    """
    x = _points("x", x, "empirical_modes")
    th = angles(x.reshape(-1, x.shape[-2], 2))
    ks = np.asarray(ks)
    out = np.stack([np.abs(_emp_coefficients(t, ks)) for t in th])
    return out.reshape(x.shape[:-2] + (len(ks),))


def histogram_circle(x, m: int):
    """Cell averages counts/(N h) of the empirical measure of clouds on the M-cell grid.

    Cells [θ_j − h/2, θ_j + h/2], no smoothing, so ``cluster_counts`` reads it with the same
    thresholds as a solver density (a kernel density would move mass out of the arcs).

    Args:
      x: (..., N, 2) clouds.
      m: the number of cells M.

    Returns:
      (..., M) NumPy float64 cell averages.

    A ValueError (from the shared checks, :mod:`jaxdyn._checks`) refuses an ``x`` that is not
    (..., N, 2) with N ≥ 1, or not finite, and an ``m`` that is not an integer ≥ 1; a
    TypeError a traced ``x`` (host-only).

    Dtypes: float32 or float64, float16 or bfloat16 (computed in float64 on the host);
    integers are converted to float; complex is refused (a TypeError naming ``x``).
    """
    m = _cells(m)
    x = _points("x", x, "histogram_circle")
    h = 2 * math.pi / m
    th = angles(x.reshape(-1, x.shape[-2], 2))
    j = np.floor(np.mod(th + h / 2, 2 * math.pi) / h).astype(int) % m
    out = np.stack([np.bincount(r, minlength=m) for r in j]) / (x.shape[-2] * h)
    return out.reshape(x.shape[:-2] + (m,))


def angles(x):
    """Angles in [0, 2π) of points on S¹.

    Host-only: a traced ``x`` is refused with a TypeError naming ``angles``.

    Dtypes: float32 or float64, float16 or bfloat16 (computed in float64 on the host);
    integers are converted to float; complex is refused (a TypeError naming ``x``).

    Args:
      x: (..., 2) points.

    Returns:
      (...,) NumPy float64 angles; NaN where a point is not finite.

    Raises:
      ValueError: ``x`` whose last axis is not 2.
    """
    check_host("angles", x=x)
    check_dtype("x", x, half=True, fn="angles")
    x = np.asarray(np.asarray(x).astype(np.float64))
    if x.ndim < 1 or x.shape[-1] != 2:
        raise ValueError(f"angles: x must hold points of the plane, shape (..., 2), got shape "
                         f"{x.shape}")
    th = np.mod(np.arctan2(x[..., 1], x[..., 0]), 2 * math.pi)
    return np.where(np.all(np.isfinite(x), axis=-1), th, np.nan)


def kde_circle(x, m: int, bandwidth: float):
    """Kernel density of a cloud on the M-cell grid: the wrapped Gaussian mixture (1/n) Σ_i N(θ_i, bw²).

    Its cell averages, exactly by the FFT (its Fourier coefficients are e^{−k²bw²/2} times those
    of the empirical measure, times the cell average's sinc factor).

    Args:
      x: (n, 2) points.
      m: the number of cells M.
      bandwidth: the Gaussian's standard deviation (radians).

    Returns:
      (M,) NumPy float64 cell averages.

    Raises:
      ValueError: ``x`` not (n, 2) with n ≥ 1, or not finite; ``m`` not an integer ≥ 1; a
        bandwidth that is not finite and > 0.
    """
    m = _cells(m)
    x = _points("x", x, "kde_circle")
    if x.ndim != 2:
        raise ValueError(f"x must be one cloud of shape (n, 2), got shape {x.shape}")
    if not (np.ndim(bandwidth) == 0 and math.isfinite(float(bandwidth)) and float(bandwidth) > 0):
        # 0 would be the empirical measure cut at M/2 modes: Gibbs oscillations, negative cells
        raise ValueError(f"bandwidth must be a finite number > 0 (radians; for the cell counts "
                         f"use histogram_circle), got {bandwidth!r}")
    th = angles(x)
    n = np.arange(m // 2 + 1)
    emp = _emp_coefficients(th, n)
    spec = emp * np.exp(-0.5 * (n * bandwidth) ** 2) * np.sinc(n / m)
    return np.fft.irfft(spec * m, n=m) / (2 * math.pi)


def _emp_coefficients(th, n, chunk_elems=2 ** 22):
    """(1/N) Σ_j e^{−i n θ_j} for the modes n, in chunks of particles (memory O(chunk_elems))."""
    out = np.zeros(len(n), complex)
    step = max(1, chunk_elems // max(1, len(n)))
    for s in range(0, th.size, step):
        out += np.exp(-1j * np.outer(n, th[s:s + step])).sum(axis=1)
    return out / th.size


def _circular_w1(seg_len, f_lo, f_hi):
    """Min over c of Σ_s ∫_seg |f − c| for f linear on each segment (from f_lo to f_hi).

    The minimiser c is the median of the pushforward of Lebesgue measure by f (a mixture of
    uniforms), found exactly from its piecewise-linear CDF; then each segment's integral in
    closed form.

    Returns:
      (the minimum, c).
    """
    lo, hi = np.minimum(f_lo, f_hi), np.maximum(f_lo, f_hi)
    total = seg_len.sum()
    flat = hi - lo <= 1e-300
    pts = np.unique(np.concatenate([lo, hi]))

    def H(c):  # Lebesgue measure of {f ≤ c}, vectorised over c
        c = np.asarray(c)[:, None]
        frac = np.where(flat[None], (c >= lo[None]).astype(float),
                        np.clip((c - lo[None]) / np.where(flat, 1, hi - lo)[None], 0, 1))
        return frac @ seg_len

    # H is nondecreasing, piecewise linear with knots at pts: bisect on the knots
    a, b = 0, len(pts) - 1
    half = total / 2
    while b - a > 1:
        mid = (a + b) // 2
        if H([pts[mid]])[0] < half:
            a = mid
        else:
            b = mid
    ha, hb = H([pts[a], pts[b]])
    c = pts[a] if hb <= ha else pts[a] + (half - ha) / (hb - ha) * (pts[b] - pts[a])
    if H([pts[0]])[0] >= half:
        c = pts[0]
    # ∫ |f − c| over each segment
    mean = (lo + hi) / 2
    width = np.where(flat, 1.0, hi - lo)
    inside = np.where(flat, np.abs(mean - c), ((hi - c) ** 2 + (c - lo) ** 2) / (2 * width))
    val = np.where(c <= lo, mean - c, np.where(c >= hi, c - mean, inside))
    return float(np.sum(seg_len * val)), float(c)


def w1_circle(rho, x):
    """W1 on S¹ (geodesic cost) between a grid density and the empirical measure of a cloud.

    W1 = min_c ∫_0^{2π} |F(θ) − G(θ) − c| dθ, F, G the CDFs from θ = −h/2 (the circular formula;
    exact: F − G is linear between the merged cell edges and particle angles, and the minimising
    c is computed exactly).

    Args:
      rho: (M,) cell averages (piecewise constant on cells; finite, ≥ 0, normalised to mass 1).
      x: (n, 2) points.

    Returns:
      W1 as a Python float.

    Raises:
      ValueError: ``rho`` not finite, negative somewhere or of zero mass; ``x`` not (n, 2) with
        n ≥ 1, or not finite.
    """
    x = _points("x", x, "w1_circle")
    if x.ndim != 2:
        raise ValueError(f"x must be one cloud of shape (n, 2), got shape {x.shape}")
    cdf, h = _cdf_nodes(rho)
    m = len(cdf) - 1
    th = np.sort(np.mod(angles(x) + h / 2, 2 * math.pi))  # measured from the first edge
    edges = np.arange(m + 1) * h
    knots = np.unique(np.concatenate([edges, th]))
    F = np.interp(knots, edges, cdf)
    G_right = np.searchsorted(th, knots, side="right") / th.size  # G just after each knot
    # on (knots[i], knots[i+1]) G is constant = G_right[i]; F linear
    seg = np.diff(knots)
    f_lo = F[:-1] - G_right[:-1]
    f_hi = F[1:] - G_right[:-1]
    return _circular_w1(seg, f_lo, f_hi)[0]


def _cdf_at(rho, theta, name="rho"):
    """Mass of the piecewise-constant density in [−h/2, θ] for any real θ (each turn adds 1)."""
    cdf, h = _cdf_nodes(rho, name)
    m = len(cdf) - 1
    u = np.asarray(theta) + h / 2
    turns = np.floor(u / (2 * math.pi))
    return turns + np.interp(u - turns * 2 * math.pi, np.arange(m + 1) * h, cdf)


def w1_circle_densities(rho_a, rho_b):
    """W1 on S¹ between two densities given by cell averages (the grids may differ).

    Exact: the densities are piecewise constant on their cells (centred at jh), so the
    difference of the CDFs is linear between the merged cell edges.

    Args:
      rho_a: (M_a,) cell averages (finite, ≥ 0, positive mass; normalised to 1 here).
      rho_b: (M_b,) cell averages (the same).

    Returns:
      W1 as a Python float.

    A ValueError (from the shared checks, :mod:`jaxdyn._checks`) refuses a density that is not
    finite, negative somewhere or of zero mass; a TypeError a traced one (host-only).

    Dtypes: float32 or float64, float16 or bfloat16 (computed in float64 on the host);
    integers are converted to float; complex is refused (a TypeError naming the density).
    """
    rho_a = check_density("rho_a", rho_a, fn="w1_circle_densities")
    rho_b = check_density("rho_b", rho_b, fn="w1_circle_densities")
    ma, mb = np.shape(rho_a)[-1], np.shape(rho_b)[-1]
    ha, hb = 2 * math.pi / ma, 2 * math.pi / mb
    o = -ha / 2
    eb = (np.arange(mb + 1) - 0.5) * hb
    eb = np.mod(eb - o, 2 * math.pi) + o
    knots = np.unique(np.concatenate([o + np.arange(ma + 1) * ha, eb, [o, o + 2 * math.pi]]))
    d = ((_cdf_at(rho_a, knots, "rho_a") - _cdf_at(rho_a, o, "rho_a"))
         - (_cdf_at(rho_b, knots, "rho_b") - _cdf_at(rho_b, o, "rho_b")))
    return _circular_w1(np.diff(knots), d[:-1], d[1:])[0]
