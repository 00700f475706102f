"""The constructive reachability certificate of Paper B (V = B = 0, A from the Monge map)."""

from __future__ import annotations

import functools
import math
from typing import Optional

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ..distances import bures_w2_squared, sqrtm_psd
from .._results import RESULTS, Solution, from_codes, status_code
from ..gaussian._solve import Control
from ._problem import _check_problem, _ranks, controlled_moments


# ---------------------------------------------------------------------------------------
# Certificate
# ---------------------------------------------------------------------------------------


class Certificate(Solution):
    r"""The constructive solution (V = B = 0): ``A`` piecewise constant, ``b`` constant.

    A :class:`jaxdyn.Solution` pytree (every leaf an array; the construction static).

    Attributes:
        A: :class:`Control` (n_pieces, d, d).
        b: :class:`Control` (n_pieces, d).
        G: (d, d) ``Φ(t1)``, with ``G Σ0 Gᵀ = Σ1`` (on the kept ranges).
        dropped: the largest eigenvalue (of Σ0 or Σ1) treated as zero, relative to its
            λ_max (0 if none).
        residual: ``‖G Σ0 Gᵀ − Σ1‖_F / max(‖Σ1‖_F, tiny)`` (algebraic, with the full Σ0, Σ1).
        mean_residual: ``|G m0 + J b − m1|`` (algebraic).
        energy: ``∫_0^{t1} (‖A‖_F² + |b|²) dt``.
        w2: Bures W2 at t1 of the moment ODE solved with these controls
            (``solve_moments``), None when not verified.
        result: :class:`jaxdyn.RESULTS`: that solve's status (``successful`` when not
            verified).
        stats: empty.
        construction: ``"monge"`` (full rank, one phase, A symmetric) or ``"polar"`` (rank
            ``r < d``: two phases, ``log P`` then ``log R``) (static).
        rank: the numerical rank used (static).
        rank_rtol: its relative cut (static).
    """

    A: Control
    b: Control
    G: Array
    dropped: Array
    residual: Array
    mean_residual: Array
    energy: Array
    w2: Optional[Array]
    result: RESULTS
    stats: dict
    construction: str = eqx.field(static=True)
    rank: int = eqx.field(static=True)
    rank_rtol: float = eqx.field(static=True)

    def controls(self, dtype=None) -> dict:
        """The controls of the certificate.

        Args:
            dtype: the dtype of the values (default: the certificate's).

        Returns:
            ``{"A", "B", "V", "b"}`` as Controls (B = V = 0) on this certificate's grid.
        """
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
    r"""Real skew-symmetric ``K`` with ``expm(K) = R`` for ``R ∈ SO(d)`` (real Schur form).

    2×2 blocks give angles; eigenvalues −1 come in pairs, rotated by π.

    Args:
        R: (d, d) rotation.

    Returns:
        ``K``, (d, d) skew-symmetric.

    Raises:
        ValueError: an odd number of eigenvalues −1 (not a rotation).
    """
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


def _monge_phases(S0h, S1h, u0, w0):
    """Full rank: ``[log T]``, T the Monge map of N(·, S0) to N(·, S1) (float64, host).

    Returns:
        The one phase's ``log T``, (d, d).

    Raises:
        ValueError: a Monge map that is not positive definite (internal).
    """
    # T(a Σ0, b Σ1) = sqrt(b/a) T(Σ0, Σ1): T is built from Σ0/a and Σ1/b of largest entries
    # of order 1 and log T = log T(Σ0/a, Σ1/b) + ½ log(b/a) I. Unscaled, Σ0^{1/2} Σ1 Σ0^{1/2}
    # underflowed for a subnormal (or 1e-300) Σ0, so that T read 0 where it is 1e161.
    a = float(w0[0])
    b = float(np.max(np.abs(S1h)))
    # Σ0^{1/2} by sqrtm_psd; its inverse from Σ0's eigenpairs (all kept: full rank).
    R0 = np.asarray(sqrtm_psd(jnp.asarray(S0h / a)), np.float64)
    R0i = (u0 / np.sqrt(w0 / a)) @ u0.T
    C = np.asarray(sqrtm_psd(jnp.asarray(R0 @ (S1h / b) @ R0)), np.float64)
    T = R0i @ C @ R0i
    T = 0.5 * (T + T.T)
    mu, v = np.linalg.eigh(T)
    if mu[0] <= 0:  # pragma: no cover - T is SPD for full-rank Σ0, Σ1
        raise ValueError(f"internal: Monge map not positive definite (min eigenvalue {mu[0]:.3e})")
    shift = 0.5 * (math.log(b) - math.log(a))
    return [(v * np.log(mu)) @ v.T + shift * np.eye(len(mu))]


def _polar_phases(u0, w0, u1, w1, r):
    """Rank r < d: ``[log P, log R]`` of the polar factors of ``G = R P`` (module doc).

    Returns:
        The two phases' logarithms, each (d, d).
    """
    L1 = u1[:, :r] * np.sqrt(w1[:r])
    L0p = (u0[:, :r] / np.sqrt(w0[:r])).T
    W0, W1 = u0[:, r:], u1[:, r:].copy()
    G = L1 @ L0p + W1 @ W0.T
    if np.linalg.det(G) < 0:
        W1[:, 0] *= -1.0
        G = L1 @ L0p + W1 @ W0.T
    us, s, vt = np.linalg.svd(G)
    logP = (vt.T * np.log(s)) @ vt
    return [0.5 * (logP + logP.T), _rotation_log(us @ vt)]


def _offset(phases, h, n, m0h, m1h):
    """The flow map Φ(t1) of the phases and the constant offset b with ``m(t1) = m1``.

    ``Φ(t1) = exp(X_last) … exp(X_first)`` (``X_k`` the log factor of phase k, each of
    length h), ``J = ∫ Φ(t1) Φ(s)^{-1} ds``, ``b = J^{-1}(m1 − Φ m0)``.

    Returns:
        ``(Φ(t1), b on the n pieces (n, d), the mean's residual)``.
    """
    d = m0h.shape[0]
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
    return Phi, bvals, mean_res


def _verify(A_c, bvals, m0, S0, m1, S1, t1, dtype, rtol, atol):
    """The certificate's check solve and its Bures W2 at t1.

    With V = B = 0 the moment ODE is linear, so the problem divided by sigma (means, b) and
    sigma^2 (covariances), sigma a power of two that brings the smaller of S0 and S1 to unit
    size, is solved exactly as the original one scaled: the absolute tolerance means the same
    at any scale (a 1e-300 covariance is not below it). The blow-up threshold is the solve's
    default (1e6) where the growth asked for is below 1e5 (the program ``reach`` compiles),
    the largest the dtype resolves otherwise (``1e-3 / eps``; a linear ODE has no blow-up).

    Returns:
        ``(w2, status)``: W2 in the caller's units (NaN unless the solve succeeded; a growth
        beyond the dtype's reach stops it with status ``large``) and the solve's status code.
    """
    sizes = [float(np.max(np.abs(S))) for S in (S0, S1)]
    sizes = [x for x in sizes if x > 0 and np.isfinite(x)]
    e = (np.frexp(min(sizes))[1] + 1) // 2 if sizes else 0  # sigma = 2^e, sigma^2 ~ min size
    growth = max(sizes) / min(sizes) if sizes else 1.0
    m0, m1, b = (np.ldexp(a, -e) for a in (m0, m1, bvals))
    S0, S1 = (np.ldexp(a, -2 * e) for a in (S0, S1))
    zeros = Control(jnp.zeros_like(A_c.values), t1)
    ctr = {"A": A_c, "B": zeros, "V": zeros, "b": Control(jnp.asarray(b, dtype), t1)}
    sol = controlled_moments(ctr, jnp.asarray(m0, dtype), jnp.asarray(S0, dtype), t1=t1,
                             rtol=rtol, atol=atol,
                             blowup_threshold=1e6 if growth <= 1e5 else 1e300)  # cut to 1e-3/eps
    status = sol.status
    w2 = jnp.asarray(jnp.nan, dtype)
    if int(status) == status_code("successful"):
        w2 = jnp.ldexp(jnp.sqrt(bures_w2_squared(sol.mean_final, sol.cov_final,
                                                 jnp.asarray(m1, dtype), jnp.asarray(S1, dtype))),
                       e)
    return w2, status


def certificate(m0, S0, m1, S1, *, t1=1.0, n_pieces: Optional[int] = None,
                rank_rtol: Optional[float] = None, verify: bool = True,
                rtol: Optional[float] = None, atol: Optional[float] = None) -> Certificate:
    r"""Controls that steer ``N(m0, S0)`` exactly to ``N(m1, S1)`` at ``t1`` (V = B = 0).

    Full rank (Monge): ``T = S0^{-1/2} (S0^{1/2} S1 S0^{1/2})^{1/2} S0^{-1/2}`` (SPD,
    ``T S0 T = S1``), ``A = log(T)/t1`` constant. Same rank ``r < d`` (polar): ``G = R P``
    as in the module doc, ``A = 2 log P / t1`` then ``2 log R / t1``. In both, ``b`` is
    constant with ``m(t1) = G m0 + J b = m1``, ``J = ∫ Φ(t1) Φ(s)^{-1} ds``.

    Built on the host in float64 (square roots by :func:`jaxdyn.distances.sqrtm_psd`, matrix
    logarithms by SciPy), stored in the dtype of S0: concrete inputs only (not under ``jit``).

    Args:
        m0: (d,) initial mean (None = 0).
        S0: (d, d) PSD initial covariance.
        m1: (d,) target mean (None = 0).
        S1: (d, d) PSD target covariance of the numerical rank of S0.
        t1: the final time.
        n_pieces: length of the returned piecewise grids (default 1 for Monge, 2 for polar;
            polar needs an even number).
        rank_rtol: relative eigenvalue cut of the numerical rank (default sqrt(eps)).
            Eigenvalues below it are treated as 0 (regularised square roots); the largest
            one dropped is reported as ``dropped``.
        verify: solve the moment ODE with these controls (``controlled_moments``) and report
            the Bures W2 at t1. The solve runs on the problem rescaled by a power of two that
            brings the smaller of S0 and S1 to unit size (exact: the ODE is linear when
            V = B = 0), so that it is right at any scale; a growth from S0 to S1 beyond what
            the dtype resolves (``1e-3 / eps``: 4.5e12 in float64) is reported as status
            ``large`` with W2 NaN.
        rtol: the verification solve's relative tolerance (default 1e-11 in float64).
        atol: its absolute tolerance, in units of the smaller covariance (default 1e-13 in
            float64).

    Dtypes: S0 float32 or float64 (the certificate's dtype; an integer S0 is refused by name);
    m0, m1, S1 float32, float64 or integers (converted to S0's dtype); float16, bfloat16 and
    complex are refused (a TypeError naming the parameter).

    Returns:
        :class:`Certificate`.

    Raises:
        ValueError: ``t1 <= 0``, an odd ``n_pieces`` for a rank-deficient pair, invalid
            Gaussians, or S1 of another numerical rank than S0.
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
        phases = _monge_phases(S0h, S1h, u0, w0)
    else:
        construction = "polar"
        n = 2 if n_pieces is None else int(n_pieces)
        if n % 2:
            raise ValueError(f"n_pieces must be even for a rank-deficient certificate (two phases: "
                             f"log P then log R), got {n_pieces}")
        phases = _polar_phases(u0, w0, u1, w1, r)
    h = t1 / len(phases)
    per = n // len(phases)
    Phi, bvals, mean_res = _offset(phases, h, n, m0h, m1h)
    cov_res = float(np.linalg.norm(Phi @ S0h @ Phi.T - S1h) / max(np.linalg.norm(S1h), 1e-300))
    Avals = np.concatenate([np.repeat((X / h)[None], per, axis=0) for X in phases], axis=0)
    energy = float(sum(h * np.sum((X / h) ** 2) for X in phases)
                   + (t1 / n) * np.sum(bvals ** 2))
    A_c = Control(jnp.asarray(Avals, dtype), t1)
    b_c = Control(jnp.asarray(bvals, dtype), t1)
    w2, status = None, jnp.asarray(status_code("successful"), jnp.int32)
    if verify:
        w2, status = _verify(A_c, bvals, m0h, S0h, m1h, S1h, t1, dtype, rtol, atol)
    arr = functools.partial(jnp.asarray, dtype=dtype)
    return Certificate(A=A_c, b=b_c, G=arr(Phi), dropped=arr(dropped), residual=arr(cov_res),
                       mean_residual=arr(mean_res), energy=arr(energy), w2=w2,
                       result=from_codes(status), stats={}, construction=construction, rank=r,
                       rank_rtol=rt)
