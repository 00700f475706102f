"""Exponential-map (Lie–)Euler: x ← exp_x(dt f(t, x)); stays on the sphere by construction, order 1."""

from typing import ClassVar

from ._base import AbstractIntegrator, resolve


class ExpEuler(AbstractIntegrator):
    """Geometric (Lie–Euler) scheme: x ← exp_x(dt f(t, x)), the sphere's exponential map along
    the tangent field. Stays on S^{d-1} by construction. Order 1. In R^d it is plain Euler."""

    order: ClassVar[int] = 1

    def step(self, field, t, x, dt, args, geometry=None):
        return resolve(field, geometry).exp(x, dt * field(t, x, args))
