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
        """``exp_{y0}(dt f(t0, y0))``.

        Args:
          terms: the term; ``terms.vf_prod`` with its control gives dt f.
          t0: the step's start.
          t1: the step's end.
          y0: the state at ``t0``.
          args: passed to the field.

        Returns:
          The new state.
        """
        return self.space.exp(y0, terms.vf_prod(t0, y0, args, terms.contr(t0, t1)))
