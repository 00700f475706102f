"""``solve_density``: integrate the density on S¹ or S² through diffrax, and the result type."""

from __future__ import annotations

import math

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_dtype, check_integer, check_times
from .._results import RESULTS, Solution, error_if_failed, stat
from ._circle import CircleDensity, cfl_dt
from ._sphere2 import sphere_cfl_dt

__all__ = ["DensitySolution", "solve_density", "METHODS"]

#: the time steppers ``solve_density`` takes, by name
METHODS = {"heun": diffrax.Heun, "tsit5": diffrax.Tsit5, "dopri5": diffrax.Dopri5}


class DensitySolution(Solution):
    """Saved densities of a mean-field solve on S¹ or S² (a :class:`jaxdyn.Solution`).

    Every leaf is an array (one more leading axis per ``jax.vmap``).

    Attributes:
      ts: (S,) saved times.
      rho: (S, M) (S¹) or (S, n_lat, n_lon) (S²) cell averages of ρ at those times
        (S¹: ∫ρ dθ = h Σ_j ρ_j).
      result: ``successful``, ``nonfinite``, ``invalid_input`` (traced inputs out of range:
        ρ0 negative or not finite, β ≤ 0, σ < 0, ``ts``/``t1``/``dt`` not valid, ``ts`` past
        ``t1``; ``rho`` is then not a solution), or diffrax's codes (``max_steps_reached``, ...).
      stats: ``num_steps`` (steps attempted: accepted + rejected), ``num_accepted_steps``,
        ``dt`` (the step of the fixed-step method; the first step of the adaptive ones),
        ``mass_error`` (max over saved times of |mass − mass of rho0|), ``min_rho`` (min over saved
        ρ), ``mass`` ((S,) the mass at each saved time).
    """

    ts: jax.Array
    rho: jax.Array
    result: RESULTS
    stats: dict

    num_steps = stat("num_steps", "Steps attempted (accepted + rejected), ``stats['num_steps']``.")
    num_accepted_steps = stat("num_accepted_steps", "Accepted steps, ``stats['num_accepted_steps']``.")
    mass = stat("mass", "(S,) total mass at each saved time (S¹: h Σ_j ρ_j; S²: Σ A_i ρ_ij).")


def _default_dt(model, cfl):
    """The positivity (CFL) step of the model's grid."""
    return cfl_dt(model, cfl) if isinstance(model, CircleDensity) else sphere_cfl_dt(model, cfl)


@eqx.filter_jit
def _solve(model, rho0, ts, t1, dt, cfl, method, max_steps, rtol, atol, traced):
    """The jitted solve; traced inputs out of range give ``invalid_input``.

    ``traced`` (static) names the inputs that were traced when ``solve_density`` was called:
    only those are checked in the program (the others were checked on the host).

    Returns:
      A :class:`DensitySolution`.
    """
    dtype = rho0.dtype
    if dt is None:
        dt = _default_dt(model, cfl)
    dt = jnp.asarray(dt, dtype)
    # what the host checks for concrete inputs, in the program for traced ones: flagged, and
    # the solve then runs on stand-in times and step (diffrax's own checks stay quiet, the
    # step count bounded)
    checks = {"rho0": lambda: jnp.all(jnp.isfinite(rho0)) & jnp.all(rho0 >= 0),
              "model": lambda: ((model.beta > 0) & jnp.isfinite(model.beta) & (model.sigma >= 0)
                                & jnp.isfinite(model.sigma)),
              "ts": lambda: (jnp.all(jnp.isfinite(ts)) & jnp.all(ts[1:] >= ts[:-1]) & (ts[0] >= 0)
                             & (ts[-1] > 0)),
              "t1": lambda: (t1 > 0) & jnp.isfinite(t1),
              "dt": lambda: (dt > 0) & jnp.isfinite(dt),
              "ts_t1": lambda: ts[-1] <= t1}
    valid = None
    for name in traced:
        valid = checks[name]() if valid is None else valid & checks[name]()
    if valid is not None:
        ts = jnp.where(valid, ts, jnp.ones_like(ts))
        dt = jnp.where(valid, dt, jnp.ones_like(dt))
    # rho0 is the density at t = 0 (the solve runs from 0 whatever ts[0])
    t0, t_end = jnp.zeros((), ts.dtype), ts[-1]
    if method == "heun":
        ctrl = diffrax.ConstantStepSize()
    else:
        ctrl = diffrax.PIDController(rtol=rtol, atol=atol)
    sol = diffrax.diffeqsolve(diffrax.ODETerm(model), METHODS[method](), t0, t_end, dt, rho0,
                              saveat=diffrax.SaveAt(ts=ts), stepsize_controller=ctrl,
                              max_steps=max_steps, throw=False)
    rho = sol.ys
    result = RESULTS.promote(sol.result)
    result = RESULTS.where((result == RESULTS.successful) & ~jnp.all(jnp.isfinite(rho)),
                           RESULTS.nonfinite, result)
    if valid is not None:
        result = RESULTS.where(valid, result, RESULTS.invalid_input)
    axes = tuple(range(1, rho.ndim))
    mass = jnp.sum(rho * model.cell_measure, axis=axes)
    stats = {"num_steps": sol.stats["num_steps"], "num_accepted_steps": sol.stats["num_accepted_steps"],
             "dt": dt,
             "mass_error": jnp.max(jnp.abs(mass - jnp.sum(rho0 * model.cell_measure))),
             "min_rho": jnp.min(rho), "mass": mass}
    return DensitySolution(ts=ts, rho=rho, result=result, stats=stats)


def _concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def solve_density(model, rho0, *, t1, ts=None, n_save=101, dt=None, cfl=0.9,
                  method="heun", max_steps=1_000_000, rtol=1e-8, atol=1e-12, throw=False):
    """Integrate ∂_t ρ = model(t, ρ) from the cell averages ``rho0`` at t = 0 to the last saved time.

    One ``diffrax.diffeqsolve`` in one jitted program. Runs under ``jax.jit`` and ``jax.vmap``
    with traced ρ0, model parameters (β, σ, Q, K, V), ``t1``, ``ts`` and ``dt`` (traced values
    out of range give the result code ``invalid_input``; concrete ones raise here), and
    ``jax.grad`` flows through it (diffrax's checkpointed adjoint).

    Args:
      model: a :class:`CircleDensity` or :class:`SphereDensity` (a stack of them under
        ``jax.vmap`` sweeps β, σ).
      rho0: (M,) (S¹) or (n_lat, n_lon) (S²) cell averages, finite and ≥ 0 (a probability
        density: h Σ ρ0 = 1 for the usual scaling).
      t1: the final time (> 0); with ``ts`` given, only checked (``ts`` must end at or before
        it).
      ts: saved times, non-decreasing, ≥ 0, the last > 0 (default: ``n_save`` times evenly
        spaced on [0, t1]; ``n_save = 1``: t1 alone). The solve runs from 0 to the last of them.
      n_save: number of saved times when ``ts`` is not given (an integer ≥ 1, static).
      dt: the step; default the positivity (CFL) step ``cfl_dt(model, cfl)`` (S²:
        ``sphere_cfl_dt``), which keeps ρ ≥ 0 with ``method="heun"`` (SSPRK2) and cfl ≤ 1. May
        be traced (under vmap each member takes its own step count; the loop runs until the
        slowest finishes).
      cfl: the CFL number of the default step.
      method: ``"heun"`` (fixed step, SSP, positivity-preserving), ``"tsit5"``/``"dopri5"``
        (adaptive, ``rtol``/``atol``; ``dt`` is the first step; positivity not guaranteed).
      max_steps: diffrax's bound on the number of steps (static, an integer ≥ 1).
      rtol: relative tolerance of the adaptive methods.
      atol: absolute tolerance of the adaptive methods.
      throw: raise (also under jit, through ``eqx.error_if``) if the solve is not successful.

    Dtypes: rho0 float32 or float64, float16 or bfloat16, or integers (all computed in the
    model's dtype); complex is refused (a TypeError naming ``rho0``).

    Returns:
      :class:`DensitySolution` (``ts``, ``rho`` (S, ...), ``result``, ``stats``).

    Raises:
      ValueError: an unknown method, ``rho0`` of the wrong shape, ``max_steps`` not an integer
        ≥ 1, or concrete inputs out of range (ρ0 negative or not finite, t1 ≤ 0, ``n_save``
        < 1, ``ts`` not valid or past t1, dt ≤ 0).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {tuple(METHODS)}, got {method!r}")
    max_steps = check_integer("max_steps", max_steps, minimum=1)
    check_dtype("rho0", rho0, half=True, fn="solve_density")
    dtype = model.beta.dtype
    check_dtype("model", model.beta, integers=False, fn="solve_density (the model's dtype: "
                "the FFT's)")
    # the inputs the program checks (traced: out-of-range values flagged); the others are
    # checked here, on the host
    traced = tuple(name for name, value in (
        ("rho0", rho0), ("model", (model.beta, model.sigma)), ("ts", t1 if ts is None else ts),
        ("t1", t1), ("dt", cfl if dt is None else dt),
        ("ts_t1", () if ts is None else (ts, t1)))
        if not all(map(_concrete, jax.tree.leaves(value))))
    if np.shape(rho0) != tuple(model.shape):
        raise ValueError(f"rho0 must have shape {tuple(model.shape)} (the model's grid), got {np.shape(rho0)}")
    if _concrete(rho0):
        r = np.asarray(rho0, dtype)
        if not np.all(np.isfinite(r)) or np.any(r < 0):
            raise ValueError("rho0 must be finite and >= 0 (cell averages of a density)")
    rho0 = jnp.asarray(rho0, dtype)
    if np.ndim(t1) != 0 or (_concrete(t1) and not (np.isreal(t1) and float(t1) > 0
                                                   and math.isfinite(float(t1)))):
        raise ValueError(f"t1 must be a number > 0, got {t1!r}")
    if ts is None:
        if isinstance(n_save, bool) or not isinstance(n_save, (int, np.integer)) or n_save < 1:
            raise ValueError(f"n_save must be an integer >= 1, got {n_save!r}")
        if _concrete(t1):
            t1 = float(t1)
            # n_save = 1: t1 alone (linspace gives t = 0, the input itself)
            ts = np.array([t1]) if n_save == 1 else np.linspace(0.0, t1, int(n_save))
        else:
            ts = t1[None] if n_save == 1 else jnp.linspace(0.0, t1, int(n_save))
    if np.ndim(ts) != 1 or np.shape(ts)[0] < 1:
        raise ValueError(f"ts must be a 1-D array of at least one time, got shape {np.shape(ts)}")
    # concrete times and step are checked here, on the host (a clear ValueError); traced ones
    # in the program (invalid_input). ``throw`` raises through the program, below
    if _concrete(ts):
        host_ts = np.asarray(ts, np.float64)
        if np.all(np.isfinite(host_ts)) and host_ts[-1] <= 0:
            raise ValueError(f"ts must end after t = 0 (rho0 is the density at t = 0), got {host_ts}")
        check_times(0.0, host_ts[-1], host_ts, dt if dt is not None and _concrete(dt) else None,
                     name="ts")
        if _concrete(t1) and host_ts[-1] > float(t1):
            raise ValueError(f"ts must end at or before t1 = {float(t1)!r} (the solve runs to the "
                             f"last saved time), got a last time {float(host_ts[-1])!r}; raise t1 or "
                             "drop the times after it")
    elif dt is not None and _concrete(dt) and not float(dt) > 0:
        raise ValueError(f"the step dt must be > 0, got {float(dt)!r}")
    if dt is None and _concrete(cfl) and not float(cfl) > 0:
        raise ValueError(f"cfl must be > 0, got {cfl!r}")
    ts = jnp.asarray(ts, dtype)
    t1 = jnp.asarray(t1, dtype)
    dt = None if dt is None else jnp.asarray(dt, dtype)
    cfl = jnp.asarray(cfl, dtype)
    sol = _solve(model, rho0, ts, t1, dt, cfl, method, int(max_steps), rtol, atol, traced)
    if throw:
        sol = eqx.tree_at(lambda s: s.rho, sol, error_if_failed(sol.rho, sol.result))
    return sol
