"""``simulate_sde``: noisy particle dynamics (docs/math.md §H.3), one ``diffeqsolve`` call.

On the sphere, each particle follows the Stratonovich SDE

    dx_i = f_i(t, x) dt + σ P⊥(x_i) ∘ dW_i,      W_i independent Brownian motions in R^d,

whose noise part is Brownian motion on S^{d−1} with generator (σ²/2) Δ_S (so that, with no
drift, E[x(t)] = x(0) exp(−σ²(d−1)t/2)). In R^d (Euclidean models, the pre-/peri-LN
placements) the noise is plain: dz_i = f_i dt + σ dW_i.

The methods:

* ``"geodesic_em"`` (default, fast, for sweeps): the geodesic Euler–Maruyama step
  x ← exp_x(dt f(t, x) + σ P⊥(x) ΔW), ΔW ~ N(0, dt I)
  (:class:`~jaxdyn.integrators.GeodesicEulerMaruyama`); on the sphere it stays on S^{d−1} by
  construction (|x_i| = 1 to round-off). Weak order 1 (measured in
  ``tests/test_variants_dynamics.py``). Its Brownian increments come from
  :class:`GridBrownianPath`.
* ``"heun"``, ``"midpoint"``: diffrax's Stratonovich solvers on a
  ``diffrax.VirtualBrownianTree`` (the reference; fixed step dt). Their states leave the
  sphere by the scheme's error (the exact flow keeps |x| = 1).
* a diffrax solver object: a scheme of :mod:`jaxdyn.integrators` steps on the grid with
  :class:`GridBrownianPath` (as ``"geodesic_em"``); any other diffrax solver as ``"heun"``.

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

from ..choices import SDE_METHODS  # the method names simulate_sde takes (one source)
from ..integrators import AbstractIntegrator, GeodesicEulerMaruyama, GridODETerm
from ..sphere import tangent_project
from ._simulate import (_adjoint, _check_x0, _trajectory, diffrax_trajectory,
                        end_time, finish, flag_invalid, invalid_parameters, plan_steps, save_indices,
                        solver_of, step_grid)

_SDE_SOLVERS = {"geodesic_em": GeodesicEulerMaruyama, "heun": diffrax.Heun,
                "midpoint": diffrax.Midpoint}


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


class GridBrownianPath(diffrax.AbstractBrownianPath):
    """Brownian increments on a step grid: step k's increment is drawn from ``fold_in(key, k)``.

        W(t_{k+1}) − W(t_k) = √dt · N(0, I),   the normal draw from ``fold_in(key, k)``

    A run is then a deterministic function of its key, whatever the saving, and each step
    costs one draw (no tree of increments). It answers increments over one step of its grid
    only (``evaluate(t_k, t_{k+1})``: the step is found by its start time), which is how a
    fixed-step solver on ``diffrax.StepTo`` over that grid asks for them.

    Attributes:
      shape: the increments' shape and dtype.
      key: the PRNG key.
      grid: the step grid t_0 < t_1 < ... (the solver's ``StepTo`` times).
      dt: the grid's step (the increments' variance).
      levy_area: ``diffrax.BrownianIncrement`` (no Lévy area).
    """

    shape: jax.ShapeDtypeStruct = eqx.field(static=True)
    key: jax.Array
    grid: jax.Array
    dt: jax.Array
    levy_area: type = eqx.field(static=True, default=diffrax.BrownianIncrement)

    @property
    def t0(self):
        """The grid's first time."""
        return self.grid[0]

    @property
    def t1(self):
        """The grid's last time."""
        return self.grid[-1]

    def evaluate(self, t0, t1=None, left=True, use_levy=False):
        """The increment over the grid step that starts at ``t0``.

        Args:
          t0: the step's start (a time of the grid).
          t1: the step's end (the next time of the grid).
          left: ignored (Brownian motion has no jumps).
          use_levy: return a ``diffrax.BrownianIncrement`` instead of the array.

        Returns:
          ``√dt · N(0, I)`` drawn from ``fold_in(key, k)``, k the step's index.

        Raises:
          ValueError: no ``t1`` (the path gives increments, not values).
        """
        del left
        if t1 is None:
            raise ValueError("GridBrownianPath gives the increments over steps of its grid; "
                             "call evaluate(t_k, t_k+1)")
        k = jnp.searchsorted(self.grid, t0)
        w = jnp.sqrt(self.dt) * jax.random.normal(jax.random.fold_in(self.key, k),
                                                  self.shape.shape, self.shape.dtype)
        if use_levy:
            return diffrax.BrownianIncrement(dt=t1 - t0, W=w)
        return w


def simulate_sde(model, x0, key, *, sigma, t1, dt, t0=0.0, save_every=None, saveat=None,
                 method="geodesic_em", args=None, adjoint=None, throw=False):
    """Integrate ``dx_i = model(t, x)_i dt + σ P⊥(x_i) ∘ dW_i`` from ``x0`` on [t0, t1].

    Args:
      model: a particle field (any :func:`jaxdyn.simulate` model); its ``manifold`` decides
        the noise (tangent on the sphere, plain in R^d).
      x0: (N, d) initial particles (unit rows for sphere models).
      key: a PRNG key; the run is a deterministic function of it.
      sigma: noise level σ >= 0 (scalar; may be traced, e.g. vmapped over a σ sweep).
      t1: the end time (a Python number).
      dt: the step (a Python number; rounded so that the steps tile [t0, t1]).
      t0: the start time.
      save_every: save every k steps (as in :func:`jaxdyn.simulate`).
      saveat: or times on the step grid.
      method: ``"geodesic_em"`` | ``"heun"`` | ``"midpoint"`` or a diffrax solver object
        (see the module docstring).
      args: passed to the model.
      adjoint: how ``jax.grad`` differentiates the solve (as in :func:`jaxdyn.simulate`).
      throw: raise on an unsuccessful run instead of flagging it.

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to the float dtype
    of the model's parameters; complex is refused (a TypeError naming ``x0``).

    Returns:
      :class:`jaxdyn.Trajectory` (``result``: ``successful`` or ``nonfinite``; a negative
      traced σ, an invalid traced x0 or a traced model parameter outside its domain,
      ``model.invalid()``, is flagged ``invalid_input``).

    Raises:
      ValueError: a bad method, key, times, shapes or σ, a concrete x0 that is non-finite or
        off the sphere, or a concrete model parameter outside its domain.
    """
    if isinstance(method, str):
        if method not in SDE_METHODS:
            raise ValueError(f"method must be one of {SDE_METHODS} or a diffrax solver, "
                             f"got {method!r}")
        solver = _SDE_SOLVERS[method]()
    else:
        solver, _ = solver_of(method, SDE_METHODS)
    _check_key(key)
    t0, t1, dt, n = plan_steps(t0, t1, dt)
    in_dtype = x0.dtype if hasattr(x0, "dtype") else np.asarray(x0).dtype
    x0 = _check_x0(model, x0)
    bad_params = invalid_parameters(model)
    sigma = jnp.asarray(sigma, x0.dtype)
    if sigma.ndim != 0:
        raise ValueError(f"sigma must be a scalar, got shape {sigma.shape}; vmap to sweep σ")
    if not isinstance(sigma, jax.core.Tracer) and not bool(np.asarray(sigma) >= 0):
        raise ValueError(f"sigma (noise level) must be >= 0, got {float(np.asarray(sigma))}")
    idx = save_indices(n, save_every, saveat, t0, dt)
    if isinstance(solver, AbstractIntegrator):
        solver = solver.on(model)
        traj = _solve_grid_sde(solver, solver.field_of(model), _project(model), x0, key, sigma,
                               args, t0, dt, idx, _adjoint(adjoint))
    else:
        traj = _solve_tree_sde(solver, model, _project(model), x0, key, sigma, args, t0, t1, dt,
                               idx, end_time(t0, t1, dt, n, idx), _adjoint(adjoint))
    if isinstance(sigma, jax.core.Tracer):
        traj = flag_invalid(traj, ~(sigma >= 0))
    return finish(traj, model, x0, in_dtype, bad_params, throw)


def _diffusion(sigma, proj, struct):
    """The diffusion σ P⊥(y) as a linear operator on the Brownian increment."""
    def diffusion(t, y, args):
        return lx.FunctionLinearOperator(lambda w: sigma * proj(y, w), struct)

    return diffusion


@eqx.filter_jit
def _solve_grid_sde(solver, field, proj, x0, key, sigma, args, t0, dt, idx, adjoint):
    """A fixed-step scheme on the grid t0 + k dt with :class:`GridBrownianPath` increments."""
    m = idx[-1]
    grid = step_grid(t0, dt, m, x0.dtype)
    ts = grid[np.asarray(idx)]
    if m == 0:  # only t0 saved: nothing to integrate
        return _trajectory(jnp.asarray(ts), x0[None], jnp.asarray(0))
    struct = jax.ShapeDtypeStruct(x0.shape, x0.dtype)
    dt_a = jnp.asarray(dt, x0.dtype)
    bm = GridBrownianPath(struct, key, jnp.asarray(grid), dt_a)
    terms = diffrax.MultiTerm(GridODETerm(field, dt_a),
                              diffrax.ControlTerm(_diffusion(sigma, proj, struct), bm))
    sol = diffrax.diffeqsolve(terms, solver, t0, float(grid[-1]), None, x0, args=args,
                              saveat=diffrax.SaveAt(ts=ts),
                              stepsize_controller=diffrax.StepTo(grid), max_steps=m,
                              adjoint=adjoint, throw=False)
    return diffrax_trajectory(sol, sol.ts)


@eqx.filter_jit
def _solve_tree_sde(solver, model, proj, x0, key, sigma, args, t0, t1, dt, idx, t_end, adjoint):
    """A diffrax SDE solver on a ``VirtualBrownianTree`` over [t0, t1], fixed step dt."""
    # the solve ends at the last saved time t_end (a saveat before t1 ran out of steps); the
    # Brownian path is the one on [t0, t1] (the same path as a run saved up to t1)
    ts = jnp.asarray(t0 + np.asarray(idx) * dt, x0.dtype)
    ts = ts.at[-1].set(t_end)
    struct = jax.ShapeDtypeStruct(x0.shape, x0.dtype)
    bm = diffrax.VirtualBrownianTree(t0, t1, tol=dt / 16, shape=struct, key=key)
    terms = diffrax.MultiTerm(diffrax.ODETerm(model),
                              diffrax.ControlTerm(_diffusion(sigma, proj, struct), bm))
    sol = diffrax.diffeqsolve(terms, solver, t0, t_end, dt, x0, args=args,
                              saveat=diffrax.SaveAt(ts=ts),
                              stepsize_controller=diffrax.ConstantStepSize(),
                              max_steps=idx[-1] + 1, adjoint=adjoint, throw=False)
    return diffrax_trajectory(sol, ts)

