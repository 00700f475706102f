"""Base class of the fixed-step integrators."""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx

from ..sphere import normalize


class AbstractIntegrator(eqx.Module):
    """One step ``x_{n+1} = step(field, t_n, x_n, dt, args)``.

    On the sphere (``field.manifold == "sphere"``) every scheme returns a point of S^{d-1}:
    either by construction (exponential map) or by a final retraction x ↦ x/|x|, which does
    not lower the order because |x| = 1 is invariant for the ambient extension of the field
    (d|x|²/dt = 2(1 − |x|²)⟨x, v⟩).
    """

    order: ClassVar[int]

    @abc.abstractmethod
    def step(self, field, t, x, dt, args):
        ...


def retract(field, x):
    return normalize(x) if getattr(field, "manifold", "euclidean") == "sphere" else x
