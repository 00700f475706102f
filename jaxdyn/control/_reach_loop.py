r"""The optimiser of :func:`jaxdyn.control.reach`: its phases as one jitted state machine.

One ``lax.while_loop`` (:func:`jaxdyn.control._optimise.segment_loop`, run from the host by
:func:`jaxdyn.control._optimise.drive` in segments) runs every phase: the start (a start
whose solve fails is halved towards zero controls, up to 8 times), an optional Adam phase (a
rejected trial is halved towards the last accepted iterate, once after a blow-up or
non-finite solve, up to 3 times when only the step-error check failed; its gradient never
enters Adam's moments), and the L-BFGS phase (its zoom line search treats a trial of
non-finite loss as a rejected step). With an energy weight λ > 0 the L-BFGS phase runs in
stages, λ divided by 10 after each stage that ends above the target, then λ = 0 (a penalty
continuation towards minimum-energy reaching controls); each stage starts with an empty
L-BFGS memory.

Every loss evaluation outside the line search goes through one
``optax.value_and_grad_from_state`` call, which reuses the value and gradient the line search
left in the L-BFGS state.

A solve whose steps were too long for its controls has loss ``+inf`` (see
:func:`~jaxdyn.control._loss.loss_value`); with ``refine`` the loop stops there (the start,
or an Adam trial after 3 halvings) so that the caller can halve the steps and resume it.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree
from jaxtyping import Array

from . import _optimise as driver
from ._loss import Problem, SolveOptions, free_energy, optimiser_value_fn, physical

START, ADAM, LBFGS, DONE = 0, 1, 2, 3
# Why the loop stopped (``State.stop``; -1 while it runs).
RUNNING, REACHED, BUDGET, NO_DECREASE, NO_START, TOO_LONG, STALLED = -1, 0, 1, 2, 3, 4, 5
STOP_TEXT = {REACHED: "the target was reached", BUDGET: "the iteration budget ran out",
             NO_DECREASE: "the L-BFGS line search found no decrease",
             NO_START: "no finite starting point (every trial solve failed)",
             TOO_LONG: "the fixed steps were too long for the controls",
             STALLED: "the loss stopped decreasing (relative decrease < 1e-10, 5 times)"}

# A start whose solve fails is halved towards zero controls at most this many times.
MAX_RETREATS = 8
# An Adam trial that fails only the step-error check is halved towards the accepted iterate
# at most this many times (once for any other failure) before the iteration is rejected.
TOO_LONG_HALVINGS = 3
# L-BFGS stalls after this many accepted iterations in a row whose relative decrease is
# below STALL_RTOL.
STALL_COUNT = 5
STALL_RTOL = 1e-10


class LoopSettings(eqx.Module):
    """Settings of the optimiser loop (integers static: they size the history buffers).

    Attributes:
        stop_w2: the loop stops once W2 ≤ stop_w2 at λ = 0.
        adam_lr: Adam's learning rate.
        adam_steps: Adam iterations before L-BFGS.
        lbfgs_steps: L-BFGS iterations at λ = 0 (or without continuation).
        stage_steps: L-BFGS iterations of each continuation stage at λ > 0.
        max_stages: continuation stages at λ > 0 before the last one at λ = 0.
        continuation: whether λ > 0 runs in continuation stages (a bool array).
        refine: stop at a solve whose steps were too long (the caller refines and resumes).
    """

    stop_w2: Array
    adam_lr: Array
    continuation: Array
    adam_steps: int = eqx.field(static=True)
    lbfgs_steps: int = eqx.field(static=True)
    stage_steps: int = eqx.field(static=True)
    max_stages: int = eqx.field(static=True)
    refine: bool = eqx.field(static=True)

    @property
    def size(self) -> int:
        """Length of the history buffers: the start and every iteration the loop can take."""
        return 1 + self.adam_steps + self.lbfgs_steps + (self.max_stages + 1) * self.stage_steps


class State(eqx.Module):
    """The loop's state (every field an array or a pytree of arrays).

    Attributes:
        phase: START, ADAM, LBFGS or DONE.
        stop: why the loop stopped (RUNNING while it runs).
        raw: the point evaluated next (START, ADAM) or the current iterate (LBFGS).
        good: the last accepted Adam iterate.
        value: the loss at ``good`` (ADAM).
        grad: its gradient.
        best: the accepted Adam iterate of least loss.
        best_value: its loss.
        best_grad: its gradient.
        best_stale: the best iterate's loss is of another step count (evaluate it again).
        adam: Adam's state.
        lbfgs: L-BFGS's state (its value and gradient are those at ``raw``).
        lam: the current energy weight.
        stage: continuation stages done.
        it: iterations done (the history index).
        it_phase: iterations of the current Adam phase or L-BFGS stage.
        tries: retreats at the start, halvings of an Adam trial.
        stall: accepted L-BFGS iterations in a row with a negligible decrease.
        evaluations: loss evaluations.
        rejected: rejected trials (start, Adam) and L-BFGS iterations without decrease.
        backtracks: rejected trials whose solve failed only the step-error check.
        loss_history: the loss after each iteration (NaN: rejected, or not reached).
        w2_history: W2 after each iteration.
    """

    phase: Array
    stop: Array
    raw: Array
    good: Array
    value: Array
    grad: Array
    best: Array
    best_value: Array
    best_grad: Array
    best_stale: Array
    adam: tuple
    lbfgs: tuple
    lam: Array
    stage: Array
    it: Array
    it_phase: Array
    tries: Array
    stall: Array
    evaluations: Array
    rejected: Array
    backtracks: Array
    loss_history: Array
    w2_history: Array


def _transforms(loop: LoopSettings):
    """The shared driver's Adam and L-BFGS."""
    return driver.adam(loop.adam_lr), driver.lbfgs()


def _where(c, a, b):
    return jax.tree.map(lambda x, y: jnp.where(c, x, y), a, b)


def _w2(value, x, prob: Problem, lam, unravel):
    """W2 at ``x`` from its loss: ``sqrt(L − λ energy)`` (the energy in closed form)."""
    w2sq = value - lam * free_energy(unravel(x), prob)
    return jnp.sqrt(jnp.maximum(w2sq, 0.0))


def _record(s: State, i, value, w2) -> State:
    return eqx.tree_at(lambda t: (t.loss_history, t.w2_history), s,
                       (s.loss_history.at[i].set(value), s.w2_history.at[i].set(w2)))


def initial_state(raw, prob: Problem, loop: LoopSettings) -> State:
    """The state before the first evaluation of ``raw``."""
    adam, lbfgs = _transforms(loop)
    dtype = prob.S0.dtype
    i0 = jnp.zeros((), jnp.int32)
    nan = jnp.full((loop.size,), jnp.nan, dtype)
    inf = jnp.asarray(jnp.inf, dtype)
    zeros = jax.tree.map(jnp.zeros_like, raw)
    return State(phase=jnp.asarray(START, jnp.int32), stop=jnp.asarray(RUNNING, jnp.int32),
                 raw=raw, good=raw, value=inf, grad=zeros, best=raw, best_value=inf,
                 best_grad=zeros, best_stale=jnp.zeros((), bool), adam=adam.init(raw),
                 lbfgs=lbfgs.init(raw), lam=prob.weight, stage=i0, it=i0, it_phase=i0, tries=i0,
                 stall=i0, evaluations=i0, rejected=i0, backtracks=i0, loss_history=nan,
                 w2_history=nan)


def _enter_lbfgs(s: State, raw, value, grad, lbfgs_tx) -> State:
    """Start an L-BFGS stage at ``raw`` with an empty memory (a finite value kept, else stale)."""
    known = jnp.isfinite(value)
    st = optax.tree.set(lbfgs_tx.init(raw), value=jnp.where(known, value, jnp.inf),
                        grad=_where(known, grad, jax.tree.map(jnp.zeros_like, grad)))
    return eqx.tree_at(lambda t: (t.phase, t.raw, t.lbfgs, t.it_phase, t.stall, t.tries), s,
                       (jnp.asarray(LBFGS, jnp.int32), raw, st, jnp.zeros_like(s.it_phase),
                        jnp.zeros_like(s.stall), jnp.zeros_like(s.tries)))


def _start_branch(s: State, v, g, prob, loop, txs, unravel) -> State:
    """The start: accept a finite solve, else halve the controls (or stop)."""
    adam_tx, lbfgs_tx = txs
    ok = jnp.isfinite(v) & driver.finite(g)
    too_long = v == jnp.inf
    w2 = _w2(v, s.raw, prob, s.lam, unravel)
    reached = ok & (s.lam == 0) & (w2 <= loop.stop_w2)
    # accepted: record, then the next phase
    acc = _record(s, 0, v, w2)
    if loop.adam_steps > 0:
        u, adam_st = adam_tx.update(g, acc.adam, acc.raw)
        acc = eqx.tree_at(
            lambda t: (t.phase, t.good, t.value, t.grad, t.best, t.best_value, t.best_grad,
                       t.adam, t.raw, t.tries),
            acc, (jnp.asarray(ADAM, jnp.int32), s.raw, v, g, s.raw, v, g, adam_st,
                  optax.apply_updates(s.raw, u), jnp.zeros_like(s.tries)))
    else:
        acc = _enter_lbfgs(acc, s.raw, v, g, lbfgs_tx)
    acc = eqx.tree_at(lambda t: (t.phase, t.stop, t.raw), acc,
                      (jnp.where(reached, DONE, acc.phase), jnp.where(reached, REACHED, acc.stop),
                       _where(reached, s.raw, acc.raw)))
    # rejected: halve towards zero controls, or stop
    give_up = s.tries >= MAX_RETREATS
    stop = jnp.where(too_long & loop.refine, TOO_LONG, jnp.where(give_up, NO_START, RUNNING))
    rej = _record(s, 0, jnp.nan, jnp.nan)
    rej = eqx.tree_at(
        lambda t: (t.raw, t.tries, t.rejected, t.backtracks, t.stop, t.phase), rej,
        (_where(stop == RUNNING, jax.tree.map(lambda a: 0.5 * a, s.raw), s.raw),
         s.tries + (stop == RUNNING), s.rejected + 1, s.backtracks + too_long,
         stop.astype(jnp.int32), jnp.where(stop == NO_START, DONE, s.phase)))
    return _where(ok, acc, rej)


def _adam_branch(s: State, v, g, prob, loop, txs, unravel) -> State:
    """One Adam trial: accept it and propose the next, or halve it towards the accepted iterate."""
    adam_tx, lbfgs_tx = txs
    ok = jnp.isfinite(v) & driver.finite(g)
    too_long = v == jnp.inf
    # A rejected trial's gradient is passed on as NaN: apply_if_finite then gives a zero
    # update and leaves Adam's moments as they were (a too-long trial's gradient is finite:
    # zeros through the ``where`` of its loss).
    g_in = _where(ok, g, jax.tree.map(lambda a: jnp.full_like(a, jnp.nan), g))
    u, adam_st = adam_tx.update(g_in, s.adam, s.raw)
    w2 = _w2(v, s.raw, prob, s.lam, unravel)
    it = s.it + 1
    # accepted
    better = v < s.best_value
    acc = _record(s, it, v, w2)
    acc = eqx.tree_at(
        lambda t: (t.good, t.value, t.grad, t.raw, t.adam, t.tries, t.it, t.it_phase, t.best,
                   t.best_value, t.best_grad),
        acc, (s.raw, v, g, optax.apply_updates(s.raw, u), adam_st, jnp.zeros_like(s.tries), it,
              s.it_phase + 1, _where(better, s.raw, s.best), jnp.where(better, v, s.best_value),
              _where(better, g, s.best_grad)))
    reached = (s.lam == 0) & (w2 <= loop.stop_w2)
    acc = eqx.tree_at(lambda t: (t.phase, t.stop, t.raw), acc,
                      (jnp.where(reached, DONE, acc.phase), jnp.where(reached, REACHED, acc.stop),
                       _where(reached, s.raw, acc.raw)))
    # rejected
    limit = jnp.where(too_long, TOO_LONG_HALVINGS, 1)
    halve = s.tries < limit
    refine = ~halve & too_long & loop.refine
    half = jax.tree.map(lambda a, b: b + 0.5 * (a - b), s.raw, s.good)
    u2, adam_st2 = adam_tx.update(s.grad, adam_st, s.good)  # a new step from the accepted iterate
    give_up = ~halve & ~refine
    rej = eqx.tree_at(
        lambda t: (t.raw, t.adam, t.tries, t.rejected, t.backtracks, t.stop, t.it, t.it_phase),
        s, (_where(halve, half, _where(refine, s.raw, optax.apply_updates(s.good, u2))),
            jax.tree.map(lambda a, b: jnp.where(give_up, a, b), adam_st2, adam_st),
            jnp.where(halve, s.tries + 1, jnp.where(refine, s.tries, 0)), s.rejected + 1,
            s.backtracks + too_long, jnp.where(refine, TOO_LONG, s.stop).astype(jnp.int32),
            jnp.where(give_up, it, s.it), s.it_phase + give_up))
    rej = jax.tree.map(lambda a, b: jnp.where(give_up, a, b), _record(rej, it, jnp.nan, jnp.nan), rej)
    out = _where(ok, acc, rej)
    # the Adam budget is spent: L-BFGS from the best iterate
    end = (out.phase == ADAM) & (out.it_phase >= loop.adam_steps) & (out.stop == RUNNING)
    use_best = jnp.isfinite(out.best_value)
    nxt = _enter_lbfgs(out, _where(use_best, out.best, out.good),
                       jnp.where(use_best, out.best_value, out.value),
                       _where(use_best, out.best_grad, out.grad), lbfgs_tx)
    out = _where(end, nxt, out)
    # after a refinement: the best iterate's loss at the new step count (no iteration)
    stale = eqx.tree_at(lambda t: (t.best_value, t.best_grad, t.best_stale), s,
                        (jnp.where(ok, v, jnp.inf), g, jnp.zeros((), bool)))
    return _where(s.best_stale, stale, out)


def _lbfgs_branch(s: State, v, g, prob, loop, txs, fn, unravel) -> State:
    """One L-BFGS iteration (direction and zoom line search), and the end of a stage."""
    _, lbfgs_tx = txs
    ok = jnp.isfinite(v) & driver.finite(g)
    st = optax.tree.set(s.lbfgs, value=v, grad=g)
    prob_l = eqx.tree_at(lambda p: p.weight, prob, s.lam)
    raw2, st2, v2, g2, trial_ok = driver.lbfgs_iteration(lbfgs_tx, s.raw, st, v, g, fn, prob=prob_l)
    lr = optax.tree.get(st2, "learning_rate")
    n_ls = optax.tree.get(st2, "num_linesearch_steps")
    accepted = ok & trial_ok & (lr > 0) & (v2 <= v + 1e-6 * jnp.abs(v))
    raw_n = _where(accepted, raw2, s.raw)
    v_n = jnp.where(accepted, v2, v)
    w2 = _w2(v_n, raw_n, prob, s.lam, unravel)
    it = s.it + 1
    rel = (v - v2) / jnp.maximum(jnp.abs(v), jnp.finfo(v.dtype).tiny)
    stall = jnp.where(accepted, jnp.where(rel < STALL_RTOL, s.stall + 1, 0), s.stall)
    out = _record(s, it, jnp.where(ok, v_n, jnp.nan), jnp.where(ok, w2, jnp.nan))
    out = eqx.tree_at(
        lambda t: (t.raw, t.lbfgs, t.it, t.it_phase, t.stall, t.evaluations, t.rejected),
        out, (raw_n, _where(accepted, st2, st), it, s.it_phase + 1, stall,
              s.evaluations + jnp.where(ok, n_ls, 0), s.rejected + ~accepted))
    reached = ok & (w2 <= loop.stop_w2)
    budget = jnp.where((s.lam == 0) | ~loop.continuation, loop.lbfgs_steps, loop.stage_steps)
    stage_end = ~accepted | (stall >= STALL_COUNT) | (out.it_phase >= budget)
    # λ > 0: the stage ends at the target or continues at λ/10 (λ = 0 after max_stages)
    next_stage = stage_end & ok & (s.lam > 0) & ~reached & loop.continuation
    nxt = eqx.tree_at(lambda t: (t.lam, t.stage), out,
                      (jnp.where(s.stage < loop.max_stages, s.lam / 10, 0.0), s.stage + 1))
    nxt = _enter_lbfgs(nxt, raw_n, jnp.asarray(jnp.inf, v.dtype), g, lbfgs_tx)
    finished = (reached & ((s.lam == 0) | stage_end)) | (stage_end & ~next_stage)
    why = jnp.where(reached, REACHED, jnp.where(~accepted, NO_DECREASE,
                                                jnp.where(stall >= STALL_COUNT, STALLED, BUDGET)))
    done = eqx.tree_at(lambda t: (t.phase, t.stop), out,
                       (jnp.asarray(DONE, jnp.int32), why.astype(jnp.int32)))
    return _where(finished, done, _where(next_stage, nxt, out))


def run(s: State, prob: Problem, loop: LoopSettings, opts: SolveOptions, unravel, it_end) -> State:
    """Run the loop from ``s`` until it is done, stops for a refinement, or ``it_end`` iterations are done.

    The iterates are flat vectors (``jax.flatten_util.ravel_pytree`` of the controls'
    parameters; ``unravel`` maps one back): one array per field of the loop's state and of
    the optimisers' states.

    Args:
        s: the state.
        prob: the problem.
        loop: the loop's settings.
        opts: the solve's settings.
        unravel: maps a flat vector to the controls' parameters.
        it_end: the segment's end, an int32 array (iterations counted from the start).

    Returns:
        The state at the end of the segment.
    """
    txs = _transforms(loop)
    fn = optimiser_value_fn(opts, unravel)
    vg = optax.value_and_grad_from_state(fn)
    kw = dict(prob=prob, loop=loop, txs=txs, unravel=unravel)

    def typed(branch):  # every branch returns the state's own dtypes
        return lambda s, v, g: jax.tree.map(lambda a, b: jnp.asarray(a, b.dtype), branch(s, v, g), s)

    branches = [typed(functools.partial(_start_branch, **kw)),
                typed(functools.partial(_adam_branch, **kw))
                if loop.adam_steps > 0 else (lambda s, v, g: s),  # no Adam phase: not compiled
                typed(functools.partial(_lbfgs_branch, fn=fn, **kw))]

    def body(s):
        in_lbfgs = s.phase == LBFGS
        stored = optax.tree.get(s.lbfgs, "value")
        known = in_lbfgs & jnp.isfinite(stored)
        # one evaluation site: the L-BFGS state's value and gradient when known, else a solve
        st = optax.tree.set(s.lbfgs, value=jnp.where(known, stored, jnp.inf))
        x = jnp.where(s.best_stale, s.best, s.raw)
        v, g = vg(x, state=st, prob=eqx.tree_at(lambda p: p.weight, prob, s.lam))
        s = eqx.tree_at(lambda t: t.evaluations, s, s.evaluations + ~known)
        return jax.lax.switch(jnp.minimum(s.phase, LBFGS), branches, s, v, g)

    return driver.segment_loop(body, s, it_end, running)


def running(s: State):
    """Whether the loop goes on (a boolean array): not done and not stopped."""
    return (s.phase != DONE) & (s.stop == RUNNING)


@eqx.filter_jit
def start(raw, prob: Problem, loop: LoopSettings):
    """The state before the first evaluation of the controls' parameters ``raw``."""
    return initial_state(ravel_pytree(raw)[0], prob, loop)


@eqx.filter_jit
def advance(s: State, like, prob: Problem, loop: LoopSettings, opts: SolveOptions, it_end):
    """One segment of :func:`run` (``like``: parameters giving the structure)."""
    return run(s, prob, loop, opts, ravel_pytree(like)[1], it_end)


@eqx.filter_jit
def outcome(s: State, like, prob: Problem):
    """The controls' values and their energy at the state's iterate."""
    unravel = ravel_pytree(like)[1]
    return physical(unravel(s.raw), prob), free_energy(unravel(s.raw), prob)


@eqx.filter_jit
def error_ratio(x, like, prob: Problem, opts: SolveOptions):
    """The largest step-error ratio of the solve at the flat parameters ``x`` (forward only)."""
    from ._loss import solve_terms

    return solve_terms(ravel_pytree(like)[1](x), prob, opts)[3]
