"""Base class of the fixed-step integrators."""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx

from ._geometry import geometry_of


class AbstractIntegrator(eqx.Module):
    """One step ``x_{n+1} = step(field, t_n, x_n, dt, args, geometry=None)``.

    ``geometry`` (:class:`~jaxdyn.integrators.Euclidean` or
    :class:`~jaxdyn.integrators.Sphere`, with the axis of the state's vectors) defaults to
    the field's ``manifold``. On the sphere every scheme returns a point of S^{d-1}: either
    by construction (exponential map) or by a final retraction x ↦ x/|x|, which does not
    lower the order because |x| = 1 is invariant for the ambient extension of the field
    (d|x|²/dt = 2(1 − |x|²)⟨x, v⟩).
    """

    order: ClassVar[int]

    @abc.abstractmethod
    def step(self, field, t, x, dt, args, geometry=None):
        ...


def resolve(field, geometry):
    """``geometry``, or the field's own when None."""
    return geometry_of(field) if geometry is None else geometry
