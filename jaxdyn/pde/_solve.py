"""``solve_density``: integrate the density on S¹ through diffrax, and the result type."""

from __future__ import annotations

import math

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_times
from .._results import RESULTS, Solution, error_if_failed, from_codes
from ._circle import CircleDensity, cfl_dt
from ._sphere2 import sphere_cfl_dt

__all__ = ["DensitySolution", "solve_density", "METHODS"]

METHODS = {"heun": diffrax.Heun, "tsit5": diffrax.Tsit5, "dopri5": diffrax.Dopri5}


class DensitySolution(Solution):
    """Saved densities of a mean-field solve on S¹ (a :class:`jaxdyn.Solution`).

    Attributes:
      ts: (S,) saved times.
      rho: (S, M) cell averages of ρ at those times (∫ρ dθ = h Σ_j ρ_j).
      result: ``successful``, ``nonfinite``, or diffrax's codes (``max_steps_reached``, ...).
      stats: ``num_steps``, ``num_accepted_steps``, ``dt`` (the step, fixed-step methods),
        ``mass_error`` (max over saved times of |mass − mass of rho0|), ``min_rho`` (min over saved ρ).
    """

    ts: jax.Array
    rho: jax.Array
    result: RESULTS
    stats: dict

    @property
    def mass(self):
        """(S,) total mass at each saved time (S¹: h Σ_j ρ_j; S²: Σ A_i ρ_ij)."""
        return self.stats["mass"]


@eqx.filter_jit
def _solve(model, rho0, ts, dt, method, max_steps, rtol, atol):
    # rho0 is the density at t = 0 (the solve ran from ts[0]: with ts = [t1] it integrated
    # nothing)
    t0, t1 = jnp.zeros((), ts.dtype), ts[-1]
    if method == "heun":
        ctrl = diffrax.ConstantStepSize()
    else:
        ctrl = diffrax.PIDController(rtol=rtol, atol=atol)
    sol = diffrax.diffeqsolve(diffrax.ODETerm(model), METHODS[method](), t0, t1, dt, rho0,
                              saveat=diffrax.SaveAt(ts=ts), stepsize_controller=ctrl,
                              max_steps=max_steps, throw=False)
    rho = sol.ys
    result = RESULTS.promote(sol.result)
    result = RESULTS.where((result == RESULTS.successful) & ~jnp.all(jnp.isfinite(rho)),
                           RESULTS.nonfinite, result)
    mass = jnp.sum(rho * model.cell_measure, axis=tuple(range(1, rho.ndim)))
    stats = {"num_steps": sol.stats["num_steps"], "num_accepted_steps": sol.stats["num_accepted_steps"],
             "dt": jnp.asarray(dt, rho0.dtype),
             "mass_error": jnp.max(jnp.abs(mass - jnp.sum(rho0 * model.cell_measure))),
             "min_rho": jnp.min(rho), "mass": mass}
    return DensitySolution(ts=ts, rho=rho, result=result, stats=stats)


def solve_density(model, rho0, *, t1, ts=None, n_save=101, dt=None, cfl=0.9,
                  method="heun", max_steps=1_000_000, rtol=1e-8, atol=1e-12, throw=False):
    """Integrate ∂_t ρ = model(t, ρ) from the cell averages ``rho0`` on [0, t1].

    Args:
      model: a :class:`CircleDensity` or :class:`SphereDensity` (a stack of them under
        ``jax.vmap`` sweeps β, σ).
      rho0: (M,) (S¹) or (n_lat, n_lon) (S²) cell averages (a probability density: h Σ ρ0 = 1 for the usual scaling).
      ts: saved times in [0, t1], non-decreasing (default: ``n_save`` times evenly spaced on
        [0, t1]; ``n_save = 1``: t1 alone). The solve runs from 0 to the last of them.
      dt: the step; default the positivity (CFL) step ``cfl_dt(model, cfl)``, which keeps
        ρ ≥ 0 with ``method="heun"`` (SSPRK2) and cfl ≤ 1. May be traced (under vmap each
        member takes its own step count; the loop runs until the slowest finishes).
      method: ``"heun"`` (fixed step, SSP, positivity-preserving), ``"tsit5"``/``"dopri5"``
        (adaptive, ``rtol``/``atol``; ``dt`` is the first step; positivity not guaranteed).
      throw: raise (also under jit) if the solve is not successful.

    Returns:
      :class:`DensitySolution` (``ts``, ``rho`` (S, M), ``result``, ``stats``).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {tuple(METHODS)}, got {method!r}")
    rho0 = jnp.asarray(rho0, model.beta.dtype)
    if rho0.shape != tuple(model.shape):
        raise ValueError(f"rho0 must have shape {tuple(model.shape)} (the model's grid), got {rho0.shape}")
    if not isinstance(rho0, jax.core.Tracer):
        r = np.asarray(rho0)
        if not np.all(np.isfinite(r)) or np.any(r < 0):
            raise ValueError("rho0 must be finite and >= 0 (cell averages of a density)")
    if isinstance(t1, jax.core.Tracer) or not (np.ndim(t1) == 0 and np.isreal(t1)
                                                and float(t1) > 0 and math.isfinite(float(t1))):
        raise ValueError(f"t1 must be a (concrete) number > 0, got {t1!r}")
    t1 = float(t1)
    if ts is None:
        if isinstance(n_save, bool) or not isinstance(n_save, (int, np.integer)) or n_save < 1:
            raise ValueError(f"n_save must be an integer >= 1, got {n_save!r}")
        # n_save = 1: t1 alone (linspace gave t = 0, the input itself)
        ts = np.array([t1]) if n_save == 1 else np.linspace(0.0, t1, int(n_save))
    ts = jnp.asarray(ts, rho0.dtype)
    if dt is None:
        dt = cfl_dt(model, cfl) if isinstance(model, CircleDensity) else sphere_cfl_dt(model, cfl)
    dt = jnp.asarray(dt, rho0.dtype)
    # concrete times and step are checked here, on the host (a clear ValueError); ``throw``
    # raises outside the program, below
    concrete = not isinstance(ts, jax.core.Tracer) and not isinstance(dt, jax.core.Tracer)
    if concrete:
        if float(ts[-1]) <= 0:
            raise ValueError(f"ts must end after t = 0 (rho0 is the density at t = 0), got {ts}")
        check_times(0.0, ts[-1], ts, dt, name="ts")
    sol = _solve(model, rho0, ts, dt, method, int(max_steps), rtol, atol)
    if throw:
        sol = eqx.tree_at(lambda s: s.rho, sol, error_if_failed(sol.rho, sol.result))
    return sol
