"""The mean-field equation itself: a solver for the density ρ(t) on S¹ and S² (docs/math.md §C).

``CircleDensity`` is the right-hand side on a grid of M cells of S¹ (FFT convolutions, a
positivity-preserving finite-volume flux, optional noise); ``SphereDensity`` the same on a
latitude–longitude grid of S² (dense kernel, second order); ``solve_density`` integrates either
with diffrax and returns a :class:`DensitySolution`; ``growth_rate``/``linear_rates`` (S¹) and
``zonal_growth_rate``/``sphere_rates`` (S²) are the linear stability of the uniform state;
``sample_density``, ``kde_circle`` and ``w1_circle`` compare the density with particles on S¹
(``quantile_points``: a stratified cloud that keeps a small perturbation; ``histogram_circle``,
``empirical_modes``: a cloud's cell averages and Fourier modes),
``sample_sphere_density``, ``kde_sphere`` and ``w2_sphere_check`` on S²; ``CircleAttention`` is the
particle field on S¹ in O(N K) (the kernel's Bessel series, K from a certified tail bound);
``perturbed_uniform``, ``cluster_counts``, ``first_clusters``, ``merge_times`` read clusters.

Modules: ``_circle`` (S¹ grid, kernels, flux), ``_sphere2`` (S²), ``_solve`` (the diffrax
driver and the result type), ``_theory`` (rates), ``_particles`` (sampling, KDE, W1),
``_fourier`` (the O(N K) particle field on S¹), ``_particles_s2``
(particles ↔ density on S²).

Composability: the models are built without device work (concrete inputs checked on the host);
``solve_density``, ``growth_rate``, ``zonal_growth_rate``, ``CircleAttention``, ``cluster_counts``,
``first_clusters`` and ``perturbed_uniform`` run under ``jax.jit``/``jax.vmap`` with traced inputs,
and ``jax.grad`` flows through ``solve_density``. The closed-form rates (SciPy's Bessel functions),
the samplers, kernel densities, W1/W2 checks, ``clusters`` and ``merge_times`` (data-dependent
lengths) are host functions on concrete arrays.
"""

from ._circle import (
    CircleDensity as CircleDensity,
    cfl_dt as cfl_dt,
    circle_grid as circle_grid,
    cos_mode as cos_mode,
    mode_amplitude as mode_amplitude,
    uniform_density as uniform_density,
    velocity_bound as velocity_bound,
)
from ._solve import DensitySolution as DensitySolution, METHODS as METHODS, solve_density as solve_density
from ._theory import (
    growth_rate as growth_rate,
    linear_rates as linear_rates,
    most_unstable_mode as most_unstable_mode,
)
from ._particles import (
    angles as angles,
    kde_circle as kde_circle,
    sample_density as sample_density,
    w1_circle as w1_circle,
    w1_circle_densities as w1_circle_densities,
    quantile_points as quantile_points,
    empirical_modes as empirical_modes,
    histogram_circle as histogram_circle,
)
from ..clusters._density import (
    cluster_counts as cluster_counts,
    clusters as clusters,
    first_clusters as first_clusters,
    merge_times as merge_times,
    perturbed_uniform as perturbed_uniform,
)
from ._sphere2 import (
    SphereDensity as SphereDensity,
    sphere_cfl_dt as sphere_cfl_dt,
    sphere_rates as sphere_rates,
    zonal_growth_rate as zonal_growth_rate,
    zonal_mode as zonal_mode,
)
from ._fourier import (
    CircleAttention as CircleAttention,
    bessel_ive as bessel_ive,
    fourier_modes as fourier_modes,
)
from ._particles_s2 import (
    kde_sphere as kde_sphere,
    sample_sphere_density as sample_sphere_density,
    sphere_cell_averages as sphere_cell_averages,
    sphere_cell_centres as sphere_cell_centres,
    w2_sphere_check as w2_sphere_check,
)

__all__ = [
    "CircleAttention", "CircleDensity", "DensitySolution", "METHODS", "SphereDensity", "angles",
    "bessel_ive", "cfl_dt", "circle_grid", "cluster_counts", "clusters", "cos_mode",
    "empirical_modes", "first_clusters", "fourier_modes", "growth_rate", "histogram_circle",
    "kde_circle", "kde_sphere", "linear_rates", "merge_times", "mode_amplitude",
    "most_unstable_mode", "perturbed_uniform", "quantile_points", "sample_density",
    "sample_sphere_density", "solve_density", "sphere_cell_averages", "sphere_cell_centres",
    "sphere_cfl_dt", "sphere_rates", "uniform_density", "velocity_bound", "w1_circle",
    "w1_circle_densities", "w2_sphere_check", "zonal_growth_rate", "zonal_mode",
]
