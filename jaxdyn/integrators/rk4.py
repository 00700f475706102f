"""Projected RK4: classical Runge–Kutta in the ambient space, then the retraction; order 4."""

from typing import ClassVar

from ._base import AbstractIntegrator, resolve


class ProjectedRK4(AbstractIntegrator):
    """Classical RK4 in the ambient space, then retraction onto the sphere. Order 4."""

    order: ClassVar[int] = 4

    def step(self, field, t, x, dt, args, geometry=None):
        k1 = field(t, x, args)
        k2 = field(t + dt / 2, x + (dt / 2) * k1, args)
        k3 = field(t + dt / 2, x + (dt / 2) * k2, args)
        k4 = field(t + dt, x + dt * k3, args)
        return resolve(field, geometry).retract(x + (dt / 6) * (k1 + 2 * k2 + 2 * k3 + k4))
