"""jaxdyn: mean-field dynamics of Transformers in JAX.

Particles on the sphere under softmax self-attention (Paper A), Gaussian transformer
dynamics in R^d (Paper B), Wasserstein measurement and optax-driven control.
"""

__version__ = "0.1.0"

from ._kernels import interaction as interaction
from ._models import (
    EuclideanAttention as EuclideanAttention,
    SphereAttention as SphereAttention,
    ZeroTemperature as ZeroTemperature,
    stack_models as stack_models,
)
from ._simulate import Trajectory as Trajectory, simulate as simulate
from ._sphere import (
    exp_map as exp_map,
    geodesic_distance as geodesic_distance,
    normalize as normalize,
    sample_mixture as sample_mixture,
    sample_sphere as sample_sphere,
    sample_vmf as sample_vmf,
    tangent_project as tangent_project,
)
