"""Experiment kind ``concentration``: Paper A's Theorem 1 and Conjecture 1, measured.

For each grid point (β, seed, …) the particles run under softmax attention; at the saved
times it records

* ``w2_<method>(t)``: W2(ρ^β_t, Π_# ρ0) with ρ0's sample pushed by Π (the cloud Π(x_i(0))),
  by each method of ``w2_methods`` (``exact`` assignment, debiased ``sinkhorn`` with ε
  following the distance, the ``coupling`` upper bound |x_i(t) − Π(x_i(0))|);
* ``lyapunov_mean``/``lyapunov_median``: L(x) = |P_{E⊥}x|²/|P_E x|² over the particles;
* ``mass_E``/``mass_V``: the fraction of particles within ``near_angle_deg`` of E (the top
  eigenspace of VBᵀ) and of the top eigenspace of V.

``summary.json`` holds the fits: (a) the log–log slope of min_t W2 against β beside the
slope of sqrt(log(β+1)/β) on the same β; (b) argmin_t W2 against log β (slope, R²);
(c) the time at which mass_V overtakes mass_E, per β, if it does.
"""

from ..kinds import kind_exports
from .schema import (BATCH_AXES, SCHEMA, W2_METHODS, check, estimate_bytes, process_split,
                     output_bytes, spectral_info)

__getattr__, __all__ = kind_exports(__name__, ("W2_METHODS", "spectral_info"), lazy_extra={"analyse": "summary"})
