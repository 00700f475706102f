"""``simulate_ensemble``: many small sphere systems at once (phase diagrams, seed sweeps).

    traj = simulate_ensemble(stack_models([SphereAttention(Q, K, V, b) for b in betas]),
                             x0,            # (B, N, d): one cloud per system
                             t1=30.0, dt=0.1, method="euler", save_every=300)
    traj.xs      # (B, S, N, d),  traj.result / traj.ok / traj.messages  # (B,)

It computes what ``jax.vmap(lambda m, x: simulate(m, x, ...))(models, x0)`` computes (same
schemes, same save times; equal up to float rounding, tested), but is built for thousands
of systems of a few dozen particles, where the generic path spends its time in the per-call
cost of a dozen small kernels per step rather than in arithmetic:

* **Systems on the vector lanes.** Each device takes chunks of ``chunk`` systems and stores
  a chunk as (N, d, chunk): every operation of a step (logits, exponentials, sums over
  keys, projection, retraction) is an elementwise loop over the systems of the chunk, and a
  chunk of 128 systems of 32 particles (a 512 KiB logits tile) stays in cache through all
  steps. Chunks are split over the devices (on CPU, the host cores as devices) with
  ``shard_map``.
* **No running maximum when it is not needed.** Softmax weights are shifted by a bound of
  the logits, ``r_i = |β Bᵀx_i| · max_j |x_j|`` (Cauchy–Schwarz; on the sphere
  ``β|Bᵀx_i|``), instead of their maximum: the shift is exact algebra (it cancels in the
  normalisation) and never overflows. It could only underflow: every particle attends to
  itself, so row i's largest weight is at least ``exp(l_ii − r_i)``, and a chunk uses the
  bound while ``max_i (r_i − l_ii) <= SAFE_SHIFT`` (60 in float32, 600 in float64: the largest
  weight of every row stays above e^-60, resp. e^-600, a normal number; weights below
  e^-27 of it, which may underflow, are below float32 resolution anyway). Otherwise the chunk
  subtracts the maximum: a ``lax.cond`` per chunk and step (the online-softmax core's
  ``guarded_shift``; under ``vmap`` one decision for the whole batch, so only one branch
  runs). With B positive definite and x on the sphere the bound is nearly tight
  (``l_ii ≈ r_i``): the phase-diagram workload (Q = K = V = I) always takes it.
* On CPU the program is jitted with XLA's library ("ynn") fusions off (``jax.jit``'s
  ``compiler_options``): for this layout XLA's own loop fusions are faster. The option
  applies to this one program when it is called at the top level; inside a caller's ``jit``
  the caller's options apply.
* Each chunk is one ``diffrax.diffeqsolve`` with the scheme of :mod:`jaxdyn.integrators`
  on ``Sphere(axis=1)`` (vectors along axis 1): the schemes and the step grid of
  ``simulate``, another memory layout.

Differences from ``vmap(simulate)``: ``ts`` is (S,) (shared) and the step counts in
``stats`` scalars; ``result`` holds one code per system (``successful``, ``nonfinite``, or
``invalid_input`` for a traced cloud off the sphere or a traced β outside its domain), as
from ``vmap(simulate)``.
``simulate_ensemble`` runs under ``jax.jit``, ``jax.vmap`` and ``jax.grad`` (through the
states; the shift takes no gradient). The shift (bound or maximum) is chosen per chunk, so a
system's trajectory can differ from the same system run in another chunk, with another chunk
size or device count, or under ``vmap``, by float rounding (the values, not the maths, change;
bitwise equal when the chunks are the same).

Scope: :class:`~jaxdyn.SphereAttention` models (softmax or unnormalised weights; the
kernel choice is irrelevant here) with N up to ``MAX_PARTICLES``, faster than the generic
path up to ``FASTER_MAX_PARTICLES`` (48) on CPU; fixed-step methods
``"euler"``, ``"rk4"``, ``"exp_euler"``, ``"euler_renormalise"``. For larger N use
:func:`jaxdyn.simulate` (blocked kernel) with :func:`jaxdyn.sharded_vmap`.
"""

from __future__ import annotations

import functools
import math
import warnings

from typing import ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

# the online-softmax core's guard, shift and quotient (shared with the blocked kernels)
from ..kernels._online import SAFE_SHIFT, guarded_shift, ratio
from ..integrators import INTEGRATORS, GridODETerm, Sphere
from ..models._fields import SphereAttention
from ..models._heads import MultiHeadAttention
from .._checks import check_dtype
from .._results import RESULTS, error_if_failed, raise_if_failed
from ._simulate import (Trajectory, flag_invalid, invalid_parameters, plan_steps, save_indices,
                        step_grid, unit_tolerance)
from ..sphere import tangent_project

__all__ = ["simulate_ensemble", "MAX_PARTICLES", "SAFE_SHIFT"]

#: largest N the ensemble path takes (the (N, N, chunk) tile must stay cache-sized).
MAX_PARTICLES = 256
#: up to this N the ensemble path beats vmap(simulate) on CPU (beyond, XLA's library matmuls
#: win; ``benchmarks/bench_phase.py``). The experiments engine uses the ensemble path up to here.
FASTER_MAX_PARTICLES = 48
#: target logits-tile size (elements) of one chunk: 128 systems of 32 particles.
TILE_ELEMENTS = 128 * 32 * 32
#: on accelerators, the largest logits tile of one chunk (elements; 256 MiB in float32)
ACCEL_TILE_ELEMENTS = 2**26
#: the fixed-step schemes ``simulate_ensemble`` takes, by name
METHODS = ("euler", "rk4", "exp_euler", "euler_renormalise")
_CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def default_chunk(n: int) -> int:
    """Systems per chunk for N particles: a logits tile of about ``TILE_ELEMENTS``."""
    return int(min(256, max(8, TILE_ELEMENTS // (n * n))))


# ------------------------------------------------------------------ the field, batch-minor
# Layout: x (N, d, c), per-system matrices (d, d, c), beta (c,). Axis 1 is the vector axis
# of the particles; the last axis runs over the c systems of a chunk.


def _field(x, B, V, beta, normalization, safe, project=True):
    d = x.shape[1]
    # qx_i = β Bᵀ x_i:  qx[i, a, s] = β_s Σ_b x[i, b, s] B[b, a, s]
    qx = sum(x[:, b:b + 1, :] * B[None, b, :, :] for b in range(d)) * beta
    # logits l[i, j, s] = Σ_a qx[i, a, s] x[j, a, s]
    logits = sum(qx[:, None, a, :] * x[None, :, a, :] for a in range(d))
    n = x.shape[0]
    if normalization == "unnormalized":
        e = jnp.exp(logits)
    else:
        xmax = jnp.sqrt(jnp.max(jnp.sum(x * x, axis=1), axis=0))  # (c,)
        bound = jnp.sqrt(jnp.sum(qx * qx, axis=1)) * xmax  # (N, c): l_ij <= bound_i
        # row i attends to itself, so its largest weight is >= exp(l_ii - bound_i): the core's
        # guard takes the bound while that stays in range for every row of the chunk, else
        # the maximum (NaN anywhere: the maximum); no derivative through the shift
        self_logit = jnp.sum(qx * x, axis=1)  # (N, c): l_ii
        shift = guarded_shift(bound, self_logit, lambda: jnp.max(logits, axis=1), safe)
        e = jnp.exp(logits - shift[:, None, :])
    m = jnp.stack([jnp.sum(e * x[None, :, a, :], axis=1) for a in range(d)], axis=1)
    if normalization == "unnormalized":
        m = m / n  # w_ij = exp(l_ij) / N, as jaxdyn.interaction
    else:
        m = ratio(m, jnp.sum(e, axis=1)[:, None, :])  # no den² in the gradient
    # u = V m, then the tangent projection P⊥(x) u (project=False: the ambient field u)
    u = sum(m[:, b:b + 1, :] * V[None, :, b, :] for b in range(d))
    return tangent_project(x, u, axis=1) if project else u


#: the geometry of a batch-minor chunk: particle vectors along axis 1
CHUNK_GEOMETRY = Sphere(axis=1)


class _ChunkField(eqx.Module):
    """A chunk's autonomous field (:func:`_field`) as a model for the integrator classes.

    ``__call__`` is the projected field, ``ambient`` the field before the projection
    (``euler_renormalise``); vectors along axis 1, systems along the last axis.
    """

    B: jax.Array
    V: jax.Array
    beta: jax.Array
    normalization: str = eqx.field(static=True)
    safe: float = eqx.field(static=True)
    manifold: ClassVar[str] = "sphere"

    def __call__(self, t, y, args=None):
        return _field(y, self.B, self.V, self.beta, self.normalization, self.safe)

    def ambient(self, t, y, args=None):
        return _field(y, self.B, self.V, self.beta, self.normalization, self.safe, project=False)


def _chunk_run(x, B, V, beta, *, method, dt, idx, normalization, safe):
    """One chunk, batch-minor: x (N, d, c) → saved frames (S, N, d, c).

    The chunk's own ``diffeqsolve`` (the scheme of :mod:`jaxdyn.integrators` on
    ``Sphere(axis=1)``, the step grid of ``simulate``), inside ``lax.map`` over the chunks,
    inside ``shard_map`` over the devices. Its adjoint is ``diffrax.DirectAdjoint``: the
    default ``RecursiveCheckpointAdjoint`` cannot be reverse-differentiated inside
    ``shard_map`` (equinox's closure conversion compares the avals with shard_map's
    varying-axes types and refuses them; diffrax's tracker, #765), and its forward pass gives
    the same states bitwise at about the same cost as the default adjoint's.

    Returns:
      The saved frames (S, N, d, c).
    """
    solver = INTEGRATORS[method](CHUNK_GEOMETRY)
    field = _ChunkField(B, V, beta, normalization, safe)
    m = idx[-1]
    if m == 0:  # only t0 saved: nothing to integrate
        return x[None]
    grid = step_grid(0.0, dt, m, x.dtype)
    sol = diffrax.diffeqsolve(
        GridODETerm(solver.field_of(field), jnp.asarray(dt, x.dtype)), solver, 0.0,
        float(grid[-1]), None, x, saveat=diffrax.SaveAt(ts=grid[np.asarray(idx)]),
        stepsize_controller=diffrax.StepTo(grid), max_steps=m, throw=False,
        adjoint=diffrax.DirectAdjoint())
    return sol.ys


def _device_run(x0, B, V, beta, *, chunk, **kw):
    """A device's share: (b, N, d) systems in chunks → (b, S, N, d)."""
    b, n, d = x0.shape
    k = b // chunk
    xc = x0.reshape(k, chunk, n, d).transpose(0, 2, 3, 1)  # (k, N, d, c)
    Bc = B.reshape(k, chunk, d, d).transpose(0, 2, 3, 1)  # (k, d, d, c)
    Vc = V.reshape(k, chunk, d, d).transpose(0, 2, 3, 1)
    bc = beta.reshape(k, chunk)

    def one(args):
        return _chunk_run(*args, **kw)

    out = jax.lax.map(one, (xc, Bc, Vc, bc))  # (k, S, N, d, c)
    S = out.shape[1]
    return out.transpose(0, 4, 1, 2, 3).reshape(b, S, n, d)


def _arrays(x0, Q, K, V, beta, dtype, total):
    """The systems' arrays, B = QᵀK, in ``dtype``, padded with copies of system 0 to ``total``."""
    B = jnp.matmul(jnp.swapaxes(Q, 1, 2), K, precision=jax.lax.Precision.HIGHEST)
    arrays = [x0.astype(dtype), B.astype(dtype), V.astype(dtype), beta.astype(dtype)]
    nb = x0.shape[0]
    if total > nb:
        arrays = [jnp.concatenate([a, jnp.broadcast_to(a[:1], (total - nb,) + a.shape[1:])])
                  for a in arrays]
    return arrays


def _results(xs, x0, tol):
    """Each system's code: nonfinite states, or (``tol``: a traced x0) x0 off the sphere."""
    finite = jnp.all(jnp.isfinite(xs), axis=(1, 2, 3))
    if tol is None:
        invalid = jnp.zeros_like(finite)
    else:
        err = jnp.max(jnp.abs(jnp.linalg.norm(x0, axis=-1) - 1.0), axis=-1)
        invalid = ~jnp.all(jnp.isfinite(x0), axis=(1, 2)) | ~(err <= tol)

    def one(ok, bad):
        r = RESULTS.where(ok, RESULTS.successful, RESULTS.nonfinite)
        return RESULTS.where(bad, RESULTS.invalid_input, r)

    return jax.vmap(one)(finite, invalid)


def _program(x0, Q, K, V, beta, *, dtype, total, mesh, method, dt, idx, normalization, chunk,
             safe, tol):
    """The whole ensemble run: pad, split the chunks over the mesh, step, statuses."""
    arrays = _arrays(x0, Q, K, V, beta, dtype, total)
    fn = functools.partial(_device_run, chunk=chunk, method=method, dt=dt, idx=idx,
                           normalization=normalization, safe=safe)
    xs = jax.shard_map(fn, mesh=mesh, in_specs=P("batch"), out_specs=P("batch"),
                       check_vma=False)(*arrays)[:x0.shape[0]]
    return xs, _results(xs, x0, tol)


_STATIC = ("dtype", "total", "mesh", "method", "dt", "idx", "normalization", "chunk", "safe", "tol")
#: the program as jitted for CPU devices (XLA's library fusions off) and for the others
_PROGRAMS = {"cpu": jax.jit(_program, static_argnames=_STATIC, compiler_options=_CPU_OPTIONS),
             "other": jax.jit(_program, static_argnames=_STATIC)}


def _run(platform, args, kw):
    """The program's ``(xs, result)``: on CPU at the top level with the compiler options.

    ``jax.jit`` takes compiler options at the top level only: inside a caller's trace the
    plain program inlines; an XLA that rejects the options runs the plain one (with a
    warning).

    Returns:
      The saved states and the per-system result.
    """
    if (platform != "cpu" or _PROGRAMS["cpu"] is None
            or any(_is_traced(a) for a in jax.tree.leaves(args))):
        return _PROGRAMS["other"](*args, **kw)
    try:
        return _PROGRAMS["cpu"](*args, **kw)
    except Exception as err:  # an XLA without the option: compile as usual
        if "top-level" in str(err):  # concrete inputs inside a caller's trace
            return _PROGRAMS["other"](*args, **kw)
        if not any(k in str(err) for k in _CPU_OPTIONS):
            raise
        warnings.warn(f"simulate_ensemble: XLA rejected {_CPU_OPTIONS} ({err}); compiling "
                      "with the defaults (slower on CPU)", RuntimeWarning, stacklevel=3)
        _PROGRAMS["cpu"] = None
        return _PROGRAMS["other"](*args, **kw)


def _is_traced(a):
    return isinstance(a, jax.core.Tracer)


def _checked_stack(models, x0, method):
    """``x0`` as an array, after the checks of a stacked SphereAttention, its method and shapes.

    Returns:
      ``x0`` (B, N, d).

    Raises:
      ValueError: weights other than softmax/unnormalised, another method, shapes that
        disagree, no system or particle, N > ``MAX_PARTICLES``.
    """
    if models.normalization not in ("softmax", "unnormalized"):
        raise ValueError(f"simulate_ensemble supports softmax and unnormalized weights, not "
                         f"{models.normalization!r}; use jaxdyn.sharded_vmap(simulate)")
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"simulate_ensemble: method must be one of {METHODS}, got {method!r}")
    check_dtype("x0", x0, half=True, fn="simulate_ensemble")
    x0 = jnp.asarray(x0) if not _is_traced(x0) else x0
    if x0.ndim != 3:
        raise ValueError(f"x0 must have shape (B, N, d) (a batch of clouds), got {x0.shape}")
    nb, n, d = x0.shape
    if nb == 0 or n == 0 or d == 0:
        raise ValueError("x0 must hold at least one system of at least one particle of "
                         f"dimension d >= 1, got {x0.shape}")
    if models.Q.ndim != 3 or models.Q.shape != (nb, d, d) or models.beta.shape != (nb,):
        raise ValueError(f"models must be a stack of {nb} models of dimension {d} (Q of shape "
                         f"({nb}, {d}, {d}), beta of shape ({nb},)), matching x0 {x0.shape}; got Q "
                         f"{models.Q.shape}, beta {models.beta.shape}")
    if n > MAX_PARTICLES:
        raise ValueError(f"simulate_ensemble is for N <= {MAX_PARTICLES} particles, got N = {n}; "
                         "use jaxdyn.sharded_vmap(simulate) (blocked kernel) for larger systems")
    return x0


def _dtype_and_tolerance(models, x0):
    """The computation's dtype, and the unit-row tolerance the program checks (traced ``x0``).

    Returns:
      ``(dtype, tol)``: a NumPy dtype; None where a concrete ``x0`` was checked here.

    Raises:
      ValueError: a dtype other than float32/float64, a concrete ``x0`` with non-unit rows.
    """
    in_dtype = x0.dtype
    d = x0.shape[-1]
    dtype = np.dtype(jnp.result_type(
        in_dtype if jnp.issubdtype(in_dtype, jnp.floating) else jnp.float32,
        models.Q.dtype, models.K.dtype, models.V.dtype, models.beta.dtype))
    if dtype.name not in SAFE_SHIFT:
        raise ValueError(f"simulate_ensemble runs in float32 or float64, got {dtype.name}")
    if _is_traced(x0):
        return dtype, unit_tolerance(in_dtype)  # checked in the program, flagged per system
    # on the host, in float64 (simulate's rule)
    err = float(np.max(np.abs(np.linalg.norm(np.asarray(x0, np.float64), axis=-1) - 1.0)))
    if not err <= unit_tolerance(in_dtype):
        raise ValueError(f"x0 rows must be unit vectors on S^{d - 1} "
                         f"(max ||x_i| - 1| = {err:.3g}); "
                         "normalise them with jaxdyn.normalize")
    return dtype, None


def _devices_and_chunk(devices, chunk, nb, n):
    """The devices, the systems a chunk and the systems a device (whole chunks).

    Returns:
      ``(devices, chunk, per_device)``.

    Raises:
      ValueError: no device, a chunk that is not a positive integer.
    """
    devs = tuple(jax.devices() if devices is None else devices)
    if not devs:
        raise ValueError("devices must name at least one device")
    if chunk is not None and (isinstance(chunk, bool) or not hasattr(chunk, "__index__")
                              or int(chunk) < 1):
        raise ValueError(f"chunk must be a positive integer or None, got {chunk!r}")
    per_dev = math.ceil(nb / len(devs))
    platform = devs[0].platform
    if chunk is not None:
        c = int(chunk)
    elif platform == "cpu":
        c = default_chunk(n)
    else:  # accelerators: one chunk per device (each chunk is a sequential step of lax.map)
        c = max(1, min(per_dev, ACCEL_TILE_ELEMENTS // (n * n)))
    c = min(c, per_dev)
    return devs, c, math.ceil(per_dev / c) * c


def simulate_ensemble(models, x0, *, t1, dt, t0=0.0, save_every=None, saveat=None,
                      method="rk4", chunk=None, devices=None, throw=False) -> Trajectory:
    """Integrate a batch of small sphere systems; equal to ``vmap(simulate)`` (see module doc).

    Each system b follows ``dx_i/dt = P⊥(x_i) V_b Σ_j w_ij x_j``,
    ``w_ij ∝ exp(β_b x_iᵀ Q_bᵀ K_b x_j)`` (softmax, or divided by N when unnormalised).

    Args:
      models: a stacked :class:`SphereAttention` (:func:`jaxdyn.stack_models`): Q, K, V of
        shape (B, d, d), beta of shape (B,); softmax or unnormalised weights. Or a stacked
        :class:`MultiHeadAttention` (Q, K of shape (B, H, p, d), V (B, H, d, d), beta (B,);
        any mask, positions and weights): each system's own field (the online core's
        kernels), ``vmap`` over the systems of a chunk.
      x0: (B, N, d) initial clouds, unit rows, N <= ``MAX_PARTICLES``.
      t1: the end time (a Python number).
      dt: the step (a Python number; rounded so that the steps tile [t0, t1]).
      t0: the start time.
      save_every: save every k steps (as :func:`jaxdyn.simulate`).
      saveat: or times on the step grid.
      method: a fixed-step method of :func:`jaxdyn.simulate`: ``"euler"``, ``"rk4"``,
        ``"exp_euler"``, ``"euler_renormalise"``.
      chunk: systems per chunk (default on CPU :func:`default_chunk`, 128 at N = 32; on
        accelerators each device's whole share, up to a 2^26-element logits tile).
      devices: the devices to split the systems over (default: all of ``jax.devices()``).
      throw: if True, an unsuccessful system raises: ``RuntimeError`` with the message of the
        first such system (concrete inputs), ``eqx.error_if`` under jit/vmap; default False
        (read ``traj.result`` / ``traj.ok``, one per system).

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to the float dtype
    of the models' parameters; complex is refused (a TypeError naming ``x0``).

    Returns:
      :class:`Trajectory` with ``ts`` (S,), ``xs`` (B, S, N, d), ``result`` (B,) codes
      (``successful``, ``nonfinite``; ``invalid_input`` for a traced cloud that is not
      finite or off the sphere, or a system whose traced β lies outside its domain,
      ``models.invalid()``) and ``stats`` (scalar step counts).

    Raises:
      ValueError: not a stacked SphereAttention or MultiHeadAttention, hardmax weights,
        another method, shapes
        that disagree, N > ``MAX_PARTICLES``, a concrete x0 with non-unit rows, a concrete
        β outside its domain, a dtype other than float32/float64, a bad ``chunk`` or
        ``devices``.
    """
    if isinstance(models, MultiHeadAttention):
        return _ensemble_of_fields(models, x0, t1=t1, dt=dt, t0=t0, save_every=save_every,
                                   saveat=saveat, method=method, chunk=chunk, devices=devices,
                                   throw=throw)
    if not isinstance(models, SphereAttention):
        raise ValueError("simulate_ensemble takes a stacked SphereAttention or MultiHeadAttention "
                         f"(jaxdyn.stack_models); got {type(models).__name__}. Other models: "
                         "jaxdyn.sharded_vmap(simulate)")
    x0 = _checked_stack(models, x0, method)
    nb, n, _ = x0.shape
    bad_params = invalid_parameters(models)  # traced parameters outside their domain, (B,)
    dtype, tol = _dtype_and_tolerance(models, x0)
    t0, t1, dt, steps = plan_steps(t0, t1, dt)
    idx = save_indices(steps, save_every, saveat, t0, dt)
    devs, c, per_dev = _devices_and_chunk(devices, chunk, nb, n)
    platform = devs[0].platform
    mesh = jax.sharding.Mesh(np.array(devs), ("batch",))
    kw = dict(dtype=dtype.name, total=per_dev * len(devs), mesh=mesh, method=method,
              dt=float(dt), idx=tuple(idx), normalization=models.normalization, chunk=c,
              safe=float(SAFE_SHIFT[dtype.name]), tol=tol)
    xs, result = _run(platform, (x0.astype(dtype), models.Q, models.K, models.V, models.beta), kw)
    # the saved times t0 + idx·dt in the dtype (a constant: the grid of simulate)
    ts = jnp.asarray(step_grid(t0, dt, idx[-1], dtype)[np.asarray(idx)])
    steps = jnp.asarray(idx[-1])
    traj = Trajectory(ts=ts, xs=xs, result=result,
                      stats={"num_steps": steps, "num_accepted_steps": steps})
    traj = flag_invalid(traj, bad_params)  # one flag per system
    return _thrown(traj, x0, models, throw)


def _ensemble_of_fields(models, x0, *, t1, dt, t0, save_every, saveat, method, chunk, devices,
                        throw):
    """:func:`simulate_ensemble` of models in the generic layout: ``simulate`` per system.

    Each system runs :func:`jaxdyn.simulate` with its model's own field (its kernels: the
    online core for :class:`~jaxdyn.MultiHeadAttention`), ``vmap`` over the systems of a
    chunk and the chunks split over the devices (:func:`jaxdyn.sharded_vmap`, adjoint
    ``diffrax.DirectAdjoint``); the result has the ensemble's form (``ts`` (S,), scalar step
    counts).

    Returns:
      The :class:`Trajectory`.

    Raises:
      ValueError: as :func:`simulate_ensemble` (method, shapes, N, a concrete x0 off the
        sphere, dtype, chunk, devices).
    """
    from ._sharding import sharded_vmap
    from ._simulate import simulate

    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"simulate_ensemble: method must be one of {METHODS}, got {method!r}")
    x0 = jnp.asarray(x0) if not _is_traced(x0) else x0
    if x0.ndim != 3 or 0 in x0.shape:
        raise ValueError(f"x0 must have shape (B, N, d) (a batch of clouds), got {x0.shape}")
    nb, n, d = x0.shape
    if models.Q.ndim != 4 or models.Q.shape[0] != nb or models.Q.shape[-1] != d \
            or models.beta.shape != (nb,):
        raise ValueError(f"models must be a stack of {nb} models of dimension {d} (Q of shape "
                         f"({nb}, H, p, {d}), beta of shape ({nb},)), matching x0 {x0.shape}; "
                         f"got Q {models.Q.shape}, beta {models.beta.shape}")
    if n > MAX_PARTICLES:
        raise ValueError(f"simulate_ensemble is for N <= {MAX_PARTICLES} particles, got N = {n}; "
                         "use jaxdyn.sharded_vmap(simulate) for larger systems")
    dtype = np.dtype(jnp.result_type(
        x0.dtype if jnp.issubdtype(x0.dtype, jnp.floating) else jnp.float32, models.Q.dtype))
    if dtype.name not in SAFE_SHIFT:
        raise ValueError(f"simulate_ensemble runs in float32 or float64, got {dtype.name}")
    if not _is_traced(x0):  # on the host, in float64 (simulate's rule)
        err = float(np.max(np.abs(np.linalg.norm(np.asarray(x0, np.float64), axis=-1) - 1.0)))
        if not err <= unit_tolerance(x0.dtype):
            raise ValueError(f"x0 rows must be unit vectors on S^{d - 1} "
                             f"(max ||x_i| - 1| = {err:.3g}); "
                             "normalise them with jaxdyn.normalize")
    if chunk is not None and (isinstance(chunk, bool) or not hasattr(chunk, "__index__")
                              or int(chunk) < 1):
        raise ValueError(f"chunk must be a positive integer or None, got {chunk!r}")
    devs = tuple(jax.devices() if devices is None else devices)
    if not devs:
        raise ValueError("devices must name at least one device")

    def one(model, x):
        return simulate(model, x, t1=t1, dt=dt, t0=t0, save_every=save_every, saveat=saveat,
                        method=method, adjoint=diffrax.DirectAdjoint())

    traj = sharded_vmap(one, devs, batch_size=None if chunk is None else int(chunk))(
        models, x0.astype(dtype))
    traj = Trajectory(ts=traj.ts[0], xs=traj.xs, result=traj.result,
                      stats={k: v[0] for k, v in traj.stats.items()})
    return _thrown(traj, x0, models, throw)


def _thrown(traj, x0, models, throw):
    """A trajectory with ``throw`` applied: a failure raised (concrete inputs) or flagged.

    Traced inputs flag the failure for equinox's runtime error instead of raising.

    Returns:
      ``traj`` (or its flagged copy).
    """
    if not throw:
        return traj
    if any(_is_traced(a) for a in jax.tree.leaves(eqx.filter((x0, models), eqx.is_array))):
        return error_if_failed(traj, traj.result)
    raise_if_failed(traj, "simulate_ensemble")
    return traj
