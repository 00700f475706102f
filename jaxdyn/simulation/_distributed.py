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
    """The arguments of ``jax.distributed.initialize`` given by the environment.

    Args:
      environ: the environment (default ``os.environ``).

    Returns:
      ``{"coordinator_address", "num_processes", "process_id"}`` when all three variables are
      set, ``{}`` when none is (JAX then detects the cluster).

    Raises:
      DistributedSetupError: half a description (naming the missing variables), a malformed
        address, count or id, or an id not below the count.
    """
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
    """Join the JAX cluster described by the environment (:func:`cluster_from_env`) or detected by JAX.

    Must run before any JAX computation (``jax.devices()`` included). On CPU the collectives are
    gloo's. Calling it again in a process that has joined returns the same pair. Process 0 checks
    first that the coordinator's port is free on its host (a port in use makes JAX's coordinator
    crash, and the other processes wait for it until their time-out).

    Args:
      heartbeat_timeout_seconds: seconds without a heartbeat after which a process counts as dead.
      initialization_timeout: seconds every process waits for the others to join.

    Returns:
      (this process's index, process count).

    Raises:
      DistributedSetupError: an incomplete or malformed environment, a coordinator port in use,
        no cluster detected, or JAX already started (the message names it).
    """
    if jax.distributed.is_initialized():
        return jax.process_index(), jax.process_count()
    kwargs = cluster_from_env()
    if kwargs.get("process_id") == 0:
        check_coordinator_port(kwargs["coordinator_address"])
    from ._sharding import backends_initialized

    if backends_initialized():
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


def check_coordinator_port(address: str):
    """Refuse a coordinator address whose port another program holds on this host.

    Process 0 runs JAX's coordination service at ``address``; a port in use there crashes it
    (gRPC "Failed to add port") and leaves the other processes waiting for their time-out. The
    check binds the port on every local interface for a moment; an address of another host is
    not checked.

    Args:
      address: ``HOST:PORT``.

    Raises:
      DistributedSetupError: the port is in use on this host.
    """
    import errno
    import socket

    host, _, port = address.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):  # a name that does not resolve: JAX's own error names it
        return
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(sockaddr)  # another host's address: EADDRNOTAVAIL, not checked
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise DistributedSetupError(
                        f"{ENV_ADDRESS}={address}: port {port} is in use on this host (another "
                        "run's coordinator, or another program); choose a free port") from None


def all_gather_rows(row) -> np.ndarray:
    """Every process's ``row`` (a 1-D integer array of the same length everywhere), stacked.

    Args:
      row: this process's row.

    Returns:
      Shape (process count, length), the same array on every process; one process: ``row[None]``.
    """
    row = np.asarray(row, np.int32).reshape(-1)
    if jax.process_count() == 1:
        return row[None]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(row, tiled=False)).reshape(
        jax.process_count(), -1)


def is_lost_process_error(e: BaseException) -> bool:
    """Whether ``e``, raised by a computation with collectives, says that another process went away.

    Args:
      e: the exception.

    Returns:
      True for a closed or reset connection, a missed heartbeat, a coordination-service error.
    """
    text = f"{type(e).__name__} {e}".lower()
    return any(w in text for w in ("gloo", "connection reset", "connection closed", "broken pipe",
                                   "heartbeat", "coordination service", "nccl", "socket closed"))


def abandon_cluster(status: int = LOST_EXIT_STATUS):
    """Mark this process's part in the cluster as over.

    Another process died, or this one stops mid-run on its own (an error, a signal). At exit the
    process then ends at once with ``status`` (the last one given), skipping JAX's shutdown
    barrier: that barrier would wait for a dead process until its heartbeat times out and then
    abort, and while this process waits in it, a process still in a collective with it would wait
    too. Leaving closes the connections, so the others' collectives fail at once.

    Args:
      status: the exit status.
    """
    _LOST.append(int(status))


def _exit_if_abandoned():
    if _LOST:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing more to say
                pass
        os._exit(_LOST[-1])
