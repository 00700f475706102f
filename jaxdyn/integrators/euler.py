"""Projected (explicit) Euler: one step x ← retract(x + dt f(t, x)), order 1."""

from typing import ClassVar

from ._base import AbstractIntegrator, resolve


class ProjectedEuler(AbstractIntegrator):
    """Projected (explicit) Euler: x ← retract(x + dt f(t, x)). Order 1."""

    order: ClassVar[int] = 1

    def step(self, field, t, x, dt, args, geometry=None):
        return resolve(field, geometry).retract(x + dt * field(t, x, args))
