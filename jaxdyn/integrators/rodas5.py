r"""Rodas5: the L-stable, stiffly accurate Rosenbrock method of order 5(4) as a diffrax solver.

Di Marzo's 8-stage method with ``γ = 0.19`` (G. A. Di Marzo, "RODAS5(4) – Méthodes de
Rosenbrock d'ordre 5(4) adaptées aux problèmes différentiels-algébriques", Mémoire de
diplôme, Université de Genève, 1993; the RODAS family of Hairer & Wanner, *Solving ODEs II*,
§IV.7). diffrax has no Rosenbrock method; :class:`Rodas5` is one, for
``diffrax.diffeqsolve(diffrax.ODETerm(f), Rodas5(), ...)`` with any adaptive step-size
controller. There are no Newton iterations: each step is one LU factorisation of
``I/(hγ) − J`` (``J = ∂f/∂y`` exact, by ``jax.jacfwd``) and eight linear solves, so a step
never fails to converge and members of a ``vmap`` stay in lock-step.

Transformed (A, C) form (Hairer–Wanner IV.7.25, non-autonomous), ``U_i`` the stage unknowns:

    (I/(hγ) − J) U_i = f(t0 + α_i h, y0 + Σ_j a_ij U_j) + Σ_j (c_ij / h) U_j + d_i h ∂f/∂t,
    y1 = y0 + Σ_{j<8} a_8j U_j + U_8,   error estimate U_8,

and the dense output of order 4 (Θ = (t − t0)/h; ``K_r = Σ_i h_ri U_i``):

    y(Θ) = (1 − Θ) y0 + Θ (y1 + (1 − Θ) (K_1 + Θ (K_2 + Θ K_3))).
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

__all__ = ["Rodas5", "RosenbrockTableau", "RODAS5", "rosenbrock_step", "rodas5_step"]


class RosenbrockTableau(NamedTuple):
    """A Rosenbrock tableau in transformed form.

    Attributes:
        gamma: the diagonal coefficient γ.
        a: (s, s) strictly lower stage coefficients ``a_ij``; the last row gives ``y1``
            (with ``U_s`` added: stiffly accurate).
        c: (s, s) strictly lower coefficients ``c_ij`` of the stage right sides.
        order: the order of ``y1`` (the error estimate ``U_s`` is one order lower).
        alpha: (s,) stage nodes ``α_i`` (stage i evaluates f at ``t0 + α_i h``).
        d: (s,) coefficients of ``h ∂f/∂t`` in the stage right sides.
        h: (3, s) dense-output coefficients ``h_ri``.
    """

    gamma: float
    a: np.ndarray
    c: np.ndarray
    order: int
    alpha: np.ndarray
    d: np.ndarray
    h: np.ndarray


_A = np.zeros((8, 8))
_A[1, :1] = [2.0]
_A[2, :2] = [3.040894194418781, 1.041747909077569]
_A[3, :3] = [2.576417536461461, 1.622083060776640, -0.9089668560264532]
_A[4, :4] = [2.760842080225597, 1.446624659844071, -0.3036980084553738, 0.2877498600325443]
_A[5, :5] = [-14.09640773051259, 6.925207756232704, -41.47510893210728, 2.343771018586405,
             24.13215229196062]
_A[6, :6] = [*_A[5, :5], 1.0]
_A[7, :7] = [*_A[5, :5], 1.0, 1.0]
_C = np.zeros((8, 8))
_C[1, :1] = [-10.31323885133993]
_C[2, :2] = [-21.04823117650003, -7.234992135176716]
_C[3, :3] = [32.22751541853323, -4.943732386540191, 19.44922031041879]
_C[4, :4] = [-20.69865579590063, -8.816374604402768, 1.260436877740897, -0.7495647613787146]
_C[5, :5] = [-46.22004352711257, -17.49534862857472, -289.6389582892057, 93.60855400400906,
             318.3822534212147]
_C[6, :6] = [34.20013733472935, -14.15535402717690, 57.82335640988400, 25.83362985412365,
             1.408950972071624, -6.551835421242162]
_C[7, :7] = [42.57076742291101, -13.80770672017997, 93.98938432427124, 18.77919633714503,
             -31.58359187223370, -6.685968952921985, -5.810979938412932]
_ALPHA = np.array([0.0, 0.38, 0.3878509998321533, 0.4839718937873840, 0.4570477008819580,
                   1.0, 1.0, 1.0])
_D = np.array([0.19, -0.1823079225333714636, -0.319231832186874912, 0.3449828624725343,
               -0.377417564392089818, 0.0, 0.0, 0.0])
_H = np.array([
    [27.354592673333357, -6.925207756232857, 26.40037733258859, 0.5635230501052979,
     -4.699151156849391, -1.6008677469422725, -1.5306074446748028, -1.3929872940716344],
    [44.19024239501722, 1.3677947663381929e-13, 202.93261852171622, -35.5669339789154,
     -181.91095152160645, 3.4116351403665033, 2.5793540257308067, 2.2435122582734066],
    [-44.0988150021747, -5.755396159656812e-13, -181.26175034586677, 56.99302194811676,
     183.21182741427398, -7.480257918273637, -5.792426076169686, -5.32503859794143],
])

#: Di Marzo's Rodas5(4) (the coefficients of Hairer & Wanner's RODAS family layout).
RODAS5 = RosenbrockTableau(gamma=0.19, a=_A, c=_C, order=5, alpha=_ALPHA, d=_D, h=_H)
del _A, _C, _ALPHA, _D, _H


def _stages(tableau: RosenbrockTableau, f, y, h, f0, ft, J):
    """The stage unknowns ``U`` (s, n) of one step of the vector ``y' = f(α, y)``.

    ``f(alpha, y)`` evaluates the field at the stage node ``t0 + α h``; ``f0 = f(0, y)``,
    ``ft`` the time derivative ``∂f/∂t`` at (t0, y) (zeros for an autonomous field),
    ``J = ∂f/∂y``. Stages 2 … s run in one ``lax.fori_loop`` (one copy of f and of the
    solve in the compiled program), the stage sums one contraction over the stage axis.

    Returns:
        (s, n) the stage unknowns.
    """
    gamma, A, C = tableau.gamma, tableau.a, tableau.c
    ns = A.shape[0]
    W = jnp.eye(y.shape[0], dtype=y.dtype) / (h * gamma) - J
    lu = jax.scipy.linalg.lu_factor(W)
    At, Ct = jnp.asarray(A, y.dtype), jnp.asarray(C, y.dtype)
    alpha, d = jnp.asarray(tableau.alpha, y.dtype), jnp.asarray(tableau.d, y.dtype)
    hp = jax.lax.Precision.HIGHEST
    U = jnp.zeros((ns,) + y.shape, y.dtype).at[0].set(
        jax.scipy.linalg.lu_solve(lu, f0 + d[0] * h * ft))

    def stage(i, U):
        yi = y + jnp.tensordot(At[i], U, axes=1, precision=hp)
        rhs = f(alpha[i], yi) + jnp.tensordot(Ct[i] / h, U, axes=1, precision=hp) + d[i] * h * ft
        return U.at[i].set(jax.scipy.linalg.lu_solve(lu, rhs))

    return jax.lax.fori_loop(1, ns, stage, U)


def _new_state(tableau: RosenbrockTableau, y, U):
    """``y1 = y + Σ_{j<s} a_sj U_j + U_s`` (the terms in the order j = 0, 1, …)."""
    last = tableau.a.shape[0] - 1
    a = jnp.asarray(tableau.a[last], y.dtype)  # NumPy float64 would promote a float32 state
    return y + sum(a[j] * U[j] for j in range(last)) + U[last]


def rosenbrock_step(tableau: RosenbrockTableau, f, y, h):
    """One step of the autonomous ``y' = f(y)`` (``y`` a vector, exact Jacobian by ``jax.jacfwd``).

    Args:
        tableau: the method (e.g. :data:`RODAS5`).
        f: ``y -> y'``.
        y: (n,) state.
        h: step.

    Returns:
        ``(y1, error estimate, f(y1))``.
    """
    f0 = f(y)
    U = _stages(tableau, lambda _alpha, yy: f(yy), y, h, f0, jnp.zeros_like(y), jax.jacfwd(f)(y))
    y1 = _new_state(tableau, y, U)
    return y1, U[-1], f(y1)


def rodas5_step(f, y, h):
    """One Rodas5 step of the autonomous ``y' = f(y)``.

    Args:
        f: ``y -> y'``.
        y: (n,) state.
        h: step.

    Returns:
        ``(y1, error estimate, f(y1))`` (:func:`rosenbrock_step` with :data:`RODAS5`).
    """
    return rosenbrock_step(RODAS5, f, y, h)


class Rodas5Interpolation(diffrax.AbstractLocalInterpolation):
    """Rodas5's dense output of order 4 on one step (module doc).

    Attributes:
        t0, t1: the step's ends.
        y0, y1: the state there (a pytree).
        k: the three dense-output vectors ``K_1, K_2, K_3`` stacked on a leading axis (the
            pytree of y).
    """

    t0: jax.Array
    t1: jax.Array
    y0: object
    y1: object
    k: object

    def evaluate(self, t0, t1=None, left: bool = True):
        """The interpolant at ``t0`` (or its increment from ``t0`` to ``t1``).

        Args:
            t0: time in [self.t0, self.t1].
            t1: optional second time: then the increment ``y(t1) − y(t0)``.
            left: unused (the interpolant is continuous).

        Returns:
            The state (a pytree of y's structure).
        """
        del left
        if t1 is not None:
            return jax.tree.map(lambda a, b: a - b, self.evaluate(t1), self.evaluate(t0))
        dt = self.t1 - self.t0
        theta = (t0 - self.t0) / jnp.where(dt == 0, 1.0, dt)

        def one(y0, y1, k):
            th = jnp.asarray(theta, y0.dtype)
            return (1 - th) * y0 + th * (y1 + (1 - th) * (k[0] + th * (k[1] + th * k[2])))

        return jax.tree.map(one, self.y0, self.y1, self.k)


class Rodas5(diffrax.AbstractAdaptiveSolver):
    r"""Rodas5(4), an L-stable, stiffly accurate Rosenbrock method, as a diffrax solver.

    For ODEs ``dy/dt = f(t, y, args)`` given as a ``diffrax.ODETerm`` (y any pytree of
    floating arrays, flattened to one vector per step). Each step forms the exact Jacobian
    ``J = ∂f/∂y`` (``jax.jacfwd``) and ``∂f/∂t`` (``jax.jvp``), factorises ``I/(hγ) − J``
    once and solves for the eight stages (module doc); the error estimate is the last
    stage ``U_8`` (order 4, so the controller's exponent is 1/5) and the dense output is of
    order 4. Reverse- and forward-mode derivatives flow through it (``jax.jacfwd`` and the LU
    solve are differentiable).
    """

    term_structure: ClassVar = diffrax.AbstractTerm
    interpolation_cls: ClassVar = Rodas5Interpolation

    def order(self, terms):
        """Order 5."""
        return 5

    def init(self, terms, t0, t1, y0, args):
        """No solver state."""
        return None

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        """One step from ``t0`` to ``t1`` (diffrax's solver interface).

        Args:
            terms: the ODE term.
            t0: start of the step.
            t1: end of the step.
            y0: the state at t0.
            args: passed to the vector field.
            solver_state: unused (None).
            made_jump: unused (no state carried between steps).

        Returns:
            ``(y1, error estimate, dense info, None, RESULTS.successful)``.
        """
        del solver_state, made_jump
        tab = RODAS5
        yv, unravel = ravel_pytree(y0)
        h = jnp.asarray(t1 - t0, yv.dtype)
        t0 = jnp.asarray(t0, yv.dtype)

        def f(t, y):
            return ravel_pytree(terms.vf(t, unravel(y), args))[0]

        f0, ft = jax.jvp(lambda t: f(t, yv), (t0,), (jnp.ones_like(t0),))
        J = jax.jacfwd(lambda y: f(t0, y))(yv)
        U = _stages(tab, lambda alpha, y: f(t0 + alpha * h, y), yv, h, f0, ft, J)
        y1v = _new_state(tab, yv, U)
        K = jnp.tensordot(jnp.asarray(tab.h, yv.dtype), U, axes=1,
                          precision=jax.lax.Precision.HIGHEST)
        y1 = unravel(y1v)
        k = jax.vmap(unravel)(K)
        dense_info = dict(y0=y0, y1=y1, k=k)
        return y1, unravel(U[-1]), dense_info, None, diffrax.RESULTS.successful

    def func(self, terms, t0, y0, args):
        """The vector field at (t0, y0).

        Args:
            terms: the ODE term.
            t0: time.
            y0: state.
            args: passed to the vector field.

        Returns:
            ``f(t0, y0, args)``.
        """
        return terms.vf(t0, y0, args)
