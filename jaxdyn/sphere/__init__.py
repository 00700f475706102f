"""The unit sphere S^{d-1}: geometry (projection, retraction, exponential map, distance) and
sampling (uniform, von Mises–Fisher, mixtures)."""

from ._geometry import (
    exp_map as exp_map,
    geodesic_distance as geodesic_distance,
    normalize as normalize,
    tangent_project as tangent_project,
)
from ._sampling import (
    sample_initial as sample_initial,
    sample_mixture as sample_mixture,
    sample_sphere as sample_sphere,
    sample_vmf as sample_vmf,
)
