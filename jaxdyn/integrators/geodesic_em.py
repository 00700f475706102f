"""Geodesic Euler–Maruyama, weak order 1.

x ← exp_x(dt f(t, x) + σ P⊥(x) ΔW): the fixed-step scheme of ``jaxdyn.simulate_sde``
(docs/math.md §H.3).
"""

from typing import ClassVar

import diffrax

from ._base import AbstractIntegrator


class GeodesicEulerMaruyama(AbstractIntegrator, diffrax.AbstractStratonovichSolver):
    """The geodesic Euler–Maruyama step for ``dx = f dt + σ P⊥(x) ∘ dW`` on the sphere.

        x_{n+1} = exp_{x_n}(dt f(t_n, x_n) + σ P⊥(x_n) ΔW_n),   ΔW_n ~ N(0, dt I)

    with ``terms`` a ``diffrax.MultiTerm`` of the drift and the diffusion (whose products
    with their controls dt and ΔW are summed: ``terms.vf_prod``). On S^{d-1} the step stays
    on the sphere by construction, and the exponential map's second-order term
    −|v|²/2 x supplies the Itô correction −σ²(d−1)/2 x dt of the Stratonovich equation:
    the scheme converges (weakly, order 1) to the Stratonovich solution, Brownian motion on
    the sphere with generator (σ²/2)Δ_S when f = 0. In R^d with additive noise (no
    projection) it is plain Euler–Maruyama, where Itô and Stratonovich agree. On an ODE
    term it is :class:`~jaxdyn.integrators.ExpEuler`.

    Attributes:
      geometry: the space (None: the model's).
    """

    scheme_order: ClassVar[int] = 1

    def strong_order(self, terms):
        """Strong order 1/2 (Euler–Maruyama)."""
        del terms
        return 0.5

    def update(self, terms, t0, t1, y0, args):
        """``exp_{y0}(dt f + σ P⊥ ΔW)``: the terms' products with their controls, summed."""
        return self.space.exp(y0, self.increment(terms, t0, t1, y0, args))
