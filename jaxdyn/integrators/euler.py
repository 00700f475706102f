"""Projected (explicit) Euler: one step x ← retract(x + dt f(t, x)), order 1."""

from typing import ClassVar

from ._base import AbstractIntegrator


class ProjectedEuler(AbstractIntegrator):
    """Projected (explicit) Euler, order 1.

        x_{n+1} = retract(x_n + dt f(t_n, x_n))

    (in R^d plain explicit Euler, diffrax's ``Euler``).

    Attributes:
      geometry: the space (None: the model's).
    """

    scheme_order: ClassVar[int] = 1

    def update(self, terms, t0, t1, y0, args):
        """``retract(y0 + dt f(t0, y0))``."""
        return self.space.retract(y0 + self.increment(terms, t0, t1, y0, args))
