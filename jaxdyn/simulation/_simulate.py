"""``simulate``: the one jitted driver of the particle integrators.

    traj = simulate(model, x0, t1=10.0, dt=0.01, save_every=10, method="rk4")
    traj.ts  # (S,)        saved times
    traj.xs  # (S, N, d)   saved states
    traj.result  # jaxdyn.RESULTS: successful, nonfinite, max_steps_reached, invalid_input
    traj.ok, traj.status, traj.messages  # per member under vmap (never an exception)

Fixed-step methods (``"euler"``, ``"rk4"``, ``"exp_euler"``, ``"euler_renormalise"``) run as
nested ``lax.scan``s (reverse-mode differentiable); the diffrax methods (``"tsit5"``,
``"dopri5"``, ``"dopri8"``) take adaptive steps for accuracy references. ``simulate`` works under
``jax.vmap`` over a stack of models (a β sweep) and over initial conditions (seeds).
Step counts and save indices are static: ``t0``, ``t1``, ``dt`` must be Python numbers.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._results import RESULTS, Solution, error_if_failed, from_codes, status_codes
from ..integrators import INTEGRATORS

DIFFRAX_METHODS = {
    "tsit5": diffrax.Tsit5,
    "dopri5": diffrax.Dopri5,
    "dopri8": diffrax.Dopri8,
}
METHODS = tuple(INTEGRATORS) + tuple(DIFFRAX_METHODS)


class Trajectory(Solution):
    """Saved states of a particle simulation (a :class:`jaxdyn.Solution`).

    Attributes:
      ts: (S,) saved times.
      xs: (S, N, d) saved particle positions.
      result: :class:`jaxdyn.RESULTS` item, one code per run (an array of codes under
        ``vmap`` and from ``simulate_ensemble``): ``successful``; ``nonfinite`` (a saved
        state is NaN/inf); diffrax's own codes for adaptive methods (``max_steps_reached``,
        ``dt_min_reached``, ...); ``invalid_input`` (x0 non-finite or off the sphere, found
        under jit/vmap). Read it with ``.ok``, ``.status``, ``.messages`` (any batch shape).
      stats: ``{"num_steps", "num_accepted_steps"}`` int arrays (fixed-step methods: the
        step count; diffrax: attempted and accepted steps).
    """

    ts: jax.Array
    xs: jax.Array
    result: RESULTS
    stats: dict

    @property
    def finite(self):
        """Bool array (one per run): every saved state is finite. (The status is ``result``;
        this reads the states alone.)"""
        return _all_finite(self.xs)

    @property
    def n_steps(self):
        """Steps taken (accepted steps for diffrax methods): ``stats["num_accepted_steps"]``."""
        return self.stats["num_accepted_steps"]


def _static_float(name, v):
    if isinstance(v, jax.core.Tracer):
        raise ValueError(f"{name} must be a Python number (it fixes the step count), got a traced value")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {v!r}") from None
    if not math.isfinite(f):
        raise ValueError(f"{name} must be finite, got {f}")
    return f


def _plan(t0, t1, dt):
    t0 = _static_float("t0", t0)
    t1 = _static_float("t1", t1)
    dt = _static_float("dt", dt)
    if dt <= 0:
        raise ValueError(f"dt (time step) must be > 0, got {dt}")
    if t1 <= t0:
        raise ValueError(f"t1 must be > t0, got t0={t0}, t1={t1}")
    span = t1 - t0
    n = round(span / dt)
    if n < 1 or abs(n * dt - span) > 1e-9 * max(1.0, span):
        n = max(1, math.ceil(span / dt - 1e-9))
    return t0, t1, span / n, n


def unit_tolerance(in_dtype) -> float:
    """How far from 1 the norms of sphere rows given in ``in_dtype`` may be: 1e-8 in float64,
    else max(1e-4, 8 eps) (float16 rows normalised by jaxdyn.normalize are unit to ~1e-3).
    One rule for the concrete check, the traced one and ``simulate_ensemble``."""
    if not jnp.issubdtype(in_dtype, jnp.floating):
        return 1e-4
    return 1e-8 if in_dtype == jnp.float64 else max(1e-4, 8 * float(jnp.finfo(in_dtype).eps))


def _check_x0(model, x0):
    x0 = jnp.asarray(x0)
    d = model.dim
    if x0.ndim != 2 or x0.shape[1] != d or x0.shape[0] < 1:
        raise ValueError(f"x0 must have shape (N, {d}) with N >= 1 for this model, got {x0.shape}")
    params = [l for l in jax.tree.leaves(model) if hasattr(l, "dtype")
              and jnp.issubdtype(l.dtype, jnp.floating)]
    dt = jnp.result_type(x0.dtype if jnp.issubdtype(x0.dtype, jnp.floating) else jnp.float32,
                         *[p.dtype for p in params])
    in_dtype = x0.dtype
    x0 = x0.astype(dt)
    # checked on the host (NumPy): no program compiled per shape, and a concrete x0 closed over
    # by a user's jit is not a traced boolean
    if not isinstance(x0, jax.core.Tracer) and not np.all(np.isfinite(np.asarray(x0))):
        raise ValueError("x0 must be finite (it holds NaN or inf)")
    if getattr(model, "manifold", "euclidean") == "sphere" and not isinstance(x0, jax.core.Tracer):
        err = float(np.max(np.abs(np.linalg.norm(np.asarray(x0, np.float64), axis=-1) - 1.0)))
        unit_tol = unit_tolerance(in_dtype)
        if not err <= unit_tol:
            raise ValueError(
                f"x0 rows must be unit vectors on S^{d - 1} (max ||x_i| - 1| = {err:.3g}); "
                "normalise them with jaxdyn.normalize or sample with jaxdyn.sample_sphere")
    return x0


def plan_steps(t0, t1, dt):
    """The fixed-step time grid of ``simulate``: ``(t0, t1, dt', n)`` with ``n`` steps of
    ``dt' = (t1 − t0)/n`` (``dt`` rounded so that the steps land on t1)."""
    return _plan(t0, t1, dt)


def _x0_invalid(model, x0, in_dtype):
    """Traceable: True where x0 is non-finite or (sphere models) has rows off the sphere
    (the checks of ``_check_x0`` that cannot raise under jit/vmap)."""
    tol = None
    if getattr(model, "manifold", "euclidean") == "sphere":
        tol = unit_tolerance(in_dtype)  # the concrete check's (_check_x0)
    return _x0_invalid_program(x0, tol)


@functools.partial(jax.jit, static_argnums=1)
def _x0_invalid_program(x0, tol):
    # one program (under a vmap without jit, op by op, it compiled eight small ones)
    bad = ~jnp.all(jnp.isfinite(x0))
    if tol is not None:
        err = jnp.max(jnp.abs(jnp.linalg.norm(x0, axis=-1) - 1.0))
        bad = bad | ~(err <= tol)
    return bad


@jax.jit
def _all_finite(xs):
    return jnp.all(jnp.isfinite(xs), axis=(-3, -2, -1))


def end_time(t0, t1, dt, n_steps, idx):
    """The time of the last saved step: ``t1`` itself when it is step ``n_steps`` (no rounding
    of ``t0 + n dt``), else ``t0 + idx[-1] dt``."""
    return t1 if idx[-1] == n_steps else t0 + idx[-1] * dt


def save_indices(n_steps: int, save_every: Optional[int] = None, saveat=None, t0=0.0, dt=1.0):
    """Static step indices at which states are saved (always includes 0 and n_steps)."""
    if saveat is not None and save_every is not None:
        raise ValueError("give either saveat or save_every, not both")
    if saveat is not None:
        ts = np.atleast_1d(np.asarray(saveat, dtype=np.float64))
        if ts.ndim != 1 or ts.size == 0:
            raise ValueError(f"saveat must hold at least one time (a 1-D list of times), got "
                             f"shape {ts.shape}")
        k = np.rint((ts - t0) / dt).astype(np.int64)
        off = np.abs(t0 + k * dt - ts)
        if np.any(off > 1e-6 * dt) or np.any(k < 0) or np.any(k > n_steps):
            bad = ts[(off > 1e-6 * dt) | (k < 0) | (k > n_steps)][0]
            raise ValueError(f"saveat time {bad} is not on the step grid t0 + k*dt (dt={dt}) "
                             f"within [t0, t1]; use multiples of dt or save_every")
        if np.any(np.diff(k) <= 0):
            raise ValueError("saveat must be strictly increasing")
        return tuple(int(i) for i in k)
    if save_every is None:
        save_every = max(1, n_steps // 100)
    if isinstance(save_every, bool) or not isinstance(save_every, (int, np.integer)) or save_every < 1:
        raise ValueError(f"save_every must be an integer >= 1 (steps between saves), got {save_every!r}")
    idx = list(range(0, n_steps + 1, int(save_every)))
    if idx[-1] != n_steps:
        idx.append(n_steps)
    return tuple(idx)


def simulate(model, x0, *, t1, dt, t0=0.0, save_every=None, saveat=None, method="rk4", args=None,
             rtol=1e-8, atol=1e-10, max_steps=1_000_000, throw=False):
    """Integrate a particle model from ``x0`` on [t0, t1].

    Args:
      model: a particle vector field (``SphereAttention``, ``ZeroTemperature``,
        ``EuclideanAttention``, or any ``field(t, x, args)`` with ``dim``/``manifold``).
      x0: (N, d) initial particles (unit rows for sphere models).
      t1, dt, t0: Python numbers; dt is adjusted down so that the steps tile [t0, t1].
      save_every: save every k steps (default: about 100 frames). Or ``saveat``: times on
        the step grid.
      method: ``"euler"`` (projected Euler), ``"rk4"`` (projected RK4), ``"exp_euler"``
        (exponential-map Euler), ``"euler_renormalise"`` (Euler on the unprojected field,
        then x/|x|: the published rotf step; needs the model's ``ambient``), or a diffrax
        adaptive method ``"tsit5"``, ``"dopri5"``,
        ``"dopri8"`` (with ``rtol``, ``atol``, ``max_steps``; ``dt`` is the first step).
      throw: if True, an unsuccessful run raises with its status message (``eqx.error_if``,
        so also under jit/vmap); default False: read ``traj.result`` / ``traj.ok``.

    Returns:
      :class:`Trajectory` with ``ts`` (S,), ``xs`` (S, N, d), ``result`` (the status:
      ``successful``, ``nonfinite``, diffrax's codes such as ``max_steps_reached``,
      ``invalid_input``) and ``stats``.

    Raises:
      ValueError: bad method/times/shapes, or a concrete x0 that is non-finite or off the
        sphere (under jit/vmap these are flagged as ``RESULTS.invalid_input`` instead).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    t0, t1, dt, n = _plan(t0, t1, dt)
    in_dtype = x0.dtype if hasattr(x0, "dtype") else np.asarray(x0).dtype
    x0 = _check_x0(model, x0)
    idx = save_indices(n, save_every, saveat, t0, dt)
    if method in DIFFRAX_METHODS:
        # a saveat ending before t1: the solve ends at its last time (it saved t1's state
        # under that time's label)
        traj = _run_diffrax(model, x0, args, t0, end_time(t0, t1, dt, n, idx), dt, idx, method,
                            float(rtol), float(atol), int(max_steps))
    else:
        traj = _run_fixed(model, x0, args, t0, dt, idx, method)
    if isinstance(x0, jax.core.Tracer):
        # flagged, not raised: the concrete checks of _check_x0 cannot run under jit/vmap
        result = RESULTS.where(_x0_invalid(model, x0, in_dtype), RESULTS.invalid_input,
                               traj.result)
        traj = eqx.tree_at(lambda t: t.result, traj, result)
    if throw:
        traj = error_if_failed(traj, traj.result)
    return traj


def saved_states(x0, idx, advance):
    """The states at the static step indices ``idx``, stacked on a new leading axis.

    ``advance(x, k_start, n_steps)`` takes ``n_steps`` steps from step ``k_start``. States
    before ``idx[0]`` are integrated but not saved (``saveat`` after t0); consecutive
    equal-length segments share one nested scan (traced once per length).
    """
    seg = np.diff(np.asarray(idx))
    x = x0
    if idx[0] > 0:
        x = advance(x, 0, int(idx[0]))
    saved = [x[None]]
    i = 0
    while i < len(seg):
        j = i
        while j < len(seg) and seg[j] == seg[i]:
            j += 1
        L, reps, start = int(seg[i]), j - i, int(idx[i])

        def outer(x, r, L=L, start=start):
            x = advance(x, start + r * L, L)
            return x, x

        x, xs = jax.lax.scan(outer, x, jnp.arange(reps))
        saved.append(xs)
        i = j
    return jnp.concatenate(saved, axis=0)


def fixed_steps(integ, field, x, t0, dt, n_steps: int, args=None, *, k_start=0,
                geometry=None):
    """``n_steps`` steps of the fixed-step scheme ``integ`` (a ``jaxdyn.integrators`` class
    instance), steps ``k_start, k_start + 1, …``: step k starts at ``t0 + k dt`` (traced
    ``k_start`` allowed; ``n_steps`` static). The one inner loop of every fixed-step driver
    (:func:`simulate`, the transfer of controls to particles and layers)."""
    dtype = x.dtype

    def body(x, k):
        t = t0 + k.astype(dtype) * dt
        return integ.step(field, t, x, dt, args, geometry=geometry), None

    x, _ = jax.lax.scan(body, x, k_start + jnp.arange(n_steps))
    return x


def trajectory_leaves(traj):
    """A :class:`Trajectory` as a flat tuple of arrays (what a stored program returns; see
    :func:`trajectory_program`)."""
    return (traj.ts, traj.xs, status_codes(traj.result), traj.stats["num_steps"],
            traj.stats["num_accepted_steps"])


def trajectory_from_leaves(vals):
    """The :class:`Trajectory` of :func:`trajectory_leaves`' tuple."""
    ts, xs, codes, n_steps, n_acc = vals
    return Trajectory(ts=ts, xs=xs, result=from_codes(codes),
                      stats={"num_steps": n_steps, "num_accepted_steps": n_acc})


def trajectory_program(leaves_fn):
    """``leaves_fn`` (a function returning :func:`trajectory_leaves`) through
    ``equinox.filter_jit``; returns a function giving the :class:`Trajectory`. Static
    arguments (times, step indices, method names, a model's non-array fields) are baked in."""
    program = eqx.filter_jit(leaves_fn)

    def run(*args):
        return trajectory_from_leaves(program(*args))

    return run


def _run_fixed_leaves(model, x0, args, t0, dt, idx, method):
    integ = INTEGRATORS[method]()
    dtype = x0.dtype
    t0 = jnp.asarray(t0, dtype)
    dt_a = jnp.asarray(dt, dtype)

    def advance(x, k_start, n_steps):
        return fixed_steps(integ, model, x, t0, dt_a, n_steps, args, k_start=k_start)

    return trajectory_leaves(fixed_step_trajectory(x0, idx, advance, t0, dt_a))


_run_fixed = trajectory_program(_run_fixed_leaves)


def fixed_step_trajectory(x0, idx, advance, t0, dt):
    """The :class:`Trajectory` of a fixed-step run (deterministic or stochastic): the states at
    the static step indices ``idx`` (:func:`saved_states` with ``advance``), their times
    ``t0 + idx·dt`` (``t0``, ``dt`` arrays of the state's dtype), ``nonfinite`` if any saved
    state is not finite, and the step counts."""
    xs = saved_states(x0, idx, advance)
    ts = t0 + jnp.asarray(np.asarray(idx), t0.dtype) * dt
    result = RESULTS.where(jnp.all(jnp.isfinite(xs)), RESULTS.successful, RESULTS.nonfinite)
    steps = jnp.asarray(idx[-1])
    return Trajectory(ts=ts, xs=xs, result=result,
                      stats={"num_steps": steps, "num_accepted_steps": steps})


@eqx.filter_jit
def _run_diffrax(model, x0, args, t0, t1, dt, idx, method, rtol, atol, max_steps):
    # t1: the last saved time (end_time)
    ts = jnp.asarray(t0 + np.asarray(idx) * dt, x0.dtype)
    ts = ts.at[-1].set(t1)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(model), DIFFRAX_METHODS[method](), t0, t1, dt, x0, args=args,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        max_steps=max_steps, throw=False)
    # diffrax's own code passes through (max_steps_reached, dt_min_reached, ...)
    return diffrax_trajectory(sol, ts)


def diffrax_trajectory(sol, ts):
    """The :class:`Trajectory` of a diffrax solve saved at ``ts`` (ODE or SDE): diffrax's code
    passes through; a successful solve with NaN/inf in it is ``nonfinite``."""
    result = RESULTS.promote(sol.result)
    xs = sol.ys
    result = RESULTS.where((result == RESULTS.successful) & ~jnp.all(jnp.isfinite(xs)),
                           RESULTS.nonfinite, result)
    return Trajectory(ts=ts, xs=xs, result=result,
                      stats={"num_steps": sol.stats["num_steps"],
                             "num_accepted_steps": sol.stats["num_accepted_steps"]})
