"""Geometry of the unit sphere S^{d-1} ⊂ R^d (points are rows of shape (..., d), |x| = 1).

* tangent projection  P⊥(x) v = v − ⟨x, v⟩ x
* exponential map     exp_x(v) = cos|v| x + sin|v| v/|v|   (v tangent at x)
* geodesic distance   d(x, y) = 2 arcsin(|x − y| / 2)      (stable near 0 and π)
"""

from __future__ import annotations

import jax.numpy as jnp


def tangent_project(x, v, axis=-1):
    """The tangent projection P⊥(x) v = v − ⟨x, v⟩ x, row-wise.

    Args:
      x: points of the sphere, vectors along ``axis``.
      v: vectors of the same shape.
      axis: the axis of the vectors.

    Returns:
      P⊥(x) v, the shape of v.
    """
    return v - jnp.sum(x * v, axis=axis, keepdims=True) * x


def normalize(x, axis=-1):
    """Project onto the sphere: x / |x|, row-wise.

    Args:
      x: vectors along ``axis`` (a zero vector gives NaN).
      axis: the axis of the vectors.

    Returns:
      x / |x|, the shape of x.
    """
    return x / jnp.linalg.norm(x, axis=axis, keepdims=True)


def exp_map(x, v, axis=-1):
    """Exponential map of the sphere at x applied to the tangent vector v, row-wise.

        exp_x(v) = cos|v| x + sin|v| v/|v|

    Safe at v = 0 (uses sin(r)/r → 1); the result is renormalised against round-off.

    Args:
      x: points of the sphere, vectors along ``axis``.
      v: tangent vectors at x, the same shape.
      axis: the axis of the vectors.

    Returns:
      exp_x(v), the shape of x.
    """
    r = jnp.linalg.norm(v, axis=axis, keepdims=True)
    small = r < 1e-8
    r_safe = jnp.where(small, 1.0, r)
    sinc = jnp.where(small, 1.0 - r**2 / 6.0, jnp.sin(r_safe) / r_safe)
    return normalize(jnp.cos(r) * x + sinc * v, axis=axis)


def geodesic_distance(x, y):
    """Great-circle distance d(x, y) = 2 arcsin(|x − y|/2), row-wise (stable near 0 and π).

    Args:
      x: (..., d) points of the sphere.
      y: (..., d) points of the sphere.

    Returns:
      (...) distances in [0, π]; NaN where x or y is not finite (the clip below would read an
      infinite |x − y| as π).
    """
    c = jnp.linalg.norm(x - y, axis=-1) / 2.0
    return jnp.where(jnp.isfinite(c), 2.0 * jnp.arcsin(jnp.clip(c, 0.0, 1.0)), jnp.nan)
