"""Several processes, one JAX cluster (``jax.distributed``): start-up and agreement.

Every process runs the same program: :func:`initialize_distributed` joins the cluster
(before any JAX computation), after which ``jax.devices()`` lists the devices of every
process and the sharding of :mod:`._sharding` (``sharded_vmap``, ``query_sharded_field``)
spans them all. Inputs built identically on every process (same config, same seeds) are
passed as they are: ``jit`` treats them as replicated, and each device computes its share.

The cluster is described by ``JAX_COORDINATOR_ADDRESS`` (host:port of process 0),
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``, or, when none of the three is set, detected
by JAX (SLURM, Open MPI, ...). On CPU the processes talk over the gloo collectives.

:func:`all_gather_rows` is the one collective the engine uses to agree before computing
(same config, same plan, what is already on disk); a killed process is detected by the
coordination service's heartbeat (``heartbeat_timeout_seconds``), or at once by the
collectives' closed connections, and the surviving processes stop.
"""

from __future__ import annotations

import atexit
import os
import sys

import jax
import numpy as np

ENV_ADDRESS = "JAX_COORDINATOR_ADDRESS"
ENV_COUNT = "JAX_NUM_PROCESSES"
ENV_ID = "JAX_PROCESS_ID"
#: seconds without a heartbeat after which a process counts as dead (JAX's default: 100)
HEARTBEAT_SECONDS = 30
#: seconds every process waits for the others to join at start-up (JAX's default: 300)
INIT_TIMEOUT_SECONDS = 120
#: exit status of a process whose cluster lost a member (the CLI's "the run failed")
LOST_EXIT_STATUS = 1
_LOST: list = []


class DistributedSetupError(ValueError):
    """The cluster cannot be formed from the environment (the message names what is wrong)."""


def _env_int(name, value, low):
    try:
        v = int(value)
    except ValueError:
        raise DistributedSetupError(f"{name}={value!r} is not an integer") from None
    if v < low:
        raise DistributedSetupError(f"{name}={value!r} must be >= {low}")
    return v


def cluster_from_env(environ=None) -> dict:
    """The arguments of ``jax.distributed.initialize`` given by the environment:
    ``{"coordinator_address", "num_processes", "process_id"}`` when all three variables are
    set, ``{}`` when none is (JAX then detects the cluster). Half a description is an
    error naming the missing variables."""
    env = os.environ if environ is None else environ
    names = (ENV_ADDRESS, ENV_COUNT, ENV_ID)
    given = {n: env.get(n, "") for n in names}
    missing = [n for n in names if not given[n]]
    if len(missing) == 3:
        return {}
    if missing:
        raise DistributedSetupError(
            f"{', '.join(missing)} not set: set all of {', '.join(names)} (or none, to let JAX "
            "detect a cluster such as SLURM)")
    addr = given[ENV_ADDRESS]
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise DistributedSetupError(f"{ENV_ADDRESS}={addr!r} must be HOST:PORT (process 0's host)")
    count = _env_int(ENV_COUNT, given[ENV_COUNT], 1)
    pid = _env_int(ENV_ID, given[ENV_ID], 0)
    if pid >= count:
        raise DistributedSetupError(f"{ENV_ID}={pid} must be below {ENV_COUNT}={count}")
    return {"coordinator_address": addr, "num_processes": count, "process_id": pid}


def initialize_distributed(*, heartbeat_timeout_seconds: int = HEARTBEAT_SECONDS,
                           initialization_timeout: int = INIT_TIMEOUT_SECONDS) -> tuple[int, int]:
    """Join the JAX cluster described by the environment (:func:`cluster_from_env`) or
    detected by JAX; returns (this process's index, process count). Must run before any JAX
    computation (``jax.devices()`` included). On CPU the collectives are gloo's. Calling it
    again in a process that has joined returns the same pair.

    Raises :class:`DistributedSetupError` (a ``ValueError``) naming the problem: an
    incomplete or malformed environment, no cluster detected, JAX already started."""
    if jax.distributed.is_initialized():
        return jax.process_index(), jax.process_count()
    kwargs = cluster_from_env()
    from ._sharding import _backends_initialized

    if _backends_initialized():
        raise DistributedSetupError("JAX has already started in this process; join the cluster "
                                    "before any JAX computation")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    atexit.register(_exit_if_abandoned)  # runs before JAX's own exit handler (registered earlier)
    try:
        jax.distributed.initialize(**kwargs, heartbeat_timeout_seconds=heartbeat_timeout_seconds,
                                   initialization_timeout=initialization_timeout)
    except ValueError as e:
        if kwargs:
            raise DistributedSetupError(f"jax.distributed.initialize: {e}") from None
        raise DistributedSetupError(
            f"no cluster detected ({e}); set {ENV_ADDRESS}, {ENV_COUNT} and {ENV_ID}, or run "
            "under a cluster manager JAX detects (SLURM, Open MPI)") from None
    return jax.process_index(), jax.process_count()


def all_gather_rows(row) -> np.ndarray:
    """Every process's ``row`` (a 1-D integer array of the same length everywhere), stacked:
    shape (process count, length), the same array on every process. One process: ``row[None]``."""
    row = np.asarray(row, np.int32).reshape(-1)
    if jax.process_count() == 1:
        return row[None]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(row, tiled=False)).reshape(
        jax.process_count(), -1)


def is_lost_process_error(e: BaseException) -> bool:
    """Whether ``e``, raised by a computation with collectives, says that another process of
    the cluster went away (a closed or reset connection, a missed heartbeat)."""
    text = f"{type(e).__name__} {e}".lower()
    return any(w in text for w in ("gloo", "connection reset", "connection closed", "broken pipe",
                                   "heartbeat", "coordination service", "nccl", "socket closed"))


def abandon_cluster(status: int = LOST_EXIT_STATUS):
    """Mark this process's part in the cluster as over: another process died, or this one
    stops mid-run on its own (an error, a signal). At exit the process then ends at once with
    ``status`` (the last one given), skipping JAX's shutdown barrier: that barrier would wait
    for a dead process until its heartbeat times out and then abort, and while this process
    waits in it, a process still in a collective with it would wait too. Leaving closes the
    connections, so the others' collectives fail at once."""
    _LOST.append(int(status))


def _exit_if_abandoned():
    if _LOST:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing more to say
                pass
        os._exit(_LOST[-1])
