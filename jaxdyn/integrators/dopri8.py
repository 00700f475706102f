"""Dormand–Prince 8(7): the explicit Runge–Kutta pair of order 8 with an embedded order-7
error estimate, 13 stages + FSAL (Prince & Dormand, "High order embedded Runge–Kutta
formulae", J. Comput. Appl. Math. 7 (1981) 67–75; Hairer, Nørsett & Wanner, *Solving ODEs I*,
§II.5 and §II.10). The coefficients are diffrax's ``Dopri8`` tableau (the same floats as
``simulate(method="dopri8")``), read once here as Python floats so that a step traces to
scalar-times-array operations.

:func:`explicit_rk_step` takes one step of any explicit FSAL tableau on a pytree state;
the pole refinement of :mod:`jaxdyn.gaussian` and the lock-step explicit stage of the batched
moment solver both step with it.
"""

from __future__ import annotations

from typing import NamedTuple

import diffrax
import jax
import numpy as np


class ButcherTableau(NamedTuple):
    """An explicit tableau: nodes ``c`` (c[0] = 0), strictly lower rows ``a`` (``a[i-1]`` for
    stage i), weights ``b`` and error weights ``e`` (``b − b̂``), as Python floats. FSAL: the
    last row of ``a`` equals ``b`` (the last stage is evaluated at the new state)."""

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


def explicit_rk_step(tableau: ButcherTableau, f, y, h, *, k0=None, last_stage: bool = False):
    """One step of the explicit FSAL ``tableau`` for the autonomous ``y' = f(y)`` on a pytree.

    Args:
      f: ``y -> y'`` (same pytree structure).
      y, h: the state and the step (an array that broadcasts against the leaves, e.g. one
        step per member in a batch-last layout).
      k0: ``f(y)`` when already known (FSAL from the previous step); else evaluated.
      last_stage: also evaluate the FSAL stage ``f(y1)`` (its error weight may then enter).

    Returns:
      ``(y1, err, ks, ys)``: the new state, the error estimate ``h Σ_j e_j k_j``, the stage
      derivatives ``ks`` (list; ``ks[-1] = f(y1)`` with ``last_stage``) and the stage states
      ``ys`` (``ys[i]`` is stage i's argument, ``ys[0] = y``).
    """
    tm = jax.tree_util.tree_map
    a_rows, e = tableau.a, tableau.e
    ns = len(tableau.b)
    ks = [f(y) if k0 is None else k0]
    ys = [y]
    for i in range(1, ns):
        a = a_rows[i - 1]
        inc = tm(lambda *k: sum(a[j] * k[j] for j in range(i) if a[j] != 0.0), *ks)
        yi = tm(lambda y_, d_: y_ + h * d_, y, inc)
        ys.append(yi)
        if i < ns - 1 or last_stage:
            ks.append(f(yi))
    y1 = yi  # the last (FSAL) row of a equals b
    err = tm(lambda *k: h * sum(e[j] * k[j] for j in range(len(ks)) if e[j] != 0.0), *ks)
    return y1, err, ks, ys


def dopri8_step(f, y, h, **kw):
    """One Dormand–Prince 8(7) step (:func:`explicit_rk_step` with :data:`DOPRI8`)."""
    return explicit_rk_step(DOPRI8, f, y, h, **kw)
