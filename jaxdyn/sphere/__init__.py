"""The unit sphere S^{d-1}: geometry and sampling.

Geometry: tangent projection, retraction (normalisation), exponential map, geodesic distance.
Sampling: uniform, von Mises–Fisher, mixtures; jittable and vmappable over keys.
"""

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

# every name imported above (the private modules start with an underscore)
__all__ = sorted(n for n in globals() if not n.startswith("_"))
