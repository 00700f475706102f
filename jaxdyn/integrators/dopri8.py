"""Dormand–Prince 8(7): one step of the explicit pair on a pytree, for hand-driven lock-step loops.

The explicit Runge–Kutta pair of order 8 with an embedded order-7 error estimate, 13 stages
+ FSAL (Prince & Dormand, "High order embedded Runge–Kutta formulae", J. Comput. Appl. Math.
7 (1981) 67–75; Hairer, Nørsett & Wanner, *Solving ODEs I*, §II.5 and §II.10). The
coefficients are diffrax's ``Dopri8`` tableau (the same floats as
``simulate(method="dopri8")``), read once here as Python floats so that a step traces to
scalar-times-array operations.

:func:`explicit_rk_step` takes one step of any explicit FSAL tableau on a pytree state with a
step per member (an array ``h``): the fast lock-step explicit stage of
:func:`jaxdyn.solve_moments_batch` steps with it (every member with its own step size, the
batch laid out batch-last). Everything else integrates with diffrax.
"""

from __future__ import annotations

from typing import NamedTuple

import diffrax
import jax
import jax.numpy as jnp
import numpy as np


class ButcherTableau(NamedTuple):
    """An explicit tableau as Python floats.

    FSAL: the last row of ``a`` equals ``b`` (the last stage is evaluated at the new state).

    Attributes:
        c: nodes (c[0] = 0).
        a: strictly lower rows (``a[i-1]`` for stage i).
        b: weights.
        e: error weights (``b − b̂``).
        order: the order of ``b``.
    """

    c: list
    a: list
    b: list
    e: list
    order: int


_T = diffrax.Dopri8.tableau
DOPRI8 = ButcherTableau(
    c=[0.0] + [float(c) for c in np.asarray(_T.c)],
    a=[[float(x) for x in np.asarray(row)] for row in _T.a_lower],
    b=[float(x) for x in np.asarray(_T.b_sol)],
    e=[float(x) for x in np.asarray(_T.b_error)],
    order=8,
)
del _T


def explicit_rk_step(tableau: ButcherTableau, f, y, h, *, k0=None, last_stage: bool = False,
                     stage_states=()):
    """One step of the explicit FSAL ``tableau`` for the autonomous ``y' = f(y)`` on a pytree.

    The stages run in one ``lax.fori_loop`` whose body evaluates ``f`` once (the row of the
    tableau is read from a constant array by the stage index), so the compiled program holds
    one copy of ``f``, not one per stage: a 13-stage Dopri8 step compiles several times
    faster than its unrolled form. Only the stage derivatives are stored; the new state, the
    error estimate and any requested stage states are one contraction of them with rows of
    the tableau (one kernel per leaf). The stage sums add the terms in the order
    j = 0, 1, ... over the whole row (zero coefficients included): the same floating-point
    sums as the unrolled form, which skips the zero terms (``x + 0·k = x``), whenever the
    stages are finite (with ``last_stage``, a non-finite ``f(y1)`` makes ``y1`` and the
    error estimate NaN, so that an error control rejects the step).

    Args:
        tableau: the method (e.g. :data:`DOPRI8`).
        f: ``y -> y'`` (same pytree structure).
        y: the state.
        h: the step (an array that broadcasts against the leaves, e.g. one step per member
            in a batch-last layout).
        k0: ``f(y)`` when already known (FSAL from the previous step); else evaluated.
        last_stage: also evaluate the FSAL stage ``f(y1)`` (its error weight may then enter).
        stage_states: indices i of the stage states to return (``ys[i]`` is stage i's
            argument; 0 is y).

    Returns:
        ``(y1, err, ks, ys)``: the new state, the error estimate ``h Σ_j e_j k_j``, the stage
        derivatives ``ks`` (list; ``ks[-1] = f(y1)`` with ``last_stage``) and the requested
        stage states ``ys`` (a dict by stage index).
    """
    tm = jax.tree_util.tree_map
    ns = len(tableau.b)
    coef = np.zeros((ns, ns))
    for i in range(1, ns):
        coef[i, :i] = tableau.a[i - 1]
    nk = ns if last_stage else ns - 1  # derivatives evaluated: k_0 .. k_{nk-1}
    k_first = f(y) if k0 is None else k0
    K = tm(lambda k: jnp.zeros((nk,) + jnp.shape(k), jnp.result_type(k)).at[0].set(k), k_first)

    def combo(rows, K):
        """``Σ_j rows[..., j] K[j]`` per leaf: one contraction over the stage axis."""
        return tm(lambda Kl: jnp.tensordot(jnp.asarray(rows).astype(Kl.dtype), Kl, axes=1,
                                           precision=jax.lax.Precision.HIGHEST), K)

    table = jnp.asarray(coef[:, :nk])

    def body(i, K):
        yi = tm(lambda y_, d_: y_ + h * d_, y, combo(table[i], K))
        return tm(lambda Kl, k: Kl.at[i].set(k), K, f(yi))

    K = jax.lax.fori_loop(1, nk, body, K)
    # The new state (the last, FSAL, row of a equals b), the error estimate and the
    # requested stage states: one contraction of the stored derivatives per leaf.
    stage_states = tuple(stage_states)
    rows = np.zeros((2 + len(stage_states), nk))
    rows[0] = coef[ns - 1, :nk]
    rows[1] = np.asarray(tableau.e)[:nk]
    for r, i in enumerate(stage_states):
        rows[2 + r] = coef[i, :nk]
    out = combo(rows, K)
    y1 = tm(lambda y_, o: y_ + h * o[0], y, out)
    err = tm(lambda o: h * o[1], out)
    ys = {i: (y if i == 0 else tm(lambda y_, o: y_ + h * o[2 + r], y, out))
          for r, i in enumerate(stage_states)}
    ks = [tm(lambda Kl: Kl[j], K) for j in range(nk)]
    return y1, err, ks, ys


def dopri8_step(f, y, h, **kw):
    """One Dormand–Prince 8(7) step (:func:`explicit_rk_step` with :data:`DOPRI8`; the same arguments)."""
    return explicit_rk_step(DOPRI8, f, y, h, **kw)
