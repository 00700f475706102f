"""Experiment kind ``pde``: the mean-field equation itself, solved for the density ρ(θ, t).

On S¹ (and S² in mode ``s2``), by :mod:`jaxdyn.pde`.

``mode: clusters``: a near-uniform start (every mode up to M/4 with amplitude ε and random
phases), a sweep over β (and σ, seeds): ρ(θ, t), the cluster count against t, the first clusters
(count and time) against k* = argmax k² I_k(β)/I_0(β), the merges; the solver's linear growth
rates against λ_k; mass and positivity. With ``particles.cluster_n`` > 0, N particles from the same
ρ0 (``starts``: quantile, keeping the ε-perturbation, or iid) run with the configured field to the
solver's first clusters; their histogram on the same grid is read by the same cluster count, and
their dominant Fourier mode when it first reaches ``mode_threshold`` (figure k_star_particles.png).

``mode: particles``: ρ0 = (1 + a cos kθ)/(2π); N particles sampled from ρ0 (inverse CDF) run by
``jaxdyn.simulate`` (SphereAttention, d = 2, or with ``particles.kernel: fourier`` the O(N K)
field ``jaxdyn.pde.CircleAttention``, equal to it to rounding) and compared with ρ(t) in W1 on S¹
(exact, by CDFs) at a few times, for N over a range and several seeds; one cloud's kernel density
for the figure; the cost of a density step and of a particle step.

``mode: s2``: the density on S² (``SphereDensity``, n_lat × 2n_lat cells) from two bumps; N
particles sampled from ρ0 run by ``jaxdyn.simulate`` (d = 3); W2 (exact assignment) from the
particles to N samples of ρ(t) against the null level of two samples of ρ(t) (docs/math.md §C.5);
one cloud's kernel density on the grid for the figure; the zonal growth rates.
"""

from ..kinds import kind_exports
from .schema import BATCH_AXES, SCHEMA, check, estimate_bytes, process_split, output_bytes

__getattr__, __all__ = kind_exports(__name__)
