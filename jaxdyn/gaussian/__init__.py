"""Gaussian transformer dynamics (Paper B): the moment ODE and its adaptive solve with blow-up detection.

The single-member solve (:func:`solve_moments`) and the batch solver
(:func:`solve_moments_batch`), closed forms, stationary points and regimes, the attention
variants' moment fields, and the statistics of Gaussian particle clouds.
"""

from ._batch import (
    BatchSolution as BatchSolution,
    MomentBatchOptions as MomentBatchOptions,
    solve_moments_batch as solve_moments_batch,
)
from ._closed import (
    lyapunov_equilibrium as lyapunov_equilibrium,
    lyapunov_solve as lyapunov_solve,
    scalar_blowup_time as scalar_blowup_time,
    scalar_variance as scalar_variance,
    vi_blowup_time as vi_blowup_time,
    vi_blowup_time_general as vi_blowup_time_general,
    vi_covariance as vi_covariance,
    vi_precision as vi_precision,
)
from ._particles import (
    bures_distance as bures_distance,
    cloud_stats as cloud_stats,
    directions as directions,
    fit_slope as fit_slope,
    gaussian_cloud as gaussian_cloud,
    parting_time as parting_time,
)
from ._regimes import (
    GridResult as GridResult,
    Regime as Regime,
    StationaryPoint as StationaryPoint,
    bernoulli_residual as bernoulli_residual,
    classify as classify,
    linearisation as linearisation,
    moment_grid as moment_grid,
    scalar_grid as scalar_grid,
    stationary_covariance as stationary_covariance,
    vi_grid as vi_grid,
)
from ._solve import (
    DOMINANCE as DOMINANCE,
    POLE_FRACTION as POLE_FRACTION,
    Control as Control,
    MomentField as MomentField,
    MomentOptions as MomentOptions,
    MomentSolution as MomentSolution,
    VariantMomentField as VariantMomentField,
    check_covariance as check_covariance,
    covariance_curves as covariance_curves,
    moment_rhs as moment_rhs,
    solve_moments as solve_moments,
)
from ._theory import (
    lyapunov_limit as lyapunov_limit,
    phase_theory as phase_theory,
    predicted_exponent as predicted_exponent,
    relu_initial_rates as relu_initial_rates,
    scalar_v as scalar_v,
    tilt_index as tilt_index,
    vi_closed_form as vi_closed_form,
)
from ._variants import (
    conditional_mean_affine as conditional_mean_affine,
    conditional_mean_map as conditional_mean_map,
    covariance_rhs as covariance_rhs,
    variant_moment_rhs as variant_moment_rhs,
)

__all__ = [
    # the moment ODE and its solvers
    "Control", "MomentField", "VariantMomentField", "MomentSolution", "BatchSolution",
    "MomentOptions", "MomentBatchOptions",
    "moment_rhs", "solve_moments", "solve_moments_batch", "covariance_curves",
    "check_covariance", "DOMINANCE", "POLE_FRACTION",
    # closed forms and theory
    "scalar_variance", "scalar_blowup_time", "vi_covariance", "vi_blowup_time", "vi_precision",
    "vi_blowup_time_general", "lyapunov_solve", "lyapunov_equilibrium", "scalar_v",
    "vi_closed_form", "lyapunov_limit", "phase_theory", "relu_initial_rates", "tilt_index",
    "predicted_exponent",
    # stationary points, regimes, grids
    "StationaryPoint", "stationary_covariance", "bernoulli_residual", "linearisation", "Regime",
    "classify", "GridResult", "moment_grid", "scalar_grid", "vi_grid",
    # attention variants
    "conditional_mean_map", "conditional_mean_affine", "covariance_rhs", "variant_moment_rhs",
    # particle clouds
    "gaussian_cloud", "directions", "cloud_stats", "bures_distance", "parting_time", "fit_slope",
]
