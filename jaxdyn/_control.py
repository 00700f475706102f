r"""Reachability (Paper B): steering Gaussians with optimised time-varying controls.

The moment dynamics of MATH.md §B,

    m' = (A + V) m + V Σ B m + b,   Σ' = M Σ + Σ Mᵀ,   M = A + V Σ B,

with controls ``A(t), B(t), V(t) ∈ R^{d×d}``, ``b(t) ∈ R^d`` piecewise constant (or
piecewise linear) on a uniform grid of ``[0, t1]``. :func:`reach` chooses them to bring
``N(m0, Σ0)`` to ``N(m1, Σ1)`` at ``t1`` by minimising

    L = W2²(N(m(t1), Σ(t1)), N(m1, Σ1)) + λ ∫_0^{t1} Σ_{free u} ‖u(t)‖_F² dt

(Bures–Wasserstein W2², :func:`jaxdyn._distances.bures_w2_squared`) with gradients through
:func:`jaxdyn._gaussian.solve_moments` (``diffrax.RecursiveCheckpointAdjoint``): L-BFGS
directions (``optax.scale_by_lbfgs``) with a backtracking Armijo line search, optionally after
some Adam steps (``optax.adam`` wrapped in ``optax.apply_if_finite``; off by default: on
random targets L-BFGS alone reached W2 < 1e-4 in fewer iterations, see
``benchmarks/bench_reach.py``). A trial whose solve does not reach ``t1`` (blow-up,
non-finite, step budget) has loss NaN: a line-search trial is rejected (the step is halved),
an Adam iterate retreats halfway towards the last finite point, so such trials never enter
the optimiser state. Every optimiser shares one compiled loss per ``(d, n_pieces, dtype)``:
the modes differ only in array leaves (free mask, bounds, energy weight).

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

from ._distances import bures_w2_squared, sqrtm_psd, w2_exact
from ._gaussian import Control, MomentStatus, check_covariance, solve_moments, status_name
from ._integrators import INTEGRATORS
from ._kernels import HIGHEST, KERNELS, interaction
from ._models import AbstractParticleModel, EuclideanAttention

__all__ = [
    "CONTROL_NAMES",
    "MODES",
    "Certificate",
    "ReachResult",
    "ControlledEuclideanAttention",
    "certificate",
    "reach",
    "mode_options",
    "numerical_rank",
    "random_target",
    "control_energy",
    "controlled_moments",
    "transfer_particles",
    "transformer_layers",
    "cloud_w2_to_gaussian",
    "gaussian_cloud",
]

CONTROL_NAMES = ("A", "B", "V", "b")
_ALL_FREE = ("A", "b", "V", "B")

#: Named modes of the reachability study: keyword arguments of :func:`reach`.
MODES = ("all", "attention", "bounded", "energy")


def mode_options(mode: str, *, bound: float = 1.0, energy_weight: float = 1e-3) -> dict:
    """Keyword arguments of :func:`reach` for a named mode.

    ``"all"``: A, b, V, B free. ``"attention"``: A = 0, b = 0, only V, B free.
    ``"bounded"``: all free with ``‖u(t)‖_F ≤ bound`` for each control at each time.
    ``"energy"``: all free, loss ``W2² + energy_weight · ∫ Σ ‖u‖_F² dt``.
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
    r"""``(rank, eigenvalues, eigenvectors)`` of a PSD matrix, eigenvalues descending.

    The rank counts eigenvalues ``λ > rank_rtol · λ_max`` (default ``rank_rtol =
    sqrt(eps(dtype))``: 1.5e-8 in float64, 3.5e-4 in float32). Eigenvalues at or below the
    cut are the ones a regularised square root treats as zero. Host-side (numpy, float64).
    """
    S = np.asarray(S)
    dtype = S.dtype if np.issubdtype(S.dtype, np.floating) else np.float64
    rt = _default_rank_rtol(dtype) if rank_rtol is None else float(rank_rtol)
    w, u = np.linalg.eigh(0.5 * (S + S.T).astype(np.float64))
    w, u = w[::-1], u[:, ::-1]
    lmax = max(float(w[0]), 0.0)
    rank = int(np.sum(w > rt * lmax)) if lmax > 0 else 0
    return rank, w, u


def random_target(seed: int, d: int, *, mean_scale: float = 1.0, eig_range=(0.25, 4.0),
                  rank: Optional[int] = None, dtype=np.float64):
    r"""A random Gaussian target ``(m1, S1)`` (numpy).

    ``m1 ~ mean_scale · N(0, I_d)``; ``S1 = Q diag(λ) Qᵀ`` with Q Haar-orthogonal and the
    λ log-uniform in ``eig_range``; with ``rank = r < d`` the last ``d − r`` eigenvalues are 0.
    """
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
    S0 = check_covariance(jnp.asarray(S0), "S0")
    dtype = S0.dtype
    d = S0.shape[0]
    S1 = check_covariance(jnp.asarray(S1, dtype), "S1")
    if S1.shape != (d, d):
        raise ValueError(f"S1 must have shape ({d}, {d}) like S0, got {S1.shape}")
    m0 = jnp.zeros((d,), dtype) if m0 is None else jnp.asarray(m0, dtype)
    m1 = jnp.zeros((d,), dtype) if m1 is None else jnp.asarray(m1, dtype)
    if m0.shape != (d,):
        raise ValueError(f"m0 must have shape ({d},), got {m0.shape}")
    if m1.shape != (d,):
        raise ValueError(f"m1 must have shape ({d},), got {m1.shape}")
    return m0, S0, m1, S1


def _ranks(S0, S1, rank_rtol):
    r0, w0, u0 = numerical_rank(S0, rank_rtol)
    r1, w1, u1 = numerical_rank(S1, rank_rtol)
    rt = _default_rank_rtol(np.asarray(S0).dtype) if rank_rtol is None else float(rank_rtol)
    if r0 != r1:
        raise ValueError(
            f"S1 has numerical rank {r1} but S0 has rank {r0} (eigenvalues <= {rt:.2g} * "
            f"lambda_max treated as 0): the moment dynamics preserve rank, Sigma(t) = Phi(t) "
            f"Sigma0 Phi(t)^T with Phi(t) invertible (MATH.md §B), so N(m1, S1) is not reachable "
            f"from N(m0, S0) with any controls; refusing to optimise towards it. (If the "
            f"difference is rounding, adjust rank_rtol.)")
    if r0 == 0:
        raise ValueError("S0 and S1 are both zero: nothing to steer (rank 0)")
    return r0, (w0, u0), (w1, u1), rt


# ---------------------------------------------------------------------------------------
# Certificate
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Certificate:
    r"""The constructive solution (V = B = 0): ``A`` piecewise constant, ``b`` constant.

    Attributes:
      A: :class:`Control` (n_pieces, d, d); b: :class:`Control` (n_pieces, d).
      G: (d, d) ``Φ(t1)``, with ``G Σ0 Gᵀ = Σ1`` (on the kept ranges).
      construction: ``"monge"`` (full rank, one phase, A symmetric) or ``"polar"`` (rank
        ``r < d``: two phases, ``log P`` then ``log R``).
      rank: numerical rank used; rank_rtol: its relative cut; dropped: the largest
        eigenvalue (of Σ0 or Σ1) treated as zero, relative to its λ_max (0 if none).
      residual: ``‖G Σ0 Gᵀ − Σ1‖_F / max(‖Σ1‖_F, tiny)`` (algebraic, with the full Σ0, Σ1).
      mean_residual: ``|G m0 + J b − m1|`` (algebraic).
      energy: ``∫_0^{t1} (‖A‖_F² + |b|²) dt``.
      w2: Bures W2 at t1 of the moment ODE solved with these controls (``solve_moments``),
        None when ``verify=False``; status: that solve's :class:`MomentStatus` code.
    """

    A: Control
    b: Control
    G: np.ndarray
    construction: str
    rank: int
    rank_rtol: float
    dropped: float
    residual: float
    mean_residual: float
    energy: float
    w2: Optional[float]
    status: Optional[int]

    def controls(self, dtype=None) -> dict:
        """``{"A", "B", "V", "b"}`` as Controls (B = V = 0) on this certificate's grid."""
        A = self.A if dtype is None else Control(self.A.values.astype(dtype), self.A.t1)
        b = self.b if dtype is None else Control(self.b.values.astype(dtype), self.b.t1)
        z = jnp.zeros_like(A.values)
        return {"A": A, "B": Control(z, A.t1), "V": Control(z, A.t1), "b": b}


def _phi1(X):
    """φ1(X) = Σ X^k/(k+1)! from the augmented exponential expm([[X, I], [0, 0]])."""
    from scipy.linalg import expm

    d = X.shape[0]
    big = np.zeros((2 * d, 2 * d))
    big[:d, :d] = X
    big[:d, d:] = np.eye(d)
    E = expm(big)
    return E[:d, :d], E[:d, d:]


def _rotation_log(R):
    r"""Real skew-symmetric ``K`` with ``expm(K) = R`` for ``R ∈ SO(d)``, from the real
    Schur form (2×2 blocks give angles; eigenvalues −1 come in pairs, rotated by π)."""
    from scipy.linalg import schur

    T, Z = schur(R, output="real")
    d = R.shape[0]
    L = np.zeros((d, d))
    minus = []
    i = 0
    while i < d:
        if i + 1 < d and abs(T[i + 1, i]) > 1e-12:
            theta = math.atan2(T[i + 1, i] - T[i, i + 1], T[i, i] + T[i + 1, i + 1])
            L[i, i + 1], L[i + 1, i] = -theta, theta
            i += 2
        else:
            if T[i, i] < 0:
                minus.append(i)
            i += 1
    if len(minus) % 2:  # pragma: no cover - det R = +1 forbids it
        raise ValueError("internal: rotation with an odd number of -1 eigenvalues")
    for p, q in zip(minus[0::2], minus[1::2]):
        L[p, q], L[q, p] = -math.pi, math.pi
    K = Z @ L @ Z.T
    return 0.5 * (K - K.T)


def _sqrt_host(S):
    return np.asarray(sqrtm_psd(jnp.asarray(S)), dtype=np.float64)


def certificate(m0, S0, m1, S1, *, t1=1.0, n_pieces: Optional[int] = None,
                rank_rtol: Optional[float] = None, verify: bool = True,
                rtol: Optional[float] = None, atol: Optional[float] = None) -> Certificate:
    r"""Controls that steer ``N(m0, S0)`` exactly to ``N(m1, S1)`` at ``t1`` (V = B = 0).

    Full rank (Monge): ``T = S0^{-1/2} (S0^{1/2} S1 S0^{1/2})^{1/2} S0^{-1/2}`` (SPD,
    ``T S0 T = S1``), ``A = log(T)/t1`` constant. Same rank ``r < d`` (polar): ``G = R P``
    as in the module doc, ``A = 2 log P / t1`` then ``2 log R / t1``. In both, ``b`` is
    constant with ``m(t1) = G m0 + J b = m1``, ``J = ∫ Φ(t1) Φ(s)^{-1} ds``.

    Args:
      m0, m1: (d,) means (None = 0). S0, S1: (d, d) PSD covariances of the same numerical
        rank (``ValueError`` otherwise, with the reason).
      t1: final time. n_pieces: length of the returned piecewise grids (default 1 for
        Monge, 2 for polar; polar needs an even number).
      rank_rtol: relative eigenvalue cut of the numerical rank (default sqrt(eps)).
        Eigenvalues below it are treated as 0 (regularised square roots); the largest one
        dropped is reported as ``dropped``.
      verify: solve the moment ODE with these controls (``solve_moments``, tolerances
        ``rtol``/``atol``, defaults 1e-11/1e-13 in float64) and report the Bures W2 at t1.

    Returns: :class:`Certificate`. Built on the host in float64 (square roots by
    :func:`jaxdyn._distances.sqrtm_psd`), stored in the dtype of S0.
    """
    m0, S0, m1, S1 = _check_problem(m0, S0, m1, S1)
    if not float(t1) > 0:
        raise ValueError(f"t1 must be > 0, got {t1}")
    t1 = float(t1)
    dtype = S0.dtype
    d = S0.shape[0]
    r, (w0, u0), (w1, u1), rt = _ranks(S0, S1, rank_rtol)
    S0h, S1h = (np.asarray(a, np.float64) for a in (S0, S1))
    m0h, m1h = (np.asarray(a, np.float64) for a in (m0, m1))
    dropped = 0.0
    for w in (w0, w1):
        if r < d and w[0] > 0:
            dropped = max(dropped, float(max(w[r], 0.0) / w[0]))
    if r == d:
        construction = "monge"
        n = 1 if n_pieces is None else int(n_pieces)
        # Σ0^{1/2} by sqrtm_psd; its inverse from Σ0's eigenpairs (all kept: full rank).
        R0 = _sqrt_host(S0h)
        R0i = (u0 / np.sqrt(w0)) @ u0.T
        C = _sqrt_host(R0 @ S1h @ R0)
        T = R0i @ C @ R0i
        T = 0.5 * (T + T.T)
        mu, v = np.linalg.eigh(T)
        if mu[0] <= 0:  # pragma: no cover - T is SPD for full-rank Σ0, Σ1
            raise ValueError(f"internal: Monge map not positive definite (min eigenvalue {mu[0]:.3e})")
        logT = (v * np.log(mu)) @ v.T
        G = (v * mu) @ v.T
        phases = [logT]
    else:
        construction = "polar"
        n = 2 if n_pieces is None else int(n_pieces)
        if n % 2:
            raise ValueError(f"n_pieces must be even for a rank-deficient certificate (two phases: "
                             f"log P then log R), got {n_pieces}")
        L1 = u1[:, :r] * np.sqrt(w1[:r])
        L0p = (u0[:, :r] / np.sqrt(w0[:r])).T
        W0, W1 = u0[:, r:], u1[:, r:].copy()
        G = L1 @ L0p + W1 @ W0.T
        if np.linalg.det(G) < 0:
            W1[:, 0] *= -1.0
            G = L1 @ L0p + W1 @ W0.T
        us, s, vt = np.linalg.svd(G)
        Rot = us @ vt
        logP = (vt.T * np.log(s)) @ vt
        K = _rotation_log(Rot)
        phases = [0.5 * (logP + logP.T), K]
    # Φ(t1) = exp(X_last) … exp(X_first) with X_k = (log factor of phase k); J = Σ_k h …
    h = t1 / len(phases)
    J = np.zeros((d, d))
    Phi = np.eye(d)
    for X in phases:
        E, P1 = _phi1(X)
        J = E @ J + h * P1
        Phi = E @ Phi
    rhs = m1h - Phi @ m0h
    per = n // len(phases)
    if np.linalg.cond(J) < 1e10:
        bvec = np.linalg.solve(J, rhs)
        mean_res = float(np.linalg.norm(Phi @ m0h + J @ bvec - m1h))
        bvals = np.repeat(bvec[None], n, axis=0)
    else:  # pragma: no cover - b in the last phase only: J = h φ1(X_last), invertible
        J = h * _phi1(phases[-1])[1]
        bvec = np.linalg.solve(J, rhs)
        mean_res = float(np.linalg.norm(Phi @ m0h + J @ bvec - m1h))
        bvals = np.zeros((n, d))
        bvals[n - per:] = bvec
    cov_res = float(np.linalg.norm(Phi @ S0h @ Phi.T - S1h) / max(np.linalg.norm(S1h), 1e-300))
    Avals = np.concatenate([np.repeat((X / h)[None], per, axis=0) for X in phases], axis=0)
    energy = float(sum(h * np.sum((X / h) ** 2) for X in phases)
                   + (t1 / n) * np.sum(bvals ** 2))
    A_c = Control(jnp.asarray(Avals, dtype), t1)
    b_c = Control(jnp.asarray(bvals, dtype), t1)
    w2 = status = None
    if verify:
        ctr = {"A": A_c, "B": Control(jnp.zeros_like(A_c.values), t1),
               "V": Control(jnp.zeros_like(A_c.values), t1), "b": b_c}
        sol = controlled_moments(ctr, m0, S0, t1=t1, rtol=rtol, atol=atol)
        status = int(sol.status)
        w2 = (float(jnp.sqrt(bures_w2_squared(sol.mean_final, sol.cov_final, m1, S1)))
              if status == MomentStatus.OK else float("nan"))
    return Certificate(A=A_c, b=b_c, G=Phi, construction=construction, rank=r, rank_rtol=rt,
                       dropped=dropped, residual=cov_res, mean_residual=mean_res, energy=energy,
                       w2=w2, status=status)


# ---------------------------------------------------------------------------------------
# Controlled moment solve, energy
# ---------------------------------------------------------------------------------------


def _tight_tols(dtype, rtol, atol):
    f64 = np.dtype(dtype) == np.float64
    return (1e-11 if f64 else 1e-6) if rtol is None else rtol, \
        (1e-13 if f64 else 1e-8) if atol is None else atol


def controlled_moments(controls: Mapping, m0, S0, *, t1, saveat=None, rtol=None, atol=None,
                       solver=None, max_steps: int = 16384):
    """:func:`solve_moments` with ``controls = {"A", "B", "V", "b"}`` (arrays or Controls).

    Default tolerances are tight (rtol 1e-11, atol 1e-13 in float64; 1e-6/1e-8 in float32)
    and the solver is ``Dopri8``: the reference solve that checks an optimised result.
    """
    S0 = jnp.asarray(S0)
    rtol, atol = _tight_tols(S0.dtype, rtol, atol)
    return solve_moments(m0, S0, A=controls["A"], B=controls["B"], V=controls["V"],
                         b=controls["b"], t1=t1, saveat=saveat, rtol=rtol, atol=atol,
                         solver=solver, max_steps=max_steps)


def _energy_values(vals, kind, t1):
    """∫_0^{t1} ‖u(t)‖² dt for one control's values (piecewise constant or linear)."""
    sq = jnp.sum(vals.reshape(vals.shape[0], -1) ** 2, axis=-1)
    if kind == "piecewise":
        return (t1 / vals.shape[0]) * jnp.sum(sq)
    h = t1 / (vals.shape[0] - 1)
    flat = vals.reshape(vals.shape[0], -1)
    cross = jnp.sum(flat[:-1] * flat[1:], axis=-1)
    return (h / 3.0) * jnp.sum(sq[:-1] + cross + sq[1:])


def control_energy(controls: Mapping, names: Sequence[str] = CONTROL_NAMES, t1=None) -> float:
    r"""``∫_0^{t1} Σ_{u ∈ names} ‖u(t)‖_F² dt`` (exact for piecewise-constant/linear Controls;
    a constant array counts as ``t1 ‖u‖²``, which needs ``t1``)."""
    tot = 0.0
    for k in names:
        u = controls[k]
        if isinstance(u, Control):
            tot += float(_energy_values(u.values, u.kind, u.t1))
        else:
            if t1 is None:
                raise ValueError(f"control {k!r} is a constant array: pass t1 to integrate it")
            tot += float(t1) * float(jnp.sum(jnp.asarray(u) ** 2))
    return tot


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
    solver: diffrax.AbstractSolver = eqx.field(static=True)


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
    ctr = {k: Control(v, prob.t1, prob.kind) for k, v in zip(CONTROL_NAMES, vals)}
    sol = solve_moments(prob.m0, prob.S0, A=ctr["A"], B=ctr["B"], V=ctr["V"], b=ctr["b"],
                        t1=prob.t1, rtol=opts.rtol, atol=opts.atol, solver=opts.solver,
                        max_steps=opts.max_steps)
    w2sq = bures_w2_squared(sol.mean_final, sol.cov_final, prob.m1, prob.S1)
    energy = sum(prob.mask[i] * _energy_values(v, prob.kind, prob.t1) for i, v in enumerate(vals))
    loss = w2sq + prob.weight * energy
    ok = sol.status == MomentStatus.OK
    nan = jnp.asarray(jnp.nan, loss.dtype)
    return jnp.where(ok, loss, nan), (jnp.where(ok, w2sq, nan), energy, sol.status)


@eqx.filter_jit
def _value_and_grad(raw, prob, opts):
    """``(scalars, grad)``: scalars = [loss, W2², energy, ok] (ok: finite loss and grad)."""
    (v, (w2sq, en, _)), g = jax.value_and_grad(_loss, has_aux=True)(raw, prob, opts)
    ok = jnp.isfinite(v)
    for leaf in jax.tree.leaves(g):
        ok = ok & jnp.all(jnp.isfinite(leaf))
    return jnp.stack([v, w2sq, en, ok.astype(v.dtype)]), g


@eqx.filter_jit
def _adam_step(adam, g, state, raw):
    u, state = adam.update(g, state, raw)
    return optax.apply_updates(raw, u), state


@eqx.filter_jit
def _lbfgs_direction(lb, g, state, raw):
    p, state = lb.update(g, state, raw)
    dirn = jax.tree.map(lambda a: -a, p)
    return dirn, _tree_vdot(g, dirn), state


@eqx.filter_jit
def _axpy(step, x, y):
    return jax.tree.map(lambda a, b: a + step * b, x, y)


@functools.lru_cache(maxsize=32)
def _adam(lr: float):
    # One transformation object per learning rate, so that the jitted step is reused.
    return optax.apply_if_finite(optax.adam(lr), max_consecutive_errors=10**9)


_LBFGS = optax.scale_by_lbfgs(memory_size=10)


def _tree_vdot(a, b):
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@dataclasses.dataclass(frozen=True)
class ReachResult:
    r"""Result of :func:`reach`.

    Attributes:
      controls: ``{"A", "B", "V", "b"}`` → :class:`Control` (fixed ones included).
      w2: Bures W2 at t1 from an independent tight solve (``controlled_moments``: Dopri8,
        rtol 1e-11 in float64) — the number to quote; NaN if that solve failed.
      w2_optimizer: W2 at the optimiser's own solve (its tolerances).
      w2_mean, w2_cov: ``|m(t1) − m1|`` and the Bures distance of the covariances alone.
      converged: ``w2 < tol``. energy: ``∫ Σ_{free u} ‖u‖_F² dt``.
      loss_history, w2_history: per optimiser iteration (NaN for rejected trials).
      status: :class:`MomentStatus` code of the verification solve.
      certificate: the :class:`Certificate` (None if not computed).
      rank: numerical rank of S0 and S1. free, bound, energy_weight: the mode's settings.
      iterations: optimiser iterations; evaluations: loss evaluations; rejected: trials
        whose solve failed (blow-up / non-finite / step budget), rejected and retreated.
      seconds: wall time of the optimisation (compilation included). message: a summary.
    """

    controls: dict
    w2: float
    w2_optimizer: float
    w2_mean: float
    w2_cov: float
    converged: bool
    energy: float
    loss_history: np.ndarray
    w2_history: np.ndarray
    status: int
    certificate: Optional[Certificate]
    rank: int
    free: tuple
    bound: Optional[dict]
    energy_weight: float
    energy_weight_final: float
    iterations: int
    evaluations: int
    rejected: int
    seconds: float
    message: str


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
          energy_continuation: bool = True, max_energy_stages: int = 6,
          energy_stage_steps: int = 100,
          rank_rtol: Optional[float] = None, with_certificate: bool = True,
          verify: bool = True, callback=None) -> ReachResult:
    r"""Optimise time-varying controls that steer ``N(m0, S0)`` to ``N(m1, S1)`` at ``t1``.

    Minimises ``W2²(N(m(t1), Σ(t1)), N(m1, S1)) + λ ∫ Σ_{free u} ‖u‖_F² dt`` over the free
    controls (moment ODE of MATH.md §B, gradients through :func:`solve_moments`).

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
      rtol, atol, solver, max_steps: the optimiser's solve (defaults 1e-9/1e-11 in
        float64, 1e-5/1e-7 in float32; ``Tsit5``). The result is then re-checked by an
        independent Dopri8 solve at rtol 1e-11 (``verify``).
      rank_rtol: numerical-rank cut (default sqrt(eps)). with_certificate: compute the
        :class:`Certificate` (A free or not) and return it.
      callback: ``callback(iteration, loss, w2)`` on the host after each iteration.

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
    solver = diffrax.Tsit5() if solver is None else solver

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
    raw = {k: jnp.asarray(_unsquash(start[k], bounds[k]), dtype) for k in CONTROL_NAMES}

    prob = _Problem(m0=m0, S0=S0, m1=m1, S1=S1, t1=jnp.asarray(t1, dtype),
                    mask=jnp.asarray([1.0 if k in free else 0.0 for k in CONTROL_NAMES], dtype),
                    fixed=tuple(jnp.asarray(fixed_vals[k], dtype) for k in CONTROL_NAMES),
                    bound=jnp.asarray([bounds[k] for k in CONTROL_NAMES], dtype),
                    weight=jnp.asarray(energy_weight, dtype), kind=kind)
    opts = _Opts(rtol=float(rtol), atol=float(atol), max_steps=int(max_steps), solver=solver)
    lam = float(energy_weight)
    stop_w2 = stop_factor * tol

    losses, w2s = [], []
    counters = {"evals": 0, "rejected": 0}

    def evaluate(x):
        sc, g = _value_and_grad(x, prob, opts)
        v, w2sq, en, ok = (float(a) for a in np.asarray(sc))
        counters["evals"] += 1
        ok = bool(ok)
        if not ok:
            counters["rejected"] += 1
        return ok, v, w2sq, en, g

    def record(v, w2sq, it):
        w2 = math.sqrt(max(w2sq, 0.0)) if math.isfinite(w2sq) else math.nan
        losses.append(v)
        w2s.append(w2)
        if callback is not None:
            callback(it, v, w2)
        return w2

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
            raw, ast = _adam_step(adam, g, ast, raw)
            ok, v2, w2sq2, en2, g2 = evaluate(raw)
            it += 1
            if not ok:
                # rejected trial: its NaN gradient never reaches the optimiser state; the
                # iterate retreats halfway towards the last finite point.
                raw = _axpy(jnp.asarray(0.5, dtype), last_good, jax.tree.map(jnp.subtract, raw, last_good))
                ok, v2, w2sq2, en2, g2 = evaluate(raw)
                if not ok:
                    raw = last_good
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

    # ---- L-BFGS phase (optax.scale_by_lbfgs directions, host Armijo backtracking) --------
    # With λ > 0 and energy_continuation, λ is divided by 10 after each converged stage
    # until the target is reached (a penalty continuation towards minimum-energy reaching).
    lam_now = lam
    stages = 0
    while not done and lbfgs_steps > 0:
        lst = _LBFGS.init(raw)
        stall = 0
        n_iter = lbfgs_steps if lam_now == 0 or not energy_continuation else energy_stage_steps
        for _ in range(n_iter):
            dirn, slope, lst_new = _lbfgs_direction(_LBFGS, g, lst, raw)
            slope = float(slope)
            if not slope < 0:  # not a descent direction: restart the memory, steepest descent
                dirn, slope, lst_new = _lbfgs_direction(_LBFGS, g, _LBFGS.init(raw), raw)
                slope = float(slope)
            lst = lst_new
            step, accepted = 1.0, False
            for _ls in range(30):
                trial = _axpy(jnp.asarray(step, dtype), raw, dirn)
                ok, v2, w2sq2, en2, g2 = evaluate(trial)
                if ok and v2 <= v + 1e-4 * step * slope:
                    accepted = True
                    break
                step *= 0.5
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

    vals = _physical(raw, prob)
    controls = {k: Control(v_, t1, kind) for k, v_ in zip(CONTROL_NAMES, vals)}
    energy = en
    w2_opt = math.sqrt(max(w2sq, 0.0)) if math.isfinite(w2sq) else math.nan
    if verify:
        sol = controlled_moments(controls, m0, S0, t1=t1)
        status = int(sol.status)
        if status == MomentStatus.OK:
            w2 = float(jnp.sqrt(bures_w2_squared(sol.mean_final, sol.cov_final, m1, S1)))
            w2_mean = float(jnp.linalg.norm(sol.mean_final - m1))
            w2_cov = float(jnp.sqrt(bures_w2_squared(jnp.zeros_like(m1), sol.cov_final,
                                                     jnp.zeros_like(m1), S1)))
        else:
            w2 = w2_mean = w2_cov = math.nan
    else:
        status, w2, w2_mean, w2_cov = int(MomentStatus.OK), w2_opt, math.nan, math.nan
    converged = bool(math.isfinite(w2) and w2 < tol)
    if status != MomentStatus.OK:
        message += (f"; the verification solve of the final controls ended with status "
                    f"{status_name(status)} (W2 reported as NaN)")
    message += (f"; W2 = {w2:.3e} ({'reached' if converged else 'not reached'}, tol {tol:g}) "
                f"after {it} iterations, {counters['evals']} solves, {counters['rejected']} "
                f"rejected")
    if cert_msg:
        message += f"; {cert_msg}"
    return ReachResult(
        controls=controls, w2=w2, w2_optimizer=w2_opt, w2_mean=w2_mean, w2_cov=w2_cov,
        converged=converged, energy=float(energy), loss_history=np.asarray(losses),
        w2_history=np.asarray(w2s), status=status, certificate=cert, rank=rank, free=free,
        bound=None if bound is None else {k: c for k, c in bounds.items() if k in free},
        energy_weight=lam, energy_weight_final=lam_now, iterations=it, evaluations=counters["evals"],
        rejected=counters["rejected"], seconds=time.perf_counter() - t_start, message=message)


# ---------------------------------------------------------------------------------------
# Transfer to particles and to a discrete transformer
# ---------------------------------------------------------------------------------------


def _at(p, t):
    return p(t) if isinstance(p, Control) else p


class ControlledEuclideanAttention(AbstractParticleModel):
    r"""Particle field of Paper B with time-varying controls:

        ẋ_i = A(t) x_i + b(t) + V(t) Σ_j w_ij x_j,   w_ij = exp(x_jᵀ B(t) x_i) / Σ_k exp(x_kᵀ B(t) x_i)

    ``A, B, V``: (d, d) arrays or :class:`Control`; ``b``: (d,) array, Control or None (0).
    ``x``: (N, d). For a Gaussian cloud its moments follow the moment ODE of
    :func:`solve_moments` with the same controls (up to Monte-Carlo error).
    ``at(t)`` freezes the controls into an :class:`EuclideanAttention`.
    """

    A: Union[jax.Array, Control]
    B: Union[jax.Array, Control]
    V: Union[jax.Array, Control]
    b: Union[jax.Array, Control]
    kernel: str = eqx.field(static=True, default="auto")

    def __init__(self, A, B, V, b=None, *, kernel: str = "auto"):
        def shape_of(name, p):
            if isinstance(p, Control):
                return p, tuple(p.shape)
            p = jnp.asarray(p)
            return p, tuple(p.shape)

        A, sA = shape_of("A", A)
        if len(sA) != 2 or sA[0] != sA[1]:
            raise ValueError(f"A must be a (d, d) array or a Control with (n, d, d) values, got "
                             f"shape {sA}")
        d = sA[0]
        dt = A.dtype if not isinstance(A, Control) else A.values.dtype
        B, sB = shape_of("B", B)
        V, sV = shape_of("V", V)
        for name, s in (("B", sB), ("V", sV)):
            if s != (d, d):
                raise ValueError(f"{name} must have shape ({d}, {d}) (or be a Control with values "
                                 f"(n, {d}, {d})), got {s}")
        if b is None:
            b = jnp.zeros((d,), dt)
        b, sb = shape_of("b", b)
        if sb != (d,):
            raise ValueError(f"b must have shape ({d},) (or be a Control with values (n, {d})), got {sb}")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        self.A, self.B, self.V, self.b = A, B, V, b
        self.kernel = kernel

    @classmethod
    def from_controls(cls, controls: Mapping, *, kernel: str = "auto"):
        """From ``{"A", "B", "V", "b"}`` (e.g. ``ReachResult.controls``)."""
        return cls(controls["A"], controls["B"], controls["V"], controls.get("b"), kernel=kernel)

    @property
    def dim(self) -> int:
        return (self.A.shape if isinstance(self.A, Control) else self.A.shape)[0]

    def params(self, t):
        return _at(self.A, t), _at(self.B, t), _at(self.V, t), _at(self.b, t)

    def at(self, t) -> EuclideanAttention:
        """The frozen field at time t (an :class:`EuclideanAttention`)."""
        A, B, V, b = self.params(t)
        return EuclideanAttention(A, B, V, b, kernel=self.kernel)

    def __call__(self, t, x, args=None):
        A, B, V, b = self.params(t)
        # logits_ij = x_jᵀ B x_i = x_iᵀ Bᵀ x_j  →  interaction with bilinear form Bᵀ, β = 1.
        m = interaction(x, x, B.T, 1.0, kernel=self.kernel)
        return (jnp.matmul(x, A.T, precision=HIGHEST) + b + jnp.matmul(m, V.T, precision=HIGHEST))


def _piece_info(model):
    """(piecewise?, n_pieces, t1) of a model's Controls (all must share the grid)."""
    ctrls = [p for p in (model.A, model.B, model.V, model.b) if isinstance(p, Control)]
    if not ctrls:
        return False, 1, None
    kinds = {c.kind for c in ctrls}
    ns = {(c.kind, c.n) for c in ctrls}
    if len(kinds) != 1 or len(ns) != 1:
        raise ValueError("all Controls of the model must share one grid (same kind and length)")
    c = ctrls[0]
    return c.kind == "piecewise", (c.n if c.kind == "piecewise" else c.n - 1), c.t1


@eqx.filter_jit
def _flow(model, x0, t1, n_intervals, steps_per_interval, piecewise, method):
    integ = INTEGRATORS[method]()
    dtype = x0.dtype
    h = jnp.asarray(t1, dtype) / n_intervals
    dt = h / steps_per_interval

    def interval(x, k):
        t0 = k.astype(dtype) * h
        field = model.at(t0 + 0.5 * h) if piecewise else model

        def step(x, j):
            return integ.step(field, t0 + j.astype(dtype) * dt, x, dt, None), None

        x, _ = jax.lax.scan(step, x, jnp.arange(steps_per_interval))
        return x, x

    x, xs = jax.lax.scan(interval, x0, jnp.arange(n_intervals))
    return jnp.concatenate([x0[None], xs], axis=0)


def transfer_particles(model, x0, *, t1, steps_per_piece: int = 16, method: str = "rk4"):
    r"""Integrate the particle system ``model`` (a :class:`ControlledEuclideanAttention`, or a
    controls mapping) from ``x0`` (N, d) on ``[0, t1]``.

    Piecewise-constant controls are integrated piece by piece with the controls frozen
    (no step straddles a jump); linear controls with the time-dependent field. Fixed-step
    ``method`` (``"rk4"`` or ``"euler"``), ``steps_per_piece`` steps in each piece.

    Returns: (n_pieces + 1, N, d) — the cloud at ``t = k t1 / n_pieces``.
    """
    if isinstance(model, Mapping):
        model = ControlledEuclideanAttention.from_controls(model)
    if method not in ("rk4", "euler"):
        raise ValueError(f"method must be 'rk4' or 'euler', got {method!r}")
    x0 = jnp.asarray(x0)
    if x0.ndim != 2 or x0.shape[1] != model.dim:
        raise ValueError(f"x0 must have shape (N, {model.dim}), got {x0.shape}")
    if int(steps_per_piece) < 1:
        raise ValueError(f"steps_per_piece must be >= 1, got {steps_per_piece}")
    piecewise, n, _ = _piece_info(model)
    return _flow(model, x0, float(t1), int(n), int(steps_per_piece), bool(piecewise), method)


@eqx.filter_jit
def _layers(model, x0, t1, n_layers):
    dtype = x0.dtype
    h = jnp.asarray(t1, dtype) / n_layers

    def layer(x, l):
        tl = l.astype(dtype) * h
        field = model.at(tl + 0.5 * h)
        return x + h * field(tl, x, None), None

    x, _ = jax.lax.scan(layer, x0, jnp.arange(n_layers))
    return x


def transformer_layers(model, x0, *, t1, n_layers: int):
    r"""The L-layer transformer: ``x_{l+1} = x_l + (t1/L) f_l(x_l)``, ``l = 0 … L−1`` (one
    explicit Euler step a layer), where layer l uses the controls at the midpoint of its
    interval ``[l t1/L, (l+1) t1/L]`` — for piecewise-constant controls and L a multiple
    of n_pieces, exactly the piece the layer lies in. Returns the final cloud (N, d).
    """
    if isinstance(model, Mapping):
        model = ControlledEuclideanAttention.from_controls(model)
    if int(n_layers) < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    x0 = jnp.asarray(x0)
    if x0.ndim != 2 or x0.shape[1] != model.dim:
        raise ValueError(f"x0 must have shape (N, {model.dim}), got {x0.shape}")
    return _layers(model, x0, float(t1), int(n_layers))


def _gaussian_sample(rng, m, S, n):
    R = np.asarray(sqrtm_psd(jnp.asarray(S)), np.float64)
    return np.asarray(m, np.float64) + rng.standard_normal((n, len(m))) @ R


def gaussian_cloud(seed, m, S, n: int, *, exact_moments: bool = False, dtype=np.float64):
    r"""n points ``x_i = m + S^{1/2} z_i`` with ``z_i`` i.i.d. N(0, I) (numpy, seeded).

    ``exact_moments=True`` first whitens the z (``z ← (z − z̄) Ĉ_z^{-1/2}``, needs n > d), so
    that the cloud's empirical mean and covariance (1/n) are exactly m and S: a start whose
    only remaining error is in the shape of the law, which isolates the error the finite-N
    dynamics add in a transfer study.
    """
    m = np.asarray(m, np.float64)
    d = m.shape[0]
    z = np.random.default_rng(seed).standard_normal((int(n), d))
    if exact_moments:
        if n <= d:
            raise ValueError(f"exact_moments needs n > d, got n = {n}, d = {d}")
        z = z - z.mean(axis=0)
        w, u = np.linalg.eigh(z.T @ z / n)
        z = z @ (u / np.sqrt(w)) @ u.T
    R = np.asarray(sqrtm_psd(jnp.asarray(np.asarray(S, np.float64))), np.float64)
    return (m + z @ R).astype(dtype)


def cloud_w2_to_gaussian(x, m1, S1, *, seed: int = 0, exact: bool = True,
                         exact_max: int = 2000) -> dict:
    r"""Distance of a particle cloud ``x`` (N, d) to the Gaussian ``N(m1, S1)``.

    Returns a dict:

    * ``bures``: Bures W2 between ``N(x̄, Ĉ)`` (empirical mean and covariance, 1/N) and the
      target. It compares moments only (0 for any cloud with the target's moments) and
      its Monte-Carlo error decays like ``N^{-1/2}``.
    * ``exact``: W2 by optimal assignment between ``x`` and N i.i.d. samples of the target
      (:func:`jaxdyn._distances.w2_exact`), for ``N ≤ exact_max``; it contains sampling noise.
    * ``floor``: the same between two independent N-samples of the target — the value
      ``exact`` would take for a perfect cloud (it decays slowly, like ``N^{-1/d}`` for d ≥ 3).

    ``exact`` and ``floor`` are NaN when skipped.
    """
    x = np.asarray(x, np.float64)
    m1 = np.asarray(m1, np.float64)
    S1 = np.asarray(S1, np.float64)
    if x.ndim != 2 or x.shape[1] != m1.shape[0]:
        raise ValueError(f"x must have shape (N, {m1.shape[0]}), got {x.shape}")
    n = x.shape[0]
    xbar = x.mean(axis=0)
    C = (x - xbar).T @ (x - xbar) / n
    out = {"bures": float(np.sqrt(max(float(bures_w2_squared(jnp.asarray(xbar), jnp.asarray(C),
                                                               jnp.asarray(m1), jnp.asarray(S1))),
                                      0.0))),
           "exact": math.nan, "floor": math.nan, "n": n}
    if exact and n <= exact_max and np.all(np.isfinite(x)):
        rng = np.random.default_rng([int(seed), 0x7A3C])  # a stream of its own
        y = _gaussian_sample(rng, m1, S1, n)
        y2 = _gaussian_sample(rng, m1, S1, n)
        out["exact"] = w2_exact(x, y)
        out["floor"] = w2_exact(y2, y)
    return out
