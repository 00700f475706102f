"""Geometry of the unit sphere S^{d-1} ⊂ R^d (points are rows of shape (..., d), |x| = 1).

* tangent projection  P⊥(x) v = v − ⟨x, v⟩ x
* exponential map     exp_x(v) = cos|v| x + sin|v| v/|v|   (v tangent at x)
* geodesic distance   d(x, y) = 2 arcsin(|x − y| / 2)      (stable near 0 and π)
"""

from __future__ import annotations

import jax.numpy as jnp


def tangent_project(x, v, axis=-1):
    """P⊥(x) v = v − ⟨x, v⟩ x, row-wise (vectors along ``axis``)."""
    return v - jnp.sum(x * v, axis=axis, keepdims=True) * x


def normalize(x, axis=-1):
    """Project onto the sphere: x / |x|, row-wise (vectors along ``axis``)."""
    return x / jnp.linalg.norm(x, axis=axis, keepdims=True)


def exp_map(x, v, axis=-1):
    """Exponential map of the sphere at x applied to the tangent vector v (row-wise, vectors
    along ``axis``).

    Safe at v = 0 (uses sin(r)/r → 1); the result is renormalised against round-off.
    """
    r = jnp.linalg.norm(v, axis=axis, keepdims=True)
    small = r < 1e-8
    r_safe = jnp.where(small, 1.0, r)
    sinc = jnp.where(small, 1.0 - r**2 / 6.0, jnp.sin(r_safe) / r_safe)
    return normalize(jnp.cos(r) * x + sinc * v, axis=axis)


def geodesic_distance(x, y):
    """Great-circle distance 2 arcsin(|x − y|/2), row-wise."""
    c = jnp.linalg.norm(x - y, axis=-1) / 2.0
    return 2.0 * jnp.arcsin(jnp.clip(c, 0.0, 1.0))
