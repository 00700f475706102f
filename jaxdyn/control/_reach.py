"""``reach``: optimised time-varying controls that steer N(m0, S0) to N(m1, S1)."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Mapping, Optional, Sequence, Union

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..distances import bures_w2_squared
from .._results import (RESULTS, Solution, stat, code, from_codes, raise_if_failed, status_code,
                        status_names)
from ..gaussian._solve import Control, moment_rhs, solve_moments
from ..integrators.dopri8 import DOPRI8
from ._certificate import Certificate, certificate
from ._problem import (_energy_values, controlled_moments, CONTROL_NAMES, _ALL_FREE, _check_problem, _ranks)


# ---------------------------------------------------------------------------------------
# Controlled moment solve, energy
# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# The optimisation problem
# ---------------------------------------------------------------------------------------


class _Problem(eqx.Module):
    """Arrays of one reachability problem; ``kind`` static. Modes differ only in arrays
    (mask, bound, weight), so every mode shares one compiled loss per (d, n, dtype)."""

    m0: jax.Array
    S0: jax.Array
    m1: jax.Array
    S1: jax.Array
    t1: jax.Array
    mask: jax.Array      # (4,) 1 = free, 0 = fixed, order CONTROL_NAMES
    fixed: tuple         # values for the fixed controls
    bound: jax.Array     # (4,) Frobenius bound per control (inf = none)
    weight: jax.Array    # energy weight λ
    kind: str = eqx.field(static=True)


class _Opts(eqx.Module):
    rtol: float = eqx.field(static=True)
    atol: float = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    solver: Optional[diffrax.AbstractSolver] = eqx.field(static=True)
    steps_per_piece: int = eqx.field(static=True, default=2)


# The blow-up threshold of solve_moments' default: a trial whose ‖Σ‖_F passes it is rejected.
_THRESHOLD = 1e6
# reach halves the fixed steps (doubles steps_per_piece) while the step-error check alone
# fails a trial, up to this many steps a piece; beyond, the trial is rejected.
_MAX_STEPS_PER_PIECE = 64
# A trial that fails the step-error check alone is first treated as a rejected trial: the
# L-BFGS line search backtracks, an Adam update is halved towards the accepted iterate (whose
# solve passed the check at this count). Only when this many halvings in a row did not bring a
# trial within the check are the steps refined (the accepted iterate is then evaluated again
# at the new count, since the losses compared must come from one step count).
_TOO_LONG_BACKTRACKS = 3
# Re-coarsening (L-BFGS phase): after _COARSEN_AFTER accepted iterations at one count, an
# accepted iterate whose largest step-error ratio (error estimate / tolerance) is below
# _COARSEN_BELOW is solved again at half the count (not below the initial steps_per_piece),
# which is kept if that solve passes. Dopri8's error estimate scales as h^8 a step, so the
# ratio after halving is predicted ≈ 256 · _COARSEN_BELOW ≈ 0.26 — a margin of 4 below the
# refinement threshold 1, and refinement also needs 3 failed halvings: no oscillation.
_COARSEN_BELOW = 1e-3
_COARSEN_AFTER = 3


def _fixed_step_moments(vals, prob: _Problem, opts: _Opts):
    """``(m, Σ, ok, too_long)`` of :func:`_fixed_step_solve`."""
    return _fixed_step_solve(vals, prob, opts)[:4]


def _fixed_step_solve(vals, prob: _Problem, opts: _Opts):
    r"""The moment ODE under piecewise-constant (or piecewise-linear) controls by fixed
    Dopri8 steps, ``steps_per_piece`` a piece, all stages of all steps in one ``lax.scan``
    (one copy of the right-hand side in the program, and in its gradient). Steps never straddle a piece boundary, so each step sees smooth controls
    and keeps the method's order 8. Returns ``(m, Σ, ok, too_long)``: ``ok`` is False when the
    state turned non-finite, ``‖Σ‖_F`` passed ``1e6 · max(‖Σ0‖_F, 1)`` (the blow-up threshold
    of :func:`solve_moments`), or a step's embedded error estimate exceeded the tolerances
    ``(rtol, atol)``; ``too_long`` is True when that last reason alone failed the solve (the
    steps were too long for these controls: :func:`reach` then halves the steps and solves
    again, as an adaptive solve would shorten its step). A fifth output: the largest
    step-error ratio (RMS of error estimate / (atol + rtol |y|)) over the steps."""
    A, B, V, b = vals
    linear = prob.kind == "linear"
    n = A.shape[0] - 1 if linear else A.shape[0]
    steps = opts.steps_per_piece
    dt_piece = prob.t1 / n
    h = dt_piece / steps
    dtype = prob.S0.dtype
    S0 = prob.S0
    thr = _THRESHOLD * jnp.maximum(jnp.sqrt(jnp.sum(S0 * S0)), 1.0)
    ncomp = S0.shape[0] * (S0.shape[0] + 1)
    sg = jax.lax.stop_gradient

    # One scan over every stage of every step (13 a step: Dopri8 without its FSAL stage,
    # whose weight is 0): one evaluation of the right-hand side a body, no nested loops.
    # The stage derivatives of the current step sit in K; a stage's argument is the
    # contraction of its row of the tableau with K (the rows are zero beyond the stage, so
    # the entries left from the previous step enter as 0 · k); after the last stage the
    # step's new state and error estimate are taken from K the same way.
    nk = len(DOPRI8.b) - 1
    rows = np.zeros((nk, nk))
    for j in range(1, nk):
        rows[j, :j] = DOPRI8.a[j - 1]
    rows, ends = jnp.asarray(rows, dtype), jnp.asarray([DOPRI8.b[:nk], DOPRI8.e[:nk]], dtype)
    nodes = jnp.asarray(DOPRI8.c[:nk], dtype)

    def dot(r, Kl):
        return jnp.tensordot(r, Kl, axes=1, precision=jax.lax.Precision.HIGHEST)

    def stage(c, idx):
        y, K, bad, err, emax = c
        j, i = idx % nk, idx // nk
        k = i // steps
        par = [x[k] for x in vals]
        if linear:  # controls linear in the time since the piece's start
            w = ((i - k * steps).astype(dtype) + nodes[j]) * h / dt_piece
            par = [a + w * (x[k + 1] - a) for a, x in zip(par, vals)]
        yj = [yl + h * dot(rows[j], Kl) for yl, Kl in zip(y, K)]
        K = [Kl.at[j].set(kl) for Kl, kl in zip(K, moment_rhs(*yj, *par))]
        out = [dot(ends, Kl) for Kl in K]
        y1 = [yl + h * o[0] for yl, o in zip(y, out)]
        tot = 0.0
        for y0_, y1_, o in zip(y, y1, out):
            sc = opts.atol + opts.rtol * jnp.maximum(jnp.abs(sg(y0_)), jnp.abs(sg(y1_)))
            tot = tot + jnp.sum((h * sg(o[1]) / sc) ** 2)
        S1 = sg(y1[1])
        last = j == nk - 1
        big = ~(jnp.sqrt(jnp.sum(S1 * S1)) < thr)
        ratio = jnp.sqrt(tot / ncomp)
        long_ = ~(ratio <= 1.0)
        emax = jnp.where(last, jnp.maximum(emax, ratio), emax)
        bad = bad | (last & big)
        err = err | (last & long_)
        y = [jnp.where(last, a1, a0) for a0, a1 in zip(y, y1)]
        return (y, K, bad, err, emax), None

    K0 = [jnp.zeros((nk,) + x.shape, dtype) for x in (prob.m0, S0)]
    false = jnp.zeros((), bool)
    (y, _, bad, err, emax), _ = jax.lax.scan(jax.checkpoint(stage), ([prob.m0, S0], K0, false, false,
                                                                    jnp.zeros((), dtype)),
                                       jnp.arange(n * steps * nk))
    m, S = y
    finite = jnp.all(jnp.isfinite(S)) & jnp.all(jnp.isfinite(m))
    ok = ~bad & ~err & finite
    return m, S, ok, err & ~bad & finite, emax


def _squash(w, c):
    r"""Radial squash ``w ↦ c tanh(‖w‖/c) w/‖w‖`` per piece (``‖·‖`` Frobenius): ``‖u‖ < c``."""
    flat = w.reshape(w.shape[0], -1)
    r = jnp.sqrt(jnp.sum(flat * flat, axis=-1) + jnp.finfo(w.dtype).tiny)
    bounded = jnp.isfinite(c)
    cs = jnp.where(bounded, c, 1.0)
    fac = jnp.where(bounded, cs * jnp.tanh(r / cs) / r, 1.0)
    return w * fac.reshape((-1,) + (1,) * (w.ndim - 1))


def _unsquash(u, c):
    """Inverse of :func:`_squash` (norms at or beyond the bound are first pulled to 0.95 c)."""
    if not np.isfinite(c):
        return u
    flat = u.reshape(u.shape[0], -1)
    r = np.sqrt(np.sum(flat * flat, axis=-1))
    rr = np.minimum(r, 0.95 * c)
    w = np.where(r > 0, c * np.arctanh(rr / c) / np.where(r > 0, r, 1.0), 0.0)
    return u * w.reshape((-1,) + (1,) * (u.ndim - 1))


def _physical(raw, prob: _Problem):
    out = []
    for i, name in enumerate(CONTROL_NAMES):
        u = _squash(raw[name], prob.bound[i])
        out.append(prob.mask[i] * u + (1 - prob.mask[i]) * prob.fixed[i])
    return out


def _loss(raw, prob: _Problem, opts: _Opts):
    vals = _physical(raw, prob)
    if opts.solver is None:
        m, S, ok, too_long, emax = _fixed_step_solve(vals, prob, opts)
        status = jnp.where(ok, status_code("successful"),
                           jnp.where(too_long, status_code("max_steps_reached"), status_code("nonfinite")))
    else:
        ctr = {k: Control(v, prob.t1, prob.kind) for k, v in zip(CONTROL_NAMES, vals)}
        sol = solve_moments(prob.m0, prob.S0, A=ctr["A"], B=ctr["B"], V=ctr["V"], b=ctr["b"],
                            t1=prob.t1, rtol=opts.rtol, atol=opts.atol, solver=opts.solver,
                            max_steps=opts.max_steps)
        m, S, status = sol.mean_final, sol.cov_final, sol.status
        ok = status == status_code("successful")
        emax = jnp.zeros((), S.dtype)
    w2sq = bures_w2_squared(m, S, prob.m1, prob.S1)
    energy = sum(prob.mask[i] * _energy_values(v, prob.kind, prob.t1) for i, v in enumerate(vals))
    loss = w2sq + prob.weight * energy
    nan = jnp.asarray(jnp.nan, loss.dtype)
    return jnp.where(ok, loss, nan), (jnp.where(ok, w2sq, nan), energy, status, emax)


@eqx.filter_jit
def _value_and_grad(raw, prob, opts):
    """``(scalars, grad)``: scalars = [loss, W2², energy, ok, too_long, error ratio] (ok:
    finite loss and grad; too_long: the fixed-step solve failed only on its step-error check;
    the fixed-step solve's largest step-error ratio, 0 with a diffrax solver)."""
    (v, (w2sq, en, status, emax)), g = jax.value_and_grad(_loss, has_aux=True)(raw, prob, opts)
    ok = jnp.isfinite(v)
    for leaf in jax.tree.leaves(g):
        ok = ok & jnp.all(jnp.isfinite(leaf))
    too_long = (status == status_code("max_steps_reached")) if opts.solver is None else jnp.zeros((), bool)
    return jnp.stack([v, w2sq, en, ok.astype(v.dtype), too_long.astype(v.dtype), emax.astype(v.dtype)]), g


@eqx.filter_jit
def _adam_step(adam, g, state, raw):
    u, state = adam.update(g, state, raw)
    return optax.apply_updates(raw, u), state


class _LBFGS:
    """The L-BFGS two-loop recursion of ``optax.scale_by_lbfgs`` (memory 10, initial scale
    ``⟨s, y⟩/⟨y, y⟩`` of the newest pair, ``min(1, 1/‖g‖)`` on the first step) on the host,
    in numpy on the flat parameter vector: the direction costs microseconds there, and a
    jitted one cost a compilation on every first call. Immutable: :meth:`direction`
    returns the updated memory."""

    def __init__(self, size: int = 10, pairs=(), last=None):
        self.size, self.pairs, self.last = size, tuple(pairs), last

    def direction(self, g, x):
        """``(d, ⟨g, d⟩, memory)``: the descent direction at ``x`` with gradient ``g``,
        after adding the pair ``(x − x_prev, g − g_prev)`` to the memory."""
        pairs = self.pairs
        if self.last is None:
            gn = float(np.linalg.norm(g))
            gamma = 1.0 if gn == 0 else min(1.0, 1.0 / gn)
        else:
            s, y = x - self.last[0], g - self.last[1]
            sy, yy = float(y @ s), float(y @ y)
            pairs = (pairs + ((s, y, 0.0 if sy == 0 else 1.0 / sy),))[-self.size:]
            gamma = sy / yy if yy > 0 else 1.0
        q = g.copy()
        alphas = []
        for s, y, rho in reversed(pairs):
            a = rho * float(s @ q)
            alphas.append(a)
            q -= a * y
        r = gamma * q
        for (s, y, rho), a in zip(pairs, reversed(alphas)):
            r += s * (a - rho * float(y @ r))
        return -r, float(g @ -r), _LBFGS(self.size, pairs, (x, g))


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(tree)])


def _unflat(vec, like):
    leaves, treedef = jax.tree.flatten(like)
    out, i = [], 0
    for x in leaves:
        out.append(vec[i:i + x.size].reshape(x.shape))
        i += x.size
    return jax.tree.unflatten(treedef, out)


_physical_jit = eqx.filter_jit(_physical)


@eqx.filter_jit
def _axpy(step, x, y):
    return jax.tree.map(lambda a, b: a + step * b, x, y)


@functools.lru_cache(maxsize=32)
def _adam(lr: float):
    # One transformation object per learning rate, so that the jitted step is reused.
    return optax.apply_if_finite(optax.adam(lr), max_consecutive_errors=10**9)


class ReachResult(Solution):
    r"""Result of :func:`reach` (a :class:`jaxdyn.Solution` pytree).

    Attributes:
      controls: ``{"A", "B", "V", "b"}`` → :class:`Control` (fixed ones included).
      w2: Bures W2 at t1 from an independent tight solve (``controlled_moments``: Dopri8,
        rtol 1e-11 in float64) — the number to quote; NaN if that solve failed.
      w2_optimizer: W2 at the optimiser's own solve (its tolerances).
      w2_mean, w2_cov: ``|m(t1) − m1|`` and the Bures distance of the covariances alone.
      energy: ``∫ Σ_{free u} ‖u‖_F² dt``.
      loss_history, w2_history: per optimiser iteration (NaN for rejected trials).
      result: :class:`jaxdyn.RESULTS`: ``successful`` (``w2 < tol``), ``not_converged``
        (the verification solve succeeded but ``w2 >= tol``), or the verification solve's
        own status (``blowup``, ``large``, ``nonfinite``, ``max_steps_reached``, ...; W2 is
        then NaN). Read ``.ok``, ``.status``, ``.messages``.
      certificate: the :class:`Certificate` (None if not computed).
      rank: numerical rank of S0 and S1. free, bound, energy_weight: the mode's settings.
      stats: ``iterations`` (optimiser iterations), ``evaluations`` (loss evaluations),
        ``rejected`` (trials whose solve failed: blow-up / non-finite / step-error check,
        rejected and retreated), ``step_backtracks`` (of those, the halvings after the
        step-error check alone failed), ``step_coarsenings`` (re-coarsenings), ``seconds`` (wall time of the optimisation, compilation
        included), ``steps_per_piece`` (the fixed-step solve's final count; None with a
        diffrax solver), ``step_refinements`` (how often it was doubled; also as
        attributes of the same names) and ``steps_history`` (per ``loss_history`` entry, the
        ``steps_per_piece`` of the solve behind it; 0 with a diffrax solver).
      message: a summary of the run.
    """

    controls: dict
    w2: float
    w2_optimizer: float
    w2_mean: float
    w2_cov: float
    energy: float
    loss_history: np.ndarray
    w2_history: np.ndarray
    result: RESULTS
    certificate: Optional[Certificate]
    bound: Optional[dict]
    stats: dict
    rank: int = eqx.field(static=True)
    free: tuple = eqx.field(static=True)
    energy_weight: float = eqx.field(static=True)
    energy_weight_final: float = eqx.field(static=True)
    message: str = eqx.field(static=True)

    @property
    def converged(self) -> bool:
        """``w2 < tol`` (the same as ``bool(self.ok)``)."""
        return bool(self.ok)

    iterations = stat("iterations")

    evaluations = stat("evaluations")

    rejected = stat("rejected")

    seconds = stat("seconds")

    steps_per_piece = stat("steps_per_piece")

    step_refinements = stat("step_refinements")


def _as_values(u, n, shape, dtype, t1, kind):
    """Constant array or Control → values on this reach grid (n, *shape)."""
    if isinstance(u, Control):
        if u.kind == kind and u.n == n:
            return np.asarray(u.values, np.float64)
        grid = _grid_times(n, t1, kind)
        return np.stack([np.asarray(u(jnp.asarray(t, u.dtype)), np.float64) for t in grid])
    u = np.asarray(u, np.float64)
    if u.shape != tuple(shape):
        raise ValueError(f"a fixed control must have shape {tuple(shape)} or be a Control, got {u.shape}")
    return np.broadcast_to(u, (n,) + tuple(shape)).copy()


def _grid_times(n, t1, kind):
    if kind == "piecewise":
        return (np.arange(n) + 0.5) * t1 / n
    return np.linspace(0.0, t1, n)


def reach(m0, S0, m1, S1, *, t1=1.0, n_pieces: int = 8, free: Sequence[str] = _ALL_FREE,
          kind: str = "piecewise", fixed: Optional[Mapping] = None,
          bound: Union[None, float, Mapping] = None, energy_weight: float = 0.0,
          init: Union[str, Mapping] = "auto", init_scale: float = 0.1, seed: int = 0,
          adam_steps: int = 0, adam_lr: float = 0.02, lbfgs_steps: int = 500,
          tol: float = 1e-4, stop_factor: float = 0.1, rtol=None, atol=None,
          solver: Optional[diffrax.AbstractSolver] = None, max_steps: int = 4096,
          steps_per_piece: int = 2,
          energy_continuation: bool = True, max_energy_stages: int = 6,
          energy_stage_steps: int = 100,
          rank_rtol: Optional[float] = None, with_certificate: bool = True,
          verify: bool = True, callback=None, throw: bool = False) -> ReachResult:
    r"""Optimise time-varying controls that steer ``N(m0, S0)`` to ``N(m1, S1)`` at ``t1``.

    Minimises ``W2²(N(m(t1), Σ(t1)), N(m1, S1)) + λ ∫ Σ_{free u} ‖u‖_F² dt`` over the free
    controls (moment ODE of docs/math.md §B.2, gradients through a fixed-step Dopri8 solve,
    or :func:`solve_moments` with a diffrax ``solver``).

    Args:
      m0, m1: (d,) means (None = 0). S0, S1: (d, d) PSD covariances. A target whose
        numerical rank differs from S0's raises ``ValueError`` (rank is invariant).
      t1: horizon. n_pieces: pieces of the uniform grid (``kind="linear"``: n_pieces + 1
        nodes, linear interpolation). free: subset of ``("A", "b", "V", "B")``.
      fixed: values of the non-free controls (arrays or Controls; default 0).
      bound: None, a float, or ``{name: c}``: ``‖u(t)‖_F ≤ c`` for each (free) control,
        by the radial reparametrisation ``u = c tanh(‖w‖/c) w/‖w‖`` per piece.
      energy_weight: λ ≥ 0 of the control energy. With ``energy_continuation`` the
        penalty optimum at λ is followed by stages at λ/10, λ/100, … (at most
        ``max_energy_stages``, then one at λ = 0) until W2 ≤ stop_factor · tol: an approximately minimal
        energy among reaching controls (each stage at most ``energy_stage_steps`` L-BFGS
        iterations). ``energy_weight_final`` reports the last λ.
      init: ``"auto"`` (the certificate when A and b are free and it fits the grid, else
        ``"random"``), ``"certificate"``, ``"zero"``, ``"random"`` (N(0, init_scale²)
        entries, ``seed``), or a mapping ``{name: array/Control}`` (warm start).
      adam_steps, adam_lr: optional Adam phase first (``optax.apply_if_finite(optax.adam)``;
        default 0 steps: L-BFGS alone was faster on random targets).
      lbfgs_steps: L-BFGS phase (``optax.scale_by_lbfgs`` directions, Armijo backtracking).
      tol: success threshold on W2; the optimiser stops when its W2 ≤ ``stop_factor · tol``
        (when λ = 0) or when it stalls.
      rtol, atol, solver, max_steps, steps_per_piece: the optimiser's solve. Default
        (``solver=None``): fixed Dopri8 steps, ``steps_per_piece`` a piece, whose embedded
        error estimate must stay within ``rtol, atol`` (defaults 1e-9/1e-11 in float64,
        1e-5/1e-7 in float32) at every step; when that check alone fails a trial, the trial
        is first rejected like any other (the L-BFGS line search backtracks; an Adam update
        is halved towards the accepted iterate, which passed the check), and only after 3
        such halvings in a row are the steps halved (``steps_per_piece`` doubled, up to 64)
        for it and every later trial (the current iterate is then evaluated again at the new
        count, and an L-BFGS line search restarts from it with an empty memory, so that
        losses are only compared at one step count); in the L-BFGS phase, after 3 accepted
        iterations at one count, an accepted iterate whose step-error ratio is below 1e-3 is
        solved again at half the count (never below ``steps_per_piece``), kept if that solve
        passes (``stats["step_coarsenings"]``); beyond 64, or on a blow-up /
        non-finite state, the trial is rejected (a small
        program: its first call compiles in a fraction of an adaptive solve's). A diffrax solver
        (e.g. ``diffrax.Tsit5()``) selects :func:`solve_moments` instead (adaptive, at most
        ``max_steps`` steps). The result is then re-checked by an independent adaptive
        Dopri8 solve at rtol 1e-11 (``verify``).
      rank_rtol: numerical-rank cut (default sqrt(eps)). with_certificate: compute the
        :class:`Certificate` (A free or not) and return it.
      callback: ``callback(iteration, loss, w2)`` on the host after each iteration.
      throw: if True, raise ``RuntimeError`` with the status message when the result is not
        ``successful`` (target not reached, or the verification solve failed); default
        False (read ``result.ok`` / ``result.message``).

    Returns: :class:`ReachResult`. Float64 is advised (``jax_enable_x64``): W2 < 1e-4 means
    W2² < 1e-8, near float32 resolution.
    """
    t_start = time.perf_counter()
    m0, S0, m1, S1 = _check_problem(m0, S0, m1, S1)
    dtype = S0.dtype
    d = S0.shape[0]
    if not float(t1) > 0:
        raise ValueError(f"t1 must be > 0, got {t1}")
    t1 = float(t1)
    if isinstance(n_pieces, bool) or not isinstance(n_pieces, (int, np.integer)) or n_pieces < 1:
        raise ValueError(f"n_pieces must be an integer >= 1, got {n_pieces!r}")
    n_pieces = int(n_pieces)
    if kind not in ("piecewise", "linear"):
        raise ValueError(f"kind must be 'piecewise' or 'linear', got {kind!r}")
    free = tuple(free)
    if not free or any(f not in CONTROL_NAMES for f in free) or len(set(free)) != len(free):
        raise ValueError(f"free must be a non-empty subset of {_ALL_FREE} without repeats, got {free!r}")
    if not float(energy_weight) >= 0:
        raise ValueError(f"energy_weight must be >= 0, got {energy_weight}")
    if bound is None:
        bounds = {k: math.inf for k in CONTROL_NAMES}
    elif isinstance(bound, Mapping):
        unknown = set(bound) - set(CONTROL_NAMES)
        if unknown:
            raise ValueError(f"bound keys must be among {CONTROL_NAMES}, got {sorted(unknown)}")
        bounds = {k: float(bound.get(k, math.inf)) for k in CONTROL_NAMES}
    else:
        bounds = {k: float(bound) for k in CONTROL_NAMES}
    if any(not c > 0 for c in bounds.values()):
        raise ValueError(f"bound must be > 0, got {bound!r}")
    fixed = dict(fixed or {})
    unknown = set(fixed) - set(CONTROL_NAMES)
    if unknown:
        raise ValueError(f"fixed keys must be among {CONTROL_NAMES}, got {sorted(unknown)}")
    rank, *_ = _ranks(S0, S1, rank_rtol)
    f64 = np.dtype(dtype) == np.float64
    rtol = (1e-9 if f64 else 1e-5) if rtol is None else rtol
    atol = (1e-11 if f64 else 1e-7) if atol is None else atol
    if isinstance(steps_per_piece, bool) or not isinstance(steps_per_piece, (int, np.integer)) \
            or steps_per_piece < 1:
        raise ValueError(f"steps_per_piece must be an integer >= 1, got {steps_per_piece!r}")

    n_vals = n_pieces if kind == "piecewise" else n_pieces + 1
    shapes = {"A": (d, d), "B": (d, d), "V": (d, d), "b": (d,)}
    fixed_vals = {k: _as_values(fixed.get(k, np.zeros(shapes[k])), n_vals, shapes[k], dtype, t1,
                                kind) for k in CONTROL_NAMES}

    cert = None
    cert_msg = ""
    if with_certificate or init in ("auto", "certificate"):
        # On this reach grid when possible (its verification solve then shares the
        # compiled solve of the final check); a polar certificate needs an even grid.
        for n_cert in ((n_pieces, None) if kind == "piecewise" else (None,)):
            try:
                cert = certificate(m0, S0, m1, S1, t1=t1, n_pieces=n_cert, rank_rtol=rank_rtol,
                                   verify=verify)
                cert_msg = ""
                break
            except ValueError as e:  # reported, not fatal
                cert_msg = f"certificate unavailable: {e}"

    # Initial raw parameters.
    rng = np.random.default_rng(seed)
    if isinstance(init, Mapping):
        start = {k: _as_values(init[k], n_vals, shapes[k], dtype, t1, kind) if k in init
                 else np.zeros((n_vals,) + shapes[k]) for k in CONTROL_NAMES}
        init_used = "given"
    else:
        if init not in ("auto", "certificate", "zero", "random"):
            raise ValueError(f"init must be 'auto', 'certificate', 'zero', 'random' or a mapping, "
                             f"got {init!r}")
        use_cert = init == "certificate" or (init == "auto" and "A" in free and "b" in free
                                             and cert is not None)
        if use_cert:
            if cert is None:
                raise ValueError(f"init='certificate': {cert_msg}")
            if "A" not in free or "b" not in free:
                raise ValueError("init='certificate' needs A and b free (the certificate uses them)")
            cc = cert.controls()
            start = {k: _as_values(cc[k], n_vals, shapes[k], dtype, t1, kind) for k in CONTROL_NAMES}
            init_used = "certificate"
        elif init == "zero":
            start = {k: np.zeros((n_vals,) + shapes[k]) for k in CONTROL_NAMES}
            init_used = "zero"
        else:
            start = {k: init_scale * rng.standard_normal((n_vals,) + shapes[k]) for k in CONTROL_NAMES}
            init_used = "random"
    raw = {k: np.asarray(_unsquash(start[k], bounds[k]), dtype) for k in CONTROL_NAMES}

    prob = _Problem(m0=m0, S0=S0, m1=m1, S1=S1, t1=jnp.asarray(t1, dtype),
                    mask=jnp.asarray([1.0 if k in free else 0.0 for k in CONTROL_NAMES], dtype),
                    fixed=tuple(jnp.asarray(fixed_vals[k], dtype) for k in CONTROL_NAMES),
                    bound=jnp.asarray([bounds[k] for k in CONTROL_NAMES], dtype),
                    weight=jnp.asarray(energy_weight, dtype), kind=kind)
    opts = _Opts(rtol=float(rtol), atol=float(atol), max_steps=int(max_steps), solver=solver,
                 steps_per_piece=int(steps_per_piece))
    steps_min = int(steps_per_piece)  # re-coarsening never goes below the initial count
    lam = float(energy_weight)
    stop_w2 = stop_factor * tol

    losses, w2s, steps_hist = [], [], []
    counters = {"evals": 0, "rejected": 0, "refined": 0, "too_long": False, "backtracks": 0,
                "coarsened": 0, "emax": 0.0}

    def evaluate(x, refine=True):
        """One solve at the current step count (``refine``: while the step-error check alone
        fails, halve the steps and solve again). Returns ``(ok, loss, W2², energy, grad)``;
        ``counters["too_long"]`` tells whether the last failure was the step-error check alone."""
        nonlocal opts
        while True:
            sc, g = _value_and_grad(x, prob, opts)
            v, w2sq, en, ok, too_long, counters["emax"] = (float(a) for a in np.asarray(sc))
            counters["evals"] += 1
            ok = bool(ok)
            counters["too_long"] = bool(too_long) and not ok
            if ok or not too_long or opts.steps_per_piece >= _MAX_STEPS_PER_PIECE or not refine:
                break
            # The fixed steps were too long for these controls (the embedded error estimate
            # exceeded rtol/atol; the state is finite and below the blow-up threshold): halve
            # the steps for this and every later trial and solve again (one new program).
            opts = dataclasses.replace(opts, steps_per_piece=min(2 * opts.steps_per_piece, _MAX_STEPS_PER_PIECE))
            counters["refined"] += 1
        if not ok:
            counters["rejected"] += 1
        return ok, v, w2sq, en, g

    def record(v, w2sq, it):
        w2 = math.sqrt(max(w2sq, 0.0)) if math.isfinite(w2sq) else math.nan
        losses.append(v)
        w2s.append(w2)
        steps_hist.append(opts.steps_per_piece if opts.solver is None else 0)
        if callback is not None:
            callback(it, v, w2)
        return w2

    def evaluate_together(points):
        """Evaluate ``points`` at one step count: if the steps are halved while evaluating one
        of them, all are evaluated again (at most log2(64) times: the count only grows)."""
        while True:
            before = counters["refined"]
            outs = [evaluate(p_) for p_ in points]
            if counters["refined"] == before:
                return outs

    ok, v, w2sq, en, g = evaluate(raw)
    retreats = 0
    while not ok and retreats < 8:  # an infeasible start: shrink towards zero controls
        raw = jax.tree.map(lambda a: 0.5 * a, raw)
        ok, v, w2sq, en, g = evaluate(raw)
        retreats += 1
    message = f"init={init_used}"
    it = 0
    w2_now = record(v if ok else math.nan, w2sq if ok else math.nan, it)
    done = ok and lam == 0 and w2_now <= stop_w2
    if not ok:
        message += "; no finite starting point (every trial solve failed)"
        done = True

    # ---- Adam phase -------------------------------------------------------------------
    if not done and adam_steps > 0:
        adam = _adam(float(adam_lr))
        ast = adam.init(raw)
        last_good = raw
        best = (v, raw, g, w2sq, en)
        for _ in range(adam_steps):
            last_good = raw
            refined = counters["refined"]
            raw, ast = _adam_step(adam, g, ast, raw)
            ok, v2, w2sq2, en2, g2 = evaluate(raw, refine=False)
            it += 1
            halvings = 0
            while not ok:
                # A rejected trial: its loss and gradient never reach the optimiser state (the
                # moments hold gradients of accepted iterates only); the update is halved
                # towards the last accepted iterate — once after a blow-up / non-finite
                # solve, up to _TOO_LONG_BACKTRACKS times while the step-error check alone
                # fails (the accepted iterate passed it, so a short enough update does too);
                # the last of those halvings refines the steps if the check still fails.
                too_long = counters["too_long"]
                if halvings >= (_TOO_LONG_BACKTRACKS if too_long else 1):
                    break
                raw = _axpy(jnp.asarray(0.5, dtype), last_good, jax.tree.map(jnp.subtract, raw, last_good))
                halvings += 1
                counters["backtracks"] += too_long
                ok, v2, w2sq2, en2, g2 = evaluate(
                    raw, refine=too_long and halvings == _TOO_LONG_BACKTRACKS)
            if not ok:
                raw = last_good
            if counters["refined"] != refined:
                # The steps were halved during this iteration: the best iterate's loss (and
                # the current one's, if both trials were rejected) came from the coarser
                # steps. Evaluate both again at the new count before comparing.
                (ok_c, *cur), (ok_b, *bst) = evaluate_together([raw, best[1]])
                best = (bst[0], best[1], bst[3], bst[1], bst[2]) if ok_b else (math.inf,) + best[1:]
                if ok_c and ok:
                    v2, w2sq2, en2, g2 = cur
                elif ok_c:
                    v, w2sq, en, g = cur
                else:  # the finer solve failed where a coarser one passed (steps at the cap)
                    raw, ok = best[1], False
                    v, g, w2sq, en = best[0], best[2], best[3], best[4]
            if not ok:
                record(math.nan, math.nan, it)
                continue
            v, w2sq, en, g = v2, w2sq2, en2, g2
            w2_now = record(v, w2sq, it)
            if v < best[0]:
                best = (v, raw, g, w2sq, en)
            if lam == 0 and w2_now <= stop_w2:
                done = True
                break
        if not done:
            v, raw, g, w2sq, en = best  # L-BFGS starts from Adam's best iterate

    # ---- L-BFGS phase (host two-loop directions as optax.scale_by_lbfgs, host Armijo) ----
    # With λ > 0 and energy_continuation, λ is divided by 10 after each converged stage
    # until the target is reached (a penalty continuation towards minimum-energy reaching).
    lam_now = lam
    stages = 0
    while not done and lbfgs_steps > 0:
        lst = _LBFGS()
        stall = 0
        calm, last_changes = 0, counters["refined"] + counters["coarsened"]
        n_iter = lbfgs_steps if lam_now == 0 or not energy_continuation else energy_stage_steps
        for _ in range(n_iter):
            x, gx = _flat(raw), _flat(g)
            dirn, slope, lst_new = lst.direction(gx, x)
            if not slope < 0:  # not a descent direction: restart the memory, steepest descent
                dirn, slope, lst_new = _LBFGS().direction(gx, x)
            lst = lst_new
            step, accepted, n_ls, n_long = 1.0, False, 0, 0
            refined = counters["refined"]
            while n_ls < 30:
                trial = _unflat(x + step * dirn, raw)
                # A trial failing the step-error check alone is a rejected trial like any
                # other (backtrack: the iterate passed the check, so a short enough step does
                # too); only after _TOO_LONG_BACKTRACKS such failures in this line search are
                # the steps refined for the trial (and every later one).
                ok, v2, w2sq2, en2, g2 = evaluate(trial, refine=n_long >= _TOO_LONG_BACKTRACKS)
                if counters["refined"] != refined:
                    # The steps were halved for this trial: the iterate's loss and gradient,
                    # and the memory's pairs, are those of the coarser steps. Evaluate the
                    # iterate again at the new count, forget the memory and restart the line
                    # search from a fresh direction (the count only grows: at most 6 times).
                    n_long = 0
                    ok0, v0, w2sq0, en0, g0 = evaluate(raw)
                    refined = counters["refined"]
                    if not ok0:  # the finer solve failed where a coarser one passed
                        message += "; the iterate's solve failed after the steps were halved (stopped)"
                        break
                    v, w2sq, en, g = v0, w2sq0, en0, g0
                    gx = _flat(g)
                    dirn, slope, lst = _LBFGS().direction(gx, x)
                    step, n_ls = 1.0, 0
                    continue
                if ok and v2 <= v + 1e-4 * step * slope:
                    accepted = True
                    break
                if counters["too_long"]:
                    n_long += 1
                    counters["backtracks"] += 1
                step *= 0.5
                n_ls += 1
            it += 1
            if not accepted:
                record(v, w2sq, it)
                if "line search" not in message:
                    message += "; L-BFGS line search found no decrease (stopped)"
                break
            rel = (v - v2) / max(abs(v), 1e-300)
            raw, v, w2sq, en, g = trial, v2, w2sq2, en2, g2
            w2_now = record(v, w2sq, it)
            if lam_now == 0 and w2_now <= stop_w2:
                break
            changes = counters["refined"] + counters["coarsened"]
            calm = calm + 1 if changes == last_changes else 1
            last_changes = changes
            if (opts.solver is None and calm >= _COARSEN_AFTER and counters["emax"] < _COARSEN_BELOW
                    and opts.steps_per_piece >= 2 * steps_min):
                # The accepted iterate's solve is far inside the tolerances: try half the
                # count on it (a program compiled on the way up); kept if that solve passes,
                # the iterate's loss and gradient then those of the coarser count.
                fine = opts
                opts = dataclasses.replace(opts, steps_per_piece=opts.steps_per_piece // 2)
                ok0, v0, w2sq0, en0, g0 = evaluate(raw, refine=False)
                if ok0:
                    counters["coarsened"] += 1
                    v, w2sq, en, g = v0, w2sq0, en0, g0
                else:
                    counters["rejected"] -= 1  # not a trial: the iterate stays, at the finer count
                    opts, calm = fine, 0  # and the next try waits _COARSEN_AFTER iterations
            stall = stall + 1 if rel < 1e-10 else 0
            if stall >= 5:
                break
        w2_now = math.sqrt(max(w2sq, 0.0)) if math.isfinite(w2sq) else math.nan
        if lam_now > 0 and energy_continuation and not w2_now <= stop_w2:
            # λ/10 per stage; after max_energy_stages, a last stage at λ = 0
            lam_now = lam_now / 10.0 if stages < max_energy_stages else 0.0
            stages += 1
            prob = eqx.tree_at(lambda p_: p_.weight, prob, jnp.asarray(lam_now, dtype))
            ok, v, w2sq, en, g = evaluate(raw)
            if ok:
                continue
        break
    if lam > 0:
        message += f"; energy weight {lam:g} -> {lam_now:g} ({stages} continuation stages)"

    vals = _physical_jit(raw, prob)
    controls = {k: Control(v_, t1, kind) for k, v_ in zip(CONTROL_NAMES, vals)}
    energy = en
    w2_opt = math.sqrt(max(w2sq, 0.0)) if math.isfinite(w2sq) else math.nan
    if verify:
        sol = controlled_moments(controls, m0, S0, t1=t1)
        status = int(sol.status)
        if status == status_code("successful"):
            w2 = float(jnp.sqrt(bures_w2_squared(sol.mean_final, sol.cov_final, m1, S1)))
            w2_mean = float(jnp.linalg.norm(sol.mean_final - m1))
            w2_cov = float(jnp.sqrt(bures_w2_squared(jnp.zeros_like(m1), sol.cov_final,
                                                     jnp.zeros_like(m1), S1)))
        else:
            w2 = w2_mean = w2_cov = math.nan
    else:
        status, w2, w2_mean, w2_cov = status_code("successful"), w2_opt, math.nan, math.nan
    converged = bool(math.isfinite(w2) and w2 < tol)
    if status != status_code("successful"):
        message += (f"; the verification solve of the final controls ended with status "
                    f"{status_names(from_codes(np.asarray(status)))} (W2 reported as NaN)")
    elif not converged:
        status = code(RESULTS.not_converged)
    message += (f"; W2 = {w2:.3e} ({'reached' if converged else 'not reached'}, tol {tol:g}) "
                f"after {it} iterations, {counters['evals']} solves, {counters['rejected']} "
                f"rejected")
    if counters["refined"]:
        message += f"; the fixed steps were halved {counters['refined']} time(s)"
        if counters["coarsened"]:
            message += f" and lengthened again {counters['coarsened']} time(s)"
        message += f" (steps_per_piece {opts.steps_per_piece})"
    if cert_msg:
        message += f"; {cert_msg}"
    out = ReachResult(
        controls=controls, w2=w2, w2_optimizer=w2_opt, w2_mean=w2_mean, w2_cov=w2_cov,
        energy=float(energy), loss_history=np.asarray(losses),
        w2_history=np.asarray(w2s), result=from_codes(np.asarray(status)), certificate=cert,
        rank=rank, free=tuple(free),
        bound=None if bound is None else {k: c for k, c in bounds.items() if k in free},
        energy_weight=lam, energy_weight_final=lam_now,
        stats={"iterations": it, "evaluations": counters["evals"],
               "rejected": counters["rejected"], "seconds": time.perf_counter() - t_start,
               "steps_per_piece": opts.steps_per_piece if opts.solver is None else None,
               "step_refinements": counters["refined"],
               "step_backtracks": counters["backtracks"],
               "step_coarsenings": counters["coarsened"],
               "steps_history": np.asarray(steps_hist, np.int64)},
        message=message)
    if throw:
        raise_if_failed(out, f"reach ({message})")
    return out
