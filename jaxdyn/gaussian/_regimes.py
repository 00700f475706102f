r"""Stationary covariances, their stability, regimes, and parameter-grid sweeps (Paper B).

**Stationary points** solve the algebraic Bernoulli equation (Riccati without constant term)

    F(Σ) := A Σ + Σ Aᵀ + V Σ B Σ + Σ Bᵀ Σ Vᵀ = 0.

Σ = 0 always solves it; :func:`stationary_covariance` looks for a nonzero solution by
Newton's method (``optimistix.Newton``) on the ``d(d+1)/2`` symmetric unknowns, started from the Lyapunov equilibrium
of ``V̄ = (tr V / d) I`` (exact when ``V = v I``) and continued in ``V(θ) = V̄ + θ (V − V̄)``,
θ: 0 → 1. It reports the residual ``‖F(Σ*)‖_F``, PSD-ness, and the spectrum of the
linearisation ``DF(Σ*)`` on symmetric matrices (stable iff every real part is < 0).

**Regimes.** :func:`classify` decides what it can *prove* with a trace inequality.
Write ``X_s``, ``X_a`` for the symmetric and skew parts, ``x = tr Σ``. Then

    x' = 2 tr(A_s Σ) + 2 tr(Σ V_s Σ B_s) + 2 tr(Σ V_a Σ B_a),
    |tr(Σ V_a Σ B_a)| ≤ ‖V_a‖₂ ‖B_a‖₂ ‖Σ‖_F²,   x²/r ≤ ‖Σ‖_F² ≤ x²   (r = rank Σ ≤ d).

* V_s, B_s definite with the *same* sign and ``κ = μ(V_s) μ(B_s) − ‖V_a‖₂‖B_a‖₂ > 0``
  (μ = smallest |eigenvalue|): ``x' ≥ 2α x + 2κ x²/r`` with ``α = λmin(A_s)``, so Σ blows up
  no later than the scalar Bernoulli time ``T_b = scalar_blowup_time(x0, α, κ/r)`` — for
  every nonzero Σ0 when α ≥ 0, and when ``κ x0 / r > −α`` otherwise → "blow-up".
* *opposite* signs with the same κ > 0: ``x' ≤ 2β x − 2κ x²/d``, ``β = λmax(A_s)``, so
  ``tr Σ(t) ≤ max(x0, d β/κ)`` for all t → "stable" (bounded).
* ``V = v I`` and ``A = 0`` exactly (docs/math.md §B.4.2): blow-up iff ``λmax(R vS R) > 0``,
  at ``T* = 1/λmax``; otherwise ``Σ(t) ⪯ Σ0`` → "stable".
* anything else → "other", with the numbers (docs/math.md §B.6: "V and B of opposite definiteness →
  bounded; same → blow-up" needs the skew parts to be small, which is what κ > 0 says).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx

from .._checks import any_nonfinite, check_dtype, check_finite, check_integer, check_square, nan_where
from .._results import RESULTS, Solution, from_codes, status_code
from ._solve import moment_rhs
from ._batch import solve_moments_batch
from ._closed import (lyapunov_equilibrium, scalar_blowup_time, scalar_variance, square_inputs,
                      vi_blowup_time)

__all__ = [
    "StationaryPoint",
    "stationary_covariance",
    "bernoulli_residual",
    "linearisation",
    "Regime",
    "classify",
    "GridResult",
    "moment_grid",
    "scalar_grid",
    "vi_grid",
]

HIGHEST = jax.lax.Precision.HIGHEST


def _tri(d):
    """The upper-triangle indices of a (d, d) matrix."""
    return np.triu_indices(d)


def _vech(S):
    """The ``d(d+1)/2`` upper-triangle entries of symmetric matrices."""
    i, j = _tri(S.shape[-1])
    return S[..., i, j]


def _unvech(x, d):
    """The symmetric (d, d) matrices of :func:`_vech` coordinates."""
    i, j = _tri(d)
    S = jnp.zeros(x.shape[:-1] + (d, d), x.dtype).at[..., i, j].set(x)
    return S + jnp.swapaxes(S, -1, -2) - S * jnp.eye(d, dtype=x.dtype)


def bernoulli_residual(S, A, B, V):
    """``F(Σ) = AΣ + ΣAᵀ + VΣBΣ + ΣBᵀΣVᵀ``, the covariance right side at Σ.

    Args:
        S: (d, d) the symmetric matrix Σ where F is evaluated.
        A: (d, d) drift of the tokens.
        B: (d, d) bilinear form of the attention logits.
        V: (d, d) value matrix.

    Returns:
        (d, d) F(Σ).
    """
    d = S.shape[-1]
    return moment_rhs(jnp.zeros((d,), S.dtype), S, A, B, V, jnp.zeros((d,), S.dtype))[1]


def linearisation(S, A, B, V):
    """The matrix of ``DF(Σ)`` on symmetric matrices (vech coordinates) and its eigenvalues.

    The parameters as for :func:`bernoulli_residual`: ``S`` is the point Σ of the
    linearisation, ``A``, ``B`` and ``V`` the (d, d) matrices of F.

    Args:
        S: Σ.
        A: the drift.
        B: the logits' form.
        V: the values.

    Dtypes: float32 or float64; integers are converted to the float dtype of the other
    inputs; float16, bfloat16 (no eigenvalues in half precision) and complex are refused (a
    TypeError naming the parameter).

    Returns:
        ``(J, eigenvalues)``, J of shape (d(d+1)/2, d(d+1)/2); NaN where an input holds a NaN
        or inf.
    """
    S, A, B, V = square_inputs("linearisation", S=S, A=A, B=B, V=V)
    S = jnp.asarray(S)
    d = S.shape[-1]
    J = jax.jacfwd(lambda x: _vech(bernoulli_residual(_unvech(x, d), A, B, V)))(_vech(S))
    return nan_where(any_nonfinite(S, A, B, V), (J, jnp.linalg.eigvals(J)))


class StationaryPoint(Solution):
    """Result of :func:`stationary_covariance` (a :class:`jaxdyn.Solution`; every leaf an array).

    Attributes:
        cov: (d, d) Σ*.
        residual: ``‖F(Σ*)‖_F`` (absolute).
        rel_residual: the residual divided by ``‖A‖‖Σ*‖ + ‖V‖‖B‖‖Σ*‖²``.
        converged: ``rel_residual ≤ tol``.
        psd: Σ* is PSD (a covariance).
        min_eig: the smallest eigenvalue of Σ*.
        jac_eigs: the spectrum of DF(Σ*) on symmetric matrices.
        stable: every real part of ``jac_eigs`` is < 0.
        mean: m* solving ``(A + V + VΣ*B) m + b = 0`` (NaN when b is not given).
        result: :class:`jaxdyn.RESULTS`: ``successful`` when converged, else
            ``not_converged``.
        stats: ``{"num_steps"}``: Newton steps over the continuation.
    """

    cov: jax.Array
    residual: jax.Array
    rel_residual: jax.Array
    converged: jax.Array
    psd: jax.Array
    min_eig: jax.Array
    jac_eigs: jax.Array
    stable: jax.Array
    mean: jax.Array
    result: RESULTS
    stats: dict


def _newton(x0, A, B, V, d, iters):
    """Newton's method on the symmetric unknowns (``optimistix.Newton``), ``iters`` steps at most.

    Least-squares steps by SVD where the Jacobian is singular; the last iterate is returned
    (the caller reads the residual).

    Returns:
        ``(x, steps)``.
    """
    def R(x, args):
        A, B, V = args
        return _vech(bernoulli_residual(_unvech(x, d), A, B, V))

    eps = float(jnp.finfo(x0.dtype).eps)
    solver = optx.Newton(rtol=8 * eps, atol=8 * eps, linear_solver=lx.SVD())
    sol = optx.root_find(R, solver, x0, (A, B, V), max_steps=iters, throw=False)
    return sol.value, sol.stats["num_steps"]


@eqx.filter_jit
def _stationary(A, B, V, b, S_init, n_cont, iters, tol):
    """:func:`stationary_covariance` after its checks (one program)."""
    d = A.shape[0]
    dtype = A.dtype
    vbar = jnp.trace(V) / d
    Vbar = vbar * jnp.eye(d, dtype=dtype)
    if S_init is None:
        S_init = lyapunov_equilibrium(A, B, vbar)[0]
        thetas = jnp.linspace(0.0, 1.0, n_cont + 1, dtype=dtype)
    else:
        thetas = jnp.ones((1,), dtype)

    def cont(x, th):
        Vt = Vbar + th * (V - Vbar)
        return _newton(x, A, B, Vt, d, iters)

    x, steps = jax.lax.scan(cont, _vech(S_init), thetas)
    S = _unvech(x, d)
    F = bernoulli_residual(S, A, B, V)
    res = jnp.sqrt(jnp.sum(F * F))
    nS = jnp.sqrt(jnp.sum(S * S))
    scale = (jnp.linalg.norm(A) * nS + jnp.linalg.norm(V) * jnp.linalg.norm(B) * nS * nS)
    rel = res / jnp.where(scale > 0, scale, 1.0)
    w = jnp.linalg.eigvalsh(S)
    _, ev = linearisation(S, A, B, V)
    M = A + V + jnp.matmul(V, jnp.matmul(S, B, precision=HIGHEST), precision=HIGHEST)
    mean = jnp.linalg.solve(M, -b) if b is not None else jnp.full((d,), jnp.nan, dtype)
    tol_psd = 1e3 * jnp.finfo(dtype).eps * jnp.maximum(w[-1], 1.0)
    converged = rel <= tol
    code = jnp.where(converged, status_code("successful"), status_code("not_converged"))
    return StationaryPoint(cov=S, residual=res, rel_residual=rel, converged=converged,
                           psd=w[0] >= -tol_psd, min_eig=w[0], jac_eigs=ev,
                           stable=jnp.all(jnp.real(ev) < 0), mean=mean, result=from_codes(code),
                           stats={"num_steps": jnp.sum(steps)})


def stationary_covariance(A, B, V, b=None, *, S_init=None, n_continuation: int = 10,
                          newton_iters: int = 30, tol: Optional[float] = None) -> StationaryPoint:
    """A nonzero solution Σ* of ``AΣ + ΣAᵀ + VΣBΣ + ΣBᵀΣVᵀ = 0`` and its stability.

    Newton's method (``optimistix.Newton``) on the symmetric unknowns, from ``S_init`` if
    given, else from the Lyapunov equilibrium of ``V̄ = (tr V/d) I`` with continuation
    ``V̄ → V`` in ``n_continuation`` steps (module doc). Jit-compiled; runs under ``jax.jit``,
    ``jax.vmap`` (stacks of (A, B, V)) and ``jax.grad`` (implicit differentiation of the
    root). A start that is not near a nonzero solution can converge to Σ = 0 or not
    converge: read ``converged``, ``residual`` and ``cov``.

    Args:
        A: (d, d).
        B: (d, d).
        V: (d, d).
        b: (d,) or None: with it, the stationary mean too.
        S_init: (d, d) start of Newton's iteration (no continuation), or None.
        n_continuation: continuation steps in V.
        newton_iters: Newton steps per continuation step, at most.
        tol: the convergence tolerance on the relative residual (default ``1e3 eps``).

    Dtypes: float32 or float64; integers are converted to the float dtype of the other
    inputs; float16, bfloat16 (no linear solve in half precision) and complex are refused (a
    TypeError naming the parameter).

    Returns:
        A :class:`StationaryPoint`.

    Raises:
        ValueError: A, B, V not square matrices of one shape (d >= 1); concrete A, B, V, b or
            S_init that are not finite; ``n_continuation`` or ``newton_iters`` not an integer
            >= 1.
    """
    for name, X in (("b", b), ("S_init", S_init)):
        check_dtype(name, X, fn="stationary_covariance")
    A, B, V = square_inputs("stationary_covariance", A=A, B=B, V=V)
    for name, X in (("A", A), ("B", B), ("V", V), ("b", b), ("S_init", S_init)):
        check_finite(name, X)
    n_continuation = check_integer("n_continuation", n_continuation, minimum=1)
    newton_iters = check_integer("newton_iters", newton_iters, minimum=1)
    A, B, V = (jnp.asarray(x) for x in (A, B, V))
    for name, X in (("A", A), ("B", B), ("V", V)):
        if X.ndim != 2 or X.shape != A.shape or A.shape[0] != A.shape[1]:
            raise ValueError(f"{name} must be a square (d, d) matrix like A, got shape {X.shape}")
    dtype = A.dtype
    tol = 1e3 * float(jnp.finfo(dtype).eps) if tol is None else tol
    b = None if b is None else jnp.asarray(b, dtype)
    S_init = None if S_init is None else jnp.asarray(S_init, dtype)
    return _stationary(A, B, V, b, S_init, int(n_continuation), int(newton_iters), tol)


# ---------------------------------------------------------------------------------------
# Regimes
# ---------------------------------------------------------------------------------------


class Regime(NamedTuple):
    """Result of :func:`classify` (host values: strings and floats).

    Attributes:
        regime: ``"stable"`` | ``"blow-up"`` | ``"other"``.
        condition: the rule that decided it, in words.
        numbers: the quantities behind it.
        blowup_bound: an upper bound on T* (inf if none / unknown).
        trace_bound: an upper bound on ``sup_t tr Σ(t)`` ("stable" only; inf otherwise).
    """

    regime: str
    condition: str
    numbers: dict
    blowup_bound: float
    trace_bound: float


def _definite_sign(w, tol):
    """1 (positive definite), −1 (negative definite) or 0, from sorted eigenvalues ``w``."""
    if w[0] > tol:
        return 1
    if w[-1] < -tol:
        return -1
    return 0


def _exact_rule(B, v, S0, x0, nums):
    """The exact rule for V = v I, A = 0 (module doc); ``nums`` gains its numbers.

    Returns:
        The :class:`Regime`.
    """
    K = v * (B + B.T)
    lam = np.linalg.eigvalsh(K)[-1]
    nums.update(v=v, lambda_max_vS=lam)
    if S0 is not None:
        T = float(vi_blowup_time(S0, B, v))
        nums.update(T_star=T)
        if np.isfinite(T):
            return Regime("blow-up", "V = vI, A = 0: T* = 1/λmax(S0^½ vS S0^½) (exact)",
                          nums, T, np.inf)
        return Regime("stable", "V = vI, A = 0, λmax(S0^½ vS S0^½) ≤ 0: Σ(t) ⪯ S0 (exact)",
                      nums, np.inf, x0)
    if lam > 0:
        return Regime("blow-up", "V = vI, A = 0, λmax(v(B+Bᵀ)) > 0: blow-up from every "
                      "full-rank S0 at T* = 1/λmax(S0^½ vS S0^½) (exact)", nums, np.inf, np.inf)
    return Regime("stable", "V = vI, A = 0, v(B+Bᵀ) ⪯ 0: Σ(t) ⪯ S0 (exact)", nums, np.inf,
                  np.inf)


def _definite_rule(sv, sb, spectra, r, x0, d, nums):
    """The trace rules for sym(V), sym(B) definite (signs ``sv``, ``sb``; module doc).

    Args:
        sv: the sign of sym(V).
        sb: the sign of sym(B).
        spectra: ``(eig sym A, eig sym V, eig sym B, ‖skew V‖, ‖skew B‖)``.
        r: the rank of S0 (None: not given).
        x0: tr S0 (None: not given).
        d: the dimension.
        nums: the numbers reported; gains this rule's.

    Returns:
        The :class:`Regime`.
    """
    wA, wV, wB, nVa, nBa = spectra
    mu = np.min(np.abs(wV)) * np.min(np.abs(wB))
    kappa = mu - nVa * nBa
    nums.update(kappa=kappa, mu=mu)
    if kappa > 0 and sv == sb:
        alpha = wA[0]
        rr = r if r is not None else d
        nums.update(alpha=alpha)
        if x0 is not None:
            Tb = float(scalar_blowup_time(x0, alpha, kappa / rr))
            nums.update(T_bound=Tb)
            if np.isfinite(Tb):
                return Regime("blow-up", "sym(V), sym(B) definite of the same sign, κ > 0: "
                              "tr Σ' ≥ 2α trΣ + 2κ (trΣ)²/r ⇒ T* ≤ T_b", nums, Tb, np.inf)
            return Regime("other", "same-sign definite, κ > 0, but κ trS0/r ≤ −λmin(sym A): "
                          "the trace bound does not force a blow-up", nums, np.inf, np.inf)
        if alpha >= 0:
            return Regime("blow-up", "sym(V), sym(B) definite of the same sign, κ > 0, "
                          "λmin(sym A) ≥ 0: blow-up from every nonzero S0", nums, np.inf, np.inf)
        return Regime("other", f"same-sign definite, κ > 0, λmin(sym A) < 0: blow-up when "
                      f"tr S0 > r·{-alpha:.3g}/κ (pass S0 to decide)", nums, np.inf, np.inf)
    if kappa > 0 and sv != sb:
        beta = wA[-1]
        eventual = d * max(beta, 0.0) / kappa
        nums.update(beta=beta, eventual_trace_bound=eventual)
        bound = np.inf if x0 is None else (max(x0, eventual) if beta > 0 else x0)
        return Regime("stable", "sym(V), sym(B) definite of opposite signs, κ > 0: "
                      "tr Σ' ≤ 2β trΣ − 2κ (trΣ)²/d ⇒ tr Σ(t) ≤ max(tr S0, dβ/κ)", nums,
                      np.inf, float(bound))
    return Regime("other", "sym(V), sym(B) definite but κ = μ(V_s)μ(B_s) − ‖V_a‖‖B_a‖ ≤ 0: "
                  "skew parts too large for the trace argument", nums, np.inf, np.inf)


def classify(A, B, V, S0=None, *, tol: float = 1e-12) -> Regime:
    """Classify the covariance dynamics for constant (A, B, V) by the rules of the module doc.

    With ``S0`` the bounds use ``x0 = tr S0`` and ``r = rank S0``; without it, "blow-up" is
    claimed only when it holds for every nonzero S0. NumPy-level (returns strings), for one
    parameter set.

    Args:
        A: (d, d).
        B: (d, d).
        V: (d, d).
        S0: (d, d) initial covariance or None.
        tol: the tolerance of the "exactly V = v I, A = 0" and definiteness tests, relative
            to the largest entry.

    Returns:
        A :class:`Regime`.

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses A, B, V (and S0) not
    finite (d, d) matrices of one d.
    """
    for name, X in (("A", A), ("B", B), ("V", V), ("S0", S0)):
        check_finite(name, X)
        if X is not None:
            check_square(name, X, np.shape(A)[0] if np.ndim(A) == 2 else None)
    A, B, V = (np.asarray(x, np.float64) for x in (A, B, V))
    d = A.shape[0]
    sym = lambda X: 0.5 * (X + X.T)  # noqa: E731
    skew = lambda X: 0.5 * (X - X.T)  # noqa: E731
    As, Vs, Bs = sym(A), sym(V), sym(B)
    wA, wV, wB = (np.linalg.eigvalsh(X) for X in (As, Vs, Bs))
    nVa, nBa = np.linalg.norm(skew(V), 2), np.linalg.norm(skew(B), 2)
    scale = max(np.abs(V).max(), np.abs(B).max(), np.abs(A).max(), 1e-300)
    nums = dict(eig_sym_A=wA, eig_sym_V=wV, eig_sym_B=wB, spec_A=np.linalg.eigvals(A),
                skew_norm_V=nVa, skew_norm_B=nBa)
    x0 = r = None
    if S0 is not None:
        S0 = np.asarray(S0, np.float64)
        ws = np.linalg.eigvalsh(sym(S0))
        x0 = float(np.trace(S0))
        r = int(np.sum(ws > 1e-12 * max(ws[-1], 1e-300)))
        nums.update(trace_S0=x0, rank_S0=r)
        if r == 0:
            return Regime("stable", "S0 = 0 is a stationary point", nums, np.inf, 0.0)

    # Exact rule: V = v I, A = 0.
    v = np.trace(V) / d
    if np.abs(V - v * np.eye(d)).max() <= tol * scale and np.abs(A).max() <= tol * scale:
        return _exact_rule(B, v, S0, x0, nums)

    sv, sb = _definite_sign(wV, tol * scale), _definite_sign(wB, tol * scale)
    if sv != 0 and sb != 0:
        return _definite_rule(sv, sb, (wA, wV, wB, nVa, nBa), r, x0, d, nums)
    return Regime("other", "sym(V) or sym(B) indefinite: no rule applies", nums, np.inf, np.inf)


# ---------------------------------------------------------------------------------------
# Parameter grids
# ---------------------------------------------------------------------------------------


class GridResult(NamedTuple):
    """Result of :func:`moment_grid`, :func:`scalar_grid` and :func:`vi_grid` (host arrays).

    Attributes:
        x: (nx,) grid values.
        y: (ny,) grid values.
        blowup_time: (nx, ny) from the batch solver.
        trace_final: (nx, ny) ``tr Σ`` at t_final (t1 unless blown up).
        status: (nx, ny) status codes.
        theory_blowup_time: the closed-form counterpart where known (else None).
        theory_trace: the closed-form counterpart where known (else None).
    """

    x: np.ndarray
    y: np.ndarray
    blowup_time: np.ndarray
    trace_final: np.ndarray
    status: np.ndarray
    theory_blowup_time: Optional[np.ndarray]
    theory_trace: Optional[np.ndarray]


def moment_grid(make_params: Callable, x, y, S0, *, t1, m0=None, **solver_kw) -> GridResult:
    """Sweep a 2-D parameter grid with :func:`jaxdyn.solve_moments_batch` (one batch).

    Args:
        make_params: ``make_params(x_i, y_j)`` returns ``dict(A=..., B=..., V=..., b=...)``
            (NumPy arrays, b optional) for one grid point.
        x: (nx,) grid values.
        y: (ny,) grid values.
        S0: (d, d) initial covariance.
        t1: final time.
        m0: (d,) initial mean or None.
        **solver_kw: further :func:`jaxdyn.solve_moments_batch` options.

    Returns:
        A :class:`GridResult` (no theory: see :func:`scalar_grid`, :func:`vi_grid`).
    """
    x, y = np.asarray(x), np.asarray(y)
    S0 = np.asarray(S0)
    pars = [make_params(xi, yj) for xi in x for yj in y]
    A = np.stack([p["A"] for p in pars])
    B = np.stack([p["B"] for p in pars])
    V = np.stack([p["V"] for p in pars])
    b = np.stack([p["b"] for p in pars]) if "b" in pars[0] else None
    sol = solve_moments_batch(m0, S0.astype(A.dtype), A=A, B=B, V=V, b=b, t1=t1, **solver_kw)
    shp = (x.size, y.size)
    tr = np.trace(np.asarray(sol.cov_final), axis1=-2, axis2=-1)
    return GridResult(x, y, np.asarray(sol.blowup_time).reshape(shp), tr.reshape(shp),
                      np.asarray(sol.status).reshape(shp), None, None)


def scalar_grid(a_values, c_values, sigma0: float, *, t1, dtype=np.float64, **solver_kw) -> GridResult:
    """The scalar case ``σ' = 2aσ + 2cσ²`` over an (a, c) grid (d = 1: A = a, V = 1, B = c).

    Numerically and in closed form (``scalar_blowup_time``, ``scalar_variance`` at t1). The
    theoretical boundary of blow-up before t1 is the curve ``T*(a, c) = t1``.

    Args:
        a_values: (na,) values of a.
        c_values: (nc,) values of c.
        sigma0: σ(0).
        t1: final time.
        dtype: the solve's dtype.
        **solver_kw: further :func:`jaxdyn.solve_moments_batch` options.

    Returns:
        A :class:`GridResult` with the theory.

    Raises:
        ValueError: ``a_values`` or ``c_values`` empty or not finite (and the errors of
            :func:`jaxdyn.solve_moments_batch`).
    """
    for name, vals in (("a_values", a_values), ("c_values", c_values)):
        if np.size(vals) == 0:
            raise ValueError(f"{name} must hold at least one value, got an empty list")
        check_finite(name, vals)
    res = moment_grid(lambda a, c: dict(A=np.full((1, 1), a, dtype), B=np.full((1, 1), c, dtype),
                                        V=np.ones((1, 1), dtype)),
                      a_values, c_values, np.full((1, 1), sigma0, dtype), t1=t1, **solver_kw)
    a, c = np.meshgrid(np.asarray(a_values, dtype), np.asarray(c_values, dtype), indexing="ij")
    Tth = np.asarray(scalar_blowup_time(sigma0, a, c))
    tr = np.asarray(scalar_variance(min(float(t1), 1e300), sigma0, a, c))
    return res._replace(theory_blowup_time=Tth, theory_trace=np.where(Tth > t1, tr, np.inf))


def vi_grid(v_values, lam_values, S0, *, t1, a: float = 0.0, **solver_kw) -> GridResult:
    """``V = v I``, ``B = λ I``, ``A = a I`` over a (v, λ) grid, numerically and in closed form.

    Each eigenvalue σ_k of S0 follows the scalar law with ``c = vλ``, so
    ``T* = scalar_blowup_time(λmax(S0), a, vλ)`` and ``tr Σ(t1) = Σ_k σ_k(t1)``.

    Args:
        v_values: (nv,) values of v.
        lam_values: (nl,) values of λ.
        S0: (d, d) initial covariance.
        t1: final time.
        a: the scalar of A = a I.
        **solver_kw: further :func:`jaxdyn.solve_moments_batch` options.

    Returns:
        A :class:`GridResult` with the theory.
    """
    S0 = np.asarray(S0)
    d = S0.shape[0]
    dtype = S0.dtype
    eye = np.eye(d, dtype=dtype)
    res = moment_grid(lambda v, lam: dict(A=a * eye, B=lam * eye, V=v * eye), v_values, lam_values,
                      S0, t1=t1, **solver_kw)
    vv, ll = np.meshgrid(np.asarray(v_values, dtype), np.asarray(lam_values, dtype), indexing="ij")
    sig = np.linalg.eigvalsh(S0)
    Tth = np.asarray(scalar_blowup_time(sig[-1], a, vv * ll))
    tr = sum(np.asarray(scalar_variance(float(t1), s, a, vv * ll)) for s in sig if s > 0)
    return res._replace(theory_blowup_time=Tth, theory_trace=np.where(Tth > t1, tr, np.inf))
