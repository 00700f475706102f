"""``reach``: optimised time-varying controls that steer N(m0, S0) to N(m1, S1)."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Mapping, Optional, Sequence, Union

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._checks import settings_problem, with_settings
from .._results import (RESULTS, Solution, error_if_failed, from_codes, raise_if_failed,
                        stat, status_code, status_names)
from ..distances._bures import clipped_bures_w2_squared
from ..gaussian._solve import Control
from . import _optimise as driver
from . import _reach_loop as opt
from ._certificate import Certificate, certificate
from ._loss import Problem, SolveOptions, default_tolerances, unsquash
from ._problem import _ALL_FREE, CONTROL_NAMES, _check_problem, _ranks, controlled_moments

# The steps a piece are doubled (after a solve whose steps were too long) up to this many.
MAX_STEPS_PER_PIECE = 64
# When the L-BFGS line search finds no decrease before the target, the steps are doubled if
# the iterate's own step-error ratio is above this: trials near it fail the check.
REFINE_ABOVE = 1e-2


# kept apart deliberately: the field list has the shape of the encoder configs' (an annotated
# default a line, jaxdyn/encoder/_archs.py); these are reach's own settings and defaults.
@dataclasses.dataclass(frozen=True)
class ReachOptions:
    """Settings of :func:`reach` (each can also be passed to it as a keyword).

    Attributes:
        free: the optimised controls, a subset of ``("A", "b", "V", "B")``.
        kind: ``"piecewise"`` (constant on each piece) or ``"linear"`` (linear between
            ``n_pieces + 1`` nodes).
        fixed: values of the non-free controls (arrays or Controls; default 0).
        bound: None, a float, or ``{name: c}``: ``‖u(t)‖_F ≤ c`` for each (free) control,
            by the radial reparametrisation ``u = c tanh(‖w‖/c) w/‖w‖`` per piece.
        energy_weight: λ ≥ 0 of the control energy in the loss.
        init: ``"auto"`` (the certificate when A and b are free and it exists, else
            ``"random"``), ``"certificate"``, ``"zero"``, ``"random"`` (N(0,
            init_scale²) entries from ``seed``) or a mapping ``{name: array/Control}``.
        init_scale: the scale of a random start.
        seed: the seed of a random start.
        adam_steps: Adam iterations before L-BFGS (default 0: L-BFGS alone was faster on
            random targets).
        adam_lr: Adam's learning rate.
        lbfgs_steps: L-BFGS iterations at λ = 0.
        tol: success threshold on the verified W2.
        stop_factor: the optimiser stops once its W2 ≤ ``stop_factor · tol`` (at λ = 0).
        rtol: the optimiser's solve: step-error tolerance (default 1e-9, float32 1e-5).
        atol: absolute step-error tolerance (default 1e-11, float32 1e-7).
        solver: None (constant Dopri8 steps) or a diffrax solver: an adaptive
            :func:`jaxdyn.gaussian.solve_moments` for the optimiser's solve.
        max_steps: the adaptive solve's step budget.
        steps_per_piece: constant Dopri8 steps in each piece (doubled, up to 64, when a
            solve's steps were too long for its controls).
        energy_continuation: with λ > 0, continue at λ/10, λ/100, … until the target is
            met (approximately minimal energy among reaching controls).
        max_energy_stages: continuation stages at λ > 0 before a last one at λ = 0.
        energy_stage_steps: L-BFGS iterations of each stage at λ > 0.
        rank_rtol: the numerical-rank cut (default sqrt(eps)).
        with_certificate: compute the :class:`Certificate` and return it.
        verify: check the result by an independent adaptive Dopri8 solve (rtol 1e-11).
        segment_steps: iterations of each jitted segment of the optimiser (concrete inputs;
            under ``jax.jit`` or ``jax.vmap`` it is one segment): between two segments the
            host sees a signal (``KeyboardInterrupt``) and calls ``callback``. The boundaries
            never change the values.
        callback: ``callback(iteration, loss, w2)``, called on the host for each iteration,
            after the segment that took it (concrete inputs only).
        throw: raise ``RuntimeError`` when the result is not ``successful``.
    """

    free: Sequence[str] = _ALL_FREE
    kind: str = "piecewise"
    fixed: Optional[Mapping] = None
    bound: Union[None, float, Mapping] = None
    energy_weight: float = 0.0
    init: Union[str, Mapping] = "auto"
    init_scale: float = 0.1
    seed: int = 0
    adam_steps: int = 0
    adam_lr: float = 0.02
    lbfgs_steps: int = 500
    tol: float = 1e-4
    stop_factor: float = 0.1
    rtol: Optional[float] = None
    atol: Optional[float] = None
    solver: Optional[diffrax.AbstractSolver] = None
    max_steps: int = 4096
    steps_per_piece: int = 2
    energy_continuation: bool = True
    max_energy_stages: int = 6
    energy_stage_steps: int = 100
    rank_rtol: Optional[float] = None
    with_certificate: bool = True
    verify: bool = True
    segment_steps: int = 25
    callback: Optional[Callable] = None
    throw: bool = False


class ReachResult(Solution):
    r"""Result of :func:`reach` (a :class:`jaxdyn.Solution` pytree; every leaf an array).

    Attributes:
        controls: ``{"A", "B", "V", "b"}`` → :class:`Control` (the fixed ones included).
        w2: Bures W2 at t1 from an independent tight solve (``controlled_moments``: Dopri8,
            rtol 1e-11 in float64): the number to quote; NaN if that solve failed.
        w2_optimizer: W2 at the optimiser's own solve (its tolerances).
        w2_mean: ``|m(t1) − m1|`` of the verification solve.
        w2_cov: the Bures distance of the covariances alone.
        energy: ``∫ Σ_{free u} ‖u‖_F² dt``.
        loss_history: the loss after each optimiser iteration (NaN for rejected ones).
        w2_history: W2 after each iteration.
        energy_weight: the energy weight λ asked for.
        energy_weight_final: the last λ of the continuation.
        result: :class:`jaxdyn.RESULTS`: ``successful`` (``w2 < tol``), ``not_converged``
            (the verification solve succeeded, ``w2 ≥ tol``), or the verification solve's
            own status (``blowup``, ``large``, ``nonfinite``, ...; W2 is then NaN).
        certificate: the :class:`Certificate` (None if not computed).
        stats: ``iterations``, ``evaluations`` (loss solves), ``rejected`` (rejected trials
            outside the line search and L-BFGS iterations without decrease), ``seconds``,
            ``steps_per_piece`` (the final count), ``step_refinements`` (doublings of it),
            ``step_backtracks`` (rejected trials whose solve failed only the step-error
            check, outside the line search), ``step_coarsenings`` (0: the count is never
            lowered again), ``steps_history`` (the count at each iteration), ``stop`` (why the
            optimiser stopped, see ``message``).
        rank: numerical rank of S0 and S1 (static; None when they were traced).
        free: the optimised controls (static).
        bounds: ``((name, c), ...)`` of the bounded free controls (static; ``bound`` reads it
            as a dict, None when unbounded).
        tol: the success threshold (static).
        notes: the start used and the certificate's fate (static text).
    """

    controls: dict
    w2: Array
    w2_optimizer: Array
    w2_mean: Array
    w2_cov: Array
    energy: Array
    loss_history: Array
    w2_history: Array
    energy_weight: Array
    energy_weight_final: Array
    result: RESULTS
    certificate: Optional[Certificate]
    stats: dict
    rank: Optional[int] = eqx.field(static=True, default=None)
    free: tuple = eqx.field(static=True, default=_ALL_FREE)
    bounds: Optional[tuple] = eqx.field(static=True, default=None)
    tol: float = eqx.field(static=True, default=1e-4)
    notes: str = eqx.field(static=True, default="")

    @property
    def converged(self) -> bool:
        """``w2 < tol`` (the same as ``bool(self.ok)``)."""
        return bool(self.ok)

    @property
    def bound(self) -> Optional[dict]:
        """``{name: c}`` of the bounded free controls, or None."""
        return None if self.bounds is None else dict(self.bounds)

    @property
    def message(self) -> str:
        """What happened, in words (a concrete result)."""
        st = {k: np.asarray(v) for k, v in self.stats.items()}
        w2 = float(self.w2)
        parts = [self.notes] if self.notes else []
        parts.append(f"optimiser stopped: {opt.STOP_TEXT.get(int(st['stop']), 'unknown')}")
        lam0, lam1 = float(self.energy_weight), float(self.energy_weight_final)
        if lam0 > 0:
            parts.append(f"energy weight {lam0:g} -> {lam1:g}")
        name = status_names(self.result)
        if name not in ("successful", "not_converged"):
            parts.append(f"the verification solve of the final controls ended with status "
                         f"{name} (W2 reported as NaN)")
        parts.append(f"W2 = {w2:.3e} ({'reached' if self.converged else 'not reached'}, "
                     f"tol {self.tol:g}) after {int(st['iterations'])} iterations, "
                     f"{int(st['evaluations'])} solves, {int(st['rejected'])} rejected")
        if int(st["step_refinements"]):
            parts.append(f"the fixed steps were halved {int(st['step_refinements'])} time(s) "
                         f"(steps_per_piece {int(st['steps_per_piece'])})")
        return "; ".join(parts)

    iterations = stat("iterations")

    evaluations = stat("evaluations")

    rejected = stat("rejected")

    seconds = stat("seconds")

    steps_per_piece = stat("steps_per_piece")

    step_refinements = stat("step_refinements")


def _is_traced(*xs) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in xs)


def _grid_times(n, t1, kind):
    if kind == "piecewise":
        return (np.arange(n) + 0.5) * t1 / n
    return np.linspace(0.0, t1, n)


def _as_values(u, n, shape, t1, kind):
    """Constant array or Control → values on this reach grid ``(n, *shape)`` (host, float64)."""
    if isinstance(u, Control):
        if u.kind == kind and u.n == n:
            return np.asarray(u.values, np.float64)
        grid = _grid_times(n, t1, kind)
        return np.stack([np.asarray(u(jnp.asarray(t, u.dtype)), np.float64) for t in grid])
    u = np.asarray(u, np.float64)
    if u.shape != tuple(shape):
        raise ValueError(f"a fixed control must have shape {tuple(shape)} or be a Control, "
                         f"got {u.shape}")
    return np.broadcast_to(u, (n,) + tuple(shape)).copy()


def _checked(o: ReachOptions, t1, n_pieces) -> dict:
    """The options checked on the host: ``{"bounds", "fixed", "free"}`` (ValueError)."""
    if not _is_traced(t1) and not float(t1) > 0:
        raise ValueError(f"t1 must be > 0, got {t1}")
    if isinstance(n_pieces, bool) or not isinstance(n_pieces, (int, np.integer)) or n_pieces < 1:
        raise ValueError(f"n_pieces must be an integer >= 1, got {n_pieces!r}")
    if o.kind not in ("piecewise", "linear"):
        raise ValueError(f"kind must be 'piecewise' or 'linear', got {o.kind!r}")
    free = tuple(o.free)
    if not free or any(f not in CONTROL_NAMES for f in free) or len(set(free)) != len(free):
        raise ValueError(f"free must be a non-empty subset of {_ALL_FREE} without repeats, "
                         f"got {free!r}")
    if not float(o.energy_weight) >= 0:
        raise ValueError(f"energy_weight must be >= 0, got {o.energy_weight}")
    if o.bound is None:
        bounds = {k: math.inf for k in CONTROL_NAMES}
    elif isinstance(o.bound, Mapping):
        unknown = set(o.bound) - set(CONTROL_NAMES)
        if unknown:
            raise ValueError(f"bound keys must be among {CONTROL_NAMES}, got {sorted(unknown)}")
        bounds = {k: float(o.bound.get(k, math.inf)) for k in CONTROL_NAMES}
    else:
        bounds = {k: float(o.bound) for k in CONTROL_NAMES}
    if any(not c > 0 for c in bounds.values()):
        raise ValueError(f"bound must be > 0, got {o.bound!r}")
    fixed = dict(o.fixed or {})
    unknown = set(fixed) - set(CONTROL_NAMES)
    if unknown:
        raise ValueError(f"fixed keys must be among {CONTROL_NAMES}, got {sorted(unknown)}")
    for name in ("steps_per_piece", "adam_steps", "lbfgs_steps", "max_energy_stages",
                 "energy_stage_steps", "segment_steps"):
        v = getattr(o, name)
        low = 1 if name in ("steps_per_piece", "segment_steps") else 0
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
    return {"bounds": bounds, "fixed": fixed, "free": free}


def _certificate_for(m0, S0, m1, S1, t1, n_pieces, o: ReachOptions):
    """``(certificate or None, note)`` on this grid when possible; a failure is a note."""
    note = ""
    for n_cert in ((n_pieces, None) if o.kind == "piecewise" else (None,)):
        try:
            return certificate(m0, S0, m1, S1, t1=t1, n_pieces=n_cert, rank_rtol=o.rank_rtol,
                               verify=o.verify), ""
        except ValueError as e:
            note = f"certificate unavailable: {e}"
    return None, note


def _start(o: ReachOptions, cert, note, grid, free):
    """``(start values per control, init used)`` on the host."""
    n_vals, shapes, t1 = grid
    if isinstance(o.init, Mapping):
        return {k: _as_values(o.init[k], n_vals, shapes[k], t1, o.kind) if k in o.init
                else np.zeros((n_vals,) + shapes[k]) for k in CONTROL_NAMES}, "given"
    if o.init not in ("auto", "certificate", "zero", "random"):
        raise ValueError(f"init must be 'auto', 'certificate', 'zero', 'random' or a mapping, "
                         f"got {o.init!r}")
    if o.init == "certificate" or (o.init == "auto" and "A" in free and "b" in free
                                   and cert is not None):
        if cert is None:
            raise ValueError(f"init='certificate': {note or 'certificate unavailable (traced inputs)'}")
        if "A" not in free or "b" not in free:
            raise ValueError("init='certificate' needs A and b free (the certificate uses them)")
        cc = cert.controls()
        return {k: _as_values(cc[k], n_vals, shapes[k], t1, o.kind) for k in CONTROL_NAMES}, \
            "certificate"
    if o.init == "zero":
        return {k: np.zeros((n_vals,) + shapes[k]) for k in CONTROL_NAMES}, "zero"
    rng = np.random.default_rng(o.seed)
    return {k: o.init_scale * rng.standard_normal((n_vals,) + shapes[k]) for k in CONTROL_NAMES}, \
        "random"


def _loop_settings(o: ReachOptions, dtype, refine: bool) -> opt.LoopSettings:
    return opt.LoopSettings(
        stop_w2=jnp.asarray(o.stop_factor * o.tol, dtype), adam_lr=jnp.asarray(o.adam_lr, dtype),
        adam_steps=int(o.adam_steps), lbfgs_steps=int(o.lbfgs_steps),
        stage_steps=int(o.energy_stage_steps), max_stages=int(o.max_energy_stages),
        continuation=jnp.asarray(bool(o.energy_continuation)), refine=refine)


def _reporter(callback, traced):
    """``report(state, final)`` calling ``callback(i, loss, w2)`` once for each new iteration.

    The start's entry is reported once the start is accepted (a retried start rewrites it),
    every entry at the end (``final``).

    Returns:
        The function, or None (no callback, or traced inputs).
    """
    if callback is None or traced:
        return None
    told = [0]

    def report(s, final=False):
        if int(s.phase) == opt.START and not final:
            return
        loss, w2 = np.asarray(s.loss_history), np.asarray(s.w2_history)
        for i in range(told[0], int(s.it) + 1):
            callback(i, float(loss[i]), float(w2[i]))
        told[0] = int(s.it) + 1

    return report


def _refined(s, raw, prob, opts):
    """The state resumed at twice the steps when the loop asks for it, else None.

    The loop asks at a solve whose steps were too long (``TOO_LONG``), or when the L-BFGS line
    search found no decrease at an iterate whose step-error ratio is above ``REFINE_ABOVE``
    (then with an empty L-BFGS memory: losses are compared at one step count only).

    Returns:
        The state to resume, or None.
    """
    stop, phase = int(s.stop), int(s.phase)
    if stop == opt.TOO_LONG:
        return eqx.tree_at(lambda t: (t.stop, t.tries, t.best_stale), s,
                           (jnp.asarray(opt.RUNNING, jnp.int32), jnp.zeros_like(s.tries),
                            jnp.asarray(phase == opt.ADAM)))
    if stop == opt.NO_DECREASE and phase == opt.DONE and \
            float(opt.error_ratio(s.raw, raw, prob, opts)) > REFINE_ABOVE:
        return eqx.tree_at(lambda t: (t.stop, t.phase, t.lbfgs, t.stall), s,
                           (jnp.asarray(opt.RUNNING, jnp.int32), jnp.asarray(opt.LBFGS, jnp.int32),
                            driver.lbfgs().init(s.raw), jnp.zeros_like(s.stall)))
    return None


def _run_optimiser(raw, prob: Problem, o: ReachOptions, traced: bool):
    """The loop in jitted segments, and on the host the refinements of the steps it asks for.

    Args:
        raw: the start (the controls' raw parameters).
        prob: the problem.
        o: the options.
        traced: whether the inputs are traced (one segment, no refinement then).

    Returns:
        ``(state, control values, energy, steps_per_piece, refinements, iterations at which
        the steps were refined)``.
    """
    rtol, atol = default_tolerances(prob.S0.dtype, o.rtol, o.atol)
    steps = int(o.steps_per_piece)
    opts = SolveOptions(rtol=rtol, atol=atol, steps_per_piece=steps, solver=o.solver,
                        max_steps=int(o.max_steps))
    refinable = o.solver is None and not traced
    loop = _loop_settings(o, prob.S0.dtype, refinable and steps < MAX_STEPS_PER_PIECE)
    budget = max(loop.size - 1, 1)  # every iteration the loop can take
    report = _reporter(o.callback, traced)

    def advance(s, done, end):  # reads the current step count's ``loop`` and ``opts``
        s = opt.advance(s, raw, prob, loop, opts, jnp.asarray(end, jnp.int32))
        return (s, end, True) if traced else (s, int(s.it), not bool(opt.running(s)))

    s = opt.start(raw, prob, loop)
    refinements, changes = 0, []
    while True:
        s = driver.drive(advance, s, done=0 if traced else int(s.it), budget=budget,
                         segment=budget if traced else int(o.segment_steps), report=report)
        resumed = (_refined(s, raw, prob, opts)
                   if refinable and steps < MAX_STEPS_PER_PIECE else None)
        if resumed is None:
            break
        changes.append(0 if int(s.phase) == opt.START else int(s.it) + 1)  # its first iteration
        s, steps, refinements = resumed, 2 * steps, refinements + 1
        opts = dataclasses.replace(opts, steps_per_piece=steps)
        loop = dataclasses.replace(loop, refine=steps < MAX_STEPS_PER_PIECE)
    if report is not None:
        report(s, final=True)
    vals, energy = opt.outcome(s, raw, prob)
    return s, vals, energy, steps, refinements, changes


def _verify(controls, m0, S0, m1, S1, t1):
    """``(status, mean, cov)`` of the independent verification solve (its own program)."""
    sol = controlled_moments(controls, m0, S0, t1=t1)
    return sol.status, sol.mean_final, sol.cov_final


@jax.jit
def _summary(s: opt.State, verified, m1, S1, tol):
    """``(w2, w2_optimizer, w2_mean, w2_cov, result)`` of the state and ``(status, m, S)``."""
    w2_opt = s.w2_history[s.it]
    nan = jnp.full((), jnp.nan, w2_opt.dtype)
    if verified is None:
        status, w2, w2_mean, w2_cov = jnp.asarray(status_code("successful")), w2_opt, nan, nan
    else:
        status, m, S = verified
        ok = status == status_code("successful")
        w2 = jnp.where(ok, jnp.sqrt(clipped_bures_w2_squared(m, S, m1, S1)), nan)
        w2_mean = jnp.where(ok, jnp.linalg.norm(m - m1), nan)
        w2_cov = jnp.where(ok, jnp.sqrt(clipped_bures_w2_squared(jnp.zeros_like(m1), S, jnp.zeros_like(m1),
                                                         S1)), nan)
    status = jnp.where((status == status_code("successful")) & ~(w2 < tol),
                       status_code("not_converged"), status)
    return w2, w2_opt, w2_mean, w2_cov, from_codes(status)


def _result(s, o, chk, traced, controls, energy, summary, run) -> ReachResult:
    """The :class:`ReachResult` of the final state ``s``.

    Args:
        s: the optimiser's final state.
        o: the :class:`ReachOptions`.
        chk: the checked options (``free``, ``bounds``).
        traced: whether the inputs were traced (the histories are then padded).
        controls: the controls as :class:`~jaxdyn.models.Control`.
        energy: their energy.
        summary: ``(w2, w2_optimizer, w2_mean, w2_cov, result)`` (:func:`_summary`).
        run: ``cert, rank, note, init_used, steps, refinements, changes, t_start, dtype``.

    Returns:
        The result (histories cut at the last iteration for concrete inputs).
    """
    w2, w2_opt, w2_mean, w2_cov, result = summary
    dtype = run["dtype"]
    steps, refinements, changes = run["steps"], run["refinements"], run["changes"]
    cert, rank, note, init_used = run["cert"], run["rank"], run["note"], run["init_used"]
    t_start = run["t_start"]
    loss_h, w2_h = s.loss_history, s.w2_history
    steps_h = np.full(loss_h.shape, int(o.steps_per_piece), np.int32)
    if not traced:  # concrete: the histories end at the last iteration
        n = int(s.it) + 1
        loss_h, w2_h = (jnp.asarray(np.asarray(a)[:n]) for a in (loss_h, w2_h))
        steps_h = steps_h[:n]
        for c in changes:
            steps_h[c:] *= 2
    notes = f"init={init_used}" + (f"; {note}" if note else "")
    return ReachResult(
        controls=controls, w2=w2, w2_optimizer=w2_opt, w2_mean=w2_mean, w2_cov=w2_cov,
        energy=energy, loss_history=loss_h, w2_history=w2_h,
        energy_weight=jnp.asarray(o.energy_weight, dtype), energy_weight_final=s.lam,
        result=result, certificate=cert,
        stats={"iterations": s.it, "evaluations": s.evaluations, "rejected": s.rejected,
               "seconds": jnp.asarray(np.nan if traced else time.perf_counter() - t_start),
               "steps_per_piece": jnp.asarray(steps if o.solver is None else 0, jnp.int32),
               "step_refinements": jnp.asarray(refinements, jnp.int32),
               "step_backtracks": s.backtracks,
               "step_coarsenings": jnp.zeros((), jnp.int32),
               "steps_history": jnp.asarray(steps_h), "stop": s.stop},
        rank=rank, free=chk["free"],
        bounds=None if o.bound is None else tuple((k, c) for k, c in chk["bounds"].items()
                                                   if k in chk["free"]),
        tol=float(o.tol), notes=notes)


def reach(m0, S0, m1, S1, *, t1=1.0, n_pieces: int = 8, options: Optional[ReachOptions] = None,
          **settings) -> ReachResult:
    r"""Optimise time-varying controls that steer ``N(m0, S0)`` to ``N(m1, S1)`` at ``t1``.

    Minimises over the free controls (moment ODE of docs/math.md §B.2)

    .. math::

        L = W_2^2\big(N(m(t_1), Σ(t_1)), N(m_1, S_1)\big)
            + λ \int_0^{t_1} \sum_{u \in \text{free}} \|u(t)\|_F^2\, dt

    with gradients through constant diffrax Dopri8 steps on the control grid
    (:func:`reach_loss`), by ``optax.lbfgs`` with its zoom line search (optionally after Adam
    steps), in jitted segments of ``segment_steps`` iterations between which the host sees a
    signal and calls ``callback`` (the driver shared with :func:`measure_control`,
    :mod:`jaxdyn.control._optimise`; the phases in :mod:`jaxdyn.control._reach_loop`). A trial whose
    solve fails (blow-up, non-finite state, or a step error above ``rtol, atol``) is
    rejected. When a solve's steps were too long for its controls and that blocks the
    optimiser (the start, 3 halvings of an Adam trial, or a line search without decrease at
    an iterate whose step-error ratio is above 1e-2), ``steps_per_piece`` is doubled (up to
    64) and the loop resumes from where it stopped (a new program for the new count; the
    L-BFGS memory is emptied, and Adam's best iterate evaluated again, so that losses are
    compared at one step count only). The result is checked by an independent adaptive
    Dopri8 solve at rtol 1e-11 (``verify``). A target whose numerical rank differs from
    S0's is refused: rank is invariant under the moment flow.

    Composes with ``jax.jit`` (and ``jax.vmap``) for traced ``m0, S0, m1, S1``: then no rank
    check, no certificate (``init="auto"`` starts from random controls), no refinement of
    the steps (a solve whose steps are too long is a rejected trial), the histories are
    padded with NaN to the iteration budget, and ``message`` and ``throw`` need a concrete
    result. Not differentiable (an optimisation loop).

    Args:
        m0: (d,) initial mean (None = 0).
        S0: (d, d) PSD initial covariance.
        m1: (d,) target mean (None = 0).
        S1: (d, d) PSD target covariance of the numerical rank of S0.
        t1: the horizon.
        n_pieces: pieces of the uniform control grid.
        options: a :class:`ReachOptions` (default: its defaults).
        **settings: any field of :class:`ReachOptions` by name (``free``, ``bound``,
            ``energy_weight``, ``init``, ``tol``, ``adam_steps``, ``steps_per_piece``,
            ``verify``, ``throw``, ...), overriding ``options``.

    Returns:
        :class:`ReachResult`. Float64 is advised (``jax_enable_x64``): W2 < 1e-4 means
        W2² < 1e-8, near float32 resolution.

    Invalid inputs or options raise ``ValueError`` (naming the argument), as does a target
    of another numerical rank; with ``throw=True`` a result that is not successful raises
    ``RuntimeError`` (``eqx.error_if`` under ``jit``).

    Raises:
        TypeError: a keyword that is not a field of :class:`ReachOptions`.
    """
    t_start = time.perf_counter()
    problem = settings_problem(ReachOptions, options, settings, "reach")
    if problem:
        raise TypeError(problem)
    o = with_settings(ReachOptions, options, settings)
    m0, S0, m1, S1 = _check_problem(m0, S0, m1, S1)
    traced = _is_traced(m0, S0, m1, S1, t1)
    chk = _checked(o, t1, n_pieces)
    dtype, d = S0.dtype, S0.shape[0]
    rank = None if traced else _ranks(S0, S1, o.rank_rtol)[0]
    n_vals = n_pieces if o.kind == "piecewise" else n_pieces + 1
    shapes = {"A": (d, d), "B": (d, d), "V": (d, d), "b": (d,)}
    t1h = t1 if _is_traced(t1) else float(t1)
    fixed = {k: _as_values(chk["fixed"].get(k, np.zeros(shapes[k])), n_vals, shapes[k], t1h,
                           o.kind) for k in CONTROL_NAMES}
    cert, note = None, ("certificate unavailable: traced inputs" if traced else "")
    if not traced and (o.with_certificate or o.init in ("auto", "certificate")):
        cert, note = _certificate_for(m0, S0, m1, S1, t1h, n_pieces, o)
    start, init_used = _start(o, cert, note, (n_vals, shapes, t1h), chk["free"])
    raw = {k: jnp.asarray(unsquash(start[k], chk["bounds"][k]), dtype) for k in CONTROL_NAMES}
    prob = Problem(m0=m0, S0=S0, m1=m1, S1=S1, t1=jnp.asarray(t1h, dtype),
                   mask=jnp.asarray([1.0 if k in chk["free"] else 0.0 for k in CONTROL_NAMES], dtype),
                   fixed=tuple(jnp.asarray(fixed[k], dtype) for k in CONTROL_NAMES),
                   bound=jnp.asarray([chk["bounds"][k] for k in CONTROL_NAMES], dtype),
                   weight=jnp.asarray(o.energy_weight, dtype), kind=o.kind)
    s, vals, energy, steps, refinements, changes = _run_optimiser(raw, prob, o, traced)
    controls = {k: Control(v, t1h, o.kind) for k, v in zip(CONTROL_NAMES, vals)}
    verified = _verify(controls, m0, S0, m1, S1, t1h) if o.verify else None
    w2, w2_opt, w2_mean, w2_cov, result = _summary(s, verified, m1, S1,
                                                   jnp.asarray(o.tol, dtype))
    out = _result(s, o, chk, traced, controls, energy, (w2, w2_opt, w2_mean, w2_cov, result),
                  dict(cert=cert, rank=rank, note=note, init_used=init_used, steps=steps,
                       refinements=refinements, changes=changes, t_start=t_start,
                       dtype=dtype))
    if o.throw:
        if traced:
            out = eqx.tree_at(lambda r: r.w2, out, error_if_failed(out.w2, out.result))
        else:
            raise_if_failed(out, f"reach ({out.message})")
    return out
