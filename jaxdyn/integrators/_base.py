"""Base of the fixed-step schemes: diffrax solvers that move on a geometry.

Each scheme (one a file: :mod:`.euler`, :mod:`.rk4`, :mod:`.exp_euler`,
:mod:`.euler_renormalise`, :mod:`.geodesic_em`) is a ``diffrax.AbstractSolver``, so
``diffrax.diffeqsolve`` runs it like any diffrax solver (``jaxdyn.simulate`` and
``jaxdyn.simulate_sde`` are one ``diffeqsolve`` call each). The space is an argument
(:class:`~jaxdyn.integrators.Euclidean` or :class:`~jaxdyn.integrators.Sphere`, with the
axis of the state's vectors), not a string test inside the step.

On the sphere every scheme returns a point of S^{d-1}: either by construction (exponential
map) or by a final retraction x ↦ x/|x|, which does not lower the order because |x| = 1 is
invariant for the ambient extension of the field (d|x|²/dt = 2(1 − |x|²)⟨x, v⟩).

:class:`GridODETerm` is the ODE term of a uniform step grid (its control on a step is the
grid's ``dt``, not the difference of two rounded times), :class:`GridInterpolation` the
schemes' dense output (linear, exact at the ends of a step, so that states saved on the
step grid are the states themselves).
"""

from __future__ import annotations

import abc
from typing import Callable, ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from ._geometry import Euclidean, Sphere, geometry_of


class GridODETerm(diffrax.AbstractTerm):
    """The ODE term ``dy = f(t, y, args) dt`` on a uniform step grid.

    Its control on a step is the grid's step ``dt`` itself: on the grid t_k = t0 + k dt, the
    difference of two rounded times t_{k+1} − t_k differs from dt by up to one unit in the
    last place of t (in float32 at t ~ 30 with dt = 0.1, 1e-5 of dt). Use it with
    ``diffrax.StepTo`` over that grid (every step then is one grid step).

    Attributes:
      vector_field: ``f(t, y, args)``.
      dt: the grid's step (an array in the state's dtype).
    """

    vector_field: Callable
    dt: jax.Array

    def vf(self, t, y, args):
        """The vector field ``f(t, y, args)``."""
        return self.vector_field(t, y, args)

    def contr(self, t0, t1, **kwargs):
        """The grid's step ``dt`` (whatever the rounded ``t0``, ``t1`` of the step)."""
        del t0, t1, kwargs
        return self.dt

    def prod(self, vf, control):
        """``control · vf`` (a scalar times the field)."""
        return jax.tree.map(lambda v: control * v, vf)


class GridInterpolation(diffrax.AbstractLocalInterpolation):
    """Dense output of a fixed step: linear between the two ends, exact at each end.

    diffrax's ``LocalLinearInterpolation`` evaluates ``y0 + 1·(y1 − y0)`` at the step's end,
    which is not ``y1`` in floating point; this one returns ``y0`` at ``t0`` and ``y1`` at
    ``t1``, so a state saved at a time of the step grid is the scheme's state.

    Attributes:
      t0: the step's start.
      t1: the step's end.
      y0, y1: the states there.
    """

    t0: jax.Array
    t1: jax.Array
    y0: jax.Array
    y1: jax.Array

    def evaluate(self, t0, t1=None, left=True):
        """The state at ``t0`` (or the increment from ``t0`` to ``t1`` when given).

        Args:
          t0: a time in the step.
          t1: if given, the increment ``y(t1) − y(t0)`` is returned instead.
          left: ignored (no jumps within a step).

        Returns:
          The interpolated state (or increment).
        """
        del left
        if t1 is not None:
            return jax.tree.map(lambda a, b: b - a, self.evaluate(t0), self.evaluate(t1))
        span = self.t1 - self.t0
        s = (t0 - self.t0) / jnp.where(span == 0, 1, span)

        def one(a, b):
            return jnp.where(t0 == self.t1, b, jnp.where(t0 == self.t0, a, a + s * (b - a)))

        return jax.tree.map(one, self.y0, self.y1)


class AbstractIntegrator(diffrax.AbstractSolver):
    """A fixed-step scheme on a geometry, as a diffrax solver.

    A subclass implements :meth:`update` (the new state from the old over one step); the
    diffrax interface (``init``, ``step``, ``func``, dense output) is here. Stateless: no
    FSAL, no error estimate, so it runs with ``diffrax.ConstantStepSize`` or
    ``diffrax.StepTo``.

    Attributes:
      geometry: the space (:class:`Euclidean` or :class:`Sphere`, with the axis of the
        vectors); None: the model's own (``jaxdyn.simulate`` sets it from the model's
        ``manifold``; used directly in ``diffrax.diffeqsolve``, None is R^d).
    """

    geometry: Euclidean | Sphere | None = None

    term_structure: ClassVar = diffrax.AbstractTerm
    interpolation_cls: ClassVar = GridInterpolation
    #: the scheme's order on ODEs
    scheme_order: ClassVar[int] = 1

    @property
    def space(self):
        """The geometry the scheme moves on (R^d when ``geometry`` is None)."""
        return Euclidean() if self.geometry is None else self.geometry

    def on(self, field) -> AbstractIntegrator:
        """This scheme with its geometry set: its own, else the field's ``manifold``.

        Args:
          field: the model the scheme integrates.

        Returns:
          The scheme with a geometry.
        """
        if self.geometry is not None:
            return self
        return eqx.tree_at(lambda s: s.geometry, self, geometry_of(field),
                           is_leaf=lambda x: x is None)

    def field_of(self, model):
        """The vector field this scheme integrates for ``model`` (the model itself).

        Args:
          model: a particle field ``model(t, x, args)``.

        Returns:
          The field to put in the ODE term.
        """
        return model

    def order(self, terms):
        """The scheme's order on ODEs."""
        del terms
        return self.scheme_order

    def init(self, terms, t0, t1, y0, args):
        """No solver state (returns None)."""
        del terms, t0, t1, y0, args

    def func(self, terms, t0, y0, args):
        """The vector field at ``(t0, y0)``."""
        return terms.vf(t0, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        """One step from ``y0`` at ``t0`` to ``t1``.

        Args:
          terms: the term(s) (their control on the step is its size).
          t0: the step's start.
          t1: the step's end.
          y0: the state at ``t0``.
          args: passed to the vector field.
          solver_state: unused (None).
          made_jump: unused (no state to reset).

        Returns:
          ``(y1, None, dense_info, None, RESULTS.successful)``: no error estimate.
        """
        del solver_state, made_jump
        y1 = self.update(terms, t0, t1, y0, args)
        return y1, None, dict(y0=y0, y1=y1), None, diffrax.RESULTS.successful

    def increment(self, terms, t0, t1, y0, args):
        """The terms' products with their controls at ``(t0, y0)``: dt f (+ σ P⊥ ΔW)."""
        return terms.vf_prod(t0, y0, args, terms.contr(t0, t1))

    @abc.abstractmethod
    def update(self, terms, t0, t1, y0, args):
        """The state at ``t1`` from ``y0`` at ``t0`` (one step of the scheme).

        Args:
          terms: the term(s); ``terms.contr(t0, t1)`` is the step's control (dt).
          t0: the step's start.
          t1: the step's end.
          y0: the state at ``t0``.
          args: passed to the vector field.

        Returns:
          The new state.
        """


def scheme_step(solver: AbstractIntegrator, field, t, x, dt, args=None):
    """One step of a fixed-step scheme on a bare vector field (no ``diffeqsolve`` loop).

    Args:
      solver: a scheme of this package (with its geometry, or the field's by default).
      field: the model; the scheme integrates ``solver.field_of(field)``.
      t: the step's start time.
      x: the state at ``t``.
      dt: the step (an array in the state's dtype).
      args: passed to the field.

    Returns:
      The state at ``t + dt``.
    """
    solver = solver.on(field)
    term = GridODETerm(solver.field_of(field), dt)
    return solver.update(term, t, t + dt, x, args)
