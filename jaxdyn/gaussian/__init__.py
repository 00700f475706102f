"""Gaussian transformer dynamics (Paper B): the moment ODE and its adaptive solve with blow-up
detection, the lock-step batch solver, closed forms, stationary points and regimes."""

from ._solve import (
    Control as Control,
    MomentField as MomentField,
    MomentSolution as MomentSolution,
    check_covariance as check_covariance,
    covariance_curves as covariance_curves,
    moment_rhs as moment_rhs,
    solve_moments as solve_moments,
)
from ._batch import BatchSolution as BatchSolution, solve_moments_batch as solve_moments_batch
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
from ._solve import DOMINANCE as DOMINANCE, POLE_FRACTION as POLE_FRACTION
from ._particles import (
    bures_distance as bures_distance,
    cloud_stats as cloud_stats,
    directions as directions,
    fit_slope as fit_slope,
    gaussian_cloud as gaussian_cloud,
    parting_time as parting_time,
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
from ._variants import (  # issue 15: attention variants
    conditional_mean_map as conditional_mean_map,
    covariance_rhs as covariance_rhs,
    conditional_mean_affine as conditional_mean_affine,
    variant_moment_rhs as variant_moment_rhs,
)
from ._solve import VariantMomentField as VariantMomentField  # issue 15: solve_moments(attention=)
