from typing import ClassVar

from ..sphere import exp_map
from ._base import AbstractIntegrator


class ExpEuler(AbstractIntegrator):
    """Geometric (Lie–Euler) scheme: x ← exp_x(dt f(t, x)), the sphere's exponential map along
    the tangent field. Stays on S^{d-1} by construction. Order 1. In R^d it is plain Euler."""

    order: ClassVar[int] = 1

    def step(self, field, t, x, dt, args):
        v = dt * field(t, x, args)
        if getattr(field, "manifold", "euclidean") == "sphere":
            return exp_map(x, v)
        return x + v
