"""Sharding sweeps and large systems over JAX devices (CPU cores, GPUs, hosts).

Two patterns, both ``shard_map`` over a one-axis :class:`jax.sharding.Mesh`, with no
communication inside the hot loop:

* **Sweeps** (β × seeds × ...): a batch of independent systems, stacked on a leading axis,
  is padded to a multiple of the device count and split across devices; each device runs
  ``vmap`` (or ``lax.map`` in cache-sized chunks, ``batch_size``) over its share.
  :func:`sharded_vmap` does the padding, placement and unpadding.
* **One large system**: the query particles (rows of ``x``) are split across devices and
  the keys are replicated, so each device computes ``m_i = Σ_j w_ij y_j`` for its rows
  against all N keys: :func:`query_sharded_interaction`, :func:`query_sharded_field`.

On CPU, XLA runs most fused loops on one core. Exposing the host cores as separate XLA
devices (``--xla_force_host_platform_device_count``) lets the same code use all of them:
:func:`configure_host_devices` sets that flag (and, on AVX-512 CPUs, 512-bit vectors
for XLA's loops), and only does so if JAX has not started yet. The library itself never changes global state; the CLI and the benchmark entry
points call ``configure_host_devices()`` first (opt out with ``JAXDYN_NO_HOST_DEVICES=1``).

On GPUs, several GPUs of a host are devices already. On several hosts, start every
process with ``jax.distributed.initialize()`` (coordinator address, process count and id,
or the cluster's auto-detection) before anything else; ``jax.devices()`` then lists the
devices of all processes and :func:`sweep_mesh` spans them, so the same ``shard_map`` code
runs across hosts. Every process runs the same program and passes the same (global)
arguments; for inputs too large to build everywhere, make global arrays with
``jax.make_array_from_process_local_data``. :func:`jaxdyn.simulation.initialize_distributed`
joins the cluster from the environment (tested here with two processes on one host over gloo:
``tests/test_distributed.py``).

``shard_map`` is called with ``check_vma=False``: the kernels' scans start from fresh
carries that the replication checker would otherwise reject.
"""

from __future__ import annotations

import functools
import os
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .._checks import real_arrays
from ..kernels._attention import HIGHEST, interaction
from ..sphere import tangent_project

OPT_OUT_ENV = "JAXDYN_NO_HOST_DEVICES"
_FLAG = "--xla_force_host_platform_device_count"
_VW_FLAG = "--xla_cpu_prefer_vector_width"
SWEEP_AXIS = "batch"
QUERY_AXIS = "q"


# ----------------------------------------------------------------------------------------
# Host devices


def backends_initialized() -> bool:
    """Whether a JAX backend has started in this process (after which the device count is fixed).

    Host devices (``jax_num_cpu_devices``) and a multi-process cluster
    (``jax.distributed.initialize``) must be set up before the first JAX computation.

    Returns:
        True once a backend runs; False before (and when JAX is not imported).
    """
    if "jax" not in sys.modules:
        return False
    import jax

    # JAX's public ``jax_num_cpu_devices`` option refuses a change once a backend runs: set it
    # to another value and back (nothing else changes while no backend runs)
    current = jax.config.jax_num_cpu_devices
    try:
        jax.config.update("jax_num_cpu_devices", 1 if current != 1 else 2)
    except RuntimeError:
        return True
    jax.config.update("jax_num_cpu_devices", current)
    return False


def host_core_count() -> int:
    """Cores this process may run on (affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def _cpu_has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512f" in line.split()
    except OSError:
        pass
    return False


def configure_host_devices(n: int | None = None, *, vector_width: int | str | None = "auto") -> bool:
    """Expose ``n`` host CPU cores as XLA devices (default: all cores of this process).

    Appends ``--xla_force_host_platform_device_count=n`` to ``XLA_FLAGS``. XLA reads it
    when the first backend starts, so this must run before any JAX computation (importing
    ``jax`` or ``jaxdyn`` is fine; ``jax.devices()`` or creating an array is too late).

    Args:
      n: the number of host devices (default: the cores this process may run on).
      vector_width: also ask XLA:CPU for vectors of this many bits
        (``--xla_cpu_prefer_vector_width``). ``"auto"`` (default) picks 512 on CPUs with
        AVX-512, where it makes the exponential loops of the attention kernels faster (XLA's
        default is 256); None leaves XLA's default. A vector width already in
        ``XLA_FLAGS`` is kept.

    Returns:
      True if the device count will take effect. False, leaving the device count alone, if
      ``XLA_FLAGS`` already names one (the user's choice wins) or ``n`` is 1; False and
      nothing changed at all if ``JAXDYN_NO_HOST_DEVICES=1`` is set or JAX's backends are
      already running.

    Raises:
      ValueError: ``n`` not a positive integer, or an unknown ``vector_width``.
    """
    if n is not None and (isinstance(n, bool) or not hasattr(n, "__index__") or int(n) < 1):
        raise ValueError(f"n (number of host devices) must be a positive integer or None, got {n!r}")
    if vector_width not in (None, "auto", 128, 256, 512):
        raise ValueError(f"vector_width must be None, 'auto', 128, 256 or 512, got {vector_width!r}")
    if os.environ.get(OPT_OUT_ENV, "") not in ("", "0") or backends_initialized():
        return False
    flags = os.environ.get("XLA_FLAGS", "")
    if vector_width == "auto":
        vector_width = 512 if _cpu_has_avx512() else None
    if vector_width is not None and _VW_FLAG not in flags:
        flags = f"{flags} {_VW_FLAG}={vector_width}".strip()
        os.environ["XLA_FLAGS"] = flags
    if _FLAG in flags:
        return False
    n = host_core_count() if n is None else int(n)
    if n <= 1:
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={n}".strip()
    return True


# ----------------------------------------------------------------------------------------
# Meshes and batch placement


def sweep_mesh(devices=None, axis_name: str = SWEEP_AXIS) -> Mesh:
    """A one-axis mesh over ``devices``.

    Args:
      devices: the devices (default: ``jax.devices()``, those of all processes).
      axis_name: the mesh axis's name.

    Returns:
      The :class:`jax.sharding.Mesh`.

    Raises:
      ValueError: no device.
    """
    devs = list(jax.devices() if devices is None else devices)
    if not devs:
        raise ValueError("devices must name at least one device")
    return Mesh(np.array(devs), (axis_name,))


def _resolve_mesh(mesh, axis_name):
    if mesh is None:
        return sweep_mesh(axis_name=axis_name)
    if not isinstance(mesh, Mesh):
        # A sequence of devices.
        return sweep_mesh(mesh, axis_name=axis_name)
    if len(mesh.axis_names) != 1:
        raise ValueError(f"mesh must have exactly one axis, got axes {mesh.axis_names}")
    return mesh


def _leading_size(arrays, what="tree"):
    leaves = jax.tree.leaves(arrays)
    if not leaves:
        raise ValueError(f"{what} has no array leaves to batch over")
    sizes = {l.shape[0] if l.ndim else None for l in leaves}
    if None in sizes or len(sizes) != 1:
        shapes = [tuple(l.shape) for l in leaves]
        raise ValueError(f"every array leaf of {what} must share one leading (batch) axis; "
                         f"got shapes {shapes}")
    (b,) = sizes
    if b < 1:
        raise ValueError(f"{what} has an empty batch axis")
    return b


def _pad_to(a, size):
    """Pad the leading axis to ``size`` by repeating the last entry (a valid system)."""
    pad = size - a.shape[0]
    if pad <= 0:
        return a
    return jnp.concatenate([a, jnp.repeat(a[-1:], pad, axis=0)], axis=0)


def _padded_size(b, k):
    return -(-b // k) * k


def shard_batch(tree, mesh=None):
    """Pad a batch to a multiple of the mesh's device count and place it split over the devices.

    Every array leaf's leading axis is padded by repeating its last entry (so the padding is
    a valid system) and placed with ``NamedSharding(mesh, P(axis))`` (under ``jit`` a
    sharding constraint). Non-array leaves pass through.

    Args:
      tree: a pytree whose array leaves share one leading (batch) axis.
      mesh: a one-axis mesh, a sequence of devices, or None (all devices).

    Returns:
      The placed tree; its leading size is the padded size.
    """
    mesh = _resolve_mesh(mesh, SWEEP_AXIS)
    arrays, static = eqx.partition(tree, eqx.is_array)
    b = _leading_size(arrays, "tree")
    size = _padded_size(b, mesh.devices.size)
    spec = NamedSharding(mesh, P(mesh.axis_names[0]))
    arrays = jax.tree.map(lambda a: jax.device_put(_pad_to(jnp.asarray(a), size), spec), arrays)
    return eqx.combine(arrays, static)


def sharded_vmap(fn, mesh=None, *, batch_size: int | None = None):
    """``vmap(fn)`` with the batch split across devices.

    ``sharded_vmap(fn, mesh)(*args)`` equals ``jax.vmap(fn)(*args)``: every array leaf of
    ``args`` carries the batch on its leading axis (a stack of models from
    :func:`jaxdyn.stack_models`, initial conditions of shape (S, N, d), ...); non-array
    leaves (static fields, Python numbers) are shared. The batch is padded to a multiple of
    the device count, each device maps ``fn`` over its share, and the padding is dropped.

    The result composes with ``jax.jit``, ``jax.vmap`` and ``jax.grad``; reverse mode
    through a ``diffeqsolve`` inside ``fn`` needs ``simulate(..., adjoint=
    diffrax.DirectAdjoint())`` (diffrax's default adjoint is refused inside ``shard_map``).

    Args:
      fn: function of one system, e.g. ``lambda model, x0: simulate(model, x0, t1=..,
        dt=..)``. Closed-over values are shared by all systems.
      mesh: a one-axis :class:`~jax.sharding.Mesh`, a sequence of devices, or None (all
        devices).
      batch_size: if set, each device runs ``lax.map`` over chunks of this many systems
        (``vmap`` inside a chunk) instead of one ``vmap`` over its whole share: small
        systems then keep their intermediates in cache (e.g. 32 for n = 32 particles).

    Returns:
      A jitted function of the batched arguments; compiled once per argument structure and
      shapes.

    Raises:
      ValueError: ``batch_size`` not a positive integer or None.
    """
    if batch_size is not None and (isinstance(batch_size, bool) or not hasattr(batch_size, "__index__")
                                   or int(batch_size) < 1):
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    bs = None if batch_size is None else int(batch_size)

    @eqx.filter_jit
    def run(args, mesh):
        arrays, static = eqx.partition(args, eqx.is_array)
        b = _leading_size(arrays, "args")
        size = _padded_size(b, mesh.devices.size)
        arrays = jax.tree.map(lambda a: _pad_to(a, size), arrays)
        axis = mesh.axis_names[0]

        def local(arrs):
            def one(a):
                return fn(*eqx.combine(a, static))

            if bs is None or jax.tree.leaves(arrs)[0].shape[0] <= bs:
                return jax.vmap(one)(arrs)
            return jax.lax.map(one, arrs, batch_size=bs)

        out = jax.shard_map(local, mesh=mesh, in_specs=P(axis), out_specs=P(axis),
                            check_vma=False)(arrays)
        return jax.tree.map(lambda o: o[:b], out)

    @functools.wraps(fn)
    def wrapped(*args):
        return run(args, _resolve_mesh(mesh, SWEEP_AXIS))

    return wrapped


# ----------------------------------------------------------------------------------------
# One large system: shard the query rows


def query_sharded_interaction(x, y, B, beta, *, mesh=None, **kwargs):
    """:func:`jaxdyn.interaction` with the query rows split across devices, the keys replicated.

    ``m_i = Σ_j w_ij y_j`` with ``w_ij ∝ exp(β x_iᵀ B y_j)``; equal to the unsharded result.

    Args:
      x: (n, d) queries (split over the devices).
      y: (m, d) keys (replicated).
      B: (d, d) bilinear form.
      beta: the inverse temperature.
      mesh: a one-axis mesh, a sequence of devices, or None (all devices).
      **kwargs: passed on (``normalization``, ``kernel``, ``k_block``, ``q_block``).

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to the float dtype
    of the other inputs; complex is refused (a TypeError naming the parameter).

    Returns:
      The (n, d) attention averages.
    """
    x, y, B = real_arrays(half=True, fn="query_sharded_interaction", x=x, y=y, B=B)
    mesh = _resolve_mesh(mesh, QUERY_AXIS)
    return _query_sharded(lambda xq, xk, p, off: interaction(xq, xk, p[0], p[1], **kwargs),
                          x, y, (B, jnp.asarray(beta, dtype=x.dtype)), mesh)


def _query_sharded(rows_fn, x, y, params, mesh):
    """Evaluate ``rows_fn(x_rows, y, params, offset)`` with the rows of x split over the mesh."""
    # ``offset``: the index in x of the device's first row (an int32 scalar; 0 unsharded)
    n = x.shape[0]
    k = mesh.devices.size
    if k == 1:
        return rows_fn(x, y, params, jnp.zeros((), jnp.int32))
    size = _padded_size(n, k)
    xp = _pad_to(x, size)
    axis = mesh.axis_names[0]
    rows = size // k

    def local(xq, yk, p):
        return rows_fn(xq, yk, p, jax.lax.axis_index(axis).astype(jnp.int32) * rows)

    out = jax.shard_map(local, mesh=mesh, in_specs=(P(axis), P(), P()), out_specs=P(axis),
                        check_vma=False)(xp, y, params)
    return out[:n]


def _rows_field(model, t, xq, xk, args, offset):
    """The field of ``model`` at the query rows ``xq`` (rows ``offset, …``) of the cloud ``xk``."""
    from ..models._fields import EuclideanAttention, SphereAttention, ZeroTemperature

    if _has_rows_field(model):  # e.g. MultiHeadAttention: the online core with row positions
        return tangent_project(xq, model.ambient_rows(t, xq, xk, offset, args))
    if isinstance(model, SphereAttention):
        m = interaction(xq, xk, model.B, model.beta, normalization=model.normalization,
                        kernel=model.kernel, k_block=model.k_block, q_block=model.q_block,
                        tol=model.tol, capacity=model.capacity)
        return tangent_project(xq, jnp.matmul(m, model.V.T, precision=HIGHEST))
    if isinstance(model, EuclideanAttention):
        A, B, V, b = model.params(t)  # constant arrays or Controls at t
        m = interaction(xq, xk, B.T, 1.0, kernel=model.kernel, tol=model.tol,
                        capacity=model.capacity)
        h = jax.nn.relu(xq) if model.activation == "relu" else xq
        return (jnp.matmul(h, A.T, precision=HIGHEST) + b
                + jnp.matmul(m, V.T, precision=HIGHEST))
    if isinstance(model, ZeroTemperature):  # local field: rows are independent
        return model(t, xq, args)
    raise ValueError("query sharding supports SphereAttention, MultiHeadAttention, "
                     "EuclideanAttention and ZeroTemperature models; got "
                     f"{type(model).__name__}")


def _has_rows_field(model):
    """Whether ``model`` is a sphere model with ``ambient_rows(t, rows, x, offset, args)``."""
    return (getattr(model, "manifold", None) == "sphere"
            and callable(getattr(model, "ambient_rows", None)))


class QueryShardedField(eqx.Module):
    """A particle model whose field splits the query rows over the devices of a mesh.

    ``field(t, x, args)`` equals ``model(t, x, args)`` (keys replicated). Use it in place of
    the model: ``simulate(query_sharded_field(model), x0, ...)``.

    Attributes:
      model: the particle model.
      mesh: the one-axis mesh of the devices.
    """

    model: eqx.Module
    mesh: Mesh = eqx.field(static=True)

    @property
    def manifold(self) -> str:
        return getattr(self.model, "manifold", "euclidean")

    @property
    def dim(self) -> int:
        return self.model.dim

    def invalid(self):
        """The wrapped model's flag of parameters outside their domain (``model.invalid()``).

        Returns:
          The model's flag (False for a model without one).
        """
        check = getattr(self.model, "invalid", None)
        return check() if callable(check) else np.False_

    def __call__(self, t, x, args=None):
        arrays, static = eqx.partition((self.model, args), eqx.is_array)

        def rows(xq, xk, p, off):  # p: replicated parameters and time
            arrs, tt = p
            model, a = eqx.combine(arrs, static)
            return _rows_field(model, tt, xq, xk, a, off)

        return _query_sharded(rows, x, x, (arrays, jnp.asarray(t, x.dtype)), self.mesh)


def query_sharded_field(model, mesh=None) -> QueryShardedField:
    """Wrap ``model`` so that each field evaluation splits the query particles over devices.

    For one large system (N in the tens of thousands and up); sweeps of many systems shard
    better with :func:`sharded_vmap`.

    A :class:`~jaxdyn.MultiHeadAttention` (any mask, positions and weights) evaluates its
    field at each device's rows with their positions (``ambient_rows``); with Sinkhorn
    weights every device first computes the column potentials of the whole cloud.

    Args:
      model: a :class:`SphereAttention`, :class:`MultiHeadAttention` (or another sphere
        model with ``ambient_rows``), :class:`EuclideanAttention` or
        :class:`ZeroTemperature`.
      mesh: a one-axis mesh, a sequence of devices, or None (all devices).

    Returns:
      The :class:`QueryShardedField` (a ValueError for a model of another kind).
    """
    mesh = _resolve_mesh(mesh, QUERY_AXIS)
    _rows_field_check(model)
    return QueryShardedField(model, mesh)


def _rows_field_check(model):
    from ..models._fields import EuclideanAttention, SphereAttention, ZeroTemperature

    if not (isinstance(model, (SphereAttention, EuclideanAttention, ZeroTemperature))
            or _has_rows_field(model)):
        raise ValueError("query_sharded_field supports SphereAttention, MultiHeadAttention, "
                         "EuclideanAttention and ZeroTemperature models; got "
                         f"{type(model).__name__}")
