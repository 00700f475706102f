"""``simulate_sde``: noisy particle dynamics (docs/math.md §H.3).

On the sphere, each particle follows the Stratonovich SDE

    dx_i = f_i(t, x) dt + σ P⊥(x_i) ∘ dW_i,      W_i independent Brownian motions in R^d,

whose noise part is Brownian motion on S^{d−1} with generator (σ²/2) Δ_S (so that, with no
drift, E[x(t)] = x(0) exp(−σ²(d−1)t/2)). In R^d (Euclidean models, the pre-/peri-LN
placements) the noise is plain: dz_i = f_i dt + σ dW_i.

Methods:

* ``"geodesic_em"`` (default, fast, for sweeps): the geodesic Euler–Maruyama step
  x ← exp_x(dt f(t, x) + σ P⊥(x) ΔW), ΔW ~ N(0, dt I); on the sphere it stays on S^{d−1} by
  construction (|x_i| = 1 to round-off). Weak order 1 (measured in
  ``tests/test_variants_dynamics.py``).
* ``"heun"``, ``"midpoint"``: diffrax's Stratonovich solvers on a
  ``diffrax.VirtualBrownianTree`` (the reference; fixed step dt). Their states leave the
  sphere by the scheme's error (the exact flow keeps |x| = 1).

Keys: the Brownian increments of step k are drawn from ``fold_in(key, k)``, so a run is a
deterministic function of its key (reproducible, independent of ``save_every``); a sweep
passes one key per member (``jax.random.split`` or ``fold_in(key, member)``), which makes the
members' noises independent. ``sigma`` is an array leaf (traced: vmap over it to sweep σ).
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from .._results import RESULTS, error_if_failed
from ..integrators import geometry_of
from ..sphere import tangent_project
from ._simulate import (Trajectory, _check_x0, _plan, _x0_invalid, diffrax_trajectory, end_time,
                        fixed_step_trajectory,
                        trajectory_leaves, trajectory_program,
                        save_indices)

SDE_METHODS = ("geodesic_em", "heun", "midpoint")
_DIFFRAX_SDE = {"heun": diffrax.Heun, "midpoint": diffrax.Midpoint}


def _project(model):
    """The noise's projection: P⊥(x) on the sphere, the identity in R^d."""
    if getattr(model, "manifold", "euclidean") == "sphere":
        return tangent_project
    return lambda x, w: w


def _check_key(key):
    if not hasattr(key, "dtype") or not (
            jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
            or (key.dtype == jnp.uint32 and key.shape[-1:] == (2,))):
        raise ValueError(f"key must be a jax PRNG key (jax.random.PRNGKey or jax.random.key), "
                         f"got {type(key).__name__} {getattr(key, 'shape', '')}")


def simulate_sde(model, x0, key, *, sigma, t1, dt, t0=0.0, save_every=None, saveat=None,
                 method="geodesic_em", args=None, throw=False):
    """Integrate ``dx_i = model(t, x)_i dt + σ P⊥(x_i) ∘ dW_i`` from ``x0`` on [t0, t1].

    Args:
      model: a particle field (any :func:`jaxdyn.simulate` model); its ``manifold`` decides
        the noise (tangent on the sphere, plain in R^d).
      x0: (N, d) initial particles (unit rows for sphere models).
      key: a PRNG key; the run is a deterministic function of it.
      sigma: noise level σ >= 0 (scalar; may be traced, e.g. vmapped over a σ sweep).
      t1, dt, t0, save_every, saveat: as in :func:`jaxdyn.simulate` (fixed steps).
      method: ``"geodesic_em"`` | ``"heun"`` | ``"midpoint"`` (see the module docstring).
      throw: raise on an unsuccessful run instead of flagging it.

    Returns:
      :class:`jaxdyn.Trajectory` (``result``: ``successful`` or ``nonfinite``; a negative
      traced σ is flagged ``invalid_input``).
    """
    if method not in SDE_METHODS:
        raise ValueError(f"method must be one of {SDE_METHODS}, got {method!r}")
    _check_key(key)
    t0, t1, dt, n = _plan(t0, t1, dt)
    in_dtype = x0.dtype if hasattr(x0, "dtype") else np.asarray(x0).dtype
    x0 = _check_x0(model, x0)
    sigma = jnp.asarray(sigma, x0.dtype)
    if sigma.ndim != 0:
        raise ValueError(f"sigma must be a scalar, got shape {sigma.shape}; vmap to sweep σ")
    if not isinstance(sigma, jax.core.Tracer) and not bool(sigma >= 0):
        raise ValueError(f"sigma (noise level) must be >= 0, got {float(sigma)}")
    idx = save_indices(n, save_every, saveat, t0, dt)
    if method == "geodesic_em":
        traj = _run_gem(model, x0, key, sigma, args, t0, dt, idx)
    else:
        traj = _run_diffrax_sde(model, x0, key, sigma, args, t0, t1, dt, idx, method,
                                end_time(t0, t1, dt, n, idx))
    if isinstance(sigma, jax.core.Tracer):
        traj = eqx.tree_at(lambda t: t.result, traj,
                           RESULTS.where(sigma >= 0, traj.result, RESULTS.invalid_input))
    if isinstance(x0, jax.core.Tracer):
        # flagged, not raised, as in simulate: the concrete checks cannot run under jit/vmap
        traj = eqx.tree_at(lambda t: t.result, traj,
                           RESULTS.where(_x0_invalid(model, x0, in_dtype), RESULTS.invalid_input,
                                         traj.result))
    if throw:
        traj = error_if_failed(traj, traj.result)
    return traj


def gem_step(model, t, x, dt, sigma, key, args=None):
    """One geodesic Euler–Maruyama step exp_x(dt f(t, x) + σ P⊥(x) ΔW), ΔW ~ N(0, dt I) drawn
    from ``key`` (on R^d: x + dt f + σ ΔW)."""
    geom = geometry_of(model)
    dw = jnp.sqrt(dt) * jax.random.normal(key, x.shape, x.dtype)
    v = dt * model(t, x, args) + sigma * _project(model)(x, dw)
    return geom.exp(x, v)


def _run_gem_leaves(model, x0, key, sigma, args, t0, dt, idx):
    dtype = x0.dtype
    t0 = jnp.asarray(t0, dtype)
    dt_a = jnp.asarray(dt, dtype)

    def advance(x, k_start, n_steps):
        def body(x, k):
            t = t0 + k.astype(dtype) * dt_a
            return gem_step(model, t, x, dt_a, sigma, jax.random.fold_in(key, k), args), None

        x, _ = jax.lax.scan(body, x, k_start + jnp.arange(n_steps))
        return x

    return trajectory_leaves(fixed_step_trajectory(x0, idx, advance, t0, dt_a))


_run_gem = trajectory_program(_run_gem_leaves)


@eqx.filter_jit
def _run_diffrax_sde(model, x0, key, sigma, args, t0, t1, dt, idx, method, t_end):
    # the solve ends at the last saved time t_end (a saveat before t1 ran out of steps); the
    # Brownian path is the one on [t0, t1] (the same path as a run saved up to t1)
    ts = jnp.asarray(t0 + np.asarray(idx) * dt, x0.dtype)
    ts = ts.at[-1].set(t_end)
    proj = _project(model)
    struct = jax.ShapeDtypeStruct(x0.shape, x0.dtype)

    def diffusion(t, y, args):
        return lx.FunctionLinearOperator(lambda w: sigma * proj(y, w), struct)

    bm = diffrax.VirtualBrownianTree(t0, t1, tol=dt / 16, shape=struct, key=key)
    terms = diffrax.MultiTerm(diffrax.ODETerm(model), diffrax.ControlTerm(diffusion, bm))
    sol = diffrax.diffeqsolve(terms, _DIFFRAX_SDE[method](), t0, t_end, dt, x0, args=args,
                              saveat=diffrax.SaveAt(ts=ts),
                              stepsize_controller=diffrax.ConstantStepSize(),
                              max_steps=idx[-1] + 1, throw=False)
    return diffrax_trajectory(sol, ts)
