r"""Gaussian clouds of particles and their empirical statistics (Paper B's particle studies).

* :func:`gaussian_cloud`: n i.i.d. samples ``m + z S^{1/2}`` of N(m, S), from a JAX key or a
  NumPy seed, optionally with exactly the moments (m, S);
* :func:`directions`, :func:`cloud_stats`: per-frame mean, covariance, radius and the largest
  |skewness| / |excess kurtosis| over fixed projections;
* :func:`bures_distance`: :func:`jaxdyn.distances.bures_w2` of moment pairs, read on the host;
* :func:`parting_time`, :func:`fit_slope`: when particles and closure part ways; log–log slopes.

The one PSD square root of the package is :func:`jaxdyn.distances.sqrtm_psd`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import (any_nonfinite, check_cloud, check_dtype, check_finite, check_host, check_integer,
                       check_same_length, nan_where, real_arrays)
from ..distances import bures_w2, sqrtm_psd
from ..sphere._sampling import normal_rows

__all__ = ["gaussian_cloud", "directions", "cloud_stats", "bures_distance", "parting_time",
           "fit_slope"]


def _sqrt64(S):
    """``S^{1/2}`` of a PSD matrix as a float64 NumPy array (:func:`sqrtm_psd` in float64)."""
    # evaluated now, also while a caller's function is traced (S is concrete: the cloud of a
    # jitted function built from host weights)
    with jax.enable_x64(True), jax.ensure_compile_time_eval():
        return np.asarray(sqrtm_psd(jnp.asarray(np.asarray(S, np.float64))), np.float64)


def gaussian_cloud(key, n: int, m, S, *, exact_moments: bool = False, dtype=np.float64):
    """``n`` points ``x_i = m + z_i S^{1/2}``, ``z_i`` i.i.d. N(0, I_d): a (n, d) sample of N(m, S).

    ``key`` picks the random stream and the array type:

    * a JAX PRNG key (a ``jax.Array``): ``z = jax.random.normal(key, (n, d), dtype)``, the
      sum in ``dtype``; returns a JAX array;
    * a NumPy seed (an int, a sequence of ints, or a ``np.random.Generator``, which is used
      and advanced): ``z = np.random.default_rng(key).standard_normal((n, d))`` in float64,
      cast to ``dtype`` at the end; returns a NumPy array.

    ``exact_moments=True`` first whitens the z (``z ← (z − z̄) Ĉ_z^{-1/2}``, needs n > d), so
    that the cloud's empirical mean and covariance (1/n) are exactly m and S: a start whose
    only remaining error is in the shape of the law, which isolates the error the finite-N
    dynamics add in a transfer study. ``S^{1/2}`` is :func:`jaxdyn.distances.sqrtm_psd`
    (valid for singular S).

    Args:
        key: a JAX PRNG key or a NumPy seed / Generator.
        n: number of points.
        m: (d,) mean.
        S: (d, d) covariance.
        exact_moments: whiten the draws first (module doc).
        dtype: the points' dtype.

    Returns:
        (n, d) points.

    Raises:
        ValueError: ``n`` not an integer >= 1, ``m`` not a finite (d,) vector, ``S`` not a
            (d, d) covariance (finite, symmetric, PSD), or ``exact_moments`` with ``n <= d``.
    """
    from ._solve import check_covariance

    n = check_integer("n (number of points)", n, minimum=1)
    check_finite("m", m)
    m = np.asarray(m, np.float64)
    if m.ndim != 1:
        raise ValueError(f"m must be a (d,) mean vector, got shape {m.shape}")
    d = m.shape[0]
    if np.shape(S) != (d, d):
        raise ValueError(f"S must have shape ({d}, {d}) to match m, got {tuple(np.shape(S))}")
    S_host = np.asarray(S)
    check_covariance(S_host if np.issubdtype(S_host.dtype, np.floating)
                     else S_host.astype(np.float64), "S")
    if exact_moments and n <= d:
        raise ValueError(f"exact_moments needs n > d, got n = {n}, d = {d}")
    R = _sqrt64(S)
    if isinstance(key, jax.Array):
        z = normal_rows(key, n, d, dtype)  # jax.random.normal's numbers, one program per 2^k rows
        if exact_moments:
            z = z - jnp.mean(z, axis=0)
            w, u = jnp.linalg.eigh(z.T @ z / n)
            z = z @ (u / jnp.sqrt(w)) @ u.T
        return jnp.asarray(m, dtype) + z @ jnp.asarray(R, dtype)
    z = np.random.default_rng(key).standard_normal((n, d))
    if exact_moments:
        z = z - z.mean(axis=0)
        w, u = np.linalg.eigh(z.T @ z / n)
        z = z @ (u / np.sqrt(w)) @ u.T
    return (m + z @ R).astype(dtype)


def directions(d: int, k: int, dtype=jnp.float64):
    """(d, k) unit directions for the projected moments.

    Evenly spaced angles on [0, π) in d = 2, (1,) in d = 1, fixed Gaussian draws (key 0)
    normalised otherwise.

    Args:
        d: dimension.
        k: number of directions.
        dtype: the array's dtype.

    Returns:
        (d, k) array.

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses d or k not an
    integer >= 1.
    """
    d = check_integer("d (the dimension)", d, minimum=1)
    k = check_integer("k (number of directions)", k, minimum=1)
    if d == 1:
        return jnp.ones((1, 1), dtype)
    if d == 2:
        th = np.pi * np.arange(k) / k
        return jnp.asarray(np.stack([np.cos(th), np.sin(th)]), dtype)
    g = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (d, k), jnp.float64))
    return jnp.asarray(g / np.linalg.norm(g, axis=0, keepdims=True), dtype)


def _max_radius(xs):
    """The largest radius of each frame, computed without overflow or underflow.

    Each frame is divided by its largest magnitude first: the squares of float32 points of
    size 1e±30 overflow or underflow (an infinite or zero radius, or under ``jit`` a finite
    one where XLA simplifies ``sqrt(x²)`` at d = 1).

    Args:
        xs: (S, N, d) frames.

    Returns:
        (S,) ``max_n |xs[s, n]|`` (NaN or inf where a frame holds one).
    """
    a = jnp.max(jnp.abs(xs), axis=(-2, -1))
    a = jnp.where(jnp.isfinite(a) & (a > 0), a, jnp.ones((), a.dtype))  # (NaN, inf: kept)
    u = xs / a[..., None, None]
    return a * jnp.sqrt(jnp.max(jnp.sum(u * u, axis=-1), axis=-1))


def cloud_stats(xs, dirs):
    """Per-frame statistics of clouds ``xs`` (S, N, d) (jittable).

    Args:
        xs: (S, N, d) frames of N points.
        dirs: (d, K) projection directions.

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to the float dtype
    of the other input; complex is refused (a TypeError naming the parameter).

    Returns:
        ``(mean (S, d), covariance (S, d, d) with 1/N normalisation, max radius (S,),
        largest |skewness| (S,), largest |excess kurtosis| (S,))`` of the projections on the
        columns of ``dirs`` (the last two NaN where ``dirs`` holds a NaN or inf).

    Raises:
        ValueError: ``xs`` not (S, N, d) with N, d >= 1, or ``dirs`` not (d, K).
    """
    xs, dirs = real_arrays(half=True, fn="cloud_stats", xs=xs, dirs=dirs)
    check_cloud("xs", xs, finite=False)
    if np.ndim(dirs) != 2 or np.shape(dirs)[0] != np.shape(xs)[-1]:
        raise ValueError(f"cloud_stats: dirs must have shape (d, K) with d = {np.shape(xs)[-1]} "
                         f"(that of xs), got {tuple(np.shape(dirs))}")
    xs, dirs = jnp.asarray(xs), jnp.asarray(dirs)
    n = xs.shape[-2]
    m = jnp.mean(xs, axis=-2)
    xc = xs - m[..., None, :]
    C = jnp.einsum("snk,snl->skl", xc, xc, precision=jax.lax.Precision.HIGHEST) / n
    r = _max_radius(xs)
    p = jnp.einsum("snk,kj->snj", xc, dirs, precision=jax.lax.Precision.HIGHEST)
    var = jnp.mean(p * p, axis=-2)
    sd = jnp.sqrt(jnp.where(var > 0, var, 1.0))
    z = p / sd[..., None, :]
    g1 = jnp.where(var > 0, jnp.mean(z ** 3, axis=-2), 0.0)
    g2 = jnp.where(var > 0, jnp.mean(z ** 4, axis=-2) - 3.0, 0.0)
    moments = (jnp.max(jnp.abs(g1), axis=-1), jnp.max(jnp.abs(g2), axis=-1))
    return (m, C, r) + tuple(nan_where(any_nonfinite(dirs), moments))


def bures_distance(m0, S0, m1, S1):
    """Bures–Wasserstein W2 between N(m0, S0) and N(m1, S1) in float64, as a NumPy array.

    The host-side reading of :func:`jaxdyn.distances.bures_w2` (its ``value``, computed in
    float64 whatever the inputs' dtype), for comparing saved moments.

    Args:
        m0: (..., d) means.
        S0: (..., d, d) covariances.
        m1: (..., d) means (broadcast against m0).
        S1: (..., d, d) covariances (broadcast against S0).

    Host-only: traced inputs are refused with a TypeError naming ``bures_distance``.

    Dtypes: float32 or float64, float16 or bfloat16, integers (all read in float64 on the
    host); complex is refused (a TypeError naming the parameter).

    Returns:
        W2 of the broadcast batch shape, float64 NumPy; NaN where an input is not finite
        (a blown-up closure).
    """
    check_host("bures_distance", m0=m0, S0=S0, m1=m1, S1=S1)
    for name, a in (("m0", m0), ("S0", S0), ("m1", m1), ("S1", S1)):
        check_dtype(name, a, half=True, fn="bures_distance")
    f = lambda a: np.asarray(np.asarray(a).astype(np.float64))  # noqa: E731
    with jax.enable_x64(True):
        return np.asarray(bures_w2(f(m0), f(S0), f(m1), f(S1)).value, np.float64)


def parting_time(ts, tr_particles, tr_closure, threshold):
    """The first saved time where particles and closure part ways.

    That is ``|tr_particles/tr_closure − 1| > threshold``, or the closure is no longer
    finite (blown up) while the particles are.

    Args:
        ts: (S,) times.
        tr_particles: (S,) traces of the particles' covariance.
        tr_closure: (S,) traces of the closure's covariance.
        threshold: the relative gap.

    Returns:
        The time as a Python float; NaN if never.
    """
    ts = np.asarray(ts)
    tp, tc = np.asarray(tr_particles, np.float64), np.asarray(tr_closure, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        off = np.abs(tp / tc - 1.0) > threshold
    off |= ~np.isfinite(tc) & np.isfinite(tp)
    hit = np.flatnonzero(off)
    return float(ts[hit[0]]) if hit.size else float("nan")


def fit_slope(ns, errs):
    """Least-squares slope of log err against log N.

    Args:
        ns: sample sizes.
        errs: errors (non-finite or non-positive ones left out).

    Returns:
        The slope as a Python float; NaN with fewer than 2 usable points.

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses ``ns`` and ``errs`` not
    1-D of one length.
    """
    check_same_length("ns", ns, "errs", errs)
    ns, errs = np.asarray(ns, float), np.asarray(errs, float)
    ok = np.isfinite(errs) & (errs > 0)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(ns[ok]), np.log(errs[ok]), 1)[0])
