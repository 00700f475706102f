"""jaxdyn: mean-field dynamics of Transformers in JAX.

Particles on the sphere under softmax self-attention (Paper A), Gaussian transformer
dynamics in R^d (Paper B), Wasserstein measurement and optax-driven control.

The top level holds the names the README uses; everything else lives in a subpackage with
one role each: ``jaxdyn.sphere``, ``kernels``, ``models``, ``integrators``, ``simulation``,
``spectral``, ``clusters``, ``gaussian``, ``distances``, ``control``, ``encoder``, ``weights`` (and the
shell: ``config``, ``io``, ``plots``, ``experiments``, ``cli``).

Every driver returns a :class:`Solution` pytree whose ``result`` is a :class:`RESULTS` code
per member (diffrax's codes included): read it with ``.ok``, ``.status``, ``.messages``.
"""

__version__ = "0.1.0"

from ._results import (
    RESULTS as RESULTS,
    Solution as Solution,
    is_successful as is_successful,
    status_codes as status_codes,
    status_messages as status_messages,
    status_names as status_names,
)
from . import (  # noqa: F401  (the subpackages, for jaxdyn.<role>.<name>)
    clusters, control, distances, gaussian, integrators, kernels, models, simulation, spectral,
    sphere, weights,
)
from .models import (
    EuclideanAttention as EuclideanAttention,
    SphereAttention as SphereAttention,
    ZeroTemperature as ZeroTemperature,
    stack_models as stack_models,
)
from .models import MultiHeadAttention as MultiHeadAttention  # issue 15: attention variants
from .sphere import (
    normalize as normalize,
    sample_mixture as sample_mixture,
    sample_sphere as sample_sphere,
    sample_vmf as sample_vmf,
)
from .simulation import (
    Trajectory as Trajectory,
    sharded_vmap as sharded_vmap,
    simulate as simulate,
    simulate_ensemble as simulate_ensemble,
)
from .spectral import (
    check_assumptions as check_assumptions,
    lyapunov as lyapunov,
    mass_near as mass_near,
    projection as projection,
    spectral_weights as spectral_weights,
)
from .distances import (
    bures_w2 as bures_w2,
    w2 as w2,
    w2_exact as w2_exact,
    w2_sinkhorn as w2_sinkhorn,
)
from .gaussian import solve_moments as solve_moments, solve_moments_batch as solve_moments_batch
from .control import certificate as certificate, reach as reach
from .clusters import (
    cluster_count as cluster_count,
    interaction_energy as interaction_energy,
    merge_events as merge_events,
    pair_fraction as pair_fraction,
)
from .io import open_results as open_results
