"""Independent references for the tests, in NumPy/SciPy (float64): nothing here calls jaxdyn.

* :func:`sinkhorn_divergence_gradient` -- ∇_x of the debiased Sinkhorn divergence
  S_ε(x, y) = OT_ε(x, y) − ½ OT_ε(x, x) − ½ OT_ε(y, y) (squared Euclidean cost, uniform
  weights) by the envelope theorem: ∂OT_ε/∂C_ij is the optimal plan P_ij, so
  ∇_{x_i} S_ε = Σ_j P^{xy}_ij 2(x_i − y_j) − Σ_j P^{xx}_ij 2(x_i − x_j) (the self term counts
  twice: x enters both sides of OT_ε(x, x)). The plans by log-domain Sinkhorn iterated to
  their marginals, the symmetric one by the averaged fixed point f ← ½(f + T(f)).
* :func:`riccati_covariance`, :func:`riccati_blowup_time` -- Σ(t) and T* of the Gaussian
  moment ODE with V = I: Σ⁻¹ = P solves the linear ODE P' = −PA − AᵀP − (B + Bᵀ), solved
  exactly by a matrix exponential; Σ blows up where P first loses definiteness (its least
  eigenvalue crosses 0, by Brent's method).
"""

import numpy as np
import scipy.linalg
import scipy.optimize
from scipy.special import logsumexp


def _sq_cost(x, y):
    return ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)


def _plan(x, y, eps, tol=1e-13, max_iterations=100_000):
    """The optimal entropic plan between uniform x and y (alternating log-domain Sinkhorn)."""
    c = _sq_cost(x, y)
    n, m = c.shape
    la, lb = np.full(n, -np.log(n)), np.full(m, -np.log(m))
    g = np.zeros(m)
    for it in range(max_iterations):
        f = -eps * logsumexp((g[None] - c) / eps + lb[None], axis=1)
        g = -eps * logsumexp((f[:, None] - c) / eps + la[:, None], axis=0)
        if it % 10 == 0:
            p = np.exp((f[:, None] + g[None] - c) / eps + la[:, None] + lb[None])
            if np.abs(p.sum(1) * n - 1).max() < tol:
                return p
    raise AssertionError("the NumPy Sinkhorn reference did not converge")


def _self_plan(x, eps, tol=1e-13, max_iterations=100_000):
    """The optimal entropic plan of uniform x with itself (symmetric averaged fixed point)."""
    c = _sq_cost(x, x)
    n = len(x)
    la = np.full(n, -np.log(n))
    f = np.zeros(n)
    for _ in range(max_iterations):
        f = 0.5 * (f - eps * logsumexp((f[None] - c) / eps + la[None], axis=1))
        p = np.exp((f[:, None] + f[None] - c) / eps + la[:, None] + la[None])
        if np.abs(p.sum(1) * n - 1).max() < tol:
            return p
    raise AssertionError("the NumPy symmetric Sinkhorn reference did not converge")


def sinkhorn_divergence_gradient(x, y, eps):
    """∇_x S_ε(x, y) of the debiased Sinkhorn divergence, (n, d), float64 (module doc)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    pxy, pxx = _plan(x, y, eps), _self_plan(x, eps)
    return (2 * (pxy.sum(1)[:, None] * x - pxy @ y)
            - 2 * (pxx.sum(1)[:, None] * x - pxx @ x))


def _inverse_covariance(A, B, S0):
    """t -> P(t) = Σ(t)⁻¹ of the moment ODE with V = I (exact, by a matrix exponential)."""
    A, B, S0 = (np.asarray(a, np.float64) for a in (A, B, S0))
    d = A.shape[0]
    eye = np.eye(d)
    gen = np.zeros((d * d + 1, d * d + 1))  # vec(P) (column-major) augmented by the constant 1
    gen[:d * d, :d * d] = -(np.kron(A.T, eye) + np.kron(eye, A.T))
    gen[:d * d, d * d] = -(B + B.T).flatten(order="F")
    p0 = np.r_[np.linalg.inv(S0).flatten(order="F"), 1.0]

    def at(t):
        p = (scipy.linalg.expm(gen * t) @ p0)[:d * d].reshape(d, d, order="F")
        return (p + p.T) / 2

    return at


def riccati_covariance(A, B, S0, t):
    """Σ(t) of the moment ODE with V = I, before its blow-up time (module doc)."""
    return np.linalg.inv(_inverse_covariance(A, B, S0)(t))


def riccati_blowup_time(A, B, S0, t1, grid=101):
    """T* in [0, t1] of the moment ODE with V = I (module doc); ``inf`` if none."""
    P = _inverse_covariance(A, B, S0)

    def least_eig(t):
        return np.linalg.eigvalsh(P(t))[0]

    ts = np.linspace(0.0, t1, grid)
    k = next((i for i, t in enumerate(ts) if least_eig(t) < 0), None)
    if k is None:
        return np.inf
    return scipy.optimize.brentq(least_eig, ts[k - 1], ts[k], xtol=1e-15, rtol=1e-15)


def energy_np(controls, names):
    """∫_0^{t1} Σ_names ‖u(t)‖_F² dt of Controls in NumPy: (t1/n) Σ_k ‖u_k‖² for piecewise-constant
    values, Σ_k h/3 (‖u_k‖² + ⟨u_k, u_{k+1}⟩ + ‖u_{k+1}‖²) for piecewise-linear ones (exact)."""
    total = 0.0
    for k in names:
        c = controls[k]
        v = np.asarray(c.values, np.float64).reshape(np.shape(c.values)[0], -1)
        if c.kind == "piecewise":
            total += float(c.t1) / len(v) * np.sum(v * v)
        else:
            a, b = v[:-1], v[1:]
            total += float(c.t1) / (len(v) - 1) / 3 * np.sum(a * a + a * b + b * b)
    return total


def moment_rhs_np(A, B, V, b):
    """``f(t, y)`` of the moment ODE (docs/math.md §B.2) for SciPy, ``y = (m, vec Σ)``:
    m' = (A + V) m + V Σ B m + b, Σ' = M Σ + Σ Mᵀ with M = A + V Σ B."""
    d = A.shape[0]

    def f(t, y):
        m, S = y[:d], y[d:].reshape(d, d)
        M = A + V @ S @ B
        return np.concatenate([(A + V) @ m + V @ S @ B @ m + b, (M @ S + S @ M.T).ravel()])

    return f


def moment_ode_final(m0, S0, A, B, V, b, t1, limit=1e6):
    """m(t1), Σ(t1) of the moment ODE (docs/math.md §B.2) by SciPy's DOP853 (rtol 1e-12) in
    float64, and whether it reached t1 with ‖Σ‖_F below ``limit`` (False: a blow-up or a
    failed solve on the way; m and Σ are then those at the stop)."""
    from scipy.integrate import solve_ivp

    A, B, V = (np.asarray(x, np.float64) for x in (A, B, V))
    b = np.zeros(len(A)) if b is None else np.asarray(b, np.float64)
    d = len(A)
    f = moment_rhs_np(A, B, V, b)

    def large(t, y):
        return np.linalg.norm(y[d:]) - limit

    large.terminal = True
    y0 = np.concatenate([np.asarray(m0, np.float64), np.asarray(S0, np.float64).ravel()])
    sol = solve_ivp(f, (0.0, float(t1)), y0, method="DOP853", rtol=1e-12, atol=1e-14,
                    events=large)
    y = sol.y[:, -1]
    ok = bool(sol.success and sol.status == 0 and sol.t[-1] == float(t1))
    return y[:d], y[d:].reshape(d, d), ok
