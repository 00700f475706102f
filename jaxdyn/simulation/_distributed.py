"""Several processes, one JAX cluster (``jax.distributed``): start-up and agreement.

Every process runs the same program: :func:`initialize_distributed` joins the cluster
(before any JAX computation), after which ``jax.devices()`` lists the devices of every
process and the sharding of :mod:`._sharding` (``sharded_vmap``, ``query_sharded_field``)
spans them all. Inputs built identically on every process (same config, same seeds) are
passed as they are: ``jit`` treats them as replicated, and each device computes its share.

The cluster is described as ``jax.distributed.initialize`` takes it: arguments, the variables
JAX reads itself (``JAX_COORDINATOR_ADDRESS``, ``JAX_COORDINATOR_PORT``, ...), and JAX's
cluster detection (SLURM, Open MPI, Kubernetes, Cloud TPU) for whatever is left unset.
JAX reads no variable for the process count and id; jaxdyn's own are ``JAXDYN_NUM_PROCESSES``
and ``JAXDYN_PROCESS_ID`` (passed on to JAX). On CPU the processes talk over the gloo
collectives.

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

#: the coordinator's HOST:PORT (read by JAX itself)
ENV_ADDRESS = "JAX_COORDINATOR_ADDRESS"
#: the process count (jaxdyn's name; JAX reads none)
ENV_COUNT = "JAXDYN_NUM_PROCESSES"
#: this process's id, 0 to count - 1 (jaxdyn's name; JAX reads none)
ENV_ID = "JAXDYN_PROCESS_ID"
#: names sometimes set for the count and id that neither JAX nor jaxdyn reads
UNREAD_NAMES = {"JAX_NUM_PROCESSES": ENV_COUNT, "JAX_PROCESS_ID": ENV_ID}
#: seconds without a heartbeat after which a process counts as dead (JAX's default: 100)
HEARTBEAT_SECONDS = 30
#: seconds every process waits for the others to join at start-up (JAX's default: 300)
INIT_TIMEOUT_SECONDS = 120
#: exit status of a process whose cluster lost a member (the CLI's "the run failed")
LOST_EXIT_STATUS = 1
_LOST: list = []


class DistributedSetupError(ValueError):
    """The cluster cannot be formed from the environment (the message names what is wrong)."""


def _as_int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, str)):
        raise DistributedSetupError(f"{name}={value!r} is not an integer")
    try:
        v = int(value)
    except ValueError:
        raise DistributedSetupError(f"{name}={value!r} is not an integer") from None
    if v < low:
        raise DistributedSetupError(f"{name}={value!r} must be >= {low}")
    return v


def cluster_from_env(environ=None, **given) -> dict:
    """What the environment and ``given`` say of the cluster, checked, before JAX fills the rest.

    ``given`` (the arguments of :func:`initialize_distributed`, None meaning unset) wins over
    the environment: ``JAX_COORDINATOR_ADDRESS``, ``JAXDYN_NUM_PROCESSES``,
    ``JAXDYN_PROCESS_ID``. What is left out is left to ``jax.distributed.initialize`` (its
    cluster detection).

    Args:
      environ: the environment (default ``os.environ``).
      **given: ``coordinator_address``, ``num_processes``, ``process_id``.

    Returns:
      The known ones of ``{"coordinator_address", "num_processes", "process_id"}`` (``{}``
      when nothing is set: JAX then detects the cluster).

    Raises:
      DistributedSetupError: an address that is not HOST:PORT, a count or id that is not an
        integer in range, or an id not below the count (naming the variable or argument).
    """
    env = os.environ if environ is None else environ
    sources = {"coordinator_address": ENV_ADDRESS, "num_processes": ENV_COUNT,
               "process_id": ENV_ID}
    unknown = sorted(set(given) - set(sources))
    if unknown:
        raise DistributedSetupError(f"unknown cluster argument(s) {', '.join(unknown)}")
    out, names = {}, {}
    for key, var in sources.items():
        if given.get(key) is not None:
            out[key], names[key] = given[key], key
        elif str(env.get(var, "")).strip():
            out[key], names[key] = str(env[var]).strip(), var
    if "coordinator_address" in out:
        addr = str(out["coordinator_address"])
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            raise DistributedSetupError(f"{names['coordinator_address']}={addr!r} must be "
                                        "HOST:PORT (process 0's host)")
        out["coordinator_address"] = addr
    if "num_processes" in out:
        out["num_processes"] = _as_int(names["num_processes"], out["num_processes"], 1)
    if "process_id" in out:
        out["process_id"] = _as_int(names["process_id"], out["process_id"], 0)
        if out.get("num_processes", out["process_id"] + 1) <= out["process_id"]:
            raise DistributedSetupError(f"{names['process_id']}={out['process_id']} must be "
                                        f"below {names['num_processes']}={out['num_processes']}")
    return out


def _setup_message(error, known, environ=None) -> str:
    """The message for a cluster JAX refused to form: its reason, what was given, what to set."""
    env = os.environ if environ is None else environ
    have = ", ".join(f"{k}={v}" for k, v in known.items()) or "nothing"
    text = f"jax.distributed.initialize: {error} (given: {have})"
    if "defined" in str(error):  # something JAX could neither read nor detect
        text += (f"; JAX detected no cluster manager to complete it: set {ENV_ADDRESS} (process "
                 f"0's HOST:PORT), {ENV_COUNT} and {ENV_ID}, or run under one JAX detects "
                 "(SLURM, Open MPI, Kubernetes, Cloud TPU)")
    unread = [f"{old} (use {new})" for old, new in UNREAD_NAMES.items() if env.get(old)]
    if unread:
        text += f"; set but read by neither JAX nor jaxdyn: {', '.join(unread)}"
    return text


def initialize_distributed(*, coordinator_address: str | None = None,
                           num_processes: int | None = None, process_id: int | None = None,
                           heartbeat_timeout_seconds: int = HEARTBEAT_SECONDS,
                           initialization_timeout: int = INIT_TIMEOUT_SECONDS,
                           **jax_options) -> tuple[int, int]:
    """Join the JAX cluster: ``jax.distributed.initialize`` with the gloo collectives on CPU.

    Takes what ``jax.distributed.initialize`` takes: the arguments here, else the environment
    (:func:`cluster_from_env`), and whatever both leave unset JAX detects (SLURM, Open MPI, ...;
    ``JAX_COORDINATOR_ADDRESS`` alone under SLURM, say). Must run before any JAX computation
    (``jax.devices()`` included). Calling it again in a process that has joined returns the
    same pair. A process known to be process 0 checks first that the coordinator's port is
    free on its host (a port in use makes JAX's coordinator crash, and the other processes
    wait for it until their time-out).

    Args:
      coordinator_address: process 0's ``HOST:PORT`` (default ``$JAX_COORDINATOR_ADDRESS``,
        else detected).
      num_processes: the process count (default ``$JAXDYN_NUM_PROCESSES``, else detected).
      process_id: this process's id (default ``$JAXDYN_PROCESS_ID``, else detected).
      heartbeat_timeout_seconds: seconds without a heartbeat after which a process counts as dead.
      initialization_timeout: seconds every process waits for the others to join.
      **jax_options: further arguments of ``jax.distributed.initialize``
        (``local_device_ids``, ``cluster_detection_method``, ``coordinator_bind_address``, ...).

    Returns:
      (this process's index, process count).

    Raises:
      DistributedSetupError: a malformed description, a coordinator port in use, a cluster
        JAX cannot complete or form, or JAX already started (the message names it).
    """
    if jax.distributed.is_initialized():
        return jax.process_index(), jax.process_count()
    kwargs = cluster_from_env(coordinator_address=coordinator_address,
                              num_processes=num_processes, process_id=process_id)
    if kwargs.get("process_id") == 0 and "coordinator_address" in kwargs:
        check_coordinator_port(kwargs["coordinator_address"])
    from ._sharding import backends_initialized

    if backends_initialized():
        raise DistributedSetupError("JAX has already started in this process; join the cluster "
                                    "before any JAX computation")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    atexit.register(_exit_if_abandoned)  # runs before JAX's own exit handler (registered earlier)
    try:
        jax.distributed.initialize(**kwargs, **jax_options,
                                   heartbeat_timeout_seconds=heartbeat_timeout_seconds,
                                   initialization_timeout=initialization_timeout)
    except (ValueError, TypeError, RuntimeError) as e:
        raise DistributedSetupError(_setup_message(e, kwargs)) from None
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
                        f"coordinator {address}: port {port} is in use on this host (another "
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
