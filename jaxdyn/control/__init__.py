"""Reachability (Paper B): controls that steer one Gaussian to another.

:func:`reach` optimises time-varying controls of the moment ODE, :func:`certificate` is the
constructive solution, :func:`reach_loss` is the loss reach minimises, and the controls
transfer to N particles (:func:`transfer_particles`) and to an L-layer transformer
(:func:`transformer_layers`).
"""

from ._certificate import Certificate as Certificate, certificate as certificate
from ._loss import ReachLoss as ReachLoss, reach_loss as reach_loss
from ._problem import (
    CONTROL_NAMES as CONTROL_NAMES,
    MODES as MODES,
    control_energy as control_energy,
    controlled_moments as controlled_moments,
    mode_options as mode_options,
    numerical_rank as numerical_rank,
    random_target as random_target,
)
from ._measure import (
    MeasureControlOptions as MeasureControlOptions,
    MeasureControlResult as MeasureControlResult,
    control_cost as control_cost,
    default_controls as default_controls,
    layer_models as layer_models,
    measure_control as measure_control,
    measure_flow as measure_flow,
    measure_loss as measure_loss,
    moment_controls as moment_controls,
    repeat_layers as repeat_layers,
    replay as replay,
)
from ._reach import ReachOptions as ReachOptions, ReachResult as ReachResult, reach as reach
from ._transfer import (
    CloudW2 as CloudW2,
    ControlledEuclideanAttention as ControlledEuclideanAttention,
    cloud_w2_to_gaussian as cloud_w2_to_gaussian,
    gaussian_cloud as gaussian_cloud,
    transfer_particles as transfer_particles,
    transformer_layers as transformer_layers,
)

__all__ = [
    "CONTROL_NAMES",
    "MODES",
    "Certificate",
    "CloudW2",
    "ControlledEuclideanAttention",
    "MeasureControlOptions",
    "MeasureControlResult",
    "ReachLoss",
    "ReachOptions",
    "ReachResult",
    "certificate",
    "cloud_w2_to_gaussian",
    "control_energy",
    "control_cost",
    "controlled_moments",
    "default_controls",
    "gaussian_cloud",
    "layer_models",
    "measure_control",
    "measure_flow",
    "measure_loss",
    "mode_options",
    "moment_controls",
    "numerical_rank",
    "random_target",
    "reach",
    "reach_loss",
    "repeat_layers",
    "replay",
    "transfer_particles",
    "transformer_layers",
]
