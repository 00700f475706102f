r"""Batched moment solves where members blow up (or turn stiff) without holding the batch hostage.

The problem (issue 5): ``jax.vmap`` of an adaptive diffrax solve over thousands of
parameter sets runs every member until the slowest one ends, and the slowest are those
near a blow-up, or — found while building this — members whose covariance grows to
``‖Σ‖ ~ 10⁷`` on a slow manifold where the moment ODE is stiff (linearisation eigenvalues
``~ −0.1 ‖Σ‖``): an explicit method needs 10⁵–10⁶ steps there (scipy's DOP853 too).

The design, three stages:

1. **Explicit lock-step stage** (jitted ``lax.while_loop`` over the whole batch). Every
   member carries its own time, step size and status; one iteration advances every active
   member by one step of the Dormand–Prince 8(7) pair (diffrax's ``Dopri8`` tableau, 13
   stages + FSAL) with its own error control (I-controller, exponent 1/8). The state is
   laid out batch-last, ``Σ`` as ``(d, d, n)``, products as ``einsum("ikn,kjn->ijn")``.
   (Writing them as broadcast multiply-adds is faster for one evaluation, but XLA's CPU
   fusion then recomputes inner products across the 13 stages: a step cost 100× more.)
   The loop runs on chunks of a fixed width (``chunk``, 64 members): each chunk runs until
   at most 1/4 of it is still active, then the survivors of all chunks are regrouped into
   full chunks (host-side gather) and the passes go on, the last chunk until its members
   end: the long tail of blow-up members costs one chunk's width, not the batch's, and
   every call has the same shapes, so the stage compiles one program whatever n (it
   compiled one per compaction size before, five on the benchmark workload). Per member
   of a wide batch a 64-wide chunk step costs about what a 1024-wide one does. A member stops when it
   reaches ``t1`` (OK), when ``‖Σ‖`` passes the threshold (a candidate blow-up if the pole
   test of :mod:`jaxdyn.gaussian._solve` passes, else LARGE), when its state is non-finite, or
   when it is found **stiff**: Hairer's DOP853 test
   ``h ‖f(y₁) − f(Y₁₂)‖ / ‖y₁ − Y₁₂‖ > 3.9`` (0.75 of this pair's real stability boundary
   5.15; the step is limited by stability, not accuracy) on 15 accepted steps.

   In physical time, adaptive steps approach a pole geometrically (each step removes a
   fixed fraction of ``T* − t`` at a given tolerance), so a blow-up costs a bounded number
   of steps, ``~ log(threshold)/x`` with ``x ≈ tol^{1/8}`` — the same count as stepping the
   reparametrised time ``dt/dτ = 1/(1 + ‖Σ‖)`` at constant relative accuracy, without its
   overshoot problem at ``t1``.

2. **Stiff stage**: members flagged stiff (and any still running when the explicit
   iteration cap is hit) are gathered into a small batch (padded to a power of two to bound
   recompilation) and continued from where they stopped by a vectorised **Rodas5**
   (Di Marzo's L-stable, stiffly accurate Rosenbrock method of order 5(4): no Newton
   iterations, so it runs lock-step; exact Jacobian by ``jax.jacfwd``; one LU per step).
   diffrax's ESDIRK ``Kvaerno5`` was tried first on these members: half its steps were
   rejected (Newton failures) and it ran out of 20 000 steps before t ≈ 0.83.

3. **Pole stage**: every member declared a blow-up has its ``T*`` refined past the detection
   point by integrating the bounded projective system in the reparametrised time
   ``dt/dτ = 1/‖Σ‖`` (``T* = lim t(τ)``; :func:`jaxdyn.gaussian._solve.pole_refine`), vmapped
   over chunks of the same width (one compiled program for both passes).
   The local (Bernoulli) extrapolation from ``‖Σ‖ = 10⁶`` alone was off by up to 2.5e-5 on
   the benchmark workload (sub-leading singular parts of Σ); after refinement T* from the
   thresholds 10⁵, 10⁶ and 10⁸ agree to 1e-14. The refinement is also the final pole test:
   on that workload ~15 members pass the local test at 10⁶ but their projective flow turns
   onto the cone ``uᵀBu = 0`` where the quadratic growth stops (‖Σ‖ saturates at
   10⁷–10¹⁵ and the member then creeps along the stiff slow manifold); they end LARGE, not
   BLOWUP (with thresholds 10⁹–10¹², most of them reach t1 = 1 with a finite Σ).

Each member returns a status (a :class:`jaxdyn.RESULTS` code; ``jaxdyn.status_code(name)`` gives
the codes), its final time and state, its blow-up time and its step counts. This driver is a Python function around jitted loops (the gather between them has a data-dependent size): call it, do not ``jit`` it, and
for gradients use :func:`jaxdyn.solve_moments` (diffrax, differentiable).
"""

from __future__ import annotations

import math
import time
from typing import Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..integrators.dopri8 import DOPRI8, dopri8_step
from ..integrators.rodas5 import RODAS5, rodas5_step
from .._results import RESULTS, Solution, stat, from_codes, raise_if_failed, status_code
from ._solve import (_cov_tol, dtype_threshold, dtype_tolerances, moment_rhs,
                        on_pole, pole_refine, pole_scale, remaining_time)

__all__ = ["BatchSolution", "solve_moments_batch"]

ACTIVE = -1  # internal: still integrating
HANDOFF = -2  # internal: stiff (or out of explicit iterations), continue in the stiff stage

# Dormand–Prince 8(7) (jaxdyn.integrators.dopri8).
_NSTAGE = len(DOPRI8.b)  # 14 = 13 stages + the FSAL stage (weight 0)
_STIFF_STAGE = 12  # stage with c = 1 compared with the FSAL derivative (stiffness test)
_ERR_EXP = 1.0 / DOPRI8.order
# |R(z)| = 1 at z ≈ −5.15 on the negative real axis for this pair; a step is "stiff" when
# the estimated h ρ passes 0.75 of that (Hairer's DOP853 uses 6.1 for its own pair).
_STIFF_HRHO = 3.9

# Rodas5 (jaxdyn.integrators.rodas5). Measured on the stiff members of the benchmark
# workload: 2.6–3× fewer steps than Rodas4 at rtol = 1e-10 for the same error.
_R_ERR_EXP = 1.0 / RODAS5.order


class BatchSolution(Solution):
    """Result of :func:`solve_moments_batch`, one entry per member (leading axis n); a
    :class:`jaxdyn.Solution` pytree of arrays (no static fields).

    t_final: (n,) time reached (t1 when successful, the detection time after a blow-up).
    mean: (n, d), cov: (n, d, d) — the state at ``t_final``. blowup_time: (n,) refined ``T*``
    (inf unless the status is ``blowup``). result: (n,) :class:`jaxdyn.RESULTS` codes
    (``.status`` the ints, compare with ``jaxdyn.status_code(name)``; ``.messages``, ``.ok``,
    ``.counts()``). stats: a dict of arrays: ``num_steps`` (n,) accepted + rejected steps
    over both stages; ``stiff`` (n,) True where the member was handed to the stiff (Rodas5)
    stage; ``explicit_iterations``, ``stiff_iterations``: loop counts; ``round_sizes``,
    ``round_iterations``, ``round_seconds``: each explicit round's batch size, iterations
    and wall time (compaction schedule); ``stiff_seconds``, ``pole_seconds``: wall time of
    the stiff stage and of the T* refinement (timings include compilation on a first call).
    """

    t_final: jax.Array
    mean: jax.Array
    cov: jax.Array
    blowup_time: jax.Array
    result: RESULTS
    stats: dict

    num_steps = stat("num_steps", "Accepted + rejected steps per member: ``stats['num_steps']``.")

    stiff = stat("stiff", "True where the member was handed to the stiff stage: ``stats['stiff']``.")


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
    """Member outcomes after a lock-step step (both stages): OK at t1, BLOWUP (with T*) or
    LARGE past the threshold, NONFINITE when the step size collapsed — unless the state is
    then on a pole with ``‖Σ‖ ≥ √thr``: a blow-up whose approach the dtype cannot resolve to
    the threshold (float32: steps of ``T* − t ~ 1/(q ‖Σ‖)`` fall below ``100 eps t`` near
    ``‖Σ‖ ~ 10⁵``) is a BLOWUP candidate, refined and re-tested by the pole stage."""
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
    """FSAL derivative, initial step (Hairer's first guess: 0.01 ‖y0‖/‖f0‖ in the scaled
    norm, within [1e-6, 1]·t1) and whether the state is finite, of fresh batch-last members."""
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
    """Run the explicit lock-step loop on a batch-last chunk until no member is active or at
    most ``min_active`` members are active (time to compact). Members flagged ``fresh`` are
    started first (FSAL derivative, initial step). A member that has taken ``max_steps``
    steps is handed to the stiff stage (every member steps from iteration 0 on, so this is
    the lock-step iteration cap). One compiled program per (chunk width, d, dtype): the
    driver feeds chunks of a fixed width. Returns (carry, iterations)."""
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
# Stage 2: Rodas5, member-major, vmapped per-member step, lock-step
# ---------------------------------------------------------------------------------------


def _rodas_step(t, h, y, A, B, V, b, d):
    def f(yy):
        m, S = yy[:d], yy[d:].reshape(d, d)
        dm, dS = moment_rhs(m, S, A, B, V, b)
        return jnp.concatenate([dm, dS.reshape(-1)])

    return rodas5_step(f, y, h)


@eqx.filter_jit
def _stiff_stage(t, h, m, S, status, tstar, nsteps, A, B, V, b, t1, thr, rtol, atol, max_iter,
                 hmin_rel):
    """Member-major arrays of a small gathered batch; continues members with status ACTIVE."""
    n, d = m.shape
    y = jnp.concatenate([m, S.reshape(n, d * d)], axis=1)
    ncomp = d + d * d
    step = jax.vmap(lambda tt, hh, yy, a, bb, v, c: _rodas_step(tt, hh, yy, a, bb, v, c, d))

    def body(c):
        t, h, y, status = c["t"], c["h"], c["y"], c["status"]
        active = status == ACTIVE
        hh = jnp.where(active, jnp.minimum(h, t1 - t), t1)  # inactive: any safe value
        y1, e, f1 = step(t, hh, y, A, B, V, b)
        sc = atol + rtol * jnp.maximum(jnp.abs(y), jnp.abs(y1))
        err = jnp.sqrt(jnp.sum((e / sc) ** 2, axis=1) / ncomp)
        fin = jnp.all(jnp.isfinite(y1), axis=1)
        err = jnp.where(fin & jnp.isfinite(err), err, jnp.inf)
        acc = active & (err <= 1.0)
        fac = 0.9 * jnp.where(err > 0, err, 1e-10) ** (-_R_ERR_EXP)
        fac = jnp.where(err <= 1.0, jnp.clip(fac, 0.2, 6.0), jnp.clip(fac, 0.2, 0.9))
        t_new = jnp.where(acc, jnp.where(hh >= t1 - t, t1, t + hh), t)
        y = jnp.where(acc[:, None], y1, y)
        h_new = jnp.where(active, hh * fac, h)
        S1 = y[:, d:].reshape(n, d, d)
        dS = f1[:, d:].reshape(n, d, d)
        # indicators, member-major
        s = jnp.sqrt(jnp.sum(S1 * S1, axis=(1, 2)))
        safe = jnp.where(s > 0, s, 1.0)
        lin = 2.0 * jnp.sum(S1 * jnp.matmul(A, S1, precision=jax.lax.Precision.HIGHEST), axis=(1, 2))
        tot = jnp.sum(S1 * dS, axis=(1, 2))
        ell = lin / safe**2
        q = (tot - lin) / safe**3
        status, tstar = _outcomes(status, c["tstar"], acc, active, t, t_new, h_new, t1, thr,
                                  hmin_rel, s, ell, q, pole_scale(S1, V, B))
        status = status.astype(jnp.int32)
        return dict(t=t_new, h=h_new, y=y, status=status, tstar=tstar,
                    nsteps=c["nsteps"] + active, it=c["it"] + 1)

    def cond(c):
        return jnp.any(c["status"] == ACTIVE) & (c["it"] < max_iter)

    c0 = dict(t=t, h=h, y=y, status=status, tstar=tstar, nsteps=nsteps,
              it=jnp.zeros((), jnp.int32))
    out = jax.lax.while_loop(cond, body, c0)
    st = jnp.where(out["status"] == ACTIVE, status_code("max_steps_reached"), out["status"])
    return (out["t"], out["y"][:, :d], out["y"][:, d:].reshape(n, d, d), st, out["tstar"],
            out["nsteps"], out["it"])


@eqx.filter_jit
def _pole_stage(t, S, A, B, V, active, rtol, atol, max_steps):
    return jax.vmap(lambda t_, S_, a, b_, v, act: pole_refine(
        t_, S_, a, b_, v, rtol=rtol, atol=atol, max_steps=max_steps, active=act))(t, S, A, B, V, active)


# ---------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------


def _batched(x, n, shape, name, dtype):
    x = np.asarray(x, dtype)
    if x.shape == tuple(shape):
        return np.broadcast_to(x, (n, *shape)).copy()
    if x.shape == (n, *shape):
        return x
    raise ValueError(f"{name} must have shape {tuple(shape)} or ({n}, *{tuple(shape)}), got {x.shape}")


def solve_moments_batch(m0, S0, *, A, B, V, b=None, t1, rtol: float = 1e-10, atol: float = 1e-12,
                        blowup_threshold: float = 1e6, max_explicit_iterations: int = 4096,
                        stiff: bool = True, max_stiff_iterations: int = 20000,
                        hmin_rel: Optional[float] = None, min_bucket: int = 16, chunk: int = 64,
                        throw: bool = False) -> BatchSolution:
    r"""Solve many Gaussian moment ODEs at once; members that blow up or turn stiff do not
    hold the batch hostage (two-stage design: see :mod:`jaxdyn.gaussian._batch`).

        m' = (A + V) m + V Σ B m + b,   Σ' = A Σ + Σ Aᵀ + V Σ B Σ + Σ Bᵀ Σ Vᵀ   (docs/math.md §B.2)

    Args:
      m0: (n, d) or (d,) (broadcast), or None (= 0). S0: (n, d, d) or (d, d) symmetric PSD
        (ValueError naming S0 and the measured defect otherwise).
      A, B, V: (n, d, d) or (d, d) constant parameters; b: (n, d), (d,) or None (= 0).
        The leading axis n is the batch. (Time-dependent controls: use
        :func:`jaxdyn.solve_moments`, vmapped.)
      t1: final time (scalar). rtol, atol: per-member error tolerances (both stages),
        raised to what the dtype resolves (``rtol ≥ 10 eps``, ``atol ≥ 0.1 eps``:
        :func:`jaxdyn.gaussian._solve.dtype_tolerances`).
      blowup_threshold: blow-up is declared when ``‖Σ‖_F ≥ blowup_threshold ·
        max(‖Σ0‖_F, 1)`` on a pole (quadratic dominance); ``T*`` is then refined. Capped at
        what the dtype resolves, ``1e-3 / eps`` (float32: 8389).
      max_explicit_iterations: cap on the explicit lock-step loop; members still running
        are handed to the stiff stage. stiff: run the Rodas5 stage on stiff members (if
        False they end with status STIFF at the time reached).
      max_stiff_iterations: cap on the stiff loop (members left get MAX_STEPS).
      hmin_rel: a member whose step falls below ``hmin_rel · max(t, t1)`` ends NONFINITE
        (default ``100 eps``). min_bucket: smallest batch the stiff stage pads to.
      chunk: the explicit and pole stages run on chunks of this many members (one compiled
        program each per chunk width, d and dtype, whatever n; members are regrouped into
        full chunks as others finish).
      throw: if True, raise ``RuntimeError`` with the message of the first member that is not
        successful (a blow-up included); default False (read ``result`` per member).

    Returns: :class:`BatchSolution` (numpy-convertible arrays with leading axis n).
    """
    # Host-side preparation in numpy (no per-shape compilation of small eager ops).
    if not np.issubdtype(np.asarray(S0).dtype, np.floating):
        # as solve_moments: the solve's dtype is S0's (an integer S0 ran the batch in float32
        # whatever the other inputs' precision)
        raise ValueError(f"S0 must have a floating dtype, got {np.asarray(S0).dtype}")
    dtype = np.dtype(jnp.asarray(np.zeros((), np.asarray(S0).dtype)).dtype)  # respects jax_enable_x64
    A = np.asarray(A, dtype)
    if A.ndim not in (2, 3) or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"A must have shape (d, d) or (n, d, d), got {A.shape}")
    d = A.shape[-1]
    pairs = [(np.shape(x), k) for x, k in zip((m0, S0, A, B, V, b), (1, 2, 2, 2, 2, 1))
             if x is not None]
    leads = {s[0] for s, k in pairs if len(s) == k + 1}
    if len(leads) > 1:
        raise ValueError(f"inconsistent batch sizes among m0, S0, A, B, V, b: {sorted(leads)}")
    n = leads.pop() if leads else 1
    S0 = _batched(S0, n, (d, d), "S0", dtype)
    for name, x in (("S0", S0), ("m0", m0), ("A", A), ("B", B), ("V", V), ("b", b)):
        if x is None:
            continue
        x = np.asarray(x, dtype)
        fin = np.isfinite(x)
        if not fin.all():
            where = ""
            if x.ndim > 0 and x.shape[0] == n and (name == "S0" or x.ndim == (3 if name in
                                                                              "ABV" else 2)):
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
    S0 = 0.5 * (S0 + np.swapaxes(S0, -1, -2))
    A = _batched(A, n, (d, d), "A", dtype)
    B = _batched(B, n, (d, d), "B", dtype)
    V = _batched(V, n, (d, d), "V", dtype)
    b = np.zeros((n, d), dtype) if b is None else _batched(b, n, (d,), "b", dtype)
    m0 = np.zeros((n, d), dtype) if m0 is None else _batched(m0, n, (d,), "m0", dtype)
    if not float(t1) > 0:
        raise ValueError(f"t1 must be > 0, got {t1}")
    t1 = np.asarray(t1, dtype)
    if hmin_rel is None:
        hmin_rel = 100 * float(np.finfo(dtype).eps)
    rtol, atol = dtype_tolerances(dtype, rtol, atol)
    blowup_threshold = dtype_threshold(dtype, blowup_threshold)
    thr = (blowup_threshold * np.maximum(np.sqrt(np.sum(S0 * S0, axis=(1, 2))), 1.0)).astype(dtype)

    bl = lambda X: np.ascontiguousarray(np.moveaxis(X, 0, -1))  # noqa: E731
    mm = lambda X: np.moveaxis(X, -1, 0)  # noqa: E731
    W = int(chunk)
    if W < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    # Global (host) state of every member, member-major; chunks of W members are gathered
    # from it, run, and written back.
    dt_ = np.dtype(dtype)
    t_fin = np.zeros(n, dt_)
    mean, cov = m0.astype(dt_, copy=True), S0.astype(dt_, copy=True)
    km, kS = np.zeros((n, d), dt_), np.zeros((n, d, d), dt_)
    status = np.full(n, ACTIVE, np.int32)
    tstar = np.full(n, np.inf, dt_)
    h_last = np.zeros(n, dt_)
    counters = {k: np.zeros(n, np.int32) for k in ("nacc", "nrej", "nstiff", "nonstiff")}
    fresh = np.ones(n, bool)
    rounds = []
    # Passes over the pool of running members: each chunk of W runs until at most W/4 of
    # its members are active (all of them when the pool fits in one chunk), then the
    # survivors of all chunks form the next pool. Every call has the same shapes: one
    # compiled program, and the long tail of slow members costs one chunk's width.
    pool = np.arange(n)
    while pool.size:
        t_round = time.perf_counter()
        min_active = W // 4 if pool.size > W else 0
        its = 0
        for start in range(0, pool.size, W):
            g = pool[start:start + W]
            k = g.size
            sel = np.concatenate([g, np.full(W - k, g[0])])
            st_in = status[sel]
            st_in[k:] = status_code("successful")  # padding: inactive copies, never written back
            carry = dict(t=t_fin[sel], h=h_last[sel], m=bl(mean[sel]), S=bl(cov[sel]),
                         km=bl(km[sel]), kS=bl(kS[sel]), status=st_in, tstar=tstar[sel],
                         **{c: v[sel] for c, v in counters.items()})
            out, it = _explicit_round(carry, fresh[sel], bl(A[sel]), bl(B[sel]), bl(V[sel]),
                                      bl(b[sel]), t1, thr[sel], rtol, atol,
                                      np.int32(max_explicit_iterations), np.int32(min_active),
                                      hmin_rel)
            c = {key: np.asarray(v)[..., :k] for key, v in out.items()}
            its = max(its, int(it))
            t_fin[g], h_last[g], status[g], tstar[g] = c["t"], c["h"], c["status"], c["tstar"]
            mean[g], cov[g], km[g], kS[g] = mm(c["m"]), mm(c["S"]), mm(c["km"]), mm(c["kS"])
            for key, v in counters.items():
                v[g] = c[key]
            fresh[g] = False
        rounds.append((int(pool.size), its, time.perf_counter() - t_round))
        pool = pool[status[pool] == ACTIVE]
    nsteps = counters["nacc"] + counters["nrej"]
    it1 = int(nsteps.max()) if n else 0
    status[status == ACTIVE] = HANDOFF
    t_stiff = time.perf_counter()
    hands = np.flatnonzero(status == HANDOFF)
    stiff_mask = np.zeros(n, bool)
    stiff_mask[hands] = True
    it2 = 0
    if hands.size and stiff:
        k = hands.size
        size = max(min_bucket, 1 << max(0, math.ceil(math.log2(k))))
        idx = np.concatenate([hands, np.full(size - k, hands[0])])
        st_in = np.full(size, ACTIVE, np.int32)
        st_in[k:] = status_code("successful")  # padding: inactive copies
        res = _stiff_stage(t_fin[idx], h_last[idx], mean[idx], cov[idx], st_in, tstar[idx],
                           nsteps[idx].astype(np.int32), A[idx], B[idx], V[idx], b[idx], t1,
                           thr[idx], rtol, atol, np.int32(int(max_stiff_iterations)), hmin_rel)
        t2, m2, S2, st2, ts2, ns2, it2 = (np.asarray(x) for x in res)
        t_fin[hands], mean[hands], cov[hands] = t2[:k], m2[:k], S2[:k]
        status[hands], tstar[hands], nsteps[hands] = st2[:k], ts2[:k], ns2[:k]
        it2 = int(it2)
    elif hands.size:
        status[hands] = status_code("stiff")
    stiff_seconds = time.perf_counter() - t_stiff
    # Pole stage: refine T* of every blow-up past its detection point (projective system in
    # reparametrised time, jaxdyn.gaussian._solve.pole_refine), vmapped over the blow-up members.
    t_pole = time.perf_counter()
    bu = np.flatnonzero(status == status_code("blowup"))
    # Two passes over chunks of W members: most poles converge in a few dozen τ-steps; the
    # rest (and the non-poles, which use the whole budget) are redone so they do not hold
    # the rest. (The step budget is traced: both passes run one compiled program.)
    todo, budget = bu, 64
    for last in (False, True):
        if todo.size == 0:
            break
        T_ref, conv = np.empty(todo.size, dt_), np.empty(todo.size, bool)
        for start in range(0, todo.size, W):
            g = todo[start:start + W]
            sel = np.concatenate([g, np.full(W - g.size, g[0])])
            act = np.arange(W) < g.size
            res = _pole_stage(t_fin[sel], cov[sel], A[sel], B[sel], V[sel], act, rtol, atol,
                              np.int32(budget))
            T_ref[start:start + g.size], conv[start:start + g.size] = (
                np.asarray(x)[:g.size] for x in res)
        tstar[todo] = np.where(conv, T_ref, np.inf)
        if last:
            status[todo[~conv]] = status_code("large")
        todo, budget = todo[~conv], 400
    # A pole refined past t1: the solution is finite on [0, t1] (it only passed the threshold
    # before t1), so no blow-up is claimed: LARGE, as in solve_moments.
    late = (status == status_code("blowup")) & (tstar > t1)
    status[late], tstar[late] = status_code("large"), np.inf
    pole_seconds = time.perf_counter() - t_pole
    cov = 0.5 * (cov + np.swapaxes(cov, -1, -2))
    rounds = np.asarray(rounds, np.float64).reshape(-1, 3)
    stats = {"num_steps": nsteps, "stiff": stiff_mask,
             "explicit_iterations": np.asarray(it1), "stiff_iterations": np.asarray(it2),
             "round_sizes": rounds[:, 0].astype(np.int64),
             "round_iterations": rounds[:, 1].astype(np.int64), "round_seconds": rounds[:, 2],
             "stiff_seconds": np.asarray(stiff_seconds), "pole_seconds": np.asarray(pole_seconds)}
    out = BatchSolution(t_final=t_fin, mean=mean, cov=cov, blowup_time=tstar,
                        result=from_codes(status), stats=stats)
    if throw:
        raise_if_failed(out, "solve_moments_batch")
    return out
