"""Geometry of the unit sphere S^{d-1} ⊂ R^d (points are rows of shape (..., d), |x| = 1).

* tangent projection  P⊥(x) v = v − ⟨x, v⟩ x
* exponential map     exp_x(v) = cos|v| x + sin|v| v/|v|   (v tangent at x)
* geodesic distance   d(x, y) = 2 arcsin(|x − y| / 2)      (stable near 0 and π)
"""

from __future__ import annotations

import jax.numpy as jnp

from .._checks import check_dtype, float_dtype


def _real(name, a):
    """``a`` checked (float32/float64/half, integers converted) as a JAX array."""
    check_dtype(name, a, half=True)
    a = jnp.asarray(a)
    return a if jnp.issubdtype(a.dtype, jnp.inexact) else a.astype(float_dtype(a))


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


def _normalize(x, axis=-1):
    """Rows divided by their norms, unscaled (the integrators' and samplers' rows: unit size)."""
    return x / jnp.linalg.norm(x, axis=axis, keepdims=True)


def normalize(x, axis=-1):
    """Project onto the sphere: x / |x|, row-wise.

    A row whose squared norm overflows or underflows (float32 rows of size 1e30 or 1e-30) is
    divided by its largest magnitude first, so that ``normalize(s x) = normalize(x)`` over the
    dtype's range.

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to JAX's default
    float; complex is refused (a TypeError naming ``x``).

    Args:
      x: vectors along ``axis`` (a zero vector gives NaN; so does a row with a NaN or inf).
      axis: the axis of the vectors.

    Returns:
      x / |x|, the shape of x.

    Raises:
      ValueError: ``x`` with no entry along ``axis`` (d = 0).
    """
    x = _real("x", x)
    if x.ndim == 0 or x.shape[axis] == 0:
        raise ValueError(f"x must hold vectors of dimension d >= 1 along axis {axis}, got shape "
                         f"{tuple(x.shape)}")
    return _unit_rows(x, axis)


def _unit_rows(x, axis=-1):
    """Rows divided by their norms, rescaled where the squared norm leaves the dtype's range.

    A row whose squared norm overflows or underflows is divided by its largest magnitude
    first; a row of unit size gives exactly ``x / |x|``.

    Args:
      x: vectors along ``axis``.
      axis: the axis of the vectors.

    Returns:
      x / |x|, the shape of x (NaN for a zero row or one with a NaN or inf).
    """
    r = jnp.linalg.norm(x, axis=axis, keepdims=True)
    ok = jnp.isfinite(r) & (r >= jnp.sqrt(jnp.finfo(x.dtype).tiny))
    s = jnp.max(jnp.abs(x), axis=axis, keepdims=True)
    y = x / jnp.where(ok | (s == 0), 1, s)
    return jnp.where(ok, x / r, y / jnp.linalg.norm(y, axis=axis, keepdims=True))


def exp_map(x, v, axis=-1):
    """Exponential map of the sphere at x applied to the tangent vector v, row-wise.

        exp_x(v) = cos|v| x + sin|v| v/|v|

    Safe at v = 0 (uses sin(r)/r → 1); the result is renormalised against round-off, as
    :func:`normalize` does (an x off the sphere, of size 1e30 or 1e-30 in float32, gives
    the direction of ``cos|v| x + sin|v| v/|v|``, not a zero row from its overflowed norm).

    Args:
      x: points of the sphere, vectors along ``axis``.
      v: tangent vectors at x, the same shape.
      axis: the axis of the vectors.

    Returns:
      exp_x(v), the shape of x.
    """
    return _exp_map(x, v, axis, _unit_rows)


def _exp_map(x, v, axis=-1, unit=_normalize):
    """The exponential map of :func:`exp_map`, renormalised by ``unit``.

    The integrators' rows are of unit size: they renormalise by the plain
    :func:`_normalize` (no rescaling); the public :func:`exp_map` by :func:`_unit_rows`.

    Args:
      x: points of the sphere, vectors along ``axis``.
      v: tangent vectors at x, the same shape.
      axis: the axis of the vectors.
      unit: the renormalisation, ``unit(y, axis=axis)``.

    Returns:
      exp_x(v), the shape of x.
    """
    r = jnp.linalg.norm(v, axis=axis, keepdims=True)
    small = r < 1e-8
    r_safe = jnp.where(small, 1.0, r)
    sinc = jnp.where(small, 1.0 - r**2 / 6.0, jnp.sin(r_safe) / r_safe)
    return unit(jnp.cos(r) * x + sinc * v, axis=axis)


def geodesic_distance(x, y):
    """Great-circle distance d(x, y) = 2 arcsin(|x − y|/2), row-wise (stable near 0 and π).

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to JAX's default
    float; complex is refused (a TypeError naming ``x`` or ``y``).

    Args:
      x: (..., d) points of the sphere.
      y: (..., d) points of the sphere.

    Returns:
      (...) distances in [0, π]; NaN where x or y is not finite (the clip below would read an
      infinite |x − y| as π).
    """
    x, y = _real("x", x), _real("y", y)
    c = jnp.linalg.norm(x - y, axis=-1) / 2.0
    return jnp.where(jnp.isfinite(c), 2.0 * jnp.arcsin(jnp.clip(c, 0.0, 1.0)), jnp.nan)
