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
  subtracts the maximum: a ``lax.cond`` per chunk and step (not under ``vmap``, so only one
  branch runs). With B positive definite and x on the sphere the bound is nearly tight
  (``l_ii ≈ r_i``): the phase-diagram workload (Q = K = V = I) always takes it.
* On CPU the program is compiled with XLA's library ("ynn") fusions off: for this layout
  XLA's own loop fusions are 1.5–2.8× faster (measured on a 2-core AVX-512 EPYC). The option
  applies to this one program only; nothing global changes.

Differences from ``vmap(simulate)``: ``ts`` is (S,) (shared) and the step counts in
``stats`` scalars; ``result`` holds one code per system (``successful`` or ``nonfinite``),
as from ``vmap(simulate)``; the program is
compiled ahead of time, so ``simulate_ensemble`` cannot run under ``jit``, ``grad`` or
``vmap`` (for gradients, use ``vmap(simulate)``). The shift (bound or maximum) is chosen per
chunk, so a system's trajectory can differ from the same system run in another chunk, with
another chunk size or device count, by float rounding (the values, not the maths, change;
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

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ..kernels._attention import SAFE_SHIFT, _ratio  # shared with the blocked kernel's bound shift
from ..integrators import INTEGRATORS, Sphere, scheme_step
from ..models._fields import SphereAttention
from .._results import RESULTS, code, from_codes, raise_if_failed
from ._simulate import Trajectory, _plan, save_indices, saved_states, unit_tolerance
from ..sphere import tangent_project

__all__ = ["simulate_ensemble", "MAX_PARTICLES", "SAFE_SHIFT"]

#: largest N the ensemble path takes (the (N, N, chunk) tile must stay cache-sized).
MAX_PARTICLES = 256
#: up to this N the ensemble path beats vmap(simulate) on CPU. Measured on 2 AVX-512 cores
#: (d = 3, RK4, 160 steps, the same total pairs): N = 8: 5.6x, 16: 6.4x, 32: 3.2-3.7x,
#: 48: 1.2x, then 64: 0.7x, 128: 0.3x, 256: 0.25x (XLA's library matmuls win from N ~ 64).
#: The experiments engine uses the ensemble path up to here.
FASTER_MAX_PARTICLES = 48
#: target logits-tile size (elements) of one chunk: 128 systems of 32 particles.
TILE_ELEMENTS = 128 * 32 * 32
#: on accelerators, the largest logits tile of one chunk (elements; 256 MiB in float32)
ACCEL_TILE_ELEMENTS = 2**26
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
        # row i attends to itself, so its largest weight is >= exp(l_ii - bound_i): the
        # bound is usable while that stays in range (NaN anywhere: the maximum branch)
        self_logit = jnp.sum(qx * x, axis=1)  # (N, c): l_ii
        use_bound = jnp.max(bound - self_logit) <= safe
        # the shift cancels in the weights: no gradient through it (the bound's sqrt at a
        # zero row has none)
        shift = jax.lax.stop_gradient(jax.lax.cond(use_bound, lambda: bound,
                                                   lambda: jnp.max(logits, axis=1)))
        e = jnp.exp(logits - shift[:, None, :])
    m = jnp.stack([jnp.sum(e * x[None, :, a, :], axis=1) for a in range(d)], axis=1)
    if normalization == "unnormalized":
        m = m / n  # w_ij = exp(l_ij) / N, as jaxdyn.interaction
    else:
        m = _ratio(m, jnp.sum(e, axis=1)[:, None, :])  # no den² in the gradient
    # u = V m, then the tangent projection P⊥(x) u (project=False: the ambient field u)
    u = sum(m[:, b:b + 1, :] * V[None, :, b, :] for b in range(d))
    return tangent_project(x, u, axis=1) if project else u


#: the geometry of a batch-minor chunk: particle vectors along axis 1
CHUNK_GEOMETRY = Sphere(axis=1)


class _ChunkField:
    """A chunk's autonomous field for the integrator classes: ``__call__`` the projected
    field ``f(y)``, ``ambient`` the field before the projection (``euler_renormalise``)."""

    manifold = "sphere"

    def __init__(self, f, ambient=None):
        self._f, self._ambient = f, ambient

    def __call__(self, _t, y, _args):
        return self._f(y)

    def __getattr__(self, name):
        if name == "ambient" and self.__dict__.get("_ambient") is not None:
            amb = self.__dict__["_ambient"]
            return lambda _t, y, _args: amb(y)
        raise AttributeError(name)


def _step(method, x, dt, f, ambient=None):
    """One step of the ``jaxdyn.integrators`` scheme ``method`` on a batch-minor chunk (the
    same class ``simulate`` uses; the field is autonomous, so its time is never read).
    ``f(y)``: the projected field; ``ambient(y)``: the field before the projection."""
    return scheme_step(INTEGRATORS[method](CHUNK_GEOMETRY), _ChunkField(f, ambient), 0.0, x, dt)


def _chunk_run(x, B, V, beta, *, method, dt, idx, normalization, safe):
    """One chunk, batch-minor: x (N, d, c) → saved frames (S, N, d, c)."""
    f = functools.partial(_field, B=B, V=V, beta=beta, normalization=normalization, safe=safe)
    amb = functools.partial(f, project=False)
    dt = jnp.asarray(dt, x.dtype)

    def advance(x, _start, steps):
        return jax.lax.fori_loop(0, steps, lambda _, y: _step(method, y, dt, f, amb), x)

    return saved_states(x, idx, advance)


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


@functools.partial(jax.jit, static_argnums=(5, 6))
def _device_arrays(x0, Q, K, V, beta, dtype, total):
    """The systems' arrays as the device program takes them (B = QᵀK, in ``dtype``), padded to
    ``total`` with copies of system 0 (a valid system, dropped from the result): one program
    (op by op, eagerly, it compiled a dozen small ones per shape)."""
    B = jnp.matmul(jnp.swapaxes(Q, 1, 2), K, precision=jax.lax.Precision.HIGHEST)
    arrays = [x0, B.astype(dtype), V.astype(dtype), beta.astype(dtype)]
    nb = x0.shape[0]
    if total > nb:
        arrays = [jnp.concatenate([a, jnp.broadcast_to(a[:1], (total - nb,) + a.shape[1:])])
                  for a in arrays]
    return arrays


def _status_codes_fn(xs):
    """Per system: ``successful`` if every saved state is finite, else ``nonfinite``."""
    finite = jnp.all(jnp.isfinite(xs), axis=(1, 2, 3))
    return jnp.where(finite, code(RESULTS.successful), code(RESULTS.nonfinite)).astype(jnp.int32)


_status_codes = jax.jit(_status_codes_fn)


@functools.lru_cache(maxsize=32)
def _compiled(shapes, dtype, method, dt, idx, normalization, chunk, devices, safe):
    """The ensemble program, compiled ahead of time (with the CPU compiler options)."""
    mesh = jax.sharding.Mesh(np.array(devices), ("batch",))

    def build():
        fn = functools.partial(_device_run, chunk=chunk, method=method, dt=dt, idx=idx,
                               normalization=normalization, safe=safe)
        sharded = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("batch"), out_specs=P("batch"),
                                        check_vma=False))
        args = [jax.ShapeDtypeStruct(s, dtype) for s in shapes]
        lowered = sharded.lower(*args)
        if devices[0].platform == "cpu":
            try:
                return lowered.compile(compiler_options=_CPU_OPTIONS)
            except Exception as err:  # an XLA without the option: compile as usual
                if not any(k in str(err) for k in _CPU_OPTIONS):
                    raise
                warnings.warn(f"simulate_ensemble: XLA rejected {_CPU_OPTIONS} ({err}); compiling "
                              "with the defaults (slower on CPU)", RuntimeWarning, stacklevel=4)
        return lowered.compile()

    return build(), mesh


def simulate_ensemble(models, x0, *, t1, dt, t0=0.0, save_every=None, saveat=None,
                      method="rk4", chunk=None, devices=None, throw=False) -> Trajectory:
    """Integrate a batch of small sphere systems; equal to ``vmap(simulate)`` (see module doc).

    Args:
      models: a stacked :class:`SphereAttention` (:func:`jaxdyn.stack_models`): Q, K, V of
        shape (B, d, d), beta of shape (B,); softmax or unnormalised weights.
      x0: (B, N, d) initial clouds, unit rows, N <= ``MAX_PARTICLES``.
      t1, dt, t0, save_every, saveat, method: as :func:`jaxdyn.simulate` (fixed-step methods
        ``"euler"``, ``"rk4"``, ``"exp_euler"``, ``"euler_renormalise"``).
      chunk: systems per chunk (default on CPU :func:`default_chunk`, 128 at N = 32; on
        accelerators each device's whole share, up to a 2^26-element logits tile).
      devices: the devices to split the systems over (default: all of ``jax.devices()``).
      throw: if True, raise ``RuntimeError`` with the message of the first system that is
        not successful; default False (read ``traj.result`` / ``traj.ok``, one per system).

    Returns:
      :class:`Trajectory` with ``ts`` (S,), ``xs`` (B, S, N, d), ``result`` (B,) codes
      (``successful`` or ``nonfinite``) and ``stats`` (scalar step counts).

    Raises:
      ValueError: not a stacked SphereAttention, hardmax weights, a diffrax method, shapes
        that disagree, N > ``MAX_PARTICLES``, non-unit rows, traced inputs (under jit/grad/
        vmap), a dtype other than float32/float64, a bad ``chunk``.
    """
    if not isinstance(models, SphereAttention):
        raise ValueError("simulate_ensemble takes a stacked SphereAttention (jaxdyn.stack_models); "
                         f"got {type(models).__name__}. Other models: "
                         "jaxdyn.sharded_vmap(simulate)")
    if models.normalization not in ("softmax", "unnormalized"):
        raise ValueError(f"simulate_ensemble supports softmax and unnormalized weights, not "
                         f"{models.normalization!r}; use jaxdyn.sharded_vmap(simulate)")
    if method not in METHODS:
        raise ValueError(f"simulate_ensemble: method must be one of {METHODS}, got {method!r}")
    if any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves((models, x0))):
        raise ValueError("simulate_ensemble runs a program compiled ahead of time: it cannot be "
                         "called under jax.jit, jax.grad or jax.vmap (got traced inputs); "
                         "differentiate or transform jax.vmap(jaxdyn.simulate) instead")
    x0 = jnp.asarray(x0)
    if x0.ndim != 3:
        raise ValueError(f"x0 must have shape (B, N, d) (a batch of clouds), got {x0.shape}")
    nb, n, d = x0.shape
    if nb == 0 or n == 0:
        raise ValueError("x0 must hold at least one system of at least one particle, got "
                         f"{x0.shape}")
    if models.Q.ndim != 3 or models.Q.shape != (nb, d, d) or models.beta.shape != (nb,):
        raise ValueError(f"models must be a stack of {nb} models of dimension {d} (Q of shape "
                         f"({nb}, {d}, {d}), beta of shape ({nb},)), matching x0 {x0.shape}; got Q "
                         f"{models.Q.shape}, beta {models.beta.shape}")
    if n > MAX_PARTICLES:
        raise ValueError(f"simulate_ensemble is for N <= {MAX_PARTICLES} particles, got N = {n}; "
                         "use jaxdyn.sharded_vmap(simulate) (blocked kernel) for larger systems")
    in_dtype = x0.dtype
    dtype = jnp.result_type(in_dtype if jnp.issubdtype(in_dtype, jnp.floating) else jnp.float32,
                            models.Q.dtype, models.K.dtype, models.V.dtype, models.beta.dtype)
    if np.dtype(dtype).name not in SAFE_SHIFT:
        raise ValueError("simulate_ensemble runs in float32 or float64, got "
                         f"{np.dtype(dtype).name}")
    x0 = x0.astype(dtype)
    # on the host, in float64 (eagerly on the device: four programs a second run loads again)
    err = float(np.max(np.abs(np.linalg.norm(np.asarray(x0, np.float64), axis=-1) - 1.0)))
    if not err <= unit_tolerance(in_dtype):  # simulate's rule
        raise ValueError(f"x0 rows must be unit vectors on S^{d - 1} "
                         f"(max ||x_i| - 1| = {err:.3g}); "
                         "normalise them with jaxdyn.normalize")
    t0, t1, dt, steps = _plan(t0, t1, dt)
    idx = save_indices(steps, save_every, saveat, t0, dt)
    devs = tuple(jax.devices() if devices is None else devices)
    if not devs:
        raise ValueError("devices must name at least one device")
    if chunk is not None and (isinstance(chunk, bool) or not hasattr(chunk, "__index__")
                              or int(chunk) < 1):
        raise ValueError(f"chunk must be a positive integer or None, got {chunk!r}")
    per_dev = math.ceil(nb / len(devs))
    if chunk is not None:
        c = int(chunk)
    elif devs[0].platform == "cpu":
        c = default_chunk(n)
    else:  # accelerators: one chunk per device (each chunk is a sequential step of lax.map)
        c = max(1, min(per_dev, ACCEL_TILE_ELEMENTS // (n * n)))
    c = min(c, per_dev)
    per_dev = math.ceil(per_dev / c) * c
    total = per_dev * len(devs)

    arrays = _device_arrays(x0, models.Q, models.K, models.V, models.beta, np.dtype(dtype),
                            total)
    shapes = tuple(tuple(a.shape) for a in arrays)
    fn, mesh = _compiled(shapes, np.dtype(dtype).name, method, float(dt), tuple(idx),
                         models.normalization, c, devs, float(SAFE_SHIFT[np.dtype(dtype).name]))
    sharding = jax.sharding.NamedSharding(mesh, P("batch"))
    arrays = [jax.device_put(a, sharding) for a in arrays]
    xs = fn(*arrays)[:nb]
    # t0 + idx·dt in the dtype on the host (the same IEEE operations as eagerly on the device,
    # without their programs), the status codes in one program
    ts_host = (np.asarray(t0, np.dtype(dtype))
               + np.asarray(idx).astype(np.dtype(dtype)) * np.asarray(dt, np.dtype(dtype)))
    ts = jax.device_put(ts_host)
    result = from_codes(_status_codes(xs))
    steps = jnp.asarray(idx[-1])
    traj = Trajectory(ts=ts, xs=xs, result=result,
                      stats={"num_steps": steps, "num_accepted_steps": steps})
    if throw:
        raise_if_failed(traj, "simulate_ensemble")
    return traj
