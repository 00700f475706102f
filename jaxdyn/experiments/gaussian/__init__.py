r"""Experiment kind ``gaussian``: particles against the Gaussian closure, and phase diagrams (Paper B).

**study: trajectory.** For each grid point (``n``, ``seed``, ``activation``) N particles are
drawn from ``N(m0, S0)`` and run under :class:`jaxdyn.EuclideanAttention`,

    ẋ_i = A σ(x_i) + b + V Σ_j w_ij x_j,   w_ij ∝ exp(x_jᵀ B x_i),   σ = identity or ReLU,

with fixed-step RK4 (``dt``). At the saved times it records the particles' empirical mean
``m̂ = (1/N) Σ x_i`` and covariance ``Ŝ = (1/N) Σ (x_i − m̂)(x_i − m̂)ᵀ``, the largest radius
``max_i |x_i|``, and how non-Gaussian the cloud is (the largest |skewness| and |excess
kurtosis| of its projections on ``n_directions`` fixed directions); beside them, the
Gaussian closure of the *identity* model (docs/math.md §B.2),

    m' = (A + V) m + V Σ B m + b,   Σ' = A Σ + Σ Aᵀ + V Σ B Σ + Σ Bᵀ Σ Vᵀ,

solved in float64 with :func:`jaxdyn.gaussian.solve_moments` (Dopri8, blow-up event; the
reference, whatever the particles' ``dtype``), its closed form
``Σ(t) = P(t)⁻¹`` when ``V = v I`` (``P' = −PA − AᵀP − v(B + Bᵀ)``, see
:func:`jaxdyn.gaussian.vi_closed_form`), and the Bures–Wasserstein distance between
``N(m̂(t), Ŝ(t))`` and the closure ``N(m(t), Σ(t))``.

What it shows: (1) the error against N (log–log, slope ≈ −1/2: Monte-Carlo error of the
empirical measure); (2) near a blow-up of the closure, the time at which particles and
closure part ways: the first saved time with ``|tr Ŝ / tr Σ − 1| > parting_threshold``
(the particle system cannot blow up in finite time: each attention output is a convex
average of the particles, so ``R(t) = max_i |x_i(t)|`` obeys
``R' ≤ (‖A‖ + ‖V‖) R + |b|``); (3) with ``activation: relu``, how far the ReLU particles'
empirical moments move from the identity closure (Bures distance against t, beside the
identity particles at the same N — the Monte-Carlo floor — and the first-order prediction
``t·(ṁ_relu − ṁ, Σ̇_relu − Σ̇)`` from the exact initial rates of the ReLU field on
``N(m0, S0)``, :func:`jaxdyn.gaussian.relu_initial_rates`), and how non-Gaussian the ReLU cloud becomes
(skewness/kurtosis against the identity cloud's floor).

**study: phase_diagram.** ``A = a I``, ``B = c I``, ``V = v I`` over an (a, c) grid,
solved in one batch by :func:`jaxdyn.gaussian.solve_moments_batch`. Each eigenvalue
σ of Σ follows ``σ' = 2aσ + 2vcσ²``, so the blow-up time is
``T*(a, c) = scalar_blowup_time(λmax(S0), a, v c)`` and the boundaries are drawn from it:
blow-up before t1 where ``T* = t1``; blow-up ever iff ``vc > 0`` and ``vcλmax > −a``.
Colour: the numerical blow-up time, and ``tr Σ(t1)`` where there is none.
"""

from ..kinds import kind_exports
from .schema import (BATCH_AXES, PHASE_SCHEMA, SCHEMA, check, estimate_bytes, process_split,
                     output_bytes, parameters)

__getattr__, __all__ = kind_exports(__name__, ("PHASE_SCHEMA", "parameters"), lazy_extra={
    "closed_form": "run", "closure": "run", "make_model": "run", "run_particles": "run",
    "relu_first_order": "summary", "zscores": "summary"})
