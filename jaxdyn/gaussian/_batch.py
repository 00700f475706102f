r"""Batched moment solves where members blow up (or turn stiff) without holding the batch hostage.

``jax.vmap`` of an adaptive diffrax solve over thousands of parameter sets runs every
member until the slowest one ends, and the slowest are those near a blow-up, or members
whose covariance grows to ``‖Σ‖ ~ 10⁷`` on a slow manifold where the moment ODE is stiff
(linearisation eigenvalues ``~ −0.1 ‖Σ‖``): an explicit method needs 10⁵–10⁶ steps there
(scipy's DOP853 too).

:func:`solve_moments_batch` has two paths with the same stages and the same statuses:

* **Composable** (inputs traced by ``jax.jit``, ``jax.vmap`` or ``jax.grad``, a call inside a
  jitted function, or save times other than t1): ``jax.vmap`` of the single-member solve of
  :func:`jaxdyn.solve_moments` (diffrax ``Dopri8``, the blow-up ``diffrax.Event``), where a
  member whose explicit step budget runs out continues with the diffrax solver
  :class:`jaxdyn.integrators.rodas5.Rodas5`, and a blow-up's T* is refined by
  :func:`jaxdyn.gaussian._solve.pole_refine` (a diffrax solve with an Event).
  Differentiable (``diffrax.RecursiveCheckpointAdjoint``); every member runs as long as
  the slowest one.
* **Fast** (concrete inputs, final states only): the members are driven from the host in
  three stages.

  1. **Explicit lock-step stage** (jitted ``lax.while_loop`` on a chunk of members). Every
     member carries its own time, step size and status; one iteration advances every
     active member by one step of the Dormand–Prince 8(7) pair (diffrax's ``Dopri8``
     tableau, 13 stages + FSAL, :mod:`jaxdyn.integrators.dopri8`) with its own error
     control (I-controller, exponent 1/8). The state is laid out batch-last, ``Σ`` as
     ``(d, d, n)``. Each chunk of ``chunk`` (64) members runs until at most 1/4 of it is
     still active, then the survivors of all chunks are regrouped into full chunks
     (host-side gather): the long tail of blow-up members costs one chunk's width, not the
     batch's, and every call has the same shapes (one compiled program whatever n). A
     member stops when it reaches ``t1`` (OK), when ``‖Σ‖`` passes the threshold (a
     candidate blow-up if the pole test of :mod:`jaxdyn.gaussian._solve` passes, else
     LARGE), when its state is non-finite, or when it is found **stiff**: Hairer's DOP853
     test ``h ‖f(y₁) − f(Y₁₂)‖ / ‖y₁ − Y₁₂‖ > 3.9`` (0.75 of this pair's real stability
     boundary 5.15) on 15 accepted steps.
  2. **Stiff stage**: members flagged stiff (or out of explicit iterations) are gathered
     into a small batch (padded to a power of two) and continued by ``jax.vmap`` of a
     diffrax solve with :class:`~jaxdyn.integrators.rodas5.Rodas5` and the blow-up Event.
     (diffrax's ESDIRK ``Kvaerno5`` on these members rejected half its steps, Newton
     failures, and ran out of 20 000 steps before t ≈ 0.83.)
  3. **Pole stage**: every member declared a blow-up has its ``T*`` refined by the solve in
     τ of :func:`jaxdyn.gaussian._solve.pole_refine`, vmapped over chunks of the same width
     in short passes that continue the members not converged yet, regrouped into full
     chunks, so that the few non-poles (which use the whole budget) do not hold the rest. The refinement is also
     the final pole test: a member can pass the local test at ``‖Σ‖ = 10⁶`` while its
     projective flow turns onto the cone ``uᵀBu = 0``, where the quadratic growth stops;
     such a member ends LARGE.

  Why the explicit stage is not a diffrax solve: a vmapped ``diffeqsolve`` runs every
  member for as long as the slowest (a few members need thousands of steps, the median a
  dozen), and its blow-up event costs more a step than this lock-step loop; the host-side
  regrouping avoids both. Sweeps of thousands of members belong on this fast path (call
  with concrete inputs); ``benchmarks/bench_moments.py`` measures it.

Each member returns a status (a :class:`jaxdyn.RESULTS` code; ``jaxdyn.status_code(name)``
gives the codes), its final time and state, its blow-up time and its step counts.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Optional

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_bounds, check_dtype, check_integer, settings_problem, with_settings
from ..integrators.dopri8 import DOPRI8, dopri8_step
from ..integrators.rodas5 import Rodas5
from ..models._control import Control
from .._results import error_if_failed, from_codes, raise_if_failed, stat, status_code, status_codes
from ._solve import (MomentField, MomentSolution, _PoleField, _cov_tol, _member_solve, _save_times,
                     _threshold_event, check_solver_objects, dtype_threshold, dtype_tolerances,
                     on_pole, pole_scale, pole_start, pole_steps, pole_time, remaining_time,
                     blowup_indicators)

__all__ = ["BatchSolution", "MomentBatchOptions", "solve_moments_batch"]

ACTIVE = -1  # internal: still integrating
HANDOFF = -2  # internal: stiff (or out of explicit iterations), continue in the stiff stage

# Dormand–Prince 8(7) (jaxdyn.integrators.dopri8).
_STIFF_STAGE = 12  # stage with c = 1 compared with the FSAL derivative (stiffness test)
_ERR_EXP = 1.0 / DOPRI8.order
# |R(z)| = 1 at z ≈ −5.15 on the negative real axis for this pair; a step is "stiff" when
# the estimated h ρ passes 0.75 of that (Hairer's DOP853 uses 6.1 for its own pair).
_STIFF_HRHO = 3.9


class BatchSolution(MomentSolution):
    """Result of :func:`solve_moments_batch`: a :class:`MomentSolution` per member.

    Every leaf has the leading member axis n (as ``jax.vmap`` of :func:`jaxdyn.solve_moments`
    gives).

    Attributes:
        ts: (n, n_save) save times (t1 alone by default).
        mean: (n, n_save, d) the mean at ``ts`` (NaN at or after a blow-up or a failure).
        cov: (n, n_save, d, d) the covariance at ``ts`` (NaN there likewise).
        t_final: (n,) time reached (t1 when successful, the detection time after a blow-up).
        mean_final: (n, d) the mean at ``t_final``.
        cov_final: (n, d, d) the covariance at ``t_final``.
        blowup_time: (n,) refined ``T*`` (inf unless the status is ``blowup``).
        result: (n,) :class:`jaxdyn.RESULTS` codes (``.status`` the ints, compare with
            ``jaxdyn.status_code(name)``; ``.messages``, ``.ok``, ``.counts()``).
        stats: a dict of arrays: ``num_steps`` (n,) steps attempted (accepted + rejected)
            over both stages, ``num_accepted_steps`` (n,), ``stiff`` (n,) True where the
            member went to the stiff (Rodas5) stage; the fast path adds its schedule:
            ``explicit_iterations``, ``stiff_iterations`` (loop counts), ``round_sizes``,
            ``round_iterations``, ``round_seconds`` (each explicit round's batch size,
            iterations and wall time), ``stiff_seconds``, ``pole_seconds`` (wall time of
            the stiff stage and of the T* refinement, compilation included on a first call).
    """

    stiff = stat("stiff", "True where the member went to the stiff stage: ``stats['stiff']``.")

# ---------------------------------------------------------------------------------------
# Batch-last algebra: matrices (d, d, n), vectors (d, n)
# ---------------------------------------------------------------------------------------


def _mm(X, Y):
    # Broadcast multiply-add over k (one fused kernel) rather than a batched dot_general,
    # which XLA lowers with the batch axis moved first: transposes around an elemental dot,
    # three kernels per product, and compile time grows with the kernel count.
    return jnp.sum(X[:, :, None, :] * Y[None, :, :, :], axis=1)


def _mv(X, v):
    return jnp.sum(X * v[None, :, :], axis=1)


def _rhs_bl(m, S, A, B, V, ApV, b):
    SB = _mm(S, B)
    G = _mm(A + _mm(V, SB), S)
    dm = _mv(ApV, m) + _mv(V, _mv(SB, m)) + b
    return dm, G + jnp.swapaxes(G, 0, 1)


def _indicators_bl(S, dS, A):
    """(s, ℓ, q) from the state and its derivative: ⟨S, S'⟩ = ℓ s² + q s³."""
    s2 = jnp.sum(S * S, axis=(0, 1))
    s = jnp.sqrt(s2)
    lin = 2.0 * jnp.sum(S * _mm(A, S), axis=(0, 1))
    tot = jnp.sum(S * dS, axis=(0, 1))
    safe = jnp.where(s > 0, s, 1.0)
    ell = lin / (safe * safe)
    q = (tot - lin) / (safe * safe * safe)
    return s, ell, q


def _big_status(status, big, s, ell, q, vb):
    """Status after passing the threshold: BLOWUP on a pole, LARGE otherwise."""
    pole = on_pole(s, ell, q, vb)
    return jnp.where(big, jnp.where(pole, status_code("blowup"), status_code("large")), status)


def _outcomes(status, tstar, acc, active, t, t_new, h_new, t1, thr, hmin_rel, s, ell, q, vb):
    """Member outcomes after a lock-step step: OK at t1, BLOWUP (with T*) or LARGE past the threshold.

    NONFINITE when the step size collapsed — unless the state is then on a pole with
    ``‖Σ‖ ≥ √thr``: a blow-up whose approach the dtype cannot resolve to the threshold
    (float32: steps of ``T* − t ~ 1/(q ‖Σ‖)`` fall below ``100 eps t`` near ``‖Σ‖ ~ 10⁵``)
    is a BLOWUP candidate, refined and re-tested by the pole stage.

    Returns:
        ``(status, tstar)`` per member.
    """
    big = acc & (s >= thr)
    done = acc & (t_new >= t1)
    tiny = active & ~acc & (h_new < hmin_rel * jnp.maximum(jnp.abs(t), t1))
    status = jnp.where(done, status_code("successful"), status)
    near_pole = tiny & jnp.isfinite(s) & (s * s >= thr) & on_pole(s, ell, q, vb)
    status = _big_status(status, big | near_pole, s, ell, q, vb)
    tstar = jnp.where((big | near_pole) & (status == status_code("blowup")),
                      t_new + remaining_time(s, ell, q), tstar)
    return jnp.where(tiny & ~near_pole, status_code("nonfinite"), status), tstar


def _errnorm(e, y0, y1, rtol, atol, axes):
    sc = atol + rtol * jnp.maximum(jnp.abs(y0), jnp.abs(y1))
    return jnp.sum((e / sc) ** 2, axis=axes)


# ---------------------------------------------------------------------------------------
# Stage 1: explicit Dopri8, lock-step, per-member steps
# ---------------------------------------------------------------------------------------


def _explicit_start(m, S, A, B, V, b, t1, rtol, atol):
    """The start of fresh batch-last members.

    Returns:
        The FSAL derivative ``(km, kS)``, the initial step (Hairer's first guess: 0.01
        ‖y0‖/‖f0‖ in the scaled norm, within [1e-6, 1]·t1) and whether the state is finite.
    """
    d = m.shape[0]
    ncomp = d + d * d
    km, kS = _rhs_bl(m, S, A, B, V, A + V, b)
    sc_m = atol + rtol * jnp.abs(m)
    sc_S = atol + rtol * jnp.abs(S)
    d0 = jnp.sqrt((jnp.sum((m / sc_m) ** 2, 0) + jnp.sum((S / sc_S) ** 2, (0, 1))) / ncomp)
    d1 = jnp.sqrt((jnp.sum((km / sc_m) ** 2, 0) + jnp.sum((kS / sc_S) ** 2, (0, 1))) / ncomp)
    h0 = jnp.where((d0 > 1e-5) & (d1 > 1e-5), 0.01 * d0 / jnp.where(d1 > 0, d1, 1.0), 1e-6 * t1)
    h0 = jnp.clip(h0, 1e-6 * t1, t1)
    fin0 = jnp.all(jnp.isfinite(S), (0, 1)) & jnp.all(jnp.isfinite(m), 0)
    return km, kS, h0.astype(S.dtype), fin0


@eqx.filter_jit
def _explicit_round(carry, fresh, A, B, V, b, t1, thr, rtol, atol, max_steps, min_active,
                    hmin_rel):
    """Run the explicit lock-step loop on a batch-last chunk until at most ``min_active`` members are active.

    (Then it is time to compact.) Members flagged ``fresh`` are started first (FSAL
    derivative, initial step). A member that has taken ``max_steps`` steps is handed to the
    stiff stage (every member steps from iteration 0 on, so this is the lock-step iteration
    cap). One compiled program per (chunk width, d, dtype): the driver feeds chunks of a
    fixed width.

    Returns:
        ``(carry, iterations)``.
    """
    d, n = carry["m"].shape
    ApV = A + V
    ncomp = d + d * d
    km0, kS0, h0, fin0 = _explicit_start(carry["m"], carry["S"], A, B, V, b, t1, rtol, atol)
    carry = dict(carry, km=jnp.where(fresh, km0, carry["km"]), kS=jnp.where(fresh, kS0, carry["kS"]),
                 h=jnp.where(fresh, h0, carry["h"]),
                 status=jnp.where(fresh & ~fin0, status_code("nonfinite"),
                                  carry["status"]).astype(jnp.int32))
    carry["status"] = jnp.where((carry["status"] == ACTIVE)
                                & (carry["nacc"] + carry["nrej"] >= max_steps), HANDOFF,
                                carry["status"]).astype(jnp.int32)

    def f_pair(y):
        return _rhs_bl(*y, A, B, V, ApV, b)

    def body(state):
        c, it = state
        t, h, m, S, km, kS, status = (c[k] for k in ("t", "h", "m", "S", "km", "kS", "status"))
        active = status == ACTIVE
        hh = jnp.where(active, jnp.minimum(h, t1 - t), 0.0)
        (m1, S1), (em, eS), ks, ys = dopri8_step(f_pair, (m, S), hh, k0=(km, kS),
                                                 last_stage=True, stage_states=(_STIFF_STAGE,))
        Y12 = ys[_STIFF_STAGE]
        err = jnp.sqrt((_errnorm(em, m, m1, rtol, atol, 0)
                        + _errnorm(eS, S, S1, rtol, atol, (0, 1))) / ncomp)
        fin = jnp.all(jnp.isfinite(S1), (0, 1)) & jnp.all(jnp.isfinite(m1), 0)
        err = jnp.where(fin & jnp.isfinite(err), err, jnp.inf)
        acc = active & (err <= 1.0)
        fac = 0.9 * jnp.where(err > 0, err, 1e-10) ** (-_ERR_EXP)
        fac = jnp.where(err <= 1.0, jnp.clip(fac, 0.2, 6.0), jnp.clip(fac, 0.2, 0.9))
        t_new = jnp.where(acc, jnp.where(hh >= t1 - t, t1, t + hh), t)
        km1, kS1 = ks[-1]
        m = jnp.where(acc, m1, m)
        S = jnp.where(acc, S1, S)
        km = jnp.where(acc, km1, km)
        kS = jnp.where(acc, kS1, kS)
        h_new = jnp.where(active, hh * fac, h)
        # Stiffness test (Hairer's DOP853): h ρ with ρ ≈ ‖f(y1) − f(Y12)‖ / ‖y1 − Y12‖.
        k12m, k12S = ks[_STIFF_STAGE]
        num = jnp.sum((km1 - k12m) ** 2, 0) + jnp.sum((kS1 - k12S) ** 2, (0, 1))
        den = jnp.sum((m1 - Y12[0]) ** 2, 0) + jnp.sum((S1 - Y12[1]) ** 2, (0, 1))
        hrho = hh * jnp.sqrt(num / jnp.where(den > 0, den, jnp.inf))
        stiff_step = acc & (hrho > _STIFF_HRHO)
        nstiff = jnp.where(stiff_step, c["nstiff"] + 1, c["nstiff"])
        nonstiff = jnp.where(stiff_step, 0, c["nonstiff"] + acc)
        nstiff = jnp.where(nonstiff >= 6, 0, nstiff)
        nacc, nrej = c["nacc"] + acc, c["nrej"] + (active & ~acc)
        # Member outcomes.
        s, ell, q = _indicators_bl(S, kS, A)
        # the pole test's scale (pole_scale), batch-last, on Σ̂ (Σ's products overflow)
        Sh = S / jnp.where(s > 0, s, 1.0)
        VS, BS = _mm(V, Sh), _mm(B, Sh)
        vb = jnp.sqrt(jnp.sum(VS * VS, axis=(0, 1))) * jnp.sqrt(jnp.sum(BS * BS, axis=(0, 1)))
        status, tstar = _outcomes(status, c["tstar"], acc, active, t, t_new, h_new, t1, thr,
                                  hmin_rel, s, ell, q, vb)
        status = jnp.where((status == ACTIVE) & ((nstiff >= 15) | (nacc + nrej >= max_steps)),
                           HANDOFF, status).astype(jnp.int32)
        c = dict(t=t_new, h=h_new, m=m, S=S, km=km, kS=kS, status=status, tstar=tstar,
                 nacc=nacc, nrej=nrej, nstiff=nstiff, nonstiff=nonstiff)
        return c, it + 1

    def cond(state):
        c, it = state
        return jnp.sum(c["status"] == ACTIVE) > min_active

    return jax.lax.while_loop(cond, body, (carry, jnp.zeros((), jnp.int32)))



# ---------------------------------------------------------------------------------------
# Stage 2: Rodas5 (diffrax), vmapped over the gathered stiff members
# ---------------------------------------------------------------------------------------


@eqx.filter_jit
def _stiff_stage(t, h, m, S, A, B, V, b, t1, thr, rtol, atol, max_steps):
    """Continue member-major members from ``(t, m, S)`` to ``t1`` with Rodas5 and the blow-up event.

    The first step is ``h`` (the explicit stage's last). A member past the threshold on a
    pole is a BLOWUP candidate (refined by the pole stage).

    Returns:
        ``(time, mean, covariance, status, T* estimate, steps, accepted steps)`` per member.
    """

    def one(t0, h0, m0, S0, A, B, V, b, thr):
        field = MomentField(A, B, V, b)
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(field), Rodas5(), t0, t1, jnp.minimum(h0, t1 - t0), (m0, S0),
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            event=diffrax.Event(_threshold_event(thr)), max_steps=max_steps, throw=False,
            adjoint=diffrax.ForwardMode())
        m_end, S_end, t_end = sol.ys[0][0], sol.ys[1][0], sol.ts[0]
        result = status_codes(sol.result)
        s, ell, q = blowup_indicators(S_end, A, B, V)
        finite = jnp.all(jnp.isfinite(S_end)) & jnp.all(jnp.isfinite(m_end))
        big = (result == status_code("event_occurred")) & finite & (s >= thr)
        pole = big & on_pole(s, ell, q, pole_scale(S_end, V, B))
        status = jnp.where(result == status_code("event_occurred"), status_code("nonfinite"), result)
        status = jnp.where(big, jnp.where(pole, status_code("blowup"), status_code("large")), status)
        status = jnp.where(finite | big, status, status_code("nonfinite"))
        tstar = jnp.where(pole, t_end + remaining_time(s, ell, q), jnp.inf)
        return (t_end, m_end, S_end, status.astype(jnp.int32), tstar.astype(S0.dtype),
                sol.stats["num_steps"], sol.stats["num_accepted_steps"])

    return jax.vmap(one)(t, h, m, S, A, B, V, b, thr)


@eqx.filter_jit
def _pole_stage(z, h, A, B, V, active, rtol, atol):
    """:func:`pole_steps` (``_POLE_STEPS`` steps from the step ``h``) and :func:`pole_time`, vmapped.

    A NaN ``h`` starts at ``0.05/g``.

    Returns:
        ``(z, converged, T*, step)`` per member.
    """
    def one(z, h, A, B, V, act):
        _, _, g = _PoleField(A, B, V).rates(z)
        h = jnp.where(jnp.isnan(h), 0.05 / jnp.where(g > 0, g, 1.0), h)
        z, conv, h = pole_steps(z, A, B, V, rtol=rtol, atol=atol, max_steps=_POLE_STEPS,
                                active=act, dt0=h)
        return z, conv, pole_time(z, A, B, V), h

    return jax.vmap(one)(z, h, A, B, V, active)


# The pole stage's schedule: passes of _POLE_STEPS steps over full chunks of the members not
# yet converged, each continuing from the state and with the step where the last one
# stopped, _POLE_PASSES of them (448 steps, pole_refine's budget of 400 and more). Short
# passes regroup the members still running into fewer chunks as others finish, so the few
# that use the whole budget hold one chunk, not every chunk.
_POLE_STEPS = 16
_POLE_PASSES = 28


# ---------------------------------------------------------------------------------------
# The composable path: vmap of the single-member diffrax solve
# ---------------------------------------------------------------------------------------


@eqx.filter_jit
def _composable(m0, S0, A, B, V, b, t1, ts, rtol, atol, threshold, max_explicit, max_stiff,
                stiff, throw, controller=None, adjoint=None):
    """The composable path of :func:`solve_moments_batch` (module doc)."""
    stiff_status = None if stiff else status_code("stiff")
    adjoint = diffrax.RecursiveCheckpointAdjoint() if adjoint is None else adjoint

    def one(m0, S0, A, B, V, b):
        return _member_solve(MomentField(A, B, V, b), m0, S0, t1, ts, rtol, atol, threshold,
                             diffrax.Dopri8(), max_explicit, adjoint,
                             None, stiff_steps=max_stiff if stiff else 0,
                             stiff_status=stiff_status, controller=controller)

    sols, handed = jax.vmap(one)(m0, S0, A, B, V, b)
    out = BatchSolution(**{k: getattr(sols, k) for k in _FIELDS},
                        stats=dict(sols.stats, stiff=handed))
    return error_if_failed(out, out.result) if throw else out


_FIELDS = ("ts", "mean", "cov", "t_final", "mean_final", "cov_final", "blowup_time", "result")


# ---------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------


def _is_traced(*xs) -> bool:
    """Whether any input is traced, or the call is being staged into a jitted program.

    (Inside a jitted function even constants become tracers, so the host-driven path
    cannot run there.)

    Returns:
        Bool.
    """
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(xs)):
        return True
    return isinstance(jnp.zeros(()), jax.core.Tracer)


def _batched(x, n, shape, name, xp):
    """``x`` of shape ``shape`` broadcast to ``(n, *shape)``, or already of that shape."""
    x = xp.asarray(x)
    if x.shape == tuple(shape):
        return xp.broadcast_to(x, (n, *shape))
    if x.shape == (n, *shape):
        return x
    raise ValueError(f"{name} must have shape {tuple(shape)} or ({n}, *{tuple(shape)}), got {x.shape}")


def _check_concrete(n, d, dtype, S0, named):
    """The host checks of concrete inputs (NumPy).

    Args:
        n: batch size.
        d: dimension.
        dtype: the solve's dtype.
        S0: (n, d, d) initial covariances.
        named: ``(name, array or None)`` pairs checked for finite values.

    Raises:
        ValueError: non-finite values (naming the member), or an S0 that is not a symmetric
            PSD covariance (naming the member and the defect).
    """
    for name, x in named:
        if x is None:
            continue
        x = np.asarray(x, dtype)
        fin = np.isfinite(x)
        if not fin.all():
            where = ""
            if x.ndim > 0 and x.shape[0] == n and (name == "S0" or x.ndim == (3 if name in "ABV" else 2)):
                where = f": member {int(np.argmin(fin.reshape(n, -1).all(axis=1)))}"
            raise ValueError(f"{name} must be finite (it holds NaN or inf{where})")
    asym = np.abs(S0 - np.swapaxes(S0, -1, -2)).max(axis=(1, 2))
    lmin = np.linalg.eigvalsh(0.5 * (S0 + np.swapaxes(S0, -1, -2)))[:, 0]
    tol = _cov_tol(dtype, d) * np.maximum(np.abs(S0).max(axis=(1, 2)), 1.0)
    bad_sym, bad_psd = ~(asym <= tol), ~(lmin >= -tol)
    if bad_sym.any():
        i = int(np.argmax(bad_sym))
        raise ValueError(f"S0 must be symmetric: member {i} has max |S0 - S0ᵀ| = "
                         f"{float(asym[i]):.3e} (tolerance {tol[i]:.1e})")
    if bad_psd.any():
        i = int(np.argmax(bad_psd))
        raise ValueError(f"S0 must be positive semi-definite: member {i} has min eigenvalue "
                         f"{float(lmin[i]):.3e} (tolerance -{tol[i]:.1e})")


def _batch_params(field, A, B, V, b):
    """``(A, B, V, b)`` of the call: the keywords, or those of a :class:`MomentField`.

    Returns:
        The four parameters (b may be None).

    Raises:
        TypeError: a field that is not a :class:`MomentField` of constant arrays, or a field
            and a keyword both given.
        ValueError: A, B or V missing (no field).
    """
    if field is None:
        missing = [k for k, v in (("A", A), ("B", B), ("V", V)) if v is None]
        if missing:
            raise ValueError(f"solve_moments_batch: {', '.join(missing)} required (or "
                             f"field=MomentField(A, B, V, b))")
        return A, B, V, b
    given = sorted(k for k, v in (("A", A), ("B", B), ("V", V), ("b", b)) if v is not None)
    if given:
        raise TypeError(f"solve_moments_batch: the parameters are given twice: field= and the "
                        f"keyword(s) {given}; give the field or the keywords")
    params = (field.A, field.B, field.V, field.b) if isinstance(field, MomentField) else ()
    if not params or any(isinstance(p, Control) for p in params):
        raise TypeError("solve_moments_batch: field must be a MomentField of constant arrays "
                        "(each parameter (d, d) or stacked (n, d, d), e.g. "
                        "jax.vmap(MomentField)(A, B, V, b)); for Controls or a "
                        "VariantMomentField vmap jaxdyn.solve_moments")
    return params


def _batch_size(m0, S0, A, B, V, b):
    """``(n, d)`` of the inputs' shapes (n = 1 when none is stacked).

    Returns:
        The pair.

    Raises:
        ValueError: an A that is not (d, d) or (n, d, d), or stacks of different sizes.
    """
    shape_A = np.shape(A)
    if len(shape_A) not in (2, 3) or shape_A[-1] != shape_A[-2]:
        raise ValueError(f"A must have shape (d, d) or (n, d, d), got {shape_A}")
    pairs = [(np.shape(x), k) for x, k in zip((m0, S0, A, B, V, b), (1, 2, 2, 2, 2, 1))
             if x is not None]
    leads = {s[0] for s, k in pairs if len(s) == k + 1}
    if len(leads) > 1:
        raise ValueError(f"inconsistent batch sizes among m0, S0, A, B, V, b: {sorted(leads)}")
    return (leads.pop() if leads else 1), shape_A[-1]


def _composable_call(m0, S0, A, B, V, b, t1, saveat, n, d, dtype, traced, rest):
    """The inputs brought to the composable path's stacks, and its call.

    Returns:
        The :class:`BatchSolution`.
    """
    cast = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    S0b = _batched(cast(S0), n, (d, d), "S0", jnp)
    A, B, V = (_batched(cast(x), n, (d, d), k, jnp) for x, k in ((A, "A"), (B, "B"), (V, "V")))
    b = jnp.zeros((n, d), dtype) if b is None else _batched(cast(b), n, (d,), "b", jnp)
    m0 = jnp.zeros((n, d), dtype) if m0 is None else _batched(cast(m0), n, (d,), "m0", jnp)
    if not traced:
        _check_concrete(n, d, dtype, np.asarray(S0b),
                        (("S0", S0b), ("m0", m0), ("A", A), ("B", B), ("V", V), ("b", b)))
    t1 = jnp.asarray(t1, dtype)
    ts = _save_times(saveat, t1, dtype)
    return _composable(m0, S0b, A, B, V, b, t1, ts, *rest)


@dataclasses.dataclass(frozen=True)
class MomentBatchOptions:
    """Settings of :func:`solve_moments_batch`.

    Each field can also be passed to :func:`solve_moments_batch` as a keyword, which replaces
    that field of the options given. Concrete values are checked when the options are made (a ``ValueError`` or ``TypeError``
    naming the field).

    Attributes:
        rtol: relative tolerance (per member, both stages), raised to what the dtype
            resolves (``rtol ≥ 10 eps``: :func:`jaxdyn.gaussian._solve.dtype_tolerances`).
        atol: absolute tolerance (``atol ≥ 0.1 eps``).
        blowup_threshold: a solve stops when ``‖Σ‖_F ≥ blowup_threshold · max(‖Σ0‖_F, 1)``;
            a blow-up on a pole, with ``T*`` refined. Capped at what the dtype resolves,
            ``1e-3 / eps`` (float32: 8389).
        max_explicit_iterations: step budget of the explicit (Dopri8) stage; members still
            running go to the stiff stage.
        stiff: run the Rodas5 stage (if False, those members end with status ``stiff`` at
            the time reached).
        max_stiff_iterations: step budget of the stiff stage (members left end
            ``max_steps_reached``).
        hmin_rel: fast path: a member whose explicit step falls below
            ``hmin_rel · max(t, t1)`` ends ``nonfinite`` (default ``100 eps``), unless it is
            then on a pole past ``√threshold`` (a blow-up the dtype cannot follow further).
        min_bucket: fast path: the smallest batch the stiff stage pads to.
        chunk: fast path: the explicit and pole stages run on chunks of this many members
            (one compiled program each per chunk width, d and dtype, whatever n).
        throw: if True, a member that is not successful (a blow-up included) raises: a
            ``RuntimeError`` naming the first such member (fast path) or ``eqx.error_if``'s
            error (composable path). Default False (read ``result`` per member).
        stepsize_controller: composable path: the diffrax step-size controller of the
            explicit (Dopri8) stage, given as is (default: PID at ``rtol, atol``; the Rodas5
            stage keeps PID at ``rtol, atol``; ``diffrax.ConstantStepSize`` needs a first step,
            which this path does not take: ``diffrax.StepTo(ts=...)`` fixes the steps). The
            fast path has its own per-member error control and refuses it (call under
            ``jax.jit``).
        adjoint: composable path: the diffrax adjoint of both stages (default
            ``diffrax.RecursiveCheckpointAdjoint()``); refused by the fast path likewise.
    """

    rtol: float = 1e-10
    atol: float = 1e-12
    blowup_threshold: float = 1e6
    max_explicit_iterations: int = 4096
    stiff: bool = True
    max_stiff_iterations: int = 20000
    hmin_rel: Optional[float] = None
    min_bucket: int = 16
    chunk: int = 64
    throw: bool = False
    stepsize_controller: Optional[diffrax.AbstractStepSizeController] = None
    adjoint: Optional[diffrax.AbstractAdjoint] = None

    def __post_init__(self):
        check_solver_objects("MomentBatchOptions", stepsize_controller=self.stepsize_controller,
                             adjoint=self.adjoint)
        for name in ("max_explicit_iterations", "max_stiff_iterations", "min_bucket", "chunk"):
            check_integer(name, getattr(self, name), minimum=1)
        check_bounds("rtol", self.rtol, low=0)
        check_bounds("atol", self.atol, low=0)
        check_bounds("blowup_threshold", self.blowup_threshold, low=1, low_open=True)
        check_bounds("hmin_rel", self.hmin_rel, low=0, low_open=True)


def solve_moments_batch(m0, S0, *, field=None, A=None, B=None, V=None, b=None, t1, saveat=None,
                        options: Optional[MomentBatchOptions] = None,
                        **settings) -> BatchSolution:
    r"""Solve many Gaussian moment ODEs at once; members that blow up or turn stiff do not hold the batch.

    The moment ODE of each member (docs/math.md §B.2),

        m' = (A + V) m + V Σ B m + b,   Σ' = A Σ + Σ Aᵀ + V Σ B Σ + Σ Bᵀ Σ Vᵀ,

    with the blow-up rule of :func:`jaxdyn.solve_moments` (threshold event, pole test,
    refined T*). Concrete inputs (final states only) run the fast host-driven stages;
    traced inputs (``jax.jit``, ``jax.vmap``, ``jax.grad``) or save times run ``jax.vmap``
    of the single-member diffrax solve with the Rodas5 stiff stage (module doc): the same
    statuses, values within the tolerances. The parameters are a ``field``
    (:class:`MomentField`) or the keywords ``A, B, V, b``, not both.

    Args:
        m0: (n, d) or (d,) (broadcast) initial means, or None (= 0).
        S0: (n, d, d) or (d, d) symmetric PSD initial covariances (concrete: a ValueError
            naming the member and the defect otherwise; traced: ``invalid_input``).
        field: a :class:`MomentField` of constant parameters, each (d, d) or stacked
            (n, d, d) (``jax.vmap(MomentField)(A, B, V, b)``), instead of the keywords.
        A: (n, d, d) or (d, d) constant parameter; the leading axis n is the batch.
            (Time-dependent controls: :func:`jaxdyn.solve_moments`, vmapped.)
        B: (n, d, d) or (d, d).
        V: (n, d, d) or (d, d).
        b: (n, d), (d,) or None (= 0).
        t1: final time (scalar).
        saveat: None (t1 alone), an int k (k uniform times on [0, t1]) or a 1-D array of
            times in [0, t1], the same for every member; anything but t1 alone runs the
            composable path.
        options: a :class:`MomentBatchOptions` (None: its defaults).
        **settings: any field of :class:`MomentBatchOptions` by name (``rtol``, ``atol``,
            ``blowup_threshold``, ``max_explicit_iterations``, ``stiff``,
            ``max_stiff_iterations``, ``hmin_rel``, ``min_bucket``, ``chunk``, ``throw``,
            ``stepsize_controller``, ``adjoint``), replacing that field of ``options``.

    Dtypes: S0 float32 or float64 (the solve's dtype; an integer S0 is refused by name);
    m0, A, B, V, b float32, float64 or integers (converted to S0's dtype); float16, bfloat16
    and complex are refused (a TypeError naming the parameter).

    Returns:
        A :class:`BatchSolution` (every leaf with the leading axis n).

    Raises:
        ValueError: a concrete input with a wrong shape, a non-floating S0, non-finite
            values, an S0 that is not a covariance, ``t1 <= 0`` or ``chunk < 1``, step budgets
            that are not integers >= 1, an rtol or atol not a finite number >= 0, a
            ``blowup_threshold`` not > 1, a ``stepsize_controller`` or ``adjoint`` on the
            fast path.
        TypeError: an unknown keyword (the nearest :class:`MomentBatchOptions` field
            named), ``options`` that are not MomentBatchOptions, a ``stepsize_controller`` or
            ``adjoint`` that is not diffrax's.
    """
    A, B, V, b = _batch_params(field, A, B, V, b)
    problem = settings_problem(MomentBatchOptions, options, settings, "solve_moments_batch")
    if problem:
        raise TypeError(problem)
    o = with_settings(MomentBatchOptions, options, settings)
    rtol, atol, blowup_threshold, stiff, hmin_rel = (o.rtol, o.atol, o.blowup_threshold,
                                                     o.stiff, o.hmin_rel)
    min_bucket, chunk, throw = o.min_bucket, o.chunk, o.throw
    stepsize_controller, adjoint = o.stepsize_controller, o.adjoint
    # the integers were checked when the options were made
    max_explicit_iterations, max_stiff_iterations = (int(o.max_explicit_iterations),
                                                     int(o.max_stiff_iterations))
    S0_dtype = jnp.asarray(S0).dtype if isinstance(S0, jax.Array) else np.asarray(S0).dtype
    if not jnp.issubdtype(S0_dtype, jnp.inexact):
        # as solve_moments: the solve's dtype is S0's
        raise ValueError(f"S0 must have a floating dtype, got {S0_dtype}")
    for name, x in (("S0", S0), ("m0", m0), ("A", A), ("B", B), ("V", V), ("b", b)):
        check_dtype(name, x, fn="solve_moments_batch")
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(S0_dtype))  # respects jax_enable_x64
    n, d = _batch_size(m0, S0, A, B, V, b)
    if d < 1:
        raise ValueError(f"solve_moments_batch: the dimension d must be >= 1, got A of shape "
                         f"{tuple(np.shape(A))} and S0 of shape {tuple(np.shape(S0))}")
    rtol, atol = dtype_tolerances(dtype, rtol, atol)
    blowup_threshold = dtype_threshold(dtype, blowup_threshold)
    traced = _is_traced(m0, S0, A, B, V, b, t1, saveat)
    if not traced and not float(t1) > 0:
        raise ValueError(f"t1 must be > 0, got {t1}")
    if traced or saveat is not None and not (isinstance(saveat, int) and saveat == 1):
        rest = (rtol, atol, blowup_threshold, int(max_explicit_iterations),
                int(max_stiff_iterations), bool(stiff), bool(throw), stepsize_controller, adjoint)
        return _composable_call(m0, S0, A, B, V, b, t1, saveat, n, d, dtype, traced, rest)
    passed = [k for k, v in (("stepsize_controller", stepsize_controller), ("adjoint", adjoint))
              if v is not None]
    if passed:
        raise ValueError(f"solve_moments_batch: {' and '.join(passed)} apply to the composable "
                         f"(traced) path only; the fast host path of these concrete inputs has "
                         f"its own per-member steps. Call it under jax.jit (or with saveat=) to "
                         f"use them")
    return _fast(m0, S0, A, B, V, b, t1, n, d, dtype, rtol, atol, blowup_threshold,
                 max_explicit_iterations, stiff, max_stiff_iterations, hmin_rel, min_bucket,
                 int(chunk), throw)


class _Pool:
    """The fast path's host state of every member, member-major (NumPy).

    Chunks of members are gathered from it, run, and written back.
    """

    def __init__(self, m0, S0, n, d, dt_):
        self.t = np.zeros(n, dt_)
        self.mean, self.cov = m0.astype(dt_, copy=True), S0.astype(dt_, copy=True)
        self.km, self.kS = np.zeros((n, d), dt_), np.zeros((n, d, d), dt_)
        self.status = np.full(n, ACTIVE, np.int32)
        self.tstar = np.full(n, np.inf, dt_)
        self.h = np.zeros(n, dt_)
        self.counters = {k: np.zeros(n, np.int32) for k in ("nacc", "nrej", "nstiff", "nonstiff")}
        self.fresh = np.ones(n, bool)


def _fast_inputs(m0, S0, A, B, V, b, t1, n, d, dtype, blowup_threshold):
    """The fast path's inputs checked and stacked on the host (NumPy, member-major).

    Returns:
        ``(m0, S0, A, B, V, b, t1, thr)``, ``thr`` each member's threshold on ``‖Σ‖_F``.
    """
    # Host-side preparation in numpy (no per-shape compilation of small eager ops).
    S0 = np.array(_batched(np.asarray(S0, dtype), n, (d, d), "S0", np))
    _check_concrete(n, d, dtype, S0, (("S0", S0), ("m0", m0), ("A", A), ("B", B), ("V", V),
                                      ("b", b)))
    S0 = 0.5 * (S0 + np.swapaxes(S0, -1, -2))
    A, B, V = (np.array(_batched(np.asarray(x, dtype), n, (d, d), k, np))
               for x, k in ((A, "A"), (B, "B"), (V, "V")))
    b = (np.zeros((n, d), dtype) if b is None
         else np.array(_batched(np.asarray(b, dtype), n, (d,), "b", np)))
    m0 = (np.zeros((n, d), dtype) if m0 is None
          else np.array(_batched(np.asarray(m0, dtype), n, (d,), "m0", np)))
    t1 = np.asarray(t1, dtype)
    thr = (blowup_threshold * np.maximum(np.sqrt(np.sum(S0 * S0, axis=(1, 2))), 1.0)).astype(dtype)
    return m0, S0, A, B, V, b, t1, thr


def _explicit_stage(p, prm, t1, thr, rtol, atol, max_explicit_iterations, hmin_rel, W):
    """Stage 1 on the host pool ``p``: explicit rounds on chunks of W, survivors regrouped.

    Each chunk of W runs until at most W/4 of its members are active (all of them when the
    pool fits in one chunk), then the survivors of all chunks form the next pool. Every call
    has the same shapes: one compiled program, and the long tail of slow members costs one
    chunk's width.

    Returns:
        The rounds ``[(pool size, iterations, seconds)]``.
    """
    A, B, V, b = prm
    bl = lambda X: np.ascontiguousarray(np.moveaxis(X, 0, -1))  # noqa: E731
    mm = lambda X: np.moveaxis(X, -1, 0)  # noqa: E731
    rounds = []
    pool = np.arange(p.t.size)
    while pool.size:
        t_round = time.perf_counter()
        min_active = W // 4 if pool.size > W else 0
        its = 0
        for start in range(0, pool.size, W):
            g = pool[start:start + W]
            k = g.size
            sel = np.concatenate([g, np.full(W - k, g[0])])
            st_in = p.status[sel]
            st_in[k:] = status_code("successful")  # padding: inactive copies, never written back
            carry = dict(t=p.t[sel], h=p.h[sel], m=bl(p.mean[sel]), S=bl(p.cov[sel]),
                         km=bl(p.km[sel]), kS=bl(p.kS[sel]), status=st_in, tstar=p.tstar[sel],
                         **{c: v[sel] for c, v in p.counters.items()})
            out, it = _explicit_round(carry, p.fresh[sel], bl(A[sel]), bl(B[sel]), bl(V[sel]),
                                      bl(b[sel]), t1, thr[sel], rtol, atol,
                                      np.int32(max_explicit_iterations), np.int32(min_active),
                                      hmin_rel)
            c = {key: np.asarray(v)[..., :k] for key, v in out.items()}
            its = max(its, int(it))
            p.t[g], p.h[g], p.status[g], p.tstar[g] = c["t"], c["h"], c["status"], c["tstar"]
            p.mean[g], p.cov[g], p.km[g], p.kS[g] = mm(c["m"]), mm(c["S"]), mm(c["km"]), mm(c["kS"])
            for key, v in p.counters.items():
                v[g] = c[key]
            p.fresh[g] = False
        rounds.append((int(pool.size), its, time.perf_counter() - t_round))
        pool = pool[p.status[pool] == ACTIVE]
    return rounds


def _stiff_host_stage(p, prm, t1, thr, rtol, atol, stiff, max_stiff_iterations, min_bucket,
                      nsteps, nacc):
    """Stage 2: the members handed over continue with Rodas5 (padded to a power of two).

    Without ``stiff`` they end ``stiff``. Updates ``p``, ``nsteps`` and ``nacc`` in place.

    Returns:
        ``(stiff mask, the stage's largest step count)``.
    """
    A, B, V, b = prm
    n = p.t.size
    p.status[p.status == ACTIVE] = HANDOFF
    hands = np.flatnonzero(p.status == HANDOFF)
    stiff_mask = np.zeros(n, bool)
    stiff_mask[hands] = True
    it2 = 0
    if hands.size and stiff:
        k = hands.size
        size = max(min_bucket, 1 << max(0, math.ceil(math.log2(k))))
        idx = np.concatenate([hands, np.full(size - k, hands[0])])
        t_in = p.t[idx]
        t_in[k:] = t1  # padding: copies that start at t1 and take no step
        res = _stiff_stage(t_in, p.h[idx], p.mean[idx], p.cov[idx], A[idx], B[idx], V[idx],
                           b[idx], t1, thr[idx], rtol, atol, int(max_stiff_iterations))
        t2, m2, S2, st2, ts2, ns2, na2 = (np.asarray(x)[:k] for x in res)
        p.t[hands], p.mean[hands], p.cov[hands] = t2, m2, S2
        p.status[hands], p.tstar[hands] = st2, ts2
        nsteps[hands] += ns2.astype(nsteps.dtype)
        nacc[hands] += na2.astype(nacc.dtype)
        it2 = int(ns2.max())
    elif hands.size:
        p.status[hands] = status_code("stiff")
    return stiff_mask, it2


def _pole_host_stage(p, prm, t1, rtol, atol, W):
    """Stage 3: T* of every blow-up refined past its detection point, in passes over chunks.

    (The projective system in reparametrised time, :func:`jaxdyn.gaussian._solve.pole_refine`,
    vmapped over the blow-up members.) A pole that does not converge, or is refined past t1
    (the solution is finite on [0, t1]: it only passed the threshold before t1), is LARGE,
    as in solve_moments. Updates ``p`` in place.
    """
    A, B, V, _ = prm
    dt_ = p.tstar.dtype
    bu = np.flatnonzero(p.status == status_code("blowup"))
    z = tuple(np.array(x) for x in pole_start(p.t[bu], p.cov[bu]))
    conv = np.zeros(bu.size, bool)
    T_ref = np.full(bu.size, np.inf, dt_)
    h_tau = np.full(bu.size, np.nan, dt_)  # the step in τ to continue with (NaN: a first one)
    todo = np.arange(bu.size)
    for _ in range(_POLE_PASSES):
        if todo.size == 0:
            break
        for start in range(0, todo.size, W):
            g = todo[start:start + W]
            sel = np.concatenate([g, np.full(W - g.size, g[0])])
            act = np.arange(W) < g.size
            members = bu[sel]
            zs, cs, Ts, hs = _pole_stage(tuple(x[sel] for x in z), h_tau[sel], A[members],
                                         B[members], V[members], act, rtol, atol)
            for x, x_new in zip(z, zs):
                x[g] = np.asarray(x_new)[:g.size]
            conv[g], T_ref[g] = np.asarray(cs)[:g.size], np.asarray(Ts)[:g.size]
            h_tau[g] = np.asarray(hs)[:g.size]
        todo = todo[~conv[todo]]
    p.tstar[bu] = np.where(conv, T_ref, np.inf)
    p.status[bu[~conv]] = status_code("large")
    late = (p.status == status_code("blowup")) & (p.tstar > t1)
    p.status[late], p.tstar[late] = status_code("large"), np.inf
    p.tstar[p.status != status_code("blowup")] = np.inf


def _fast(m0, S0, A, B, V, b, t1, n, d, dtype, rtol, atol, blowup_threshold,
          max_explicit_iterations, stiff, max_stiff_iterations, hmin_rel, min_bucket, W, throw):
    """The host-driven path of :func:`solve_moments_batch` (module doc)."""
    m0, S0, A, B, V, b, t1, thr = _fast_inputs(m0, S0, A, B, V, b, t1, n, d, dtype,
                                               blowup_threshold)
    if hmin_rel is None:
        hmin_rel = 100 * float(np.finfo(dtype).eps)
    dt_ = np.dtype(dtype)
    p = _Pool(m0, S0, n, d, dt_)
    prm = (A, B, V, b)
    rounds = _explicit_stage(p, prm, t1, thr, rtol, atol, max_explicit_iterations, hmin_rel, W)
    nsteps = p.counters["nacc"] + p.counters["nrej"]
    nacc = p.counters["nacc"].copy()
    it1 = int(nsteps.max()) if n else 0
    t_stiff = time.perf_counter()
    stiff_mask, it2 = _stiff_host_stage(p, prm, t1, thr, rtol, atol, stiff, max_stiff_iterations,
                                        min_bucket, nsteps, nacc)
    stiff_seconds = time.perf_counter() - t_stiff
    t_pole = time.perf_counter()
    _pole_host_stage(p, prm, t1, rtol, atol, W)
    pole_seconds = time.perf_counter() - t_pole
    cov = 0.5 * (p.cov + np.swapaxes(p.cov, -1, -2))
    ok = p.status == status_code("successful")
    rounds = np.asarray(rounds, np.float64).reshape(-1, 3)
    stats = {"num_steps": nsteps, "num_accepted_steps": nacc, "stiff": stiff_mask,
             "explicit_iterations": np.asarray(it1), "stiff_iterations": np.asarray(it2),
             "round_sizes": rounds[:, 0].astype(np.int64),
             "round_iterations": rounds[:, 1].astype(np.int64), "round_seconds": rounds[:, 2],
             "stiff_seconds": np.asarray(stiff_seconds), "pole_seconds": np.asarray(pole_seconds)}
    nan = np.asarray(np.nan, dt_)
    out = BatchSolution(ts=jnp.asarray(np.broadcast_to(t1, (n, 1))),
                        mean=jnp.asarray(np.where(ok[:, None, None], p.mean[:, None], nan)),
                        cov=jnp.asarray(np.where(ok[:, None, None, None], cov[:, None], nan)),
                        t_final=jnp.asarray(p.t), mean_final=jnp.asarray(p.mean),
                        cov_final=jnp.asarray(cov), blowup_time=jnp.asarray(p.tstar),
                        result=from_codes(p.status),
                        stats={k: jnp.asarray(v) for k, v in stats.items()})
    if throw:
        raise_if_failed(out, "solve_moments_batch")
    return out
