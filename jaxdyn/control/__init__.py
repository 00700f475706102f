"""Reachability (Paper B): optimised time-varying controls that steer one Gaussian to
another (:func:`reach`), the constructive :func:`certificate`, the loss both are measured by
(:func:`reach_loss`), and the transfer of controls to N particles and to an L-layer
transformer."""

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
    "ReachLoss",
    "ReachOptions",
    "ReachResult",
    "certificate",
    "cloud_w2_to_gaussian",
    "control_energy",
    "controlled_moments",
    "gaussian_cloud",
    "mode_options",
    "numerical_rank",
    "random_target",
    "reach",
    "reach_loss",
    "transfer_particles",
    "transformer_layers",
]
