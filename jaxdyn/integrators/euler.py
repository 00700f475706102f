from typing import ClassVar

from ._base import AbstractIntegrator, retract


class ProjectedEuler(AbstractIntegrator):
    """Projected (explicit) Euler: x ← retract(x + dt f(t, x)). Order 1."""

    order: ClassVar[int] = 1

    def step(self, field, t, x, dt, args):
        return retract(field, x + dt * field(t, x, args))
