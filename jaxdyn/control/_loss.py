r"""The loss of the reachability problem, by constant diffrax Dopri8 steps on the control grid.

The moment ODE under piecewise controls, solved by diffrax's Dopri8 in constant steps on the
control grid, and the W2 + energy objective:

    L = W2²(N(m(t1), Σ(t1)), N(m1, Σ1)) + λ ∫_0^{t1} Σ_{free u} ‖u(t)‖_F² dt

The solve takes ``steps_per_piece`` steps of :class:`diffrax.Dopri8` in each piece of the grid
(``Dopri8().step``, its tableau and stage loop, in one ``lax.scan`` over the steps): no step
straddles a piece boundary, so every step sees smooth controls and keeps the method's order 8,
and the step count is fixed, so the reverse pass is that of a scan. Each step's embedded error
estimate is measured against ``(rtol, atol)`` (the RMS norm of ``error / (atol + rtol
max(|y0|, |y1|))``, diffrax's PID controller's): a solve whose largest ratio exceeds 1 has
steps too long for its controls and is flagged, not trusted.

The pieces are a scan of ``Dopri8().step`` rather than one ``diffeqsolve`` with
``ConstantStepSize`` a piece: the same loss and error ratio to the last digit, faster to
compile and to run on this small fixed-step problem.
"""

from __future__ import annotations

import functools
from typing import Mapping, Optional

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._results import RESULTS, Solution, from_codes, status_code
from ..distances._bures import clipped_bures_w2_squared
from ..gaussian._solve import Control, moment_rhs, solve_moments
from ._problem import CONTROL_NAMES, _energy_values

# The blow-up threshold of solve_moments' default: a solve whose ‖Σ‖_F passes it is failed.
THRESHOLD = 1e6


class Problem(eqx.Module):
    """Arrays of one reachability problem (``kind`` static).

    The modes differ only in arrays (free mask, bounds, energy weight), so every mode shares
    one compiled loss per (d, n_pieces, dtype).

    Attributes:
        m0: (d,) initial mean.
        S0: (d, d) initial covariance.
        m1: (d,) target mean.
        S1: (d, d) target covariance.
        t1: the horizon.
        mask: (4,) 1 for a free control, 0 for a fixed one, in the order ``CONTROL_NAMES``.
        fixed: the values of the controls (used where ``mask`` is 0), one array each.
        bound: (4,) Frobenius bound of each control (inf: none).
        weight: the energy weight λ.
        kind: ``"piecewise"`` or ``"linear"`` (static).
    """

    m0: Array
    S0: Array
    m1: Array
    S1: Array
    t1: Array
    mask: Array
    fixed: tuple
    bound: Array
    weight: Array
    kind: str = eqx.field(static=True)


class SolveOptions(eqx.Module):
    """Static settings of the optimiser's solve (a change compiles a new program).

    Attributes:
        rtol: relative tolerance of the step-error check (or of the adaptive solve).
        atol: absolute tolerance of the step-error check (or of the adaptive solve).
        steps_per_piece: constant Dopri8 steps in each piece.
        solver: None (constant steps) or a diffrax solver for an adaptive
            :func:`jaxdyn.gaussian.solve_moments` instead.
        max_steps: step budget of the adaptive solve.
    """

    rtol: float = eqx.field(static=True)
    atol: float = eqx.field(static=True)
    steps_per_piece: int = eqx.field(static=True, default=2)
    solver: Optional[diffrax.AbstractSolver] = eqx.field(static=True, default=None)
    max_steps: int = eqx.field(static=True, default=4096)


def default_tolerances(dtype, rtol=None, atol=None):
    """The optimiser's solve tolerances: 1e-9/1e-11 in float64, 1e-5/1e-7 in float32."""
    f64 = np.dtype(dtype) == np.float64
    return ((1e-9 if f64 else 1e-5) if rtol is None else float(rtol),
            (1e-11 if f64 else 1e-7) if atol is None else float(atol))


def _field(linear, t, y, args):
    """The moment ODE's right side with the controls of one piece (``args``)."""
    if linear:  # controls linear in time across the piece
        lo, hi, t_start, h_piece = args
        w = (t - t_start) / h_piece
        par = [a + w * (b - a) for a, b in zip(lo, hi)]
    else:
        par = args
    return moment_rhs(*y, *par)


def fixed_step_moments(vals, m0, S0, t1, kind: str, opts: SolveOptions):
    r"""The moment ODE under piecewise controls by constant diffrax Dopri8 steps.

    Args:
        vals: ``(A, B, V, b)`` control values on the grid: ``(n, d, d)`` and ``(n, d)`` with
            n pieces (``kind="piecewise"``) or n + 1 nodes (``"linear"``).
        m0: (d,) initial mean.
        S0: (d, d) initial covariance.
        t1: the horizon.
        kind: ``"piecewise"`` or ``"linear"``.
        opts: the solve's settings (``steps_per_piece``, ``rtol``, ``atol``).

    Returns:
        ``(m, Σ, code, ratio)``: the state at t1, the status code (``successful``;
        ``max_steps_reached`` when a step's error ratio exceeded 1 — the steps were too long
        for these controls, and shorter ones would cure it; ``large`` when ``‖Σ‖_F`` passed
        ``1e6 max(‖Σ0‖_F, 1)``; ``nonfinite``) and the largest step-error ratio.
    """
    linear = kind == "linear"
    n = vals[0].shape[0] - (1 if linear else 0)
    steps = opts.steps_per_piece
    dtype = S0.dtype
    h_piece = t1 / n
    h = h_piece / steps
    thr = THRESHOLD * jnp.maximum(jnp.sqrt(jnp.sum(S0 * S0)), 1.0)
    term = diffrax.ODETerm(functools.partial(_field, linear))
    solver = diffrax.Dopri8()
    sg = jax.lax.stop_gradient
    ncomp = m0.size + S0.size

    def args_of(k):
        lo = tuple(v[k] for v in vals)
        if not linear:
            return lo
        return lo, tuple(v[k + 1] for v in vals), k.astype(dtype) * h_piece, h_piece

    def step(carry, i):
        y, fsal, big, emax = carry
        k = i // steps
        j = i - k * steps
        t0 = k.astype(dtype) * h_piece + j.astype(dtype) * h
        # a new piece: the controls jump, the first stage is evaluated again (not FSAL)
        y1, err, _, fsal, _ = solver.step(term, t0, t0 + h, y, args_of(k), fsal, j == 0)
        tot = 0.0
        for a, b, e in zip(y, y1, err):
            scale = opts.atol + opts.rtol * jnp.maximum(jnp.abs(sg(a)), jnp.abs(sg(b)))
            tot = tot + jnp.sum((sg(e) / scale) ** 2)
        ratio = jnp.sqrt(tot / ncomp)
        S = sg(y1[1])
        big = big | ~(jnp.sqrt(jnp.sum(S * S)) < thr)
        return (y1, fsal, big, jnp.maximum(emax, ratio)), None

    zero = jnp.zeros((), jnp.int32)
    fsal0 = solver.init(term, jnp.zeros((), dtype), h, (m0, S0), args_of(zero))
    carry0 = ((m0, S0), fsal0, jnp.zeros((), bool), jnp.zeros((), dtype))
    ((m, S), _, big, emax), _ = jax.lax.scan(step, carry0, jnp.arange(n * steps))
    finite = jnp.all(jnp.isfinite(S)) & jnp.all(jnp.isfinite(m))
    status = jnp.where(~finite, status_code("nonfinite"),
                       jnp.where(big, status_code("large"),
                                 jnp.where(emax <= 1.0, status_code("successful"),
                                           status_code("max_steps_reached"))))
    return m, S, status.astype(jnp.int32), emax


def squash(w, c):
    r"""Radial squash ``w ↦ c tanh(‖w‖/c) w/‖w‖`` per piece (``‖·‖`` Frobenius): ``‖u‖ < c``."""
    flat = w.reshape(w.shape[0], -1)
    r = jnp.sqrt(jnp.sum(flat * flat, axis=-1) + jnp.finfo(w.dtype).tiny)
    bounded = jnp.isfinite(c)
    cs = jnp.where(bounded, c, 1.0)
    fac = jnp.where(bounded, cs * jnp.tanh(r / cs) / r, 1.0)
    return w * fac.reshape((-1,) + (1,) * (w.ndim - 1))


def unsquash(u, c):
    """Inverse of :func:`squash` on the host (norms at or beyond the bound pulled to 0.95 c)."""
    if not np.isfinite(c):
        return u
    flat = u.reshape(u.shape[0], -1)
    r = np.sqrt(np.sum(flat * flat, axis=-1))
    rr = np.minimum(r, 0.95 * c)
    w = np.where(r > 0, c * np.arctanh(rr / c) / np.where(r > 0, r, 1.0), 0.0)
    return u * w.reshape((-1,) + (1,) * (u.ndim - 1))


def physical(raw, prob: Problem):
    """The control values ``(A, B, V, b)`` of the parameters ``raw`` (free ones squashed)."""
    out = []
    for i, name in enumerate(CONTROL_NAMES):
        u = squash(raw[name], prob.bound[i])
        out.append(prob.mask[i] * u + (1 - prob.mask[i]) * prob.fixed[i])
    return out


def free_energy(raw, prob: Problem):
    """``∫ Σ_{free u} ‖u‖_F² dt`` of the optimiser's parameters (closed form, no solve)."""
    vals = physical(raw, prob)
    return sum(prob.mask[i] * _energy_values(v, prob.kind, prob.t1) for i, v in enumerate(vals))


def solve_terms(raw, prob: Problem, opts: SolveOptions):
    """``(W2², energy, code, ratio)`` of the parameters ``raw`` (W2² NaN if the solve failed)."""
    vals = physical(raw, prob)
    if opts.solver is None:
        m, S, status, emax = fixed_step_moments(vals, prob.m0, prob.S0, prob.t1, prob.kind, opts)
    else:
        ctr = {k: Control(v, prob.t1, prob.kind) for k, v in zip(CONTROL_NAMES, vals)}
        sol = solve_moments(prob.m0, prob.S0, A=ctr["A"], B=ctr["B"], V=ctr["V"], b=ctr["b"],
                            t1=prob.t1, rtol=opts.rtol, atol=opts.atol, solver=opts.solver,
                            max_steps=opts.max_steps)
        m, S, status = sol.mean_final, sol.cov_final, sol.status
        emax = jnp.zeros((), S.dtype)
    w2sq = clipped_bures_w2_squared(m, S, prob.m1, prob.S1)
    energy = sum(prob.mask[i] * _energy_values(v, prob.kind, prob.t1) for i, v in enumerate(vals))
    nan = jnp.asarray(jnp.nan, w2sq.dtype)
    return jnp.where(status == status_code("successful"), w2sq, nan), energy, status, emax


def loss_value(raw, prob: Problem, opts: SolveOptions):
    """The loss ``W2² + λ energy`` of ``raw``, a failed solve encoded in the value.

    ``+inf`` when only the step-error check failed (shorter steps would cure it), NaN for any
    other failed solve (blow-up, non-finite state, step budget). Both are a rejected trial for
    optax's line search.

    Args:
        raw: the optimiser's parameters (a dict of the four controls' raw values).
        prob: the problem.
        opts: the solve's settings.

    Returns:
        The loss, a scalar array.
    """
    w2sq, energy, status, _ = solve_terms(raw, prob, opts)
    loss = w2sq + prob.weight * energy
    too_long = status == status_code("max_steps_reached")
    if opts.solver is not None:  # an adaptive solve's step budget is not cured by shorter steps
        too_long = jnp.zeros((), bool)
    return jnp.where(status == status_code("successful"), loss,
                     jnp.where(too_long, jnp.inf, jnp.nan))


def optimiser_value_fn(opts: SolveOptions, unravel):
    """:func:`loss_value` of flat parameters ``x``, its gradient from one jitted function.

    ``value(x, prob)`` with ``unravel(x)`` the controls' parameters; its gradient (with respect
    to ``x``; zero for ``prob``) comes from one jitted value-and-gradient.

    The loop calls the loss' value and gradient at three sites (its own evaluation and the
    two of optax's zoom line search); through this one jitted function they share one trace
    and one lowered function. Measured (d = 8, the value-and-gradient of the loss under a
    3-way ``lax.switch``, CPU seconds to trace and compile): 3.2 against 4.3 for the plain
    function (one site: 2.6 against 2.7).

    Args:
        opts: the solve's settings.
        unravel: maps the flat parameters to the controls' parameters.

    Returns:
        ``value(x, prob)``.
    """
    def flat_loss(x, prob):
        return loss_value(unravel(x), prob, opts)

    vg = jax.jit(jax.value_and_grad(flat_loss))

    @jax.custom_vjp
    def value(x, prob):
        return flat_loss(x, prob)

    def fwd(x, prob):
        v, g = vg(x, prob)
        return v, (g, prob)

    def bwd(res, ct):
        grad, prob = res
        return jax.tree.map(lambda g: ct * g, grad), jax.tree.map(jnp.zeros_like, prob)

    value.defvjp(fwd, bwd)
    return value


class ReachLoss(Solution):
    r"""Result of :func:`reach_loss` (a :class:`jaxdyn.Solution`; every leaf an array).

    Attributes:
        loss: ``W2² + λ ∫ Σ_{free u} ‖u‖_F² dt`` (NaN when the solve failed).
        w2_squared: the Bures W2² at t1 (NaN when the solve failed).
        energy: the control energy of the free controls.
        mean: (d,) the mean at t1 of the constant-step solve.
        cov: (d, d) the covariance at t1.
        error_ratio: the largest step-error ratio (error estimate / tolerance) of the solve;
            above 1 the steps were too long for the controls (``max_steps_reached``).
        result: :class:`jaxdyn.RESULTS`: ``successful``, ``max_steps_reached`` (step-error
            check failed), ``large`` (``‖Σ‖_F`` passed 1e6 max(‖Σ0‖_F, 1)) or ``nonfinite``.
        stats: ``num_steps`` (the constant steps taken).
    """

    loss: Array
    w2_squared: Array
    energy: Array
    mean: Array
    cov: Array
    error_ratio: Array
    result: RESULTS
    stats: dict


def _as_grid(u, name, shape, kind):
    """A control on the grid: its values (a Control's values or an (n, *shape) array)."""
    if isinstance(u, Control):
        if u.kind != kind:
            raise ValueError(f"control {name!r} is {u.kind!r}, the others {kind!r}")
        return u.values
    u = jnp.asarray(u)
    if u.shape[1:] != shape:
        raise ValueError(f"control {name!r} must have shape (n, *{shape}), got {u.shape}")
    return u


def reach_loss(controls: Mapping, m0, S0, m1, S1, *, t1=1.0, energy_weight=0.0,
               free=CONTROL_NAMES, steps_per_piece: int = 2, rtol=None,
               atol=None) -> ReachLoss:
    r"""The loss :func:`reach` minimises, for given controls: a constant-step moment solve.

    .. math::

        L = W_2^2\big(N(m(t_1), Σ(t_1)), N(m_1, S_1)\big)
            + λ \int_0^{t_1} \sum_{u \in \text{free}} \|u(t)\|_F^2\, dt

    with ``(m, Σ)`` the moment ODE of docs/math.md §B.2 under the controls, solved by
    ``steps_per_piece`` steps of :class:`diffrax.Dopri8` in each piece (module doc). Runs
    under ``jax.jit``, ``jax.vmap`` and ``jax.grad`` (with respect to the controls, the
    Gaussians and ``t1``); every input may be traced.

    Args:
        controls: ``{"A", "B", "V", "b"}``: :class:`Control` s on one grid (all piecewise
            or all linear) or arrays of values ``(n, d, d)`` / ``(n, d)`` (piecewise).
        m0: (d,) initial mean.
        S0: (d, d) initial covariance.
        m1: (d,) target mean.
        S1: (d, d) target covariance.
        t1: the horizon.
        energy_weight: λ ≥ 0.
        free: the controls whose energy counts (a subset of ``("A", "B", "V", "b")``).
        steps_per_piece: constant Dopri8 steps in each piece (static).
        rtol: relative tolerance of the step-error check (default 1e-9 in float64, 1e-5
            in float32).
        atol: absolute tolerance of the step-error check (default 1e-11 / 1e-7).

    Returns:
        :class:`ReachLoss`.

    Raises:
        ValueError: unknown control names, controls of mixed kinds or a wrong shape,
            ``steps_per_piece < 1``.
    """
    if set(controls) != set(CONTROL_NAMES):
        raise ValueError(f"controls must have the keys {CONTROL_NAMES}, got {sorted(controls)}")
    if any(f not in CONTROL_NAMES for f in free):
        raise ValueError(f"free must be a subset of {CONTROL_NAMES}, got {free!r}")
    if isinstance(steps_per_piece, bool) or int(steps_per_piece) < 1:
        raise ValueError(f"steps_per_piece must be an integer >= 1, got {steps_per_piece!r}")
    kinds = {c.kind for c in controls.values() if isinstance(c, Control)}
    if len(kinds) > 1:
        raise ValueError("all Controls must share one kind")
    kind = kinds.pop() if kinds else "piecewise"
    S0 = jnp.asarray(S0)
    d = S0.shape[-1]
    vals = [_as_grid(controls[k], k, (d,) if k == "b" else (d, d), kind) for k in CONTROL_NAMES]
    dtype = jnp.result_type(S0, *vals)
    rtol, atol = default_tolerances(dtype, rtol, atol)
    opts = SolveOptions(rtol=rtol, atol=atol, steps_per_piece=int(steps_per_piece))
    mask = jnp.asarray([1.0 if k in free else 0.0 for k in CONTROL_NAMES], dtype)
    return _reach_loss([v.astype(dtype) for v in vals], jnp.asarray(m0, dtype), S0.astype(dtype),
                       jnp.asarray(m1, dtype), jnp.asarray(S1, dtype), jnp.asarray(t1, dtype),
                       jnp.asarray(energy_weight, dtype), mask, kind, opts)


@eqx.filter_jit
def _reach_loss(vals, m0, S0, m1, S1, t1, weight, mask, kind, opts):
    """:func:`reach_loss` after its checks (one program per shape and static settings)."""
    m, S, status, emax = fixed_step_moments(vals, m0, S0, t1, kind, opts)
    ok = status == status_code("successful")
    w2sq = jnp.where(ok, clipped_bures_w2_squared(m, S, m1, S1), jnp.nan)
    energy = sum(mask[i] * _energy_values(v, kind, t1) for i, v in enumerate(vals))
    n = vals[0].shape[0] - (1 if kind == "linear" else 0)
    return ReachLoss(loss=w2sq + weight * energy, w2_squared=w2sq, energy=energy, mean=m, cov=S,
                     error_ratio=emax, result=from_codes(status),
                     stats={"num_steps": jnp.asarray(n * opts.steps_per_piece, jnp.int32)})
