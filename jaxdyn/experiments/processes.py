"""The processes of a run: one, or several of a ``jax.distributed`` cluster.

With several processes every one plans the same chunks, process 0 alone reads and writes the run
folder, and they agree before computing: a refusal on any of them stops all of them (naming the
process), they must run the same config with the same arguments, and they skip the same finished
chunks. A process that dies mid-run is noticed by the others (:class:`ProcessLostError`), and a
SIGTERM to any of them stops all at one chunk boundary. A run in one process skips all of this:
:class:`Processes` then answers without collectives (and without starting JAX).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import socket
import time

import numpy as np

from .. import io as jio
from ..config import ConfigError


class RunLockedError(ConfigError):
    """Another process holds the run folder's lock (the message names it).

    Args:
      message: the message.
      holder: who holds the lock (pid, host, since when), when known.
    """

    def __init__(self, message: str, holder: str | None = None):
        super().__init__(message)
        self.holder = holder


#: seconds every process waits for the others at start-up (``--distributed-timeout``, or the
#: environment variable below)
START_TIMEOUT_SECONDS = 120.0
START_TIMEOUT_ENV = "JAXDYN_DISTRIBUTED_TIMEOUT"
_HELLO = b"jaxdyn-rendezvous-1 "


class ClusterStartError(ConfigError):
    """The processes of a ``--distributed`` run cannot form their cluster (the message says why)."""


def start_timeout(value=None) -> float:
    """The start-up wait in seconds: ``value`` (the CLI option), else the environment, else 120.

    Args:
      value: the ``--distributed-timeout`` option (None when not given).

    Returns:
      Seconds (> 0).

    Raises:
      ConfigError: a value that is not a positive number (naming where it came from).
    """
    where = "--distributed-timeout"
    if value is None:
        value, where = os.environ.get(START_TIMEOUT_ENV, "").strip() or None, START_TIMEOUT_ENV
    if value is None:
        return START_TIMEOUT_SECONDS
    try:
        t = float(value)
    except ValueError:
        t = float("nan")
    if not t > 0 or t == float("inf"):
        raise ConfigError(f"{where}={value!r}: must be a positive number of seconds")
    return t


def _send(conn, obj):
    conn.sendall(_HELLO + json.dumps(obj).encode() + b"\n")


def _receive(conn, timeout: float):
    """The message on ``conn`` (None: closed, garbled, not a jaxdyn process, or no answer in time)."""
    conn.settimeout(timeout)
    data = b""
    try:
        while not data.endswith(b"\n") and len(data) < 4096:
            part = conn.recv(4096)
            if not part:
                break
            data += part
    except OSError:
        return None
    if not data.startswith(_HELLO):
        return None
    try:
        msg = json.loads(data[len(_HELLO):])
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


def _listen(port: int):
    """A listening socket on every interface at ``port``, or None where it is in use."""
    families = [(socket.AF_INET6, ("::", port))] if socket.has_dualstack_ipv6() else []
    for family, addr in families + [(socket.AF_INET, ("0.0.0.0", port))]:
        try:
            return socket.create_server(addr, family=family, dualstack_ipv6=family == socket.AF_INET6)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return None
    raise OSError(errno.EADDRNOTAVAIL, "cannot listen on any interface")


def rendezvous(address: str, count: int, pid: int, timeout: float, refusal: str | None = None):
    """Every process of a ``--distributed`` run checks in with process 0 before JAX joins them.

    JAX's own start-up waits for the missing, the duplicated or the miscounted process until
    its time-out and then aborts every process natively, naming nothing. Here process 0 listens
    on the coordinator's port, every other process sends it its id and count
    (``JAXDYN_PROCESS_ID``, ``JAXDYN_NUM_PROCESSES``) and its refusal if it has one (a config
    it cannot run), and process 0 answers all once every id has checked in: all go on to
    ``jax.distributed.initialize`` (on the same port, freed), or all stop with one line saying
    why: a port in use, two processes with one id, counts that disagree, a process's refusal,
    or the processes that did not check in within ``timeout`` seconds.

    Args:
      address: ``HOST:PORT`` of process 0.
      count: the process count.
      pid: this process's id.
      timeout: seconds to wait for the others.
      refusal: this process's reason not to run (told to every process), or None.

    Raises:
      ClusterStartError: the cluster cannot form (the message names the cause; a process that
        gave a refusal gets the cause found before its own, if any).
    """
    if count <= 1:
        return
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    hint = f"(wait longer with --distributed-timeout or {START_TIMEOUT_ENV})"
    if pid == 0:
        srv = _listen(int(port))
        if srv is None:
            raise ClusterStartError(
                f"JAX_COORDINATOR_ADDRESS={address}: port {port} is in use on this host (another "
                "run's coordinator, a second process started with process id 0, or another "
                "program); choose a free port")
        _serve(srv, address, count, deadline, timeout, hint, refusal)
    else:
        _join(host.strip("[]"), int(port), address, (count, pid, refusal), deadline, timeout, hint)


def _init_stalled(seconds: float, checked_in: bool):
    """The watchdog's end of a cluster that did not form: one line, exit 2, no native abort."""
    import sys

    when = ("after every process checked in (a process that stopped, or a network that blocks "
            "the processes' ports)" if checked_in else
            "(a process that did not start or stopped, one that refused its config, or a "
            "network that blocks the processes' ports; with JAXDYN_NUM_PROCESSES and "
            "JAXDYN_PROCESS_ID set the processes check in first and name the cause)")
    print(f"jaxdyn: error: --distributed: the cluster did not form within {seconds:g} s {when}; "
          "wait longer with --distributed-timeout", file=sys.stderr, flush=True)
    os._exit(2)


def _record_signal(signum, frame):
    """The signal handler of a cluster's process: record the signal, raise nothing."""
    jio.PENDING_SIGNALS.append(int(signum))


def defer_signals():
    """Make SIGTERM and SIGINT wait for the next chunk boundary in this process of a cluster.

    A process that raised at once would leave the others blocked in a collective; instead the
    handler records the signal, and :meth:`Processes.stop_if_preempted` stops every process at
    the same boundary. It replaces the handler that ``jax.distributed.initialize`` installs
    for JAX's preemption service, whose sync point is decided asynchronously and could let one
    process pass it unaware. Outside the main thread it does nothing (Python allows handlers
    there only).
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _record_signal)


def join_cluster(timeout=None, *, refusal: ConfigError | None = None, **cluster):
    """Check in with the other processes, then join the JAX cluster within a bounded wait.

    What ``jaxdyn run --distributed`` does before JAX starts, for a script that runs the engine
    itself in every process. The cluster is described as ``jax.distributed.initialize`` takes
    it (:func:`jaxdyn.simulation.initialize_distributed`): ``cluster``, the environment, and
    JAX's cluster detection for the rest. Where the address, count and id are known before JAX
    starts (given, or ``JAX_COORDINATOR_ADDRESS``, ``JAXDYN_NUM_PROCESSES``,
    ``JAXDYN_PROCESS_ID``), the processes check in first (:func:`rendezvous`), which names a
    port in use, a duplicated id, counts that disagree, a process's refusal and the processes
    that never start. JAX's start-up itself, which ends in a native abort after its own
    time-out, runs under a watchdog that ends the process first, with one line and exit 2.

    Args:
      timeout: seconds to wait for the others (None: :func:`start_timeout`'s environment or
        default).
      refusal: this process's refusal found before joining (its config): told to the other
        processes at the check-in, then raised; JAX is not started.
      **cluster: arguments of ``jax.distributed.initialize`` (``coordinator_address``,
        ``num_processes``, ``process_id``, ``local_device_ids``, ...).

    Raises:
      ConfigError: ``refusal``; the cluster cannot form, or a bad timeout (the message names
        the cause).
    """
    import sys

    from ..simulation import (DistributedSetupError, backends_initialized, cluster_from_env,
                              initialize_distributed)

    timeout = start_timeout(timeout)
    if refusal is None and "jax" in sys.modules and sys.modules["jax"].distributed.is_initialized():
        return
    known = {k: cluster.pop(k) for k in ("coordinator_address", "num_processes", "process_id")
             if k in cluster}
    try:
        spec = cluster_from_env(**known)
        if refusal is None and backends_initialized():
            initialize_distributed()  # raises: JAX has already started in this process
        checked_in = len(spec) == 3 and spec["num_processes"] > 1
        if checked_in:
            rendezvous(spec["coordinator_address"], spec["num_processes"], spec["process_id"],
                       timeout, None if refusal is None else str(refusal))
    except (DistributedSetupError, ClusterStartError) as e:
        if refusal is not None:
            raise refusal from None
        raise ConfigError(str(e)) from None
    if refusal is not None:
        raise refusal
    try:
        _start_jax(spec, cluster, timeout, checked_in)
    except DistributedSetupError as e:
        raise ConfigError(str(e)) from None


def _start_jax(spec, options, timeout, checked_in):
    """``initialize_distributed`` under the start-up watchdog; deferred signals in a cluster."""
    import sys
    import threading

    from ..simulation import initialize_distributed

    watchdog = threading.Timer(timeout, _init_stalled, (timeout, checked_in))
    watchdog.daemon = True
    watchdog.start()
    try:  # JAX's own time-out later than the watchdog's
        initialize_distributed(**spec, **options, initialization_timeout=int(timeout) + 30)
    finally:
        watchdog.cancel()
    if sys.modules["jax"].process_count() > 1:
        defer_signals()


def _serve(srv, address, count, deadline, timeout, hint, refusal):
    """Process 0's side of :func:`rendezvous`: collect every check-in, answer all, raise the cause."""
    peers, problem = {}, None  # problem: a fault that ends the wait at once
    refused = None if refusal is None else f"process 0 refused the run: {refusal}"
    with srv:
        srv.settimeout(0.5)
        while len(peers) < count - 1 and problem is None:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [i for i in range(1, count) if i not in peers]
                problem = refused or (
                    f"process(es) {', '.join(map(str, missing))} of {count} did not check in "
                    f"with process 0 at {address} within {timeout:g} s: not started, stopped, or "
                    f"given another JAX_COORDINATOR_ADDRESS {hint}")
                break
            try:
                conn, _ = srv.accept()
            except (TimeoutError, socket.timeout):
                continue
            msg = _receive(conn, min(5.0, max(left, 0.1)))
            if msg is None:  # not one of ours
                conn.close()
                continue
            i, n = msg.get("id"), msg.get("count")
            if n != count:
                problem = (f"process {i} was started with a process count of {n} and process 0 "
                           f"with {count}: every process needs the same JAXDYN_NUM_PROCESSES")
            elif i in peers or i == 0:
                problem = (f"two processes were started with process id {i}: every process "
                           f"needs its own JAXDYN_PROCESS_ID, 0 to {count - 1}")
            elif msg.get("refusal") and refused is None:  # told to all once all checked in
                refused = f"process {i} refused the run: {msg['refusal']}"
            peers.setdefault(i, []).append(conn)
        problem = problem or refused
        for conns in peers.values():
            for conn in conns:
                try:
                    _send(conn, {"ok": problem is None, "error": problem})
                    _receive(conn, 5.0)  # their close first: the port stays free for JAX
                except OSError:
                    pass
                conn.close()
    if problem is not None:
        raise ClusterStartError(f"{problem}; every process stops")


def _join(host, port, address, me, deadline, timeout, hint):
    """A process other than 0 in :func:`rendezvous`: check in, wait for process 0's answer."""
    count, pid, refusal = me
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ClusterStartError(f"process 0 at {address} did not answer within {timeout:g} s: "
                                    f"not started, stopped, or another address {hint}")
        try:
            conn = socket.create_connection((host, port), timeout=min(5.0, left))
        except OSError:
            time.sleep(min(0.5, max(left, 0.0)))
            continue
        with conn:
            try:
                _send(conn, {"id": pid, "count": count, "refusal": refusal})
            except OSError:
                continue
            # process 0 started before this connection, so it answers within `timeout` of it
            msg = _receive(conn, timeout + min(timeout, 10.0))
        if msg is None:
            raise ClusterStartError(
                f"the process at {address} is not a waiting process 0 of this run: its cluster "
                f"may have formed without this one (process id {pid} given to two "
                "processes?), or the address is another program's")
        if not msg.get("ok"):
            raise ClusterStartError(f"process 0 stopped the start: {msg.get('error')}")
        return


class ProcessLostError(ConnectionError):
    """Another process of a ``jax.distributed`` run stopped mid-run; this one stops too.

    Finished chunks are kept: ``--resume`` with any number of processes.
    """


def exit_status(e: BaseException) -> int:
    """The CLI's exit status for ``e`` (README, "What `jaxdyn run` writes").

    Args:
      e: the exception that ends the run.

    Returns:
      2 for a refused input, 4 for a locked folder, 128 + the signal for an interrupt, the code
      of a ``SystemExit``, else 1.
    """
    if isinstance(e, ConfigError):
        return 4 if isinstance(e, RunLockedError) else 2
    if isinstance(e, KeyboardInterrupt):
        return 128 + int(jio.PENDING_SIGNALS[-1] if jio.PENDING_SIGNALS else 2)
    if isinstance(e, SystemExit):
        return e.code if isinstance(e.code, int) else 1
    return 1


def _hash_row(h: str) -> list:
    return [int(h[i:i + 4], 16) for i in range(0, 16, 4)]  # 16 hex digits in int32s


def _raise_refusals(flags, failure):
    """This process's ``failure`` if any, else a refusal naming the first flagged process."""
    if failure is not None:
        raise failure
    bad = np.flatnonzero(flags)
    if bad.size:
        raise ConfigError(f"process {int(bad[0])} refused the run (its message says why); every "
                          "process stops")


@dataclasses.dataclass
class Processes:
    """This process's part in the run.

    Attributes:
      multi: several processes (a ``jax.distributed`` cluster of more than one).
      writer: this process reads and writes the run folder (process 0, or the only one).
      failure: a refusal held back until the processes share it (several processes only: a
        single process raises at once).
      index: this process's index in the cluster.
      count: the cluster's process count.
    """

    multi: bool = False
    writer: bool = True
    failure: ConfigError | None = None
    index: int = 0
    count: int = 1

    @classmethod
    def current(cls) -> Processes:
        """This process's role, without starting JAX when it has joined no cluster.

        Returns:
          The :class:`Processes` of this process.
        """
        import jax

        if not jax.distributed.is_initialized() or jax.process_count() == 1:
            return cls()
        return cls(multi=True, writer=jax.process_index() == 0, index=jax.process_index(),
                   count=jax.process_count())

    @staticmethod
    def describe() -> str:
        """``process i of n on HOST (k DEVICE device(s))``: this process, for its one line.

        Returns:
          The description.
        """
        import platform

        import jax

        return (f"process {jax.process_index()} of {jax.process_count()} on {platform.node()} "
                f"({jax.local_device_count()} {jax.default_backend()} device(s))")

    @contextlib.contextmanager
    def refusals(self):
        """Within the block a ``ConfigError`` is raised (one process) or held back (several).

        Yields:
          Nothing; with several processes a refusal is kept in :attr:`failure` until shared.

        Raises:
          ConfigError: the block's refusal, in a run of one process.
        """
        try:
            yield
        except ConfigError as e:
            if not self.multi:
                raise
            self.failure = e

    def gather(self, row) -> np.ndarray:
        """Every process's ``row`` (a 1-D integer array of one length everywhere), stacked.

        Args:
          row: this process's row.

        Returns:
          An array (process count, length), the same on every process; a process lost
          meanwhile is a :class:`ProcessLostError`.
        """
        from ..simulation import all_gather_rows

        try:
            return all_gather_rows(row)
        except Exception as e:
            lost = self.lost(e)
            if lost is None:
                raise
            raise lost from None

    def gather_bytes(self, data: bytes) -> list:
        """Every process's ``data`` (any length, empty allowed), in process order.

        Args:
          data: this process's bytes.

        Returns:
          One ``bytes`` per process, the same list on every process; a process lost meanwhile is
          a :class:`ProcessLostError`.
        """
        if not self.multi:
            return [bytes(data)]
        sizes = self.gather([len(data)])[:, 0]
        buf = np.zeros(max(int(sizes.max()), 1), np.uint8)
        buf[:len(data)] = np.frombuffer(data, np.uint8)
        from jax.experimental import multihost_utils

        try:
            rows = np.asarray(multihost_utils.process_allgather(buf, tiled=False)).reshape(len(sizes), -1)
        except Exception as e:
            lost = self.lost(e)
            if lost is None:
                raise
            raise lost from None
        return [rows[i, :int(n)].tobytes() for i, n in enumerate(sizes)]

    def agree_on_run(self, config_hash: str, resume: bool, n_chunks: int):
        """All processes start the run, or all refuse it.

        Every process shares its refusal (:attr:`failure`), its config hash, resume flag and
        chunk count; a difference from process 0 is a refusal on every process, naming it.

        Args:
          config_hash: the resolved config's hash.
          resume: whether this process resumes.
          n_chunks: the chunks this process planned.

        Raises:
          ConfigError: a process refused, or the processes disagree (named).
        """
        if not self.multi:
            return
        import jax

        rows = self.gather([self.failure is not None, bool(resume), n_chunks] + _hash_row(config_hash))
        _raise_refusals(rows[:, 0], self.failure)
        for i in range(1, rows.shape[0]):
            if rows[i, 1] != rows[0, 1]:
                raise ConfigError(f"process {i} was started {'with' if rows[i, 1] else 'without'} "
                                  f"--resume and process 0 {'with' if rows[0, 1] else 'without'}; "
                                  "every process must be started with the same arguments")
            if list(rows[i, 2:]) != list(rows[0, 2:]):
                which = "this process" if i == jax.process_index() else f"process {i}"
                raise ConfigError(f"{which}'s config differs from process 0's (config hash "
                                  f"{''.join(f'{v:04x}' for v in rows[i, 3:])} vs "
                                  f"{''.join(f'{v:04x}' for v in rows[0, 3:])}, {rows[i, 2]} vs "
                                  f"{rows[0, 2]} chunks): every process must run the same config "
                                  "(same file, --set and dtype)")

    def share_refusal(self):
        """Raise :attr:`failure` here, or a refusal naming the process that refused, if any did.

        A process's refusal is a ``ConfigError`` on every process.
        """
        if self.multi:
            _raise_refusals(self.gather([self.failure is not None])[:, 0], self.failure)

    def shared_done(self, find_done, n_chunks: int) -> list:
        """The finished chunks, as the writer finds them, so that every process skips the same.

        Args:
          find_done: called on the writer: the indices of the chunks on disk (a ``ConfigError``
            there is a refusal on every process).
          n_chunks: the planned chunk count.

        Returns:
          The indices of the finished chunks (the writer's refusal is a ``ConfigError`` on
          every process).
        """
        if not self.multi:
            return find_done()
        done, err = [], None
        if self.writer:
            try:
                done = find_done()
            except ConfigError as e:
                err = e
        mask = np.zeros(n_chunks + 1, np.int32)
        mask[0] = err is not None
        mask[[1 + ci for ci in done]] = 1
        rows = self.gather(mask)
        _raise_refusals(rows[:1, 0], err)
        return [int(ci) for ci in np.flatnonzero(rows[0, 1:])]

    def stop_if_preempted(self):
        """Several processes: a SIGTERM or SIGINT to any of them stops all at this chunk boundary.

        In a cluster the signal handler only records the signal (:func:`defer_signals`); at
        each chunk boundary every process contributes the signal it holds (0 for none) to one
        all-gather, so all of them see the same rows and stop at the same boundary, whichever
        process got the signal and whenever it came (in a chunk, in a collective).

        Raises:
          KeyboardInterrupt: a process got a signal (this process records it as its own, so
            that every process exits with the same code).
        """
        if not self.multi:
            return
        held = int(jio.PENDING_SIGNALS[-1]) if jio.PENDING_SIGNALS else 0
        got = int(self.gather(np.asarray([held], np.int32)).max())
        if got:
            if not jio.PENDING_SIGNALS:
                jio.PENDING_SIGNALS.append(got)
            raise KeyboardInterrupt(f"signal {got} (to one process: every process stops at "
                                    "this chunk)")

    def lost(self, e: BaseException) -> ProcessLostError | None:
        """A :class:`ProcessLostError` if ``e`` says another process went away, else None.

        The cluster is then marked abandoned (this process exits without JAX's shutdown barrier).

        Args:
          e: an exception raised during the run.

        Returns:
          The error to raise instead of ``e``, or None.
        """
        if not self.multi:
            return None
        import jax

        from ..simulation import abandon_cluster, is_lost_process_error

        if isinstance(e, ProcessLostError):
            return e
        if isinstance(e, (KeyboardInterrupt, SystemExit)) or not is_lost_process_error(e):
            return None
        abandon_cluster()
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return ProcessLostError(f"process {jax.process_index()} of {jax.process_count()}: another "
                                f"process of this run stopped ({first}); this one stops too")

    def stopping(self, e: BaseException) -> BaseException:
        """The exception that ends this process's run, and the cluster told so.

        Args:
          e: the exception raised during the run.

        Returns:
          ``e``, or the :class:`ProcessLostError` it stands for; when this process stops on its
          own (several processes) it leaves the cluster at exit, so that the others stop too.
        """
        lost = self.lost(e)
        if lost is not None:
            return lost
        if self.multi:
            from ..simulation import abandon_cluster

            abandon_cluster(exit_status(e))
        return e


