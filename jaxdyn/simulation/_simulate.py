"""``simulate``: the particle driver, one ``diffrax.diffeqsolve`` call.

    traj = simulate(model, x0, t1=10.0, dt=0.01, save_every=10, method="rk4")
    traj.ts  # (S,)        saved times
    traj.xs  # (S, N, d)   saved states
    traj.result  # jaxdyn.RESULTS: successful, nonfinite, max_steps_reached, invalid_input
    traj.ok, traj.status, traj.messages  # per member under vmap (never an exception)

Fixed-step methods (``"euler"``, ``"rk4"``, ``"exp_euler"``, ``"euler_renormalise"``, or any
non-adaptive diffrax solver object) step on the grid t_k = t0 + k dt with
``diffrax.StepTo`` and the term :class:`~jaxdyn.integrators.GridODETerm` (its control on
every step is dt itself); the adaptive methods (``"tsit5"``, ``"dopri5"``, ``"dopri8"``, or
any adaptive diffrax solver object) take PID-controlled steps for accuracy references.
Reverse-mode differentiable (diffrax's ``RecursiveCheckpointAdjoint``). ``simulate`` works
under ``jax.jit``, ``jax.vmap`` (over a stack of models: a β sweep; over initial
conditions: seeds) and ``jax.grad``. Step counts and save indices are static: ``t0``,
``t1``, ``dt`` must be Python numbers. Invalid inputs are refused on the host when concrete
and flagged ``RESULTS.invalid_input`` when traced (x0 non-finite or off the sphere, a model
parameter outside its domain: ``model.invalid()``, e.g. a β swept under ``vmap``).
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

from .._checks import check_dtype, check_integer
from .._results import RESULTS, Solution, error_if_failed, stat
from ..integrators import INTEGRATORS, AbstractIntegrator, GridODETerm, scheme_step

#: the adaptive diffrax methods ``simulate`` takes by name
DIFFRAX_METHODS = {
    "tsit5": diffrax.Tsit5,
    "dopri5": diffrax.Dopri5,
    "dopri8": diffrax.Dopri8,
}
#: every method name ``simulate`` takes
METHODS = tuple(INTEGRATORS) + tuple(DIFFRAX_METHODS)


class Trajectory(Solution):
    """Saved states of a particle simulation (a :class:`jaxdyn.Solution`).

    Attributes:
      ts: (S,) saved times.
      xs: (S, N, d) saved particle positions.
      result: :class:`jaxdyn.RESULTS` item, one code per run (an array of codes under
        ``vmap`` and from ``simulate_ensemble``): ``successful``; ``nonfinite`` (a saved
        state is NaN/inf); diffrax's own codes for adaptive methods (``max_steps_reached``,
        ``dt_min_reached``, ...); ``invalid_input`` (found under jit/vmap: x0 non-finite or
        off the sphere, or a model parameter outside its domain, ``model.invalid()``). Read it with ``.ok``, ``.status``, ``.messages`` (any batch shape).
      stats: ``{"num_steps", "num_accepted_steps"}`` int arrays: steps attempted (accepted
        and rejected) and accepted (equal for fixed steps).
    """

    ts: jax.Array
    xs: jax.Array
    result: RESULTS
    stats: dict

    num_steps = stat("num_steps", "Steps attempted, accepted and rejected (``stats['num_steps']``).")
    num_accepted_steps = stat("num_accepted_steps",
                              "Steps accepted (``stats['num_accepted_steps']``).")

    @property
    def finite(self):
        """Bool array (one per run): every saved state is finite.

        The status is ``result``; this reads the states alone.
        """
        return _all_finite(self.xs)


def unit_tolerance(in_dtype) -> float:
    """How far from 1 the norms of sphere rows given in ``in_dtype`` may be.

    1e-8 in float64, else max(1e-4, 8 eps) (float16 rows normalised by jaxdyn.normalize are
    unit to ~1e-3). One rule for the concrete check, the traced one and
    ``simulate_ensemble``.

    Args:
      in_dtype: the dtype the rows were given in.

    Returns:
      The tolerance on ``| |x_i| − 1 |``.
    """
    if not jnp.issubdtype(in_dtype, jnp.floating):
        return 1e-4
    return 1e-8 if in_dtype == jnp.float64 else max(1e-4, 8 * float(jnp.finfo(in_dtype).eps))


def _check_x0(model, x0):
    check_dtype("x0", x0, half=True)
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
    """The fixed-step time grid of ``simulate``.

    Args:
      t0: the start time (a Python number).
      t1: the end time (> t0).
      dt: the requested step (> 0).

    Returns:
      ``(t0, t1, dt', n)``: ``n`` steps of ``dt' = (t1 − t0)/n`` (``dt`` rounded so that
      the steps land on t1).

    Raises:
      ValueError: a time that is not a finite Python number, dt <= 0 or t1 <= t0.
    """
    vals = []
    for name, v in (("t0", t0), ("t1", t1), ("dt", dt)):
        if isinstance(v, jax.core.Tracer):
            raise ValueError(f"{name} must be a Python number (it fixes the step count), got a "
                             "traced value")
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number, got {v!r}") from None
        if not math.isfinite(f):
            raise ValueError(f"{name} must be finite, got {f}")
        vals.append(f)
    t0, t1, dt = vals
    if dt <= 0:
        raise ValueError(f"dt (time step) must be > 0, got {dt}")
    if t1 <= t0:
        raise ValueError(f"t1 must be > t0, got t0={t0}, t1={t1}")
    span = t1 - t0
    n = round(span / dt)
    if n < 1 or abs(n * dt - span) > 1e-9 * max(1.0, span):
        n = max(1, math.ceil(span / dt - 1e-9))
    return t0, t1, span / n, n





def step_grid(t0, dt, m, dtype):
    """The step grid t_k = t0 + k dt, k = 0..m, in ``dtype`` (NumPy: a constant of the program).

    The same floats as ``t0 + k·dt`` in ``dtype`` on the device (one rounding per operation).

    Args:
      t0: the start time.
      dt: the step.
      m: the number of steps.
      dtype: the state's dtype.

    Returns:
      The (m + 1,) NumPy array of times.
    """
    dtype = np.dtype(dtype)
    return np.asarray(t0, dtype) + np.arange(m + 1).astype(dtype) * np.asarray(dt, dtype)


def invalid_parameters(model):
    """The flag of a model's traced parameters outside their domain, for a driver's result.

    Reads ``model.invalid()`` (:meth:`jaxdyn.models.AbstractParticleModel.invalid`: True where
    a parameter lies outside its domain, e.g. a traced β <= 0; a scalar for one model, the
    stack's shape for a stack, one per member under ``vmap``). A field without ``invalid``
    (a user's function) has nothing to flag. Concrete parameters are answered on the host:
    all valid is nothing to flag, an invalid one (set after construction, which refuses it) is
    refused here.

    Args:
      model: the driver's model.

    Returns:
      None (nothing to flag) or the traced boolean array to OR into the result as
      ``RESULTS.invalid_input``.

    Raises:
      ValueError: a concrete parameter outside its domain.
    """
    check = getattr(model, "invalid", None)
    if not callable(check):
        return None
    bad = check()
    if isinstance(bad, jax.core.Tracer):
        return bad
    bad = np.asarray(bad)
    if np.any(bad):
        where = (f" (members {np.flatnonzero(bad).tolist()} of the stack)" if bad.ndim else "")
        raise ValueError(f"{type(model).__name__} has a parameter outside its domain{where} "
                         "(model.invalid() is True): build the model with valid values, whose "
                         "constructor names the parameter")
    return None


def flag_invalid(traj, bad):
    """``traj`` with ``result`` set to ``invalid_input`` where ``bad`` (None: unchanged).

    Args:
      traj: a :class:`Trajectory`.
      bad: None or a boolean array shaped like ``traj.result`` (one flag per code).

    Returns:
      The trajectory.
    """
    if bad is None:
        return traj
    return eqx.tree_at(lambda t: t.result, traj, _where_invalid(bad, traj.result))


def _where_invalid(bad, result):
    """``invalid_input`` where ``bad``, else ``result`` (elementwise over their shape)."""
    if jnp.ndim(bad) == 0:  # RESULTS.where takes a scalar predicate
        return RESULTS.where(bad, RESULTS.invalid_input, result)
    return jax.vmap(_where_invalid)(bad, result)


def finish(traj, model, x0, in_dtype, bad_params, throw):
    """The flags and the optional raise every particle driver ends with.

    A traced ``x0`` is flagged (not raised: the concrete checks of ``_check_x0`` cannot run
    under jit/vmap), then the traced parameters outside their domain (``bad_params``); with
    ``throw`` an unsuccessful result raises through the program.

    Args:
        traj: the driver's result.
        model: the field (its ``manifold`` decides the on-sphere check of ``x0``).
        x0: the initial state.
        in_dtype: the dtype ``x0`` came in.
        bad_params: the model's ``invalid()`` (or None).
        throw: whether to raise on an unsuccessful result.

    Returns:
        ``traj`` with its result codes updated.
    """
    if isinstance(x0, jax.core.Tracer):
        traj = flag_invalid(traj, _x0_invalid(model, x0, in_dtype))
    traj = flag_invalid(traj, bad_params)  # traced parameters outside their domain
    if throw:
        traj = error_if_failed(traj, traj.result)
    return traj


def _x0_invalid(model, x0, in_dtype):
    """Traceable: True where x0 is non-finite or (sphere models) has rows off the sphere."""
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
    """The time of the last saved step of an adaptive solve.

    Args:
      t0: the start time.
      t1: the end time.
      dt: the grid step.
      n_steps: the number of grid steps.
      idx: the saved step indices.

    Returns:
      ``t1`` itself when the last saved step is step ``n_steps`` (no rounding of
      ``t0 + n dt``), else ``t0 + idx[-1] dt``.
    """
    return t1 if idx[-1] == n_steps else t0 + idx[-1] * dt


def save_indices(n_steps: int, save_every: Optional[int] = None, saveat=None, t0=0.0, dt=1.0):
    """Static step indices at which states are saved.

    Args:
      n_steps: the number of steps.
      save_every: save every k steps (default: about 100 frames), always with the last.
      saveat: or times on the step grid t0 + k dt (strictly increasing).
      t0: the start time.
      dt: the step.

    Returns:
      A tuple of step indices.

    Raises:
      ValueError: both or a bad ``saveat``/``save_every`` (off the grid, outside [t0, t1],
        not increasing, empty, not a positive integer).
    """
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


def solver_of(method, choices=METHODS):
    """The diffrax solver of a ``method`` argument and whether it adapts its steps.

    Args:
      method: a name of ``choices`` or a ``diffrax.AbstractSolver`` instance.
      choices: the names accepted.

    Returns:
      ``(solver, adaptive)``: a solver instance; ``adaptive`` for the adaptive methods
      (``diffrax.AbstractAdaptiveSolver``), which run with a PID controller instead of the
      step grid.

    Raises:
      ValueError: an unknown name or another object.
    """
    if isinstance(method, diffrax.AbstractSolver):
        return method, isinstance(method, diffrax.AbstractAdaptiveSolver)
    if isinstance(method, str) and method in choices:
        if method in INTEGRATORS:
            return INTEGRATORS[method](), False
        return DIFFRAX_METHODS[method](), True
    raise ValueError(f"method must be one of {choices} or a diffrax solver, got {method!r}")


def simulate(model, x0, *, t1, dt, t0=0.0, save_every=None, saveat=None, method="rk4", args=None,
             rtol=1e-8, atol=1e-10, max_steps=1_000_000, adjoint=None, throw=False,
             record_local=False):
    """Integrate a particle model from ``x0`` on [t0, t1]: ``dx/dt = model(t, x, args)``.

    Args:
      model: a particle vector field (``SphereAttention``, ``ZeroTemperature``,
        ``EuclideanAttention``, or any ``field(t, x, args)`` with ``dim``/``manifold``).
      x0: (N, d) initial particles (unit rows for sphere models).
      t1: the end time (a Python number).
      dt: the step (a Python number), adjusted down so that the steps tile [t0, t1]; the
        first step of an adaptive method.
      t0: the start time (a Python number).
      save_every: save every k steps (default: about 100 frames).
      saveat: or times on the step grid (instead of ``save_every``).
      method: ``"euler"`` (projected Euler), ``"rk4"`` (projected RK4), ``"exp_euler"``
        (exponential-map Euler), ``"euler_renormalise"`` (Euler on the unprojected field,
        then x/|x|: the published rotf step; needs the model's ``ambient``), a diffrax
        adaptive method ``"tsit5"``, ``"dopri5"``, ``"dopri8"`` (with ``rtol``, ``atol``,
        ``max_steps``), or a diffrax solver object: an adaptive one runs as the adaptive
        names, any other on the step grid (a scheme of :mod:`jaxdyn.integrators` without a
        geometry takes the model's).
      args: passed to the model.
      rtol: relative tolerance of the adaptive methods.
      atol: absolute tolerance of the adaptive methods.
      max_steps: step budget of the adaptive methods.
      adjoint: how ``jax.grad`` differentiates the solve (a ``diffrax.AbstractAdjoint``);
        None: diffrax's default ``RecursiveCheckpointAdjoint``. Inside ``shard_map`` (e.g.
        :func:`jaxdyn.sharded_vmap`) reverse mode needs ``diffrax.DirectAdjoint()``: the
        default's checkpointed loop is refused there by equinox (diffrax's tracker, #765).
      throw: if True, an unsuccessful run raises with its status message (``eqx.error_if``,
        so also under jit/vmap); default False: read ``traj.result`` / ``traj.ok``.
      record_local: also record, at every saved state, the local kernel's certificate
        (the model's ``local_stats``: :class:`~jaxdyn.SphereAttention`,
        :class:`~jaxdyn.MultiHeadAttention`, :class:`~jaxdyn.EuclideanAttention`), in
        ``stats``: ``"local_bound"`` (S,) the largest certified error bound of the attention
        average over the particles (and heads), ``"local_visited"`` (S,) the fraction of
        pairs its lists visit (the largest over heads), ``"local_dense"`` (S,) whether the
        blocked kernel answered (an overflow, or ``"auto"`` judged the lists too long).
        One more attention pass a saved state.

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to the float dtype
    of the model's parameters; complex is refused (a TypeError naming ``x0``).

    Returns:
      :class:`Trajectory` with ``ts`` (S,), ``xs`` (S, N, d), ``result`` (the status:
      ``successful``, ``nonfinite``, diffrax's codes such as ``max_steps_reached``,
      ``invalid_input``: a traced x0 non-finite or off the sphere, or a traced model
      parameter outside its domain, ``model.invalid()``) and ``stats``.

    Raises:
      ValueError: bad method/times/shapes, max_steps not an integer >= 1, a concrete x0 that is non-finite or off the
        sphere, or a concrete model parameter outside its domain (under jit/vmap these are
        flagged as ``RESULTS.invalid_input`` instead), or ``record_local`` with a model
        without ``local_stats``.
    """
    if not isinstance(method, diffrax.AbstractSolver) and method not in METHODS:
        raise ValueError(f"method must be one of {METHODS} or a diffrax solver, got {method!r}")
    solver, adaptive = solver_of(method)
    max_steps = check_integer("max_steps", max_steps, minimum=1)
    t0, t1, dt, n = plan_steps(t0, t1, dt)
    in_dtype = x0.dtype if hasattr(x0, "dtype") else np.asarray(x0).dtype
    x0 = _check_x0(model, x0)
    bad_params = invalid_parameters(model)
    idx = save_indices(n, save_every, saveat, t0, dt)
    if adaptive:
        # a saveat ending before t1: the solve ends at its last time
        traj = _solve_adaptive(solver, model, x0, args, t0, end_time(t0, t1, dt, n, idx), dt,
                               idx, float(rtol), float(atol), max_steps, _adjoint(adjoint))
    else:
        if isinstance(solver, AbstractIntegrator):
            solver = solver.on(model)
            field = solver.field_of(model)
        else:
            field = model
        traj = _solve_fixed(solver, field, x0, args, t0, dt, idx, _adjoint(adjoint))
    if record_local:
        traj = _record_local(model, traj)
    return finish(traj, model, x0, in_dtype, bad_params, throw)


def _record_local(model, traj):
    """``traj`` with the local kernel's certificate at every saved state in its stats."""
    if not hasattr(model, "local_stats"):
        raise ValueError(f"record_local needs a model with local_stats (SphereAttention, "
                         f"MultiHeadAttention, EuclideanAttention), got {type(model).__name__}")
    st = jax.lax.map(lambda a: model.local_stats(a[1], a[0]), (traj.ts, traj.xs))
    frames = traj.ts.shape[0]
    stats = dict(traj.stats,
                 local_bound=jnp.max(st.bound.reshape(frames, -1), axis=1),
                 local_visited=jnp.max(st.visited.reshape(frames, -1), axis=1),
                 local_dense=jnp.any(st.dense.reshape(frames, -1), axis=1))
    return eqx.tree_at(lambda t: t.stats, traj, stats)


def _adjoint(adjoint):
    """The adjoint of a solve: diffrax's default when None."""
    return diffrax.RecursiveCheckpointAdjoint() if adjoint is None else adjoint


@eqx.filter_jit
def _solve_fixed(solver, field, x0, args, t0, dt, idx, adjoint):
    """The fixed-step solve on the grid t0 + k dt up to the last saved step ``idx[-1]``."""
    m = idx[-1]
    grid = step_grid(t0, dt, m, x0.dtype)
    ts = grid[np.asarray(idx)]
    if m == 0:  # only t0 saved: nothing to integrate
        return _trajectory(jnp.asarray(ts), x0[None], jnp.asarray(0))
    sol = diffrax.diffeqsolve(
        GridODETerm(field, jnp.asarray(dt, x0.dtype)), solver, t0, float(grid[-1]), None, x0,
        args=args, saveat=diffrax.SaveAt(ts=ts), stepsize_controller=diffrax.StepTo(grid),
        max_steps=m, adjoint=adjoint, throw=False)
    return diffrax_trajectory(sol, sol.ts)


@eqx.filter_jit
def _solve_adaptive(solver, model, x0, args, t0, t1, dt, idx, rtol, atol, max_steps, adjoint):
    # t1: the last saved time (end_time)
    ts = jnp.asarray(t0 + np.asarray(idx) * dt, x0.dtype)
    ts = ts.at[-1].set(t1)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(model), solver, t0, t1, dt, x0, args=args,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        max_steps=max_steps, adjoint=adjoint, throw=False)
    # diffrax's own code passes through (max_steps_reached, dt_min_reached, ...)
    return diffrax_trajectory(sol, ts)


def _trajectory(ts, xs, steps, accepted=None, result=RESULTS.successful):
    """A :class:`Trajectory` whose result is ``nonfinite`` when a successful run holds NaN/inf."""
    result = RESULTS.where((result == RESULTS.successful) & ~jnp.all(jnp.isfinite(xs)),
                           RESULTS.nonfinite, result)
    return Trajectory(ts=ts, xs=xs, result=result,
                      stats={"num_steps": steps,
                             "num_accepted_steps": steps if accepted is None else accepted})


def diffrax_trajectory(sol, ts):
    """The :class:`Trajectory` of a diffrax solve saved at ``ts`` (ODE or SDE).

    Args:
      sol: a ``diffrax.Solution`` saved at ``ts``.
      ts: the saved times.

    Returns:
      The trajectory: diffrax's code passes through; a successful solve with NaN/inf in it
      is ``nonfinite``.
    """
    return _trajectory(ts, sol.ys, sol.stats["num_steps"], sol.stats["num_accepted_steps"],
                       RESULTS.promote(sol.result))


def saved_states(x0, idx, advance):
    """The states at the static step indices ``idx``, stacked on a new leading axis.

    States before ``idx[0]`` are integrated but not saved (``saveat`` after t0); consecutive
    equal-length segments share one nested scan (traced once per length).

    Args:
      x0: the state at step 0.
      idx: the static step indices to save (increasing).
      advance: ``advance(x, k_start, n_steps)`` takes ``n_steps`` steps from step
        ``k_start``.

    Returns:
      The (len(idx), ...) stack of saved states.
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
    """``n_steps`` steps of a fixed-step scheme on a bare field (a ``lax.scan``).

    Step k starts at ``t0 + k dt`` (steps ``k_start, k_start + 1, …``; a traced ``k_start``
    is allowed). The inner loop of the piecewise drivers whose field changes from one piece
    to the next (the transfer of controls to particles and layers), where each piece is a
    handful of steps; :func:`simulate` itself is one ``diffeqsolve``.

    Args:
      integ: a scheme of :mod:`jaxdyn.integrators` (an instance).
      field: the model (the scheme integrates ``integ.field_of(field)``).
      x: the state at step ``k_start``.
      t0: the grid's start time.
      dt: the step (an array in the state's dtype).
      n_steps: the number of steps (static).
      args: passed to the field.
      k_start: the index of the first step.
      geometry: the space (default: the scheme's, else the field's).

    Returns:
      The state after the steps.
    """
    if geometry is not None:
        integ = eqx.tree_at(lambda s: s.geometry, integ, geometry, is_leaf=lambda v: v is None)
    dtype = x.dtype

    def body(x, k):
        t = t0 + k.astype(dtype) * dt
        return scheme_step(integ, field, t, x, dt, args), None

    x, _ = jax.lax.scan(body, x, k_start + jnp.arange(n_steps))
    return x
