"""The spaces the fixed-step schemes move on: a small geometry object per space.

A scheme takes its ambient steps (``x + dt·v``, Runge–Kutta combinations) and asks the
geometry to bring the result back (``retract``) or to follow a tangent vector exactly
(``exp``). Each geometry knows the axis along which a state stores its vectors, so the same
scheme runs on a cloud (N, d) (``axis=-1``) and on the ensemble's batch-minor chunks
(N, d, c) (``Sphere(axis=1)``): one definition of each scheme, whatever the layout (the
jax-md way of passing the space to the integrator).
"""

from __future__ import annotations

import equinox as eqx

from ..sphere._geometry import _exp_map as exp_map  # (rows of unit size: no rescaling)
from ..sphere._geometry import _normalize as normalize  # (the same)


class Euclidean(eqx.Module):
    """R^d: the retraction is the identity and ``exp(x, v) = x + v``.

    Attributes:
      axis: the axis along which a state stores its vectors (unused in R^d; kept so that
        every geometry has one).
    """

    axis: int = eqx.field(static=True, default=-1)

    def retract(self, x):
        """The point ``x`` itself (R^d needs no retraction)."""
        return x

    def exp(self, x, v):
        """The straight line's end ``x + v``."""
        return x + v


class Sphere(eqx.Module):
    """The unit sphere S^{d-1}, vectors along ``axis``.

    The retraction is x ↦ x/|x|; the exponential map follows great circles,
    exp_x(v) = cos|v| x + sin|v| v/|v| (:func:`jaxdyn.sphere.exp_map`).

    Attributes:
      axis: the axis of a state along which its vectors lie (-1 for a cloud (N, d), 1 for
        the ensemble's batch-minor chunks (N, d, c)).
    """

    axis: int = eqx.field(static=True, default=-1)

    def retract(self, x):
        """The radial projection x ↦ x/|x| onto the sphere."""
        return normalize(x, axis=self.axis)

    def exp(self, x, v):
        """The exponential map exp_x(v) along the great circle through x with velocity v."""
        return exp_map(x, v, axis=self.axis)


#: the geometry of each value a field's ``manifold`` attribute may take (vectors last)
GEOMETRIES = {"euclidean": Euclidean(), "sphere": Sphere()}


def geometry_of(field):
    """The geometry a field lives on, read from its ``manifold`` attribute.

    Args:
      field: a vector field; its ``manifold`` ("sphere" or "euclidean", default
        "euclidean" when it has none) names the space.

    Returns:
      The :class:`Sphere` or :class:`Euclidean` geometry (vectors along the last axis).

    Raises:
      ValueError: a ``manifold`` other than those of :data:`GEOMETRIES`.
    """
    name = getattr(field, "manifold", "euclidean")
    try:
        return GEOMETRIES[name]
    except KeyError:
        raise ValueError(f"unknown manifold {name!r} of {type(field).__name__}; expected one of "
                         f"{tuple(GEOMETRIES)}") from None
