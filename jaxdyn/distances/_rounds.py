"""The Sinkhorn rounds behind :func:`w2_sinkhorn`.

One debiased round (three entropic problems, annealed in ε and warm-started, on ott's
Sinkhorn; the block-sparse rounds' symmetric problems by ott's iteration with one kernel
pass per iteration), the over-relaxation re-estimated at every error check (the multiscale
solver's rounds), S_ε from given potentials (the gradient), and the host-driven ε ladder of the
multiscale solver.
"""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ..kernels._sparse import listed_lse
from ._geometries import online_geometry, sparse_geometry


def sq_dists(u, v):
    """|u_i - v_j|^2 by differences (no |u|^2 + |v|^2 - 2 u.v cancellation, no matmul)."""
    return jnp.sum((u[:, None, :] - v[None, :, :]) ** 2, axis=-1)


#: the largest unaccelerated per-iteration contraction assumed by the re-estimated
#: over-relaxation (ott's own Lehmann estimate caps the ratio of ten iterations at 0.99,
#: i.e. 0.99^(1/10) per iteration: ω <= 1.94).
_RHO_MAX = 0.99 ** 0.1


#: the re-estimation only uses error ratios measured below this marginal error (L1): the
#: relation it inverts is that of the linearised iteration, near the fixed point.
_REESTIMATE_BELOW = 0.1
#: an error grown past this multiple of its level when the over-relaxation started ends the
#: over-relaxation (ω = 1, plain Sinkhorn, for the rest of the solve).
_DIVERGED = 10.0


def _lehmann(rho):
    """The optimal over-relaxation 2 / (1 + sqrt(1 - rho)) for a contraction rho (Lehmann et al. 2021, eq. 5)."""
    return 2.0 / (1.0 + jnp.sqrt(1.0 - rho))


@functools.cache
def _reestimated_momentum_classes():
    """The re-estimated momentum and the Sinkhorn solver that keeps it (ott subclasses).

    ott's adaptive momentum measures ω once (at ``start``, from the error ratio of the
    ten iterations before) and keeps it. After a warm start the early error is dominated by
    fast modes: ω comes out small, and the slow modes that remain then contract far more
    slowly than under the optimal ω (docs/math.md §D.4, item 9). This momentum
    re-estimates ω at every error check (every ``inner_iterations``) from the ratio λ
    observed under the current ω, by inverting the over-relaxation relation of a
    symmetric linear iteration, ``(λ + ω - 1)^2 = λ ω^2 μ``, for the unaccelerated
    contraction μ, and takes ``max(ω, lehmann(μ))`` (ω never decreases; a ratio >= 1, a
    transient, changes nothing; past the optimum |λ| = ω - 1 gives back the same ω). The
    convergence test is ott's: only the number of iterations changes. It overrides the
    public ``Momentum.weight`` and reads the public ``errors`` of ott's Sinkhorn state.

    Returns:
        (ReestimatedMomentum, ReestimatingSinkhorn), built once, on first use.
    """
    import dataclasses

    from ott.solvers.linear import acceleration, sinkhorn

    @dataclasses.dataclass
    class ReestimatedMomentum(acceleration.Momentum):
        def weight(self, state, iteration):
            inner = self.inner_iterations
            k0 = self.start // inner  # first block of iterations over-relaxed (>= 2)
            k = iteration // inner  # current block
            errs = state.errors[:, -1]
            one = jnp.ones((), errs.dtype)
            p = jnp.asarray(1.0 / inner, errs.dtype)
            rho0 = jnp.minimum(errs[k0 - 1] / errs[k0 - 2], 0.99) ** p
            w0 = _lehmann(jnp.clip(rho0, 0.0, _RHO_MAX))

            e_ref = errs[k0 - 1]  # the error when the over-relaxation started

            def body(j, carry):
                w, bad = carry
                lam = (errs[j - 1] / errs[j - 2]) ** p  # observed in block j - 1 under w
                ok = jnp.isfinite(lam) & (lam > 0) & (lam < 1) & (errs[j - 1] < _REESTIMATE_BELOW)
                lam = jnp.where(ok, lam, 0.5)
                mu = jnp.clip((lam + w - 1.0) ** 2 / (lam * w * w), 0.0, _RHO_MAX)
                # safeguard: an error grown past _DIVERGED x its level at the start of the
                # over-relaxation (or not finite) ends it for the rest of the solve
                bad = bad | ~(errs[j - 1] < _DIVERGED * e_ref)
                return jnp.where(ok, jnp.maximum(w, _lehmann(mu)), w), bad

            w, bad = jax.lax.fori_loop(k0 + 1, jnp.maximum(k + 1, k0 + 1), body,
                                       (w0, jnp.zeros((), bool)))
            w = jnp.where(bad, self.value * one, w)
            return jnp.where(iteration >= self.start, w, self.value * one)

    # ott's ``Sinkhorn.__init__`` rebuilds the momentum it is given as a base-class
    # ``acceleration.Momentum`` (to set its ``inner_iterations``), which drops this subclass's
    # ``weight``: the solver wraps it again after ott's constructor (also when ott's
    # ``tree_unflatten`` calls the constructor), through the public ``momentum`` attribute.
    @jtu.register_pytree_node_class
    class ReestimatingSinkhorn(sinkhorn.Sinkhorn):
        """ott's Sinkhorn keeping a :class:`ReestimatedMomentum` (ott rebuilds its base class)."""

        def __init__(self, *args, momentum=None, **kw):
            super().__init__(*args, momentum=momentum, **kw)
            if isinstance(momentum, ReestimatedMomentum):
                self.momentum = ReestimatedMomentum(momentum.start, momentum.error_threshold,
                                                    momentum.value, self.inner_iterations)

    return ReestimatedMomentum, ReestimatingSinkhorn


def _reestimating_solver(threshold, max_iterations, start, value, inner_iterations=10):
    """A Sinkhorn solver of ott whose over-relaxation is re-estimated at every error check."""
    mom, solver = _reestimated_momentum_classes()
    return solver(threshold=threshold, max_iterations=max_iterations,
                  inner_iterations=inner_iterations, momentum=mom(start=start, value=value))


#: the largest ε ratio crossed within one Sinkhorn solve (by annealing); larger drops are
#: split over several warm-started rounds.
_MAX_ROUND_RATIO = 100.0


def _anneal_length(decay: float) -> int:
    """Iterations of an annealing over the ratio ``_MAX_ROUND_RATIO`` at ``decay``."""
    return int(math.ceil(math.log(_MAX_ROUND_RATIO) / math.log(1.0 / decay)))


#: iterations between two error checks of the symmetric problems (x, x), (y, y).
SYM_INNER = 5
#: iterations between two error checks of the (x, y) problem of the rounds whose
#: over-relaxation is re-estimated (``reestimate=True``): each check costs one more kernel
#: pass, and the over-relaxation is measured from the second check on
#: (``_multiscale.FINE_MOMENTUM_START``).
XY_INNER = 5


def _centre_gauge(init, a, b, dtype):
    """``init`` with its (x, y) potentials' gauge fixed (f + c, g - c is the same plan).

    A warm start can carry an offset, and the kernel result R_i ≈ ε log a_i - f_i then loses
    |f| · 2^-24 / ε of relative accuracy in float32, at small ε more than the marginal
    threshold. Centred, |f|, |g| are of the order of the cost.

    Returns:
        ``init`` with ``(f - c, g + c)`` for its (x, y) pair, ``c`` the weighted half difference
        of their means (0 where that is not finite).
    """
    (f0, g0) = init[0]
    shift = 0.5 * (jnp.sum(jnp.where(a > 0, a * f0, 0.0)) - jnp.sum(jnp.where(b > 0, b * g0, 0.0)))
    shift = jnp.where(jnp.isfinite(shift), shift, jnp.zeros((), dtype))
    return ((f0 - shift, g0 + shift),) + tuple(init[1:])


def _symmetric_problems(x, y, a, b, init, geom, sched, sparse, block, *, threshold,
                        max_iterations, half):
    """The (x, x) and (y, y) problems of a round: symmetric updates averaged with weight 1/2.

    As ott's divergence does. Their error is checked every SYM_INNER iterations (ott's
    default: 10): warm-started from the round before (or a coarser level), they often meet
    the threshold within a few.

    Returns:
        For (x, x) then (y, y): (potentials, regularised cost, converged, iterations).
    """
    from ott.problems.linear import linear_problem
    from ott.solvers.linear import acceleration, sinkhorn

    if sparse is not None:
        # block-sparse symmetric problems: one kernel pass per iteration (ott's parallel
        # updates make two identical ones, and two more per error check), the same iterates;
        # a hand-written loop because ott's solver has no such mode (docs/math.md §D.4, item 11)
        def sym(u, w, nbr, f0):
            f, cost, conv, its = _symmetric_sparse_solve(
                u, w, f0, sched, nbr, block, threshold=threshold, max_iterations=max_iterations,
                inner=SYM_INNER, value=half)
            return (f, f), cost, conv, its

        return sym(x, a, sparse[2], init[1][0]), sym(y, b, sparse[3], init[2][0])
    solver_sym = sinkhorn.Sinkhorn(
        threshold=threshold,
        max_iterations=max_iterations,
        inner_iterations=SYM_INNER,
        parallel_dual_updates=True,
        momentum=acceleration.Momentum(start=0, value=half),
    )
    out_xx = solver_sym(linear_problem.LinearProblem(geom(x, x, "xx"), a=a, b=a), init=init[1])
    out_yy = solver_sym(linear_problem.LinearProblem(geom(y, y, "yy"), a=b, b=b), init=init[2])
    return (((out_xx.f, out_xx.g), out_xx.reg_ot_cost, out_xx.converged, out_xx.n_iters),
            ((out_yy.f, out_yy.g), out_yy.reg_ot_cost, out_yy.converged, out_yy.n_iters))


def _round_body(x, y, eps, eps_start, init, a=None, b=None, sparse=None, *, threshold,
                max_iterations, batch_size, decay, momentum_start, block=None,
                reestimate=False):
    """One round: the three entropic problems at ``eps``, annealed from ``eps_start``.

    Warm-started from ``init`` = ((f_xy, g_xy), (f_xx, g_xx), (f_yy, g_yy)).

    ``a``, ``b``: weights (default uniform). ``sparse``: block neighbour lists
    ``(xy rows x, xy rows y, xx, yy)`` of the block-sparse geometry (clouds in leaf order,
    see :mod:`jaxdyn.distances._multiscale`), ``block`` its leaf size; else dense (``batch_size``
    None) or online (``batch_size`` rows). ``reestimate``: the (x, y) over-relaxation is
    re-estimated at every error check (:func:`_reestimating_solver`).

    Returns:
        (S_ε, the three problems' final potentials, their converged flags (3,), their
        iteration counts (3,)).
    """
    from ott.geometry import epsilon_scheduler, geometry
    from ott.problems.linear import linear_problem
    from ott.solvers.linear import acceleration, sinkhorn

    dtype = x.dtype
    n, m = x.shape[0], y.shape[0]
    if a is None:
        a = jnp.full((n,), 1.0 / n, dtype=dtype)
    if b is None:
        b = jnp.full((m,), 1.0 / m, dtype=dtype)
    eps = jnp.asarray(eps, dtype)
    start = jnp.maximum(jnp.asarray(eps_start, dtype) / eps, jnp.asarray(1.0, dtype))
    # ε(it) = max(start · decay^it, 1) · eps: ott's scheduler, whose ``init`` (traced here: a
    # value of the ladder) it keeps as pytree metadata; ott's solver only calls it
    sched = epsilon_scheduler.Epsilon(eps, init=start, decay=decay)
    init = _centre_gauge(init, a, b, dtype)

    def geom(u, v, which):
        if sparse is not None:

            nbr = {"xy": (sparse[0], sparse[1]), "xx": (sparse[2], sparse[2]),
                   "yy": (sparse[3], sparse[3])}[which]
            return sparse_geometry(u, v, sched, nbr[0], nbr[1], block)
        if batch_size is None:
            return geometry.Geometry(cost_matrix=sq_dists(u, v), epsilon=sched)
        return online_geometry(u, v, sched, batch_size)

    one = np.asarray(1.0, dtype)  # dtype-true constants: x64 mode must not promote f32 runs
    half = np.asarray(0.5, dtype)
    # (x, y): alternate updates, adaptive over-relaxation (Lehmann et al.) measured once the
    # annealing is over; it cuts the iterations at small ε on spread clouds.
    if reestimate:
        solver_xy = _reestimating_solver(threshold, max_iterations, momentum_start, one,
                                         XY_INNER)
    else:
        solver_xy = sinkhorn.Sinkhorn(
            threshold=threshold,
            max_iterations=max_iterations,
            momentum=acceleration.Momentum(start=momentum_start, value=one),
        )
    out_xy = solver_xy(linear_problem.LinearProblem(geom(x, y, "xy"), a=a, b=b), init=init[0])
    (pxx, cxx, vxx, ixx), (pyy, cyy, vyy, iyy) = _symmetric_problems(
        x, y, a, b, init, geom, sched, sparse, block, threshold=threshold,
        max_iterations=max_iterations, half=half)
    div = out_xy.reg_ot_cost - 0.5 * (cxx + cyy)
    pots = ((out_xy.f, out_xy.g), pxx, pyy)
    converged = jnp.stack([out_xy.converged, vxx, vyy])
    n_iters = jnp.stack([out_xy.n_iters, ixx, iyy]).astype(out_xy.n_iters.dtype)
    return div, pots, converged, n_iters


def _symmetric_sparse_solve(x, a, f0, sched, nbr, block, *, threshold, max_iterations, inner,
                            value):
    r"""Sinkhorn on the symmetric problem (x, x) with weights a, block-sparse, one kernel pass per iteration.

    The iteration of ott's Sinkhorn with parallel dual updates and momentum ``value`` (1/2)
    on a symmetric problem whose two potentials start equal: there both updates are one
    and the same kernel pass (same points, same lists, same potential), so the potential
    is kept once,

        f ← (1 - w) f + w (ε_t log a - ε_t lse_j((f_j - C_ij) / ε_t)),

    ε_t ott's annealed ε (``sched(t)``). Every ``inner`` iterations the error is ott's for
    parallel updates, the L1 violations of both marginals, here twice that of the rows,
    ``2 Σ_i |e^{(f_i + z_i) / ε} - a_i|`` (``z_i`` the pass's log-sum-exp), formed from the
    pass that the next update uses: no pass of its own (and at the last iteration).
    Converged when it is below ``threshold`` at the target ε; a non-finite error stops the
    solve. The dual cost is ott's
    :func:`~ott.solvers.linear.sinkhorn.compute_kl_reg_cost`.

    Returns:
        (f, dual cost, converged, iterations).
    """
    from ott.problems.linear import linear_problem
    from ott.solvers.linear.sinkhorn import compute_kl_reg_cost

    dtype = x.dtype
    target = sched(None)
    log_a = jnp.log(a)
    w = jnp.asarray(value, dtype)

    def body(carry):
        t, f, _, _ = carry
        eps_t = sched(t).astype(dtype)
        z = listed_lse(x, x, f, eps_t, nbr, block=block)
        marg = jnp.where(jnp.isfinite(f) & jnp.isfinite(z), jnp.exp((f + z) / eps_t), 0.0)
        err = 2.0 * jnp.sum(jnp.abs(marg - a))
        # checked every ``inner`` iterations and at the last (as ott); a non-finite error
        # ends the solve (ott's divergence), not converged
        check = (t > 0) & ((t % inner == 0) | (t >= max_iterations))
        conv = check & (eps_t == target) & (err < threshold)
        stop = conv | (t >= max_iterations) | (check & ~jnp.isfinite(err))
        new = eps_t * log_a - jnp.where(jnp.isfinite(z), z, 0.0)
        f_next = (1.0 - w) * jnp.where(jnp.isfinite(f), f, 0.0) + w * new
        return (jnp.where(stop, t, t + 1), jnp.where(stop, f, f_next), conv, stop)

    init = (jnp.zeros((), jnp.int32), f0.astype(dtype), jnp.zeros((), bool),
            jnp.zeros((), bool))
    t, f, conv, _ = jax.lax.while_loop(lambda c: ~c[3], body, init)
    geom = sparse_geometry(x, x, sched, nbr, nbr, block)
    cost = compute_kl_reg_cost(f, f, linear_problem.LinearProblem(geom, a=a, b=a), True)
    return f, cost, conv, t


def dual_divergence(x, y, eps, pots, batch_size):
    """S_ε of uniform clouds from given potentials ((f_xy, g_xy), (f_xx, g_xx), (f_yy, g_yy)).

    ott's dual cost of each problem (:func:`ott.solvers.linear.sinkhorn.compute_kl_reg_cost`),
    the value a round reports at its final potentials. With the potentials held fixed, its
    gradient in x and y is that of S_ε at the optimum (Danskin: the dual cost is stationary
    in optimal potentials), which is what ott's own ``use_danskin`` gradient uses.

    Returns:
        S_ε, a scalar of the clouds' dtype.
    """
    from ott.geometry import geometry
    from ott.problems.linear import linear_problem
    from ott.solvers.linear.sinkhorn import compute_kl_reg_cost

    dtype = x.dtype
    a = jnp.full((x.shape[0],), 1.0 / x.shape[0], dtype=dtype)
    b = jnp.full((y.shape[0],), 1.0 / y.shape[0], dtype=dtype)

    def cost(u, v, wu, wv, fg):
        if batch_size is None:
            geom = geometry.Geometry(cost_matrix=sq_dists(u, v), epsilon=eps)
        else:
            geom = online_geometry(u, v, eps, batch_size)
        f, g = jax.lax.stop_gradient(fg)
        return compute_kl_reg_cost(f, g, linear_problem.LinearProblem(geom, a=wu, b=wv), True)

    return cost(x, y, a, b, pots[0]) - 0.5 * (cost(x, x, a, a, pots[1]) + cost(y, y, b, b, pots[2]))


# compiled once per shapes and settings
_round_program = eqx.filter_jit(_round_body)


def _debiased_round(x, y, eps, eps_start, init, a=None, b=None, sparse=None, **static):
    """One debiased round (:func:`_round_body`) as one jitted program.

    ``eps`` and ``eps_start`` travel as arrays of the clouds' dtype, so that every round of a
    ladder runs the same program (a Python float would be baked in; the cast is the one the
    round makes inside).

    Returns:
        What :func:`_round_body` returns.
    """
    if not isinstance(eps, jax.core.Tracer):
        eps = np.asarray(eps, dtype=x.dtype)
    if not isinstance(eps_start, jax.core.Tracer):
        eps_start = np.asarray(eps_start, dtype=x.dtype)
    return _round_program(x, y, eps, eps_start, init, a, b, sparse, **static)


def _ladder(solve, eps, eps_prev, init, rule, max_rounds):
    """The host-driven ε ladder of the multiscale solver's coarse level.

    Solve at ``eps`` (annealed from ``eps_prev``), then ``rule(eps, div)`` gives the next ε,
    until it says stop.

    Returns:
        (eps, div, converged, xy iterations, ε list, divergence list, info with the final
        potentials).
    """
    eps_list, div_list = [], []
    n_total = 0
    converged = False
    div = float("nan")
    pots = init
    for _ in range(max_rounds):
        div_j, new_pots, conv, iters = solve(eps, eps_prev, pots)
        div = float(div_j)
        converged = bool(np.all(np.asarray(conv)))
        n_total += int(np.asarray(iters)[0])
        eps_list.append(float(eps))
        div_list.append(div)
        if not np.isfinite(div):
            converged = False
            break
        pots = new_pots
        nxt = rule(eps, div)
        if nxt is None:
            break
        eps_prev, eps = eps, nxt
    else:
        converged = False  # ran out of rounds before ε settled
    return eps, div, converged, n_total, eps_list, div_list, {"pots": pots}
