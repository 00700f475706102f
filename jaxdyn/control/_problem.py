r"""The reachability problem (Paper B): modes, ranks, targets, the controlled flow, the energy.

The rest of this docstring describes the whole study.

The moment dynamics of docs/math.md §B.2,

    m' = (A + V) m + V Σ B m + b,   Σ' = M Σ + Σ Mᵀ,   M = A + V Σ B,

with controls ``A(t), B(t), V(t) ∈ R^{d×d}``, ``b(t) ∈ R^d`` piecewise constant (or
piecewise linear) on a uniform grid of ``[0, t1]``. :func:`reach` chooses them to bring
``N(m0, Σ0)`` to ``N(m1, Σ1)`` at ``t1`` by minimising

    L = W2²(N(m(t1), Σ(t1)), N(m1, Σ1)) + λ ∫_0^{t1} Σ_{free u} ‖u(t)‖_F² dt

(Bures–Wasserstein W2², :func:`jaxdyn.distances.bures_w2_squared`) with gradients through
constant diffrax Dopri8 steps on the control grid (:func:`reach_loss`; or
:func:`jaxdyn.gaussian.solve_moments` with a diffrax ``solver``), by ``optax.lbfgs`` with its
zoom line search in one compiled loop, optionally after some Adam steps (``optax.adam`` wrapped
in ``optax.apply_if_finite``; off by default: on random targets L-BFGS alone reached
W2 < 1e-4 in fewer iterations, see ``benchmarks/bench_reach.py``). A trial whose solve does not
reach ``t1`` (blow-up, non-finite, steps too long for the step-error check) has a non-finite
loss: the line search rejects it, an Adam trial retreats halfway towards the last accepted
point, so such trials never enter the optimiser state. Every mode shares one compiled loop per
``(d, n_pieces, dtype)``: the modes differ only in array leaves (free mask, bounds, energy
weight).

**Rank.** ``Σ(t) = Φ(t) Σ0 Φ(t)ᵀ`` with ``Φ`` invertible, so rank Σ is invariant: a target
of another (numerical) rank is refused with a ``ValueError``, never optimised towards.

**Certificate** (:func:`certificate`, the constructive proof of Paper B, V = B = 0):

* full rank: the Monge map ``T = Σ0^{-1/2} (Σ0^{1/2} Σ1 Σ0^{1/2})^{1/2} Σ0^{-1/2}`` is SPD
  with ``T Σ0 T = Σ1``; ``A = log(T)/t1`` (real, symmetric) gives ``Φ(t1) = T``;
* same rank ``r < d``: ``G = L1 L0⁺ + W1 W0ᵀ`` (``Σk = Lk Lkᵀ`` on the range, ``Wk`` bases of
  the null spaces, one column of ``W1`` flipped so that ``det G > 0``) maps Σ0 to Σ1
  exactly; its polar factors ``G = R P`` (``R ∈ SO(d)``, ``P ≻ 0``) have real logarithms,
  so ``A = 2 log(P)/t1`` on ``[0, t1/2)`` then ``A = 2 log(R)/t1`` gives ``Φ(t1) = G``;
* the mean then obeys ``m' = A(t) m + b``: with ``b`` constant,
  ``m(t1) = G m0 + J b``, ``J = ∫_0^{t1} Φ(t1) Φ(s)^{-1} ds`` (φ1-functions), and ``b`` solves
  ``J b = m1 − G m0`` exactly (should J be ill-conditioned in the polar case, b acts in the
  last phase only, where ``J = (t1/2) φ1(log R)`` is invertible).

**Transfer.** :class:`ControlledEuclideanAttention` is the particle field with the same
time-varying controls (``ẋ_i = A(t) x_i + b(t) + V(t) Σ_j w_ij x_j``, ``w_ij ∝ exp(x_jᵀ B(t)
x_i)``); :func:`transfer_particles` integrates it (RK4), :func:`transformer_layers` runs the
L-layer discretisation ``x ← x + (t1/L) f(t_l, x)``, and :func:`cloud_w2_to_gaussian`
measures the result against the target (Bures between empirical moments, and exact W2
against a target sample with its sampling floor).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import (check_bounds, check_dtype, check_finite, check_host, check_integer,
                       check_square, nan_where, scalar_domain)
from ..gaussian._solve import Control, check_covariance, solve_moments



#: the controls of Paper B's system ``ẋ = A x + b + V Σ_j w_ij x_j`` (kernel ``exp(x_jᵀB x_i)``), in
#: the order of the loss masks
CONTROL_NAMES = ("A", "B", "V", "b")
_ALL_FREE = ("A", "b", "V", "B")

#: Named modes of the reachability study: keyword arguments of :func:`reach`.
MODES = ("all", "attention", "bounded", "energy")


def mode_options(mode: str, *, bound: float = 1.0, energy_weight: float = 1e-3) -> dict:
    """Keyword arguments of :func:`reach` for a named mode.

    ``"all"``: A, b, V, B free. ``"attention"``: A = 0, b = 0, only V, B free.
    ``"bounded"``: all free with ``‖u(t)‖_F ≤ bound`` for each control at each time.
    ``"energy"``: all free, loss ``W2² + energy_weight · ∫ Σ ‖u‖_F² dt``.

    Args:
        mode: one of :data:`MODES`.
        bound: the Frobenius bound of the ``"bounded"`` mode.
        energy_weight: λ of the ``"energy"`` mode.

    Returns:
        A dict of :class:`ReachOptions` fields (``free``, and ``bound`` or ``energy_weight``).

    Raises:
        ValueError: an unknown mode.
    """
    if mode == "all":
        return {"free": _ALL_FREE}
    if mode == "attention":
        return {"free": ("V", "B")}
    if mode == "bounded":
        return {"free": _ALL_FREE, "bound": float(bound)}
    if mode == "energy":
        return {"free": _ALL_FREE, "energy_weight": float(energy_weight)}
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


# ---------------------------------------------------------------------------------------
# Rank, targets
# ---------------------------------------------------------------------------------------


def _default_rank_rtol(dtype) -> float:
    return float(np.sqrt(np.finfo(np.dtype(dtype)).eps))


def numerical_rank(S, rank_rtol: Optional[float] = None):
    r"""The numerical rank of a PSD matrix, with its eigen-decomposition.

    The rank counts eigenvalues ``λ > rank_rtol · λ_max``. Eigenvalues at or below the cut
    are the ones a regularised square root treats as zero. Host-side (NumPy, float64; not
    under ``jit``).

    Args:
        S: (d, d) symmetric PSD matrix (concrete).
        rank_rtol: the relative cut (default ``sqrt(eps(dtype))``: 1.5e-8 in float64,
            3.5e-4 in float32).

    Returns:
        ``(rank, eigenvalues, eigenvectors)``, the eigenvalues descending (NumPy).

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses S not a finite (d, d)
    matrix with d >= 1, or a ``rank_rtol`` that is not a finite number >= 0; a TypeError a
    traced S (host-only).

    Dtypes: float32 or float64, float16 or bfloat16, integers (computed in float64 on the
    host); complex is refused (a TypeError naming ``S``).

    Raises:
        ValueError: ``S`` of dimension d = 0.
    """
    check_host("numerical_rank", S=S)
    check_dtype("S", S, half=True, fn="numerical_rank")
    check_square("S", S)
    if np.shape(S)[0] < 1:
        raise ValueError(f"numerical_rank: S must be a (d, d) matrix with d >= 1, got shape "
                         f"{np.shape(S)}")
    check_finite("S", S)
    check_bounds("rank_rtol", rank_rtol, low=0)
    S = np.asarray(S)
    if S.dtype.kind == "V":  # (bfloat16: NumPy reads it through float32)
        S = S.astype(np.float32)
    dtype = S.dtype if np.issubdtype(S.dtype, np.floating) else np.float64
    rt = _default_rank_rtol(dtype) if rank_rtol is None else float(rank_rtol)
    w, u = np.linalg.eigh(0.5 * (S + S.T).astype(np.float64))
    w, u = w[::-1], u[:, ::-1]
    lmax = max(float(w[0]), 0.0)
    rank = int(np.sum(w > rt * lmax)) if lmax > 0 else 0
    return rank, w, u


def random_target(seed: int, d: int, *, mean_scale: float = 1.0, eig_range=(0.25, 4.0),
                  rank: Optional[int] = None, dtype=np.float64):
    r"""A random Gaussian target ``(m1, S1)`` (NumPy).

    ``m1 ~ mean_scale · N(0, I_d)``; ``S1 = Q diag(λ) Qᵀ`` with Q Haar-orthogonal and the
    λ log-uniform in ``eig_range``; with ``rank = r < d`` the last ``d − r`` eigenvalues are 0.

    Args:
        seed: the NumPy seed.
        d: the dimension.
        mean_scale: the scale of the mean.
        eig_range: ``(low, high)`` of the eigenvalues.
        rank: None (full rank) or the rank r of S1.
        dtype: the NumPy dtype of the arrays.

    Returns:
        ``(m1, S1)``: (d,) and (d, d) NumPy arrays.

    Raises:
        ValueError: d not an integer >= 1, a ``mean_scale`` that is not finite, an
            ``eig_range`` that is not two finite numbers 0 < low <= high, or a rank that is
            not an integer in [0, d].
    """
    d = check_integer("d (the dimension)", d, minimum=1)
    check_finite("mean_scale", mean_scale)
    if np.shape(eig_range) != (2,):
        raise ValueError(f"eig_range must be (low, high), got {eig_range!r}")
    check_bounds("eig_range", eig_range, low=0, low_open=True)
    if float(eig_range[0]) > float(eig_range[1]):
        raise ValueError(f"eig_range must be (low, high) with low <= high, got {tuple(eig_range)}")
    if rank is not None and check_integer("rank", rank, minimum=0) > d:
        raise ValueError(f"rank must be an integer in [0, d] = [0, {d}], got {rank!r}")
    rng = np.random.default_rng(seed)
    m1 = mean_scale * rng.standard_normal(d)
    z = rng.standard_normal((d, d))
    q, r = np.linalg.qr(z)
    q = q * np.sign(np.diag(r))
    lo, hi = (float(x) for x in eig_range)
    lam = np.exp(rng.uniform(np.log(lo), np.log(hi), d))
    if rank is not None:
        lam[int(rank):] = 0.0
    S1 = (q * lam) @ q.T
    return m1.astype(dtype), (0.5 * (S1 + S1.T)).astype(dtype)


def _check_problem(m0, S0, m1, S1):
    for name, a in (("m0", m0), ("S0", S0), ("m1", m1), ("S1", S1)):
        check_dtype(name, a)  # (before the casts below, which would drop an imaginary part)
    S0 = check_covariance(jnp.asarray(S0), "S0")
    dtype = S0.dtype
    d = S0.shape[0]
    traced = lambda x: isinstance(x, jax.core.Tracer)  # noqa: E731
    S1 = check_covariance(jnp.asarray(S1, dtype) if traced(S1) else np.asarray(S1, dtype), "S1")
    if S1.shape != (d, d):
        raise ValueError(f"S1 must have shape ({d}, {d}) like S0, got {S1.shape}")

    def mean(m):  # host-side (numpy) unless traced: no small eager programs to compile
        if m is None:
            return np.zeros((d,), dtype)
        return jnp.asarray(m, dtype) if traced(m) else np.asarray(m, dtype)

    m0, m1 = mean(m0), mean(m1)
    if m0.shape != (d,):
        raise ValueError(f"m0 must have shape ({d},), got {m0.shape}")
    if m1.shape != (d,):
        raise ValueError(f"m1 must have shape ({d},), got {m1.shape}")
    for name, m in (("m0", m0), ("m1", m1)):
        if not traced(m) and not np.all(np.isfinite(m)):
            raise ValueError(f"{name} must be finite (it holds NaN or inf)")
    return jnp.asarray(m0), S0, jnp.asarray(m1), S1


def _ranks(S0, S1, rank_rtol):
    r0, w0, u0 = numerical_rank(S0, rank_rtol)
    r1, w1, u1 = numerical_rank(S1, rank_rtol)
    rt = _default_rank_rtol(np.asarray(S0).dtype) if rank_rtol is None else float(rank_rtol)
    if r0 != r1:
        raise ValueError(
            f"S1 has numerical rank {r1} but S0 has rank {r0} (eigenvalues <= {rt:.2g} * "
            f"lambda_max treated as 0): the moment dynamics preserve rank, Sigma(t) = Phi(t) "
            f"Sigma0 Phi(t)^T with Phi(t) invertible (docs/math.md §B.3), so N(m1, S1) is not reachable "
            f"from N(m0, S0) with any controls; refusing to optimise towards it. (If the "
            f"difference is rounding, adjust rank_rtol.)")
    if r0 == 0:
        raise ValueError("S0 and S1 are both zero: nothing to steer (rank 0)")
    return r0, (w0, u0), (w1, u1), rt


def _tight_tols(dtype, rtol, atol):
    f64 = np.dtype(dtype) == np.float64
    return (1e-11 if f64 else 1e-6) if rtol is None else rtol, \
        (1e-13 if f64 else 1e-8) if atol is None else atol


def controlled_moments(controls: Mapping, m0, S0, *, t1, saveat=None, rtol=None, atol=None,
                       solver=None, max_steps: int = 16384, blowup_threshold: float = 1e6):
    """The moment ODE under given controls: the adaptive reference solve.

    :func:`jaxdyn.gaussian.solve_moments` with ``A, B, V, b`` from ``controls``. The default
    tolerances are tight (rtol 1e-11, atol 1e-13 in float64; 1e-6/1e-8 in float32) and the
    solver is ``Dopri8``: the solve that checks an optimised result. Runs under ``jit``,
    ``vmap`` and ``grad`` as :func:`~jaxdyn.gaussian.solve_moments` does.

    Args:
        controls: ``{"A", "B", "V", "b"}``: arrays or :class:`Control` s.
        m0: (d,) initial mean (None = 0).
        S0: (d, d) initial covariance.
        t1: the final time.
        saveat: as :func:`~jaxdyn.gaussian.solve_moments` (None: t1 only).
        rtol: relative tolerance (default above).
        atol: absolute tolerance (default above).
        solver: a diffrax solver (default ``Dopri8()``).
        max_steps: the step budget.
        blowup_threshold: as :func:`~jaxdyn.gaussian.solve_moments` (the solve stops, status
            ``large`` or ``blowup``, once ``‖Σ‖_F`` passes it times ``max(‖Σ0‖_F, 1)``).

    Dtypes: S0 float32 or float64 (the solve's dtype; an integer S0 is refused by name); m0
    float32, float64 or integers (converted to S0's dtype); float16, bfloat16 and complex are
    refused (a TypeError naming the parameter).

    Returns:
        :class:`jaxdyn.gaussian.MomentSolution`.
    """
    S0 = jnp.asarray(S0)
    rtol, atol = _tight_tols(S0.dtype, rtol, atol)
    return solve_moments(m0, S0, A=controls["A"], B=controls["B"], V=controls["V"],
                         b=controls["b"], t1=t1, saveat=saveat, rtol=rtol, atol=atol,
                         solver=solver, max_steps=max_steps, blowup_threshold=blowup_threshold)


def _energy_values(vals, kind, t1):
    """∫_0^{t1} ‖u(t)‖² dt for one control's values (piecewise constant or linear)."""
    sq = jnp.sum(vals.reshape(vals.shape[0], -1) ** 2, axis=-1)
    if kind == "piecewise":
        return (t1 / vals.shape[0]) * jnp.sum(sq)
    h = t1 / (vals.shape[0] - 1)
    flat = vals.reshape(vals.shape[0], -1)
    cross = jnp.sum(flat[:-1] * flat[1:], axis=-1)
    return (h / 3.0) * jnp.sum(sq[:-1] + cross + sq[1:])


def control_energy(controls: Mapping, names: Sequence[str] = CONTROL_NAMES, t1=None):
    r"""The control energy ``∫_0^{t1} Σ_{u ∈ names} ‖u(t)‖_F² dt``.

    Exact for piecewise-constant (``(t1/n) Σ_k ‖u_k‖²``) and piecewise-linear (Simpson's rule
    on each piece, exact for the quadratic ``‖u(t)‖²``) Controls; a constant array counts as
    ``t1 ‖u‖²``. Runs under ``jit``, ``vmap`` and ``grad``.

    Args:
        controls: a mapping of names to :class:`Control` s or constant arrays.
        names: the controls to sum.
        t1: the horizon for constant arrays, finite and > 0. A traced value outside the
            domain gives NaN.

    Returns:
        The energy, a scalar array.

    Raises:
        ValueError: a constant array without ``t1``, or a concrete ``t1`` that is not finite
            and > 0.
    """
    err, bad = scalar_domain("t1", t1, low=0, low_open=True, what=" (the horizon)")
    if err:
        raise ValueError(err)
    tot = jnp.zeros(())
    for k in names:
        u = controls[k]
        if isinstance(u, Control):
            tot = tot + _energy_values(u.values, u.kind, u.t1)
        else:
            if t1 is None:
                raise ValueError(f"control {k!r} is a constant array: pass t1 to integrate it")
            tot = tot + t1 * jnp.sum(jnp.asarray(u) ** 2)
    return nan_where(bad, tot)
