"""Exponential-map (Lie–)Euler: x ← exp_x(dt f(t, x)); stays on the sphere by construction, order 1."""

from typing import ClassVar

from ._base import AbstractIntegrator


class ExpEuler(AbstractIntegrator):
    """Geometric (Lie–Euler) scheme, order 1.

        x_{n+1} = exp_{x_n}(dt f(t_n, x_n))

    the sphere's exponential map along the tangent field: stays on S^{d-1} by construction.
    In R^d it is plain explicit Euler.

    Attributes:
      geometry: the space (None: the model's).
    """

    scheme_order: ClassVar[int] = 1

    def update(self, terms, t0, t1, y0, args):
        """``exp_{y0}(dt f(t0, y0))``."""
        return self.space.exp(y0, self.increment(terms, t0, t1, y0, args))
