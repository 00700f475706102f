"""Drivers of the particle integrators.

``simulate`` (one system, one ``diffrax.diffeqsolve``; vmap it for sweeps), ``simulate_sde``
(noisy dynamics), ``simulate_ensemble`` (thousands of small sphere systems on the vector
lanes), the time grid they share, sharding (sweeps over devices, one large system split by
queries) and several processes (``jax.distributed``).
"""

from ._simulate import (
    METHODS as METHODS,
    Trajectory as Trajectory,
    fixed_steps as fixed_steps,
    plan_steps as plan_steps,
    save_indices as save_indices,
    saved_states as saved_states,
    simulate as simulate,
)
from ._ensemble import (
    METHODS as ENSEMBLE_METHODS,
    FASTER_MAX_PARTICLES as FASTER_MAX_PARTICLES,
    MAX_PARTICLES as MAX_PARTICLES,
    simulate_ensemble as simulate_ensemble,
)
from ._sharding import (
    QueryShardedField as QueryShardedField,
    backends_initialized as backends_initialized,
    configure_host_devices as configure_host_devices,
    query_sharded_field as query_sharded_field,
    query_sharded_interaction as query_sharded_interaction,
    shard_batch as shard_batch,
    sharded_vmap as sharded_vmap,
    sweep_mesh as sweep_mesh,
)
from ._noise import SDE_METHODS as SDE_METHODS, GridBrownianPath as GridBrownianPath
from ._noise import simulate_sde as simulate_sde
from ._distributed import (
    DistributedSetupError as DistributedSetupError,
    abandon_cluster as abandon_cluster,
    all_gather_rows as all_gather_rows,
    cluster_from_env as cluster_from_env,
    initialize_distributed as initialize_distributed,
    is_lost_process_error as is_lost_process_error,
)

__all__ = ["METHODS", "Trajectory", "fixed_steps", "plan_steps", "save_indices", "saved_states",
           "simulate", "ENSEMBLE_METHODS", "FASTER_MAX_PARTICLES", "MAX_PARTICLES",
           "simulate_ensemble", "QueryShardedField", "backends_initialized", "configure_host_devices",
           "query_sharded_field", "query_sharded_interaction", "shard_batch", "sharded_vmap",
           "sweep_mesh", "SDE_METHODS", "GridBrownianPath", "simulate_sde",
           "DistributedSetupError", "abandon_cluster", "all_gather_rows", "cluster_from_env",
           "initialize_distributed", "is_lost_process_error"]
