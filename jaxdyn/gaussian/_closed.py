r"""Closed forms of the Gaussian moment ODE (docs/math.md §B.4), for tests and reference curves.

Scalar case (d = 1, ``a = A``, ``c = V·B``): ``σ' = 2aσ + 2cσ²`` is a Bernoulli equation,

    σ(t) = σ0 e^{2at} / (1 − (cσ0/a)(e^{2at} − 1))      (σ0/(1 − 2cσ0 t) when a = 0),

which blows up iff ``c > 0`` and ``cσ0 > −a`` (always when ``a ≥ 0``), at

    T* = log(1 + a/(cσ0)) / (2a)      (1/(2cσ0) when a = 0).

(docs/math.md §B.4.1; when ``a < 0`` and ``cσ0 ≤ |a|`` there is no blow-up:
σ decays, or stays at the equilibrium ``|a|/c`` when ``cσ0 = |a|``.) If ``c < 0 < a``,
``σ → a/|c|``.

``V = v I``: ``P = Σ⁻¹`` solves the *linear* equation ``P' = −PA − AᵀP − vS``,
``S = B + Bᵀ``. With ``A = 0``, writing ``R = Σ0^{1/2}`` (valid for singular Σ0 too),

    Σ(t) = R (I − t R vS R)⁻¹ R  (= (Σ0⁻¹ − vSt)⁻¹),   T* = 1 / λmax(R vS R)  (inf if ≤ 0).

For general A (Σ0 invertible), ``P(t) = e^{−Aᵀt} P0 e^{−At} − v ∫₀ᵗ e^{−Aᵀs} S e^{−As} ds``
(computed with one matrix exponential, Van Loan's block trick) and T* is the first zero of
``λmin(P(t))``. The equilibrium ``Σ* = P*⁻¹`` with ``AᵀP* + P*A = −vS`` (Lyapunov) is
attracting when spec(A) ⊂ {Re > 0} and ``vS ≺ 0``.

All functions are jnp (jit/vmap friendly) except where noted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import any_nonfinite, check_bounds, check_finite, check_square, nan_where, real_arrays
from ..distances import sqrtm_psd

__all__ = [
    "scalar_variance",
    "scalar_blowup_time",
    "vi_covariance",
    "vi_blowup_time",
    "vi_precision",
    "vi_blowup_time_general",
    "lyapunov_solve",
    "lyapunov_equilibrium",
]

HIGHEST = jax.lax.Precision.HIGHEST


def _mm(x, y):
    return jnp.matmul(x, y, precision=HIGHEST)


def _sym(X):
    """The symmetric part ``(X + Xᵀ)/2`` (removes the rounding asymmetry of a symmetric result)."""
    return 0.5 * (X + X.T)


def square_inputs(fn: str, **mats) -> list:
    """(d, d) matrices of one d >= 1 by the dtype rule (no half precision: eigh and solve).

    Args:
        fn: the function's name, for the messages.
        **mats: the matrices by parameter name (None entries returned as None).

    Returns:
        The matrices in the order given, integers converted to the float dtype of the others.

    Raises:
        ValueError: naming the first matrix that is not square, of another d, or of d = 0.
    """
    d = None
    for name, a in mats.items():
        if a is None:
            continue
        check_square(name, a, d)
        d = np.shape(a)[-1]
        if d < 1:
            raise ValueError(f"{fn}: {name} must be a (d, d) matrix with d >= 1, got shape "
                             f"{tuple(np.shape(a))}")
    return real_arrays(fn=fn, **mats)


def _whitened(S0, B, v):
    """``(R, R vS R)`` with ``R = Σ0^{1/2}`` and ``S = B + Bᵀ`` (the ``V = v I``, ``A = 0`` case)."""
    R = sqrtm_psd(jnp.asarray(S0))
    return R, _mm(_mm(R, v * (B + B.T)), R)


def _expm1_over(a, t):
    """``expm1(2 a t) / a`` with its limit ``2t`` at ``a = 0`` (gradient-safe)."""
    small = jnp.abs(a) * jnp.abs(t) < 1e-6
    a_safe = jnp.where(small, 1.0, a)
    x = 2.0 * a * t
    series = 2.0 * t * (1.0 + x / 2.0 + x * x / 6.0)
    return jnp.where(small, series, jnp.expm1(2.0 * a_safe * t) / a_safe)


def _check_scalar_law(sigma0, a, c, t=None):
    """The host checks of the scalar law's concrete inputs (σ0 ≥ 0; t, a, c finite).

    Returns:
        σ0, NaN where a traced σ0 is negative or not finite, or a traced t, a or c is not
        finite (the results are then NaN).
    """
    check_bounds("sigma0", sigma0, low=0, what=" (the initial variance)")
    for name, v in (("t", t), ("a", a), ("c", c)):
        check_finite(name, v)
    traced = [v for v in (sigma0, t, a, c) if isinstance(v, jax.core.Tracer)]
    if not traced:
        return sigma0
    ok = jnp.asarray(sigma0) >= 0
    for v in (sigma0, t, a, c):
        if isinstance(v, jax.core.Tracer):
            ok = ok & jnp.isfinite(v)
    return jnp.where(ok, sigma0, jnp.nan)


def scalar_variance(t, sigma0, a, c):
    """σ(t) of the scalar law ``σ' = 2aσ + 2cσ²`` (d = 1, a = A, c = V·B).

        σ(t) = σ0 e^{2at} / (1 − (cσ0/a)(e^{2at} − 1))   (σ0/(1 − 2cσ0 t) when a = 0).

    Args:
        t: time(s).
        sigma0: σ(0).
        a: linear rate.
        c: quadratic rate.

    Returns:
        σ(t), broadcast over the inputs; inf at and after the blow-up time.

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses concrete t, a or c that
    are not finite, or a σ0 that is not a finite number >= 0 (a variance). A traced value
    outside the domain gives NaN.
    """
    sigma0 = _check_scalar_law(sigma0, a, c, t=t)
    t, sigma0, a, c = (jnp.asarray(x) for x in (t, sigma0, a, c))
    den = 1.0 - c * sigma0 * _expm1_over(a, t)
    val = sigma0 * jnp.exp(2.0 * a * t) / den
    tstar = scalar_blowup_time(sigma0, a, c)
    return jnp.where(jnp.isnan(sigma0), jnp.nan, jnp.where(t < tstar, val, jnp.inf))


def scalar_blowup_time(sigma0, a, c):
    """Blow-up time of ``σ' = 2aσ + 2cσ²`` from σ0 > 0; inf when there is none.

    ``T* = log(1 + a/(cσ0)) / (2a)`` if ``c > 0`` and ``cσ0 > −a``; ``1/(2cσ0)`` if a = 0.
    Differentiable (the limit a → 0 by its series).

    Args:
        sigma0: σ(0).
        a: linear rate.
        c: quadratic rate.

    Returns:
        T*, broadcast over the inputs.

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses concrete a or c that are
    not finite, or a σ0 that is not a finite number >= 0 (a variance). A traced value outside
    the domain gives NaN.
    """
    sigma0 = _check_scalar_law(sigma0, a, c)
    sigma0, a, c = (jnp.asarray(x) for x in (sigma0, a, c))
    cs = c * sigma0
    blows = (c > 0) & (sigma0 > 0) & (cs > -a)
    cs_safe = jnp.where(blows, cs, 1.0)
    x = a / cs_safe
    small = jnp.abs(x) < 1e-8
    x_safe = jnp.where(small, 1.0, x)
    # log1p(x)/(2a) = log1p(x)/x / (2 cσ0)
    ratio = jnp.where(small, 1.0 - x / 2.0, jnp.log1p(x_safe) / x_safe)
    return jnp.where(jnp.isnan(sigma0), jnp.nan, jnp.where(blows, ratio / (2.0 * cs_safe), jnp.inf))


def vi_blowup_time(S0, B, v):
    """Blow-up time for ``V = v I``, ``A = 0``: ``T* = 1 / λmax(R vS R)``.

    ``R = Σ0^{1/2}``, ``S = B + Bᵀ``; inf when ``λmax ≤ 0``. Valid for singular Σ0.

    Args:
        S0: (d, d) initial covariance.
        B: (d, d).
        v: the scalar of V = v I, finite (a concrete one that is not is a ValueError). A
            traced value outside the domain gives NaN.

    Dtypes: float32 or float64; integers are converted to the float dtype of the other
    inputs; float16, bfloat16 (no eigh in half precision) and complex are refused (a
    TypeError naming the parameter).

    Returns:
        T* (NaN where an input holds NaN or inf).
    """
    S0, B = square_inputs("vi_blowup_time", S0=S0, B=B)
    check_finite("v", v)
    lam = jnp.linalg.eigvalsh(_whitened(S0, B, v)[1])[-1]
    return nan_where(any_nonfinite(S0, B), jnp.where(
        jnp.isnan(lam), jnp.nan, jnp.where(lam > 0, 1.0 / jnp.where(lam > 0, lam, 1.0), jnp.inf)))


def vi_covariance(t, S0, B, v):
    """``Σ(t) = R (I − t R vS R)⁻¹ R`` for ``V = v I``, ``A = 0`` (t below the blow-up time).

    Args:
        t: time.
        S0: (d, d) initial covariance (``R = S0^{1/2}``).
        B: (d, d) (``S = B + Bᵀ``).
        v: the scalar of V = v I, finite (a concrete one that is not is a ValueError). A
            traced value outside the domain gives NaN.

    Dtypes: float32 or float64; integers are converted to the float dtype of the other
    inputs; float16, bfloat16 (no eigh in half precision) and complex are refused (a
    TypeError naming the parameter).

    Returns:
        (d, d) Σ(t), symmetric (NaN where S0 or B holds a NaN or inf).
    """
    S0, B = square_inputs("vi_covariance", S0=S0, B=B)
    check_finite("v", v)
    R, W = _whitened(S0, B, v)
    M = jnp.eye(R.shape[0], dtype=R.dtype) - t * W
    return nan_where(any_nonfinite(S0, B), _sym(_mm(R, jnp.linalg.solve(M, R))))


def vi_precision(t, P0, A, B, v):
    """``P(t) = Σ(t)⁻¹`` for ``V = v I`` and any A: the solution of ``P' = −PA − AᵀP − vS``.

        P(t) = e^{−Aᵀt} P0 e^{−At} − v ∫₀ᵗ e^{−Aᵀs} S e^{−As} ds,

    by Van Loan's trick: ``expm(t [[−Aᵀ, S], [0, A]]) = [[e^{−Aᵀt}, F12], [0, e^{At}]]`` with
    ``F12 = ∫₀ᵗ e^{−Aᵀ(t−s)} S e^{As} ds``, so ``∫₀ᵗ e^{−Aᵀu} S e^{−Au} du = F12 e^{−At}``.

    Args:
        t: time.
        P0: (d, d) initial precision ``Σ0⁻¹``.
        A: (d, d).
        B: (d, d) (``S = B + Bᵀ``).
        v: the scalar of V = v I, finite (a concrete one that is not is a ValueError). A
            traced value outside the domain gives NaN.

    Returns:
        (d, d) P(t), symmetric.
    """
    check_finite("v", v)
    A = jnp.asarray(A)
    d = A.shape[0]
    S = B + B.T
    Z = jnp.zeros_like(A)
    M = jnp.block([[-A.T, S], [Z, A]]) * t
    E = jax.scipy.linalg.expm(M)
    F11, F12 = E[:d, :d], E[:d, d:]
    Em = jax.scipy.linalg.expm(-A * t)
    G = _mm(F12, Em)
    out = _sym(_mm(_mm(F11, P0), Em) - v * G)
    return out if not isinstance(v, jax.core.Tracer) else jnp.where(jnp.isfinite(v), out, jnp.nan)


def vi_blowup_time_general(S0, A, B, v, t_max, n_grid: int = 2000):
    """First zero of ``λmin(P(t))`` on ``(0, t_max]`` for ``V = v I`` and any A (Σ0 invertible).

    A grid scan then SciPy's Brent method to machine precision; a NumPy/SciPy-level helper (not
    jittable), for tests and reference curves.

    Args:
        S0: (d, d) invertible initial covariance.
        A: (d, d).
        B: (d, d).
        v: the scalar of V = v I.
        t_max: end of the search interval.
        n_grid: grid intervals of the scan.

    Returns:
        T* as a Python float; inf if none.
    """
    S0 = np.asarray(S0, np.float64)
    P0 = np.linalg.inv(S0)
    A = np.asarray(A, np.float64)
    B = np.asarray(B, np.float64)

    def lmin(t):
        return float(np.linalg.eigvalsh(np.asarray(vi_precision(t, P0, A, B, v)))[0])

    from scipy.optimize import brentq  # here: importing this module loads no SciPy

    ts = np.linspace(0.0, t_max, n_grid + 1)
    prev = lmin(0.0)
    for k in range(1, ts.size):
        cur = lmin(ts[k])
        if cur <= 0.0 < prev:
            if cur == 0.0:
                return float(ts[k])
            return float(brentq(lmin, ts[k - 1], ts[k], xtol=1e-15,
                                rtol=4 * np.finfo(float).eps))
        prev = cur
    return np.inf


def lyapunov_solve(A, Q):
    """Solve ``Aᵀ P + P A = −Q`` (Kronecker form, a d² × d² linear system; small d).

    Args:
        A: (d, d).
        Q: (d, d).

    Returns:
        (d, d) P, symmetrised; NaN where a traced A or Q holds a NaN or inf.

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses A or Q not (d, d)
    matrices of one d >= 1, or concrete ones that are not finite.

    Dtypes: float32 or float64; integers are converted to the float dtype of the other
    input; float16, bfloat16 (no linear solve in half precision) and complex are refused (a
    TypeError naming the parameter).
    """
    A, Q = square_inputs("lyapunov_solve", A=A, Q=Q)
    check_finite("A", A)
    check_finite("Q", Q)
    A = jnp.asarray(A)
    d = A.shape[0]
    I = jnp.eye(d, dtype=A.dtype)
    # vec(AᵀP) = (I ⊗ Aᵀ) vec(P), vec(PA) = (Aᵀ ⊗ I) vec(P)  (column-major vec)
    K = jnp.kron(I, A.T) + jnp.kron(A.T, I)
    p = jnp.linalg.solve(K, -jnp.reshape(Q.T, (-1,)))
    return nan_where(any_nonfinite(A, Q), _sym(jnp.reshape(p, (d, d)).T))


def lyapunov_equilibrium(A, B, v):
    """The Lyapunov equilibrium ``Σ* = P*⁻¹`` with ``AᵀP* + P*A = −vS`` (``V = v I``).

    Σ* is a stationary point of the moment ODE when P* is invertible, and the attracting
    one when spec(A) ⊂ {Re > 0} and ``vS ≺ 0`` (then P* ≻ 0).

    Args:
        A: (d, d).
        B: (d, d) (``S = B + Bᵀ``).
        v: the scalar of V = v I.

    Returns:
        ``(Σ*, P*)``.
    """
    P = lyapunov_solve(A, v * (B + B.T))
    return _sym(jnp.linalg.inv(P)), P
