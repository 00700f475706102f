"""Experiment kind ``pde``: the mean-field equation itself, solved for the density ρ(θ, t) on
S¹ (:mod:`jaxdyn.pde`).

``mode: clusters``: a near-uniform start (every mode up to M/4 with amplitude ε and random
phases), a sweep over β (and σ, seeds): ρ(θ, t), the cluster count against t, the first clusters
(count and time) against k* = argmax k² I_k(β)/I_0(β), the merges; the solver's linear growth
rates against λ_k; mass and positivity.

``mode: particles``: ρ0 = (1 + a cos kθ)/(2π); N particles sampled from ρ0 (inverse CDF) run by
``jaxdyn.simulate`` (SphereAttention, d = 2) and compared with ρ(t) in W1 on S¹ (exact, by
CDFs) at a few times, for N over a range and several seeds; one cloud's kernel density for the
figure; the cost of a density step and of a particle step.
"""

from .figures import plot
from .run import run_points
from .schema import BATCH_AXES, SCHEMA, check, estimate_bytes, output_bytes
from .summary import summarize

__all__ = ["SCHEMA", "BATCH_AXES", "check", "estimate_bytes", "output_bytes", "run_points",
           "summarize", "plot"]
