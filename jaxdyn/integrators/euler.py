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
        """``retract(y0 + dt f(t0, y0))``.

        Args:
          terms: the term; ``terms.vf_prod`` with its control gives dt f.
          t0: the step's start.
          t1: the step's end.
          y0: the state at ``t0``.
          args: passed to the field.

        Returns:
          The new state.
        """
        v = terms.vf_prod(t0, y0, args, terms.contr(t0, t1))
        return self.space.retract(y0 + v)
