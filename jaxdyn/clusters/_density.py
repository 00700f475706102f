"""Clusters of a density on S¹: a near-uniform start, counts, first clusters, merges.

A near-uniform start, the cluster count against time, the first clusters that appear and the
times at which they merge.

``perturbed_uniform``, ``cluster_counts`` and ``first_clusters`` are fixed-shape array
computations written once for NumPy and ``jax.numpy``: concrete inputs are read on the host in
NumPy (float64, no compilation), traced inputs (under ``jax.jit``/``jax.vmap``) run the same
formulas in the program. ``clusters`` (the masses of the arcs: as many as there are) and
``merge_times`` (a list of drops) have data-dependent lengths and run on the host only; their
fixed-shape counterparts are ``cluster_counts`` and :func:`jaxdyn.clusters.hitting_times`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import (check_density, check_finite, check_integer, check_same_length, nan_where,
                       scalar_domain)

__all__ = ["perturbed_uniform", "clusters", "cluster_counts", "first_clusters", "merge_times"]


def _traced(*xs) -> bool:
    """Whether any input is traced (then the program's jax.numpy, else the host's NumPy)."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(xs))


_HOST_ONLY = ("{} returns a data-dependent number of values and runs on the host only: call it "
              "on concrete arrays (outside jit/vmap), or use its fixed-shape counterpart (module "
              "docstring)")


def perturbed_uniform(m: int, eps, key, k_max=None):
    """Cell averages of (1 + ε Σ_{k=1}^{k_max} cos(kθ + φ_k)/√k_max)/(2π).

    Every mode up to k_max (default M/4) with the same amplitude and i.i.d. uniform phases φ_k
    (from ``key``); the cell average of cos(kθ + φ) is sinc(k/M) cos(kθ_j + φ).

    Args:
      m: the number of cells M.
      eps: the amplitude ε (may be traced).
      key: a ``jax.random`` key for the phases (may be traced).
      k_max: the largest mode (static; default M/4).

    Returns:
      (M,) cell averages: NumPy float64 for concrete ``eps`` and ``key``, else a traced array of
      JAX's default float (NaN for a traced ε that is not finite).

    Raises:
      ValueError: ``m`` not an integer ≥ 4 (at least one mode), ``k_max`` not an integer in
        [1, M/2], or a concrete ε that is not finite.
    """
    m = check_integer("m (number of cells)", m, minimum=4, integral_floats=True)
    k_max = m // 4 if k_max is None else check_integer("k_max", k_max, minimum=1)
    if k_max > m // 2:
        raise ValueError(f"k_max must lie in [1, M/2] = [1, {m // 2}] for M = {m} cells, got {k_max}")
    check_finite("eps", eps)
    ph = jax.random.uniform(key, (k_max,), minval=0.0, maxval=2 * math.pi)
    xp = jnp if _traced(eps, key) else np
    ph = ph if xp is jnp else np.asarray(ph, float)
    c = np.arange(m) * 2 * math.pi / m
    ks = np.arange(1, k_max + 1)
    pert = (np.sinc(ks / m)[:, None] * xp.cos(np.outer(ks, c) + ph[:, None])).sum(0) / math.sqrt(k_max)
    return nan_where(scalar_domain("eps", eps)[1], (1 + eps * pert) / (2 * math.pi))


def clusters(rho, level=0.5, min_mass=0.01):
    """Masses of the clusters of one density (on the host: as many values as clusters).

    The clusters are the connected arcs where ρ > level/(2π) that carry at least ``min_mass``.

    Args:
      rho: (M,) cell averages (concrete).
      level: the threshold, relative to the uniform density 1/(2π).
      min_mass: the least mass of a cluster.

    Returns:
      (masses, covered fraction of the circle); a density above the level everywhere has no gap
      and returns (None, 1.0).

    Raises:
      ValueError: traced input, or a ``rho`` that is not 1-D, finite, ≥ 0 with positive mass.
    """
    if _traced(rho, level, min_mass):
        raise ValueError(_HOST_ONLY.format("clusters"))
    rho = check_density("rho", rho)
    if rho.ndim != 1:
        raise ValueError(f"rho must be the (M,) cell averages of one density, got shape {rho.shape}")
    m = rho.shape[-1]
    h = 2 * math.pi / m
    above = rho > level / (2 * math.pi)
    if above.all():
        return None, 1.0
    s = int(np.argmin(above))
    a, r = np.roll(above, -s), np.roll(rho, -s)
    edges = np.diff(np.concatenate([[0], a.astype(int), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    masses = np.array([r[i:j].sum() * h for i, j in zip(starts, ends)])
    return masses[masses >= min_mass], float(above.mean())


def _counts(xp, rho_t, level, min_mass, max_cover, min_total):
    """The cluster count of each row of ``rho_t`` (..., M), in NumPy or jax.numpy (``xp``).

    Each row is rotated to start in a gap (its first cell at or below the level), so that no
    arc wraps; the mass of an arc is the rise of the cumulative mass above the level from the
    previous arc's last cell to its own last cell.

    Returns:
      (...,) integer counts.
    """
    m = rho_t.shape[-1]
    h = 2 * math.pi / m
    above = rho_t > level / (2 * math.pi)
    first_gap = xp.argmin(above, axis=-1)[..., None]
    idx = (xp.arange(m) + first_gap) % m
    a = xp.take_along_axis(above, idx, axis=-1)
    r = xp.take_along_axis(rho_t, idx, axis=-1)
    last = a & ~xp.concatenate([a[..., 1:], xp.zeros_like(a[..., :1])], axis=-1)  # an arc's last cell
    cum = xp.cumsum(xp.where(a, r, 0.0), axis=-1) * h
    at_last = xp.where(last, cum, 0.0)
    if xp is np:
        before = np.maximum.accumulate(at_last, axis=-1)
    else:
        before = jax.lax.cummax(at_last, axis=at_last.ndim - 1)
    before = xp.concatenate([xp.zeros_like(before[..., :1]), before[..., :-1]], axis=-1)
    kept = last & (cum - before >= min_mass)
    n = xp.sum(kept, axis=-1)
    total = xp.sum(xp.where(kept, cum - before, 0.0), axis=-1)
    ok = ~xp.all(above, axis=-1) & (xp.mean(above, axis=-1) <= max_cover) & (total >= min_total)
    return xp.where(ok, n, 0)


def cluster_counts(rho_t, level=0.5, min_mass=0.01, max_cover=0.5, min_total=0.99):
    """The cluster count at each saved time (0 before the density has broken up).

    A density has broken up when the arcs above ``level``/(2π) cover at most ``max_cover`` of
    the circle and its clusters (arcs with mass ≥ ``min_mass``, :func:`clusters`) hold at least
    ``min_total`` of the mass; the count is then the number of clusters.

    Args:
      rho_t: (..., M) cell averages (e.g. (S, M) saved densities; traceable).
      level: the threshold, relative to the uniform density 1/(2π).
      min_mass: the least mass of a cluster.
      max_cover: the largest fraction of the circle the arcs may cover.
      min_total: the least total mass of the clusters.

    Returns:
      (...,) integer counts: NumPy for concrete inputs, a traced array otherwise (−1 for a
      traced density that holds NaN or inf).

    Raises:
      ValueError: ``rho_t`` without a cell axis, or concrete inputs that are not finite.
    """
    if np.ndim(rho_t) < 1 or np.shape(rho_t)[-1] < 1:
        raise ValueError(f"rho_t must be (..., M) cell averages with M >= 1, got shape "
                         f"{tuple(np.shape(rho_t))}")
    for name, v in (("rho_t", rho_t), ("level", level), ("min_mass", min_mass),
                    ("max_cover", max_cover), ("min_total", min_total)):
        check_finite(name, v)
    xp = jnp if _traced(rho_t, level, min_mass, max_cover, min_total) else np
    rho_t = xp.asarray(rho_t) if xp is jnp else np.asarray(rho_t, float)
    n = _counts(xp, rho_t, level, min_mass, max_cover, min_total)
    if xp is jnp:
        n = jnp.where(jnp.all(jnp.isfinite(rho_t), axis=-1), n, -1)
    return n


def first_clusters(ts, rho_t, **kw):
    """The first saved time at which the density has broken into clusters, and the count then.

    Args:
      ts: (S,) saved times.
      rho_t: (S, M) saved cell averages.
      **kw: the thresholds of :func:`cluster_counts`.

    Returns:
      (time, count) of the first saved time with ``cluster_counts`` > 0; (nan, 0) if none:
      Python numbers for concrete inputs, traced scalars otherwise.

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses ``ts`` not 1-D, or not as
    long as ``rho_t`` has rows (also under jit); the errors of :func:`cluster_counts`.
    """
    check_same_length("ts", ts, "rho_t", rho_t, axis_b=-2 if np.ndim(rho_t) >= 2 else -1)
    n = cluster_counts(rho_t, **kw)
    if isinstance(n, np.ndarray) and not _traced(ts):
        i = np.flatnonzero(n > 0)
        return (float(np.asarray(ts)[i[0]]), int(n[i[0]])) if i.size else (float("nan"), 0)
    ts, n = jnp.asarray(ts), jnp.asarray(n)
    i = jnp.argmax(n > 0)
    hit = n[i] > 0
    dtype = ts.dtype if jnp.issubdtype(ts.dtype, jnp.floating) else jnp.float32
    return jnp.where(hit, ts[i].astype(dtype), jnp.nan), jnp.where(hit, n[i], 0)


def merge_times(ts, rho_t, **kw):
    """Times at which the cluster count drops (after the first clusters), on the host.

    Args:
      ts: (S,) saved times (concrete).
      rho_t: (S, M) saved cell averages (concrete).
      **kw: the thresholds of :func:`cluster_counts`.

    Returns:
      A list of (t, n_before, n_after), one per drop (as many as there are).

    Raises:
      ValueError: traced input, ``ts`` not 1-D or not as long as ``rho_t`` has rows, ``ts``
        not finite; the errors of :func:`cluster_counts`.
    """
    if _traced(ts, rho_t):
        raise ValueError(_HOST_ONLY.format("merge_times"))
    check_same_length("ts", ts, "rho_t", rho_t, axis_b=-2 if np.ndim(rho_t) >= 2 else -1)
    check_finite("ts", ts)
    n = cluster_counts(rho_t, **kw)
    ts = np.asarray(ts)
    out = []
    first = np.flatnonzero(n > 0)
    if not first.size:
        return out
    for i in range(first[0] + 1, len(n)):
        if 0 < n[i] < n[i - 1]:
            out.append((float(ts[i]), int(n[i - 1]), int(n[i])))
    return out
