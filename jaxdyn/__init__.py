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
from ._ensemble import simulate_ensemble as simulate_ensemble
from ._sphere import (
    exp_map as exp_map,
    geodesic_distance as geodesic_distance,
    normalize as normalize,
    sample_mixture as sample_mixture,
    sample_sphere as sample_sphere,
    sample_vmf as sample_vmf,
    tangent_project as tangent_project,
)
from ._spectral import (
    AssumptionReport as AssumptionReport,
    Projection as Projection,
    angle_to_subspace as angle_to_subspace,
    check_assumptions as check_assumptions,
    lyapunov as lyapunov,
    mass_near as mass_near,
    projection as projection,
    rotation_matrix as rotation_matrix,
    spectral_weights as spectral_weights,
    subspace_angle as subspace_angle,
    top_eigenspace as top_eigenspace,
)
from ._distances import (
    SinkhornW2 as SinkhornW2,
    bures_w2 as bures_w2,
    bures_w2_squared as bures_w2_squared,
    sqrtm_psd as sqrtm_psd,
    w2 as w2,
    w2_coupling as w2_coupling,
    w2_exact as w2_exact,
    w2_sinkhorn as w2_sinkhorn,
)
from ._sharding import (
    configure_host_devices as configure_host_devices,
    QueryShardedField as QueryShardedField,
    query_sharded_field as query_sharded_field,
    query_sharded_interaction as query_sharded_interaction,
    shard_batch as shard_batch,
    sharded_vmap as sharded_vmap,
    sweep_mesh as sweep_mesh,
)
from .io import open_results as open_results
from ._encoder import (
    BertConfig as BertConfig,
    BertParams as BertParams,
    embed as embed,
    encode as encode,
    find_minilm as find_minilm,
    init_bert as init_bert,
    load_bert as load_bert,
    random_like as random_like,
)
from ._gaussianity import (
    GaussianityProfile as GaussianityProfile,
    gaussian_tokens as gaussian_tokens,
    gaussianity_profile as gaussianity_profile,
    measure_gaussianity as measure_gaussianity,
    nongaussian_stack as nongaussian_stack,
)
from ._control import (
    Certificate as Certificate,
    ControlledEuclideanAttention as ControlledEuclideanAttention,
    ReachResult as ReachResult,
    certificate as certificate,
    cloud_w2_to_gaussian as cloud_w2_to_gaussian,
    control_energy as control_energy,
    controlled_moments as controlled_moments,
    gaussian_cloud as gaussian_cloud,
    mode_options as mode_options,
    numerical_rank as numerical_rank,
    random_target as random_target,
    reach as reach,
    transfer_particles as transfer_particles,
    transformer_layers as transformer_layers,
)
from ._gaussian import (
    Control as Control,
    MomentSolution as MomentSolution,
    MomentStatus as MomentStatus,
    covariance_curves as covariance_curves,
    solve_moments as solve_moments,
)
from ._gaussian_batch import solve_moments_batch as solve_moments_batch
from ._gaussian_closed import (
    lyapunov_equilibrium as lyapunov_equilibrium,
    scalar_blowup_time as scalar_blowup_time,
    scalar_variance as scalar_variance,
    vi_blowup_time as vi_blowup_time,
    vi_covariance as vi_covariance,
)
from ._gaussian_regimes import classify as classify, stationary_covariance as stationary_covariance
