"""Clusters of a density on S¹: a near-uniform start, the cluster count against time, the
first clusters that appear and the times at which they merge (host-side analysis)."""

from __future__ import annotations

import math

import jax
import numpy as np

__all__ = ["perturbed_uniform", "clusters", "cluster_counts", "first_clusters", "merge_times"]


def perturbed_uniform(m: int, eps: float, key, k_max=None):
    """Cell averages of (1 + ε Σ_{k=1}^{k_max} cos(kθ + φ_k)/√k_max)/(2π): every mode up to
    k_max (default M/4) with the same amplitude and i.i.d. uniform phases φ_k (from ``key``)."""
    k_max = int(k_max or m // 4)
    ph = np.asarray(jax.random.uniform(key, (k_max,), minval=0.0, maxval=2 * math.pi), float)
    c = np.arange(m) * 2 * math.pi / m
    ks = np.arange(1, k_max + 1)
    pert = (np.sinc(ks / m)[:, None] * np.cos(np.outer(ks, c) + ph[:, None])).sum(0) / math.sqrt(k_max)
    return (1 + eps * pert) / (2 * math.pi)


def clusters(rho, level=0.5, min_mass=0.01):
    """Masses of the clusters of one density: the connected arcs where ρ > level/(2π) that
    carry at least ``min_mass``. Returns (masses, covered fraction of the circle); a density
    above the level everywhere has no gap and returns (None, 1.0)."""
    rho = np.asarray(rho, float)
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


def cluster_counts(rho_t, level=0.5, min_mass=0.01, max_cover=0.5, min_total=0.99):
    """The cluster count at each saved time: the number of clusters once the density has
    broken up (the arcs above the level cover at most ``max_cover`` of the circle and the
    clusters hold at least ``min_total`` of the mass); 0 before that."""
    out = []
    for r in np.asarray(rho_t):
        masses, cover = clusters(r, level, min_mass)
        ok = masses is not None and cover <= max_cover and masses.sum() >= min_total
        out.append(len(masses) if ok else 0)
    return np.array(out)


def first_clusters(ts, rho_t, **kw):
    """(time, count) of the first saved time at which the density has broken into clusters
    (``cluster_counts`` > 0); (nan, 0) if it never does."""
    n = cluster_counts(rho_t, **kw)
    i = np.flatnonzero(n > 0)
    return (float(np.asarray(ts)[i[0]]), int(n[i[0]])) if i.size else (float("nan"), 0)


def merge_times(ts, rho_t, **kw):
    """Times at which the cluster count drops (after the first clusters), with the counts
    before and after: a list of (t, n_before, n_after)."""
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
