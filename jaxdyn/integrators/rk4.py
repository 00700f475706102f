"""Projected RK4: classical Runge–Kutta in the ambient space, then the retraction; order 4.

diffrax has no classical RK4; this is its tableau (c = 0, ½, ½, 1; b = ⅙, ⅓, ⅓, ⅙) written
out as one step, with the sums in the textbook order
x + (dt/6)(k1 + 2k2 + 2k3 + k4).
"""

from typing import ClassVar

from ._base import AbstractIntegrator


class ProjectedRK4(AbstractIntegrator):
    """Classical RK4 in the ambient space, then the retraction onto the geometry. Order 4.

        k1 = f(t, x),  k2 = f(t + dt/2, x + dt/2 k1),  k3 = f(t + dt/2, x + dt/2 k2),
        k4 = f(t + dt, x + dt k3),  x_{n+1} = retract(x + dt/6 (k1 + 2k2 + 2k3 + k4)).

    Attributes:
      geometry: the space (None: the model's).
    """

    scheme_order: ClassVar[int] = 4

    def update(self, terms, t0, t1, y0, args):
        """One classical RK4 step from ``y0``, retracted.

        Args:
          terms: an ODE term; its control on the step is dt.
          t0: the step's start.
          t1: the step's end (stage times t0 + (t1 − t0)/2 and t1).
          y0: the state at ``t0``.
          args: passed to the field.

        Returns:
          The new state.
        """
        h = terms.contr(t0, t1)
        th = t0 + 0.5 * (t1 - t0)
        k1 = terms.vf(t0, y0, args)
        k2 = terms.vf(th, y0 + terms.prod(k1, h / 2), args)
        k3 = terms.vf(th, y0 + terms.prod(k2, h / 2), args)
        k4 = terms.vf(t1, y0 + terms.prod(k3, h), args)
        return self.space.retract(y0 + terms.prod(k1 + 2 * k2 + 2 * k3 + k4, h / 6))
