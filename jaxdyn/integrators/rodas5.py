"""Rodas5: the L-stable, stiffly accurate Rosenbrock method of order 5(4), 8 stages,
γ = 0.19 (G. A. Di Marzo, "RODAS5(4) – Méthodes de Rosenbrock d'ordre 5(4) adaptées aux
problèmes différentiels-algébriques", Mémoire de diplôme, Université de Genève, 1993; the
RODAS family of Hairer & Wanner, *Solving ODEs II*, §IV.7). No Newton iterations: each step
is one LU factorisation of ``I/(hγ) − J`` and eight solves, so a batch of members can run
lock-step under ``vmap``.

Transformed (A, C) form (Hairer–Wanner IV.7.25), ``U_i`` the stage unknowns:

    (I/(hγ) − J) U_i = f(y + Σ_j a_ij U_j) + Σ_j (c_ij / h) U_j,
    y1 = y + Σ_{j<8} a_8j U_j + U_8,   error estimate U_8.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class RosenbrockTableau(NamedTuple):
    """γ, the transformed coefficients ``a`` and ``c`` (strictly lower, (s, s)), the order."""

    gamma: float
    a: np.ndarray
    c: np.ndarray
    order: int


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

RODAS5 = RosenbrockTableau(gamma=0.19, a=_A, c=_C, order=5)
del _A, _C


def rosenbrock_step(tableau: RosenbrockTableau, f, y, h):
    """One step of the autonomous ``y' = f(y)``, ``y`` a vector, exact Jacobian by
    ``jax.jacfwd``. Returns ``(y1, error estimate, f(y1))``.

    Stages 1 … s−1 run in one ``lax.fori_loop`` (one copy of ``f`` and of the solve in the
    compiled program; the rows of (A, C) read by the stage index, the stage sums one
    contraction over the stage axis)."""
    gamma, A, C = tableau.gamma, tableau.a, tableau.c
    ns = A.shape[0]
    f0 = f(y)
    J = jax.jacfwd(f)(y)
    W = jnp.eye(y.shape[0], dtype=y.dtype) / (h * gamma) - J
    lu = jax.scipy.linalg.lu_factor(W)
    U = jnp.zeros((ns,) + y.shape, y.dtype).at[0].set(jax.scipy.linalg.lu_solve(lu, f0))
    At, Ct = jnp.asarray(A, y.dtype), jnp.asarray(C, y.dtype)
    hp = jax.lax.Precision.HIGHEST

    def stage(i, U):
        yi = y + jnp.tensordot(At[i], U, axes=1, precision=hp)
        rhs = f(yi) + jnp.tensordot(Ct[i] / h, U, axes=1, precision=hp)
        return U.at[i].set(jax.scipy.linalg.lu_solve(lu, rhs))

    U = jax.lax.fori_loop(1, ns, stage, U)
    last = ns - 1
    y1 = y + sum(A[last, j] * U[j] for j in range(last)) + U[last]
    return y1, U[last], f(y1)


def rodas5_step(f, y, h):
    """One Rodas5 step (:func:`rosenbrock_step` with :data:`RODAS5`)."""
    return rosenbrock_step(RODAS5, f, y, h)
