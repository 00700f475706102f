r"""Closed-form predictions for the Gaussian closure and its particle systems (Paper B).

* :func:`vi_closed_form`: ``Σ(t) = P(t)⁻¹`` for ``V = v I`` with ``P' = −PA − AᵀP − v(B + Bᵀ)``
  (Van Loan, :func:`vi_precision`) and the blow-up time, the first zero of ``λmin P``;
* :func:`lyapunov_limit`: the attracting equilibrium when it exists;
* :func:`phase_theory`: blow-up time and ``tr Σ(t1)`` over an (a, c) grid, ``A = aI, B = cI``;
* :func:`relu_initial_rates`: exact initial moment rates of the ReLU field on N(m0, S0);
* :func:`tilt_index`, :func:`predicted_exponent`: the convergence rate of the particles'
  moments to the closure.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_dtype, check_host
from ..distances import sqrtm_psd
from ._closed import (lyapunov_equilibrium, scalar_blowup_time, scalar_variance,
                      vi_blowup_time, vi_precision)

__all__ = ["scalar_v", "vi_closed_form", "lyapunov_limit", "phase_theory", "relu_initial_rates",
           "tilt_index", "predicted_exponent"]


def scalar_v(V):
    """The scalar v if ``V = v I`` exactly (the closed-form case), else None.

    Args:
        V: (d, d).

    Returns:
        v as a Python float, or None.
    """
    V = np.asarray(V, np.float64)
    v = float(V[0, 0])
    return v if np.array_equal(V, v * np.eye(V.shape[0])) else None


_BLOCK = 64


@eqx.filter_jit
def _precision_block(ts, P0, A, B, v):
    """``(P(t), λmin P(t))`` over a block of times (one program a block size)."""
    P = jax.vmap(lambda t: vi_precision(t, P0, A, B, v))(ts)
    return P, jnp.linalg.eigvalsh(P)[..., 0]


def _precision_lmin(ts, P0, A, B, v):
    """``(P(t), λmin P(t))`` over ts for V = vI (Van Loan closed form, ``vi_precision``).

    Evaluated in blocks of a fixed size (one compilation).

    Returns:
        ``(P (S, d, d), λmin (S,))`` as NumPy arrays.
    """
    ts = np.asarray(ts, np.float64)
    n = ts.size
    pad = np.concatenate([ts, np.full((-n) % _BLOCK, ts[-1])])
    # v an array of P0's dtype: one program for every v (a Python float would be baked in)
    v = np.asarray(v, dtype=getattr(P0, "dtype", np.float64))
    outs = [_precision_block(jnp.asarray(pad[i:i + _BLOCK]), P0, A, B, v)
            for i in range(0, pad.size, _BLOCK)]
    P = np.concatenate([np.asarray(o[0]) for o in outs])[:n]
    lm = np.concatenate([np.asarray(o[1]) for o in outs])[:n]
    return P, lm


def _first_zero(P0, A, B, v, t_max, n_grid=511, n_sub=_BLOCK, rounds=12):
    """The first zero of λmin P(t) on (0, t_max].

    A grid scan, then repeated sub-grids (one compiled shape each), to float64 resolution.

    Returns:
        T* as a Python float; inf if λmin stays > 0.
    """
    ts = np.linspace(0.0, t_max, n_grid + 1)
    _, lm = _precision_lmin(ts, P0, A, B, v)
    hit = np.flatnonzero(lm <= 0)
    if not hit.size:
        return math.inf
    lo, hi = float(ts[hit[0] - 1]), float(ts[hit[0]])
    for _ in range(rounds):
        sub = np.linspace(lo, hi, n_sub)
        _, lm = _precision_lmin(sub, P0, A, B, v)
        k = int(np.flatnonzero(lm <= 0)[0])
        lo, hi = float(sub[k - 1]), float(sub[k])
        if hi - lo <= 4 * np.finfo(np.float64).eps * hi:
            break
    return 0.5 * (lo + hi)


def vi_closed_form(ts, S0, A, B, v):
    """Closed form of the closure's covariance when ``V = v I`` (docs/math.md §B.4.2).

    ``Σ(t) = P(t)⁻¹``, ``P' = −PA − AᵀP − v(B + Bᵀ)``, ``P(0) = S0⁻¹`` (S0 invertible). T* is
    ``vi_blowup_time`` (A = 0) or the first zero of ``λmin P(t)`` on [0, ts[-1]].

    Args:
        ts: (S,) times.
        S0: (d, d) invertible initial covariance.
        A: (d, d).
        B: (d, d).
        v: the scalar of V = v I.

    Returns:
        ``(cov (S, d, d) with NaN from the blow-up on, T*)``, float64 NumPy.

    Raises:
        ValueError: S0 is not invertible.
    """
    S0 = np.asarray(S0, np.float64)
    A, B = np.asarray(A, np.float64), np.asarray(B, np.float64)
    if np.linalg.eigvalsh(S0)[0] <= 0:
        raise ValueError("vi_closed_form needs an invertible S0")
    with jax.enable_x64(True):
        args = (jnp.asarray(np.linalg.inv(S0)), jnp.asarray(A), jnp.asarray(B),
                jnp.asarray(v, jnp.float64))
        Ps, _ = _precision_lmin(ts, *args)
        if not np.any(A):
            Tstar = float(vi_blowup_time(jnp.asarray(S0), jnp.asarray(B), v))
        else:
            Tstar = _first_zero(*args, float(np.asarray(ts)[-1]))
    cov = np.full(Ps.shape, np.nan)
    ok = np.asarray(ts) < Tstar
    cov[ok] = np.linalg.inv(Ps[ok])
    return 0.5 * (cov + np.swapaxes(cov, -1, -2)), Tstar


def lyapunov_limit(A, B, V):
    """The attracting equilibrium ``Σ* = P*⁻¹``, ``AᵀP* + P*A = −v(B + Bᵀ)`` (docs/math.md §B.4.3).

    It exists when ``V = v I``, spec(A) ⊂ {Re > 0} and ``v(B + Bᵀ) ≺ 0``.

    Args:
        A: (d, d).
        B: (d, d).
        V: (d, d).

    Returns:
        (d, d) Σ* as float64 NumPy, or None.
    """
    v = scalar_v(V)
    A, B = np.asarray(A, np.float64), np.asarray(B, np.float64)
    if v is None or np.linalg.eigvals(A).real.min() <= 0 or np.linalg.eigvalsh(v * (B + B.T))[-1] >= 0:
        return None
    with jax.enable_x64(True):
        S, _ = lyapunov_equilibrium(jnp.asarray(A), jnp.asarray(B), v)
    return np.asarray(S, np.float64)


def phase_theory(S0, a, c, v, t1):
    """Closed-form blow-up time ``T*(a, c)`` and ``tr Σ(t1)`` for ``A = aI, B = cI, V = vI``.

    On the meshgrid of a × c (float64): each eigenvalue σ of Σ follows
    ``σ' = 2aσ + 2vcσ²``.

    Args:
        S0: (d, d) initial covariance.
        a: (na,) values of a.
        c: (nc,) values of c.
        v: the scalar of V = v I.
        t1: final time.

    Returns:
        ``(T* (na, nc), tr Σ(t1) (na, nc))``; the trace is inf at and after a blow-up.
    """
    aa, cc = np.meshgrid(a, c, indexing="ij")
    sig = np.linalg.eigvalsh(np.asarray(S0, np.float64))
    with jax.enable_x64(True):
        T = np.asarray(scalar_blowup_time(sig[-1], aa, v * cc), np.float64)
        tr = sum(np.asarray(scalar_variance(float(t1), s, aa, v * cc), np.float64)
                 for s in sig if s > 0)
    return T, np.where(T > t1, tr, np.inf)


def relu_initial_rates(A, B, V, b, m0, S0):
    """Exact initial rates of the *mean-field* moments under the ReLU field on N(m0, S0).

        ṁ = A E[relu(x)] + b + (V + V Σ0 B) m0,   E[relu(x_l)] = μ Φ(μ/s) + s φ(μ/s),
        Σ̇ = A D Σ0 + Σ0 D Aᵀ + V Σ0 B Σ0 + Σ0 Bᵀ Σ0 Vᵀ,   D = diag(P(x_l > 0)) = diag(Φ(μ/s)),

    (μ = m0_l, s² = Σ0_ll; Stein's lemma ``Cov(x, g(x)) = Σ E[∇g]ᵀ``; the attention part is
    that of the identity closure since the tilted mean of a Gaussian is ``m + ΣBx``).

    Args:
        A: (d, d).
        B: (d, d).
        V: (d, d).
        b: (d,).
        m0: (d,) mean.
        S0: (d, d) covariance.

    Returns:
        ``(ṁ, Σ̇)`` as float64 NumPy.
    """
    from scipy.stats import norm

    A, B, V, b, m, S = (np.asarray(x, np.float64) for x in (A, B, V, b, m0, S0))
    s = np.sqrt(np.clip(np.diag(S), 0.0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(s > 0, m / np.where(s > 0, s, 1.0), np.sign(m) * np.inf)
    Phi = norm.cdf(u)
    Phi = np.where((s == 0) & (m == 0), 0.5, Phi)
    er = np.where(s > 0, m * Phi + s * norm.pdf(np.where(np.isfinite(u), u, 0.0)), np.maximum(m, 0))
    D = np.diag(Phi)
    dm = A @ er + b + (V + V @ S @ B) @ m
    G = A @ D @ S + V @ S @ B @ S
    return dm, G + G.T


_sqrtm_psd_jit = eqx.filter_jit(sqrtm_psd)


def tilt_index(S, B):
    """The tilt index ``s = ‖Σ^{1/2} B Σ^{1/2}‖₂`` per frame; NaN where Σ is not finite.

    A heuristic, checked numerically in ``tests/test_gaussian_particles.py``: each particle's
    attention output is a self-normalised importance-sampling average over the keys with
    weights ``exp(yᵀBx)``. On ``N(m, Σ)`` the influence of one key y on the particle average
    is ``ψ(y) ∝ exp(½ ỹᵀ K(I + KᵀK)⁻¹Kᵀ ỹ)`` (whitened ỹ, ``K = Σ^{1/2}BΣ^{1/2}``), whose tail
    index is ``α = (1 + s²)/s²``. For s < 1 it has finite variance and the moments converge
    at the Monte-Carlo rate N^{-1/2}; for s > 1 its sum fluctuates like N^{1/α}, so the error
    decays only like ``N^{-1/(1+s²)}``. The predicted exponent of the moment error at time t
    is ``−min(1/2, 1/(1 + max_{τ≤t} s(τ)²))`` (:func:`predicted_exponent`).

    Args:
        S: (..., d, d) covariances.
        B: (d, d).

    Host-only: traced inputs are refused with a TypeError naming ``tilt_index``.

    Dtypes: float32 or float64, float16 or bfloat16, integers (all read in float64 on the
    host); complex is refused (a TypeError naming the parameter).

    Returns:
        (...) s, float64 NumPy; NaN where Σ or B is not finite.
    """
    check_host("tilt_index", S=S, B=B)
    for name, a in (("S", S), ("B", B)):
        check_dtype(name, a, half=True, fn="tilt_index")
    S = np.asarray(np.asarray(S).astype(np.float64))
    B = np.asarray(np.asarray(B).astype(np.float64))
    ok = np.all(np.isfinite(S), axis=(-2, -1)) & np.all(np.isfinite(B))
    B = np.where(np.isfinite(B), B, 0.0)
    Sf = np.where(ok[..., None, None], S, np.eye(S.shape[-1]))
    with jax.enable_x64(True):  # one program (op by op: a dozen small ones)
        R = np.asarray(_sqrtm_psd_jit(Sf), np.float64)
    s = np.linalg.norm(R @ B @ R, ord=2, axis=(-2, -1))
    return np.where(ok, s, np.nan)


def predicted_exponent(tilt):
    """``−min(1/2, 1/(1 + max_{τ≤t} s(τ)²))`` along a tilt-index curve.

    Args:
        tilt: (S,) tilt indices over time (:func:`tilt_index`).

    Returns:
        (S,) exponents; NaN once s is NaN.
    """
    smax = np.maximum.accumulate(np.where(np.isfinite(tilt), tilt, np.inf))
    out = -np.minimum(0.5, 1.0 / (1.0 + smax ** 2))
    return np.where(np.isfinite(tilt), out, np.nan)
