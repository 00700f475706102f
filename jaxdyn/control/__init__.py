"""Reachability (Paper B): optimised time-varying controls that steer one Gaussian to
another (``reach``), the constructive certificate, and the transfer of controls to N
particles and to an L-layer transformer."""

from ._problem import (
    CONTROL_NAMES as CONTROL_NAMES,
    control_energy as control_energy,
    controlled_moments as controlled_moments,
    MODES as MODES,
    mode_options as mode_options,
    numerical_rank as numerical_rank,
    random_target as random_target,
)
from ._certificate import Certificate as Certificate, certificate as certificate
from ._reach import (
    ReachResult as ReachResult,
    reach as reach,
)
from ._transfer import (
    ControlledEuclideanAttention as ControlledEuclideanAttention,
    cloud_w2_to_gaussian as cloud_w2_to_gaussian,
    gaussian_cloud as gaussian_cloud,
    transfer_particles as transfer_particles,
    transformer_layers as transformer_layers,
)
