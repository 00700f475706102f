"""Gaussian moment ODE (Paper B): closed forms, invariants, stationary points, regimes,
and the batched solver against per-member diffrax and closed forms."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from _references import moment_ode_final
from conftest import tol

from jaxdyn import status_code
from jaxdyn.gaussian import (BatchSolution, Control, solve_moments,
                             covariance_curves, solve_moments_batch)
from jaxdyn.gaussian._closed import (
    lyapunov_equilibrium,
    scalar_blowup_time,
    scalar_variance,
    vi_blowup_time,
    vi_blowup_time_general,
    vi_covariance,
)
from jaxdyn.gaussian._regimes import classify, scalar_grid, stationary_covariance, vi_grid

D = 3
N_SAVE = 9  # shared save count and tolerances keep the number of compilations down
KW64 = dict(rtol=1e-11, atol=1e-13)
KWS = dict(saveat=N_SAVE, **KW64)


def _spd(rng, d, lo=0.2):
    X = rng.standard_normal((d, d))
    return X @ X.T / d + lo * np.eye(d)


def _tols(dtype):
    return dict(rtol=tol(dtype, 1e-6, 1e-11), atol=tol(dtype, 1e-8, 1e-13))


# ----------------------------------------------------------------------------- closed forms


# The scalar law's cases (a, c, σ0, t1): three blow-ups, then c < 0 < a (σ → a/|c|, no blow-up).
SCALAR_CASES = [(0.3, 0.5, 1.0, 5.0), (0.0, 0.7, 0.5, 5.0), (-0.4, 1.0, 2.0, 5.0), (0.5, -0.5, 1.0, 40.0)]


@pytest.fixture(scope="module")
def scalar_solutions():
    """``get(dtype)``: the d = 1 solves of every SCALAR_CASES member as one vmapped program (a
    stack of parameters and t1, one compilation a dtype instead of one solve per case),
    with member ``i`` as ``sol(i)``."""
    cache = {}

    def get(dtype):
        if dtype not in cache:
            a, c, s0, t1 = (jnp.asarray(v, dtype) for v in zip(*SCALAR_CASES))
            one = lambda x: jnp.reshape(x, (1, 1))  # noqa: E731
            batch = jax.jit(jax.vmap(lambda a, c, s0, t1: solve_moments(
                None, one(s0), A=one(a), B=one(c), V=jnp.ones((1, 1), dtype), t1=t1,
                saveat=N_SAVE, **_tols(dtype))))(a, c, s0, t1)
            batch = jax.tree.map(np.asarray, batch)  # members read on the host, not op by op
            cache[dtype] = lambda i: jax.tree.map(lambda leaf: leaf[i], batch)
        return cache[dtype]

    return get


# the closed forms, jitted: one program each (op by op, each small op compiles)
_scalar_blowup_time = jax.jit(scalar_blowup_time)
_scalar_variance = jax.jit(scalar_variance)
_vi_covariance = jax.jit(vi_covariance)
_vi_blowup_time = jax.jit(vi_blowup_time)


@pytest.mark.parametrize("case", range(3), ids=["0.3-0.5-1.0", "0.0-0.7-0.5", "-0.4-1.0-2.0"])
@pytest.mark.slow_dtype("f32")  # f32: a second set of solver compilations
def test_scalar_blowup_time_matches_closed_form(dtype, case, scalar_solutions):
    a, c, s0, _ = SCALAR_CASES[case]
    T = float(_scalar_blowup_time(s0, a, c))
    assert np.isfinite(T)
    sol = scalar_solutions(dtype)(case)
    assert int(sol.status) == status_code("blowup")
    assert abs(float(sol.blowup_time) - T) / T < tol(dtype, 1e-4, 1e-9)
    # the saved trajectory before T* follows σ(t) (evaluated at every saved time: one shape)
    ts = np.asarray(sol.ts)
    before = ts < T
    ref = np.asarray(_scalar_variance(ts, s0, a, c))[before]
    got = np.asarray(sol.cov)[before, 0, 0]
    np.testing.assert_allclose(got, ref, rtol=tol(dtype, 1e-4, 1e-9))
    assert np.all(np.isnan(np.asarray(sol.cov)[~before]))


@pytest.mark.slow  # four solve_moments compilations (12 s); blow-up statuses per member under vmap by default: test_scalar_blowup_time_matches_closed_form
def test_blowup_status_message_and_throw():
    """A blow-up is a status with a message (``result``), per member under vmap;
    ``throw=True`` raises with that message, also under jit."""
    one = lambda x: jnp.full((1, 1), x, jnp.float64)  # noqa: E731
    run = lambda c, **kw: solve_moments(None, one(1.0), A=one(0.0), B=one(c), V=one(1.0),  # noqa: E731
                                        t1=2.0, **kw)
    sols = jax.vmap(run)(jnp.array([1.0, -1.0]))  # T* = 0.5 for c = 1; decay for c = -1
    assert list(sols.names) == ["blowup", "successful"]
    assert np.asarray(sols.ok).tolist() == [False, True]
    assert "blowup_time" in sols.messages[0]
    assert int(sols.status[0]) == status_code("blowup") == status_code(jaxdyn.RESULTS.blowup)
    with pytest.raises(Exception, match="Finite-time blow-up"):
        jax.block_until_ready(jax.jit(lambda c: run(c, throw=True).cov_final)(1.0))
    assert bool(run(-1.0, throw=True).ok)
    # diffrax's codes pass through: a step budget that runs out is max_steps_reached
    assert run(-1.0, max_steps=2).names == "max_steps_reached"


def test_scalar_no_blowup_cases(scalar_solutions):
    # c < 0 < a: σ → a/|c|; c > 0 > a with cσ0 < |a|: decays; both: T* = inf.
    assert np.isinf(float(_scalar_blowup_time(1.0, 0.5, -0.5)))
    assert np.isinf(float(_scalar_blowup_time(0.5, -1.0, 1.0)))
    sol = scalar_solutions(np.float64)(3)  # A = 0.5, B = -0.5, V = 1, σ0 = 1 to t1 = 40
    assert SCALAR_CASES[3] == (0.5, -0.5, 1.0, 40.0)
    assert int(sol.status) == status_code("successful")
    np.testing.assert_allclose(float(sol.cov_final[0, 0]), 1.0, rtol=1e-9)


@pytest.mark.slow_dtype("f32")
def test_vi_blowup_time_matches_closed_form(dtype):
    rng = np.random.default_rng(1)
    for _ in range(2):
        B = rng.standard_normal((D, D)).astype(dtype)
        S0 = _spd(rng, D).astype(dtype)
        v = 0.7
        T = float(_vi_blowup_time(S0.astype(np.float64), B.astype(np.float64), v))
        assert np.isfinite(T)
        sol = solve_moments(None, S0, A=np.zeros((D, D), dtype), B=B, V=v * np.eye(D, dtype=dtype),
                            t1=10 * T, saveat=N_SAVE, **_tols(dtype))
        assert int(sol.status) == status_code("blowup")
        assert abs(float(sol.blowup_time) - T) / T < tol(dtype, 1e-4, 1e-9)
        ts = np.asarray(sol.ts)
        for k in np.flatnonzero(ts < T):
            ref = np.asarray(_vi_covariance(ts[k], S0.astype(np.float64), B.astype(np.float64), v))
            np.testing.assert_allclose(np.asarray(sol.cov[k]), ref, rtol=tol(dtype, 1e-4, 1e-8),
                                       atol=tol(dtype, 1e-5, 1e-10) * np.abs(ref).max())


@pytest.mark.slow
def test_vi_blowup_time_general_A():
    """Any A with V = vI: P = Σ⁻¹ is linear; its first singular time (expm + bisection)
    against the numerical blow-up time."""
    rng = np.random.default_rng(3)
    B = rng.standard_normal((D, D))
    S0 = _spd(rng, D)
    A = 0.3 * rng.standard_normal((D, D))
    v = 0.7
    T0 = float(vi_blowup_time(S0, B, v))
    T = vi_blowup_time_general(S0, A, B, v, t_max=10 * T0)
    assert np.isfinite(T)
    sol = solve_moments(None, S0, A=A, B=B, V=v * np.eye(D), t1=10 * T0, **KWS)
    assert int(sol.status) == status_code("blowup")
    assert abs(float(sol.blowup_time) - T) / T < 1e-9


def test_lyapunov_equilibrium_reached():
    """spec(A) ⊂ {Re > 0}, vS ≺ 0: Σ(t) → Σ* = P*⁻¹ with AᵀP* + P*A = −vS."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((D, D))
    A = X @ X.T / D + 0.6 * np.eye(D) + 0.3 * (X - X.T)
    assert np.all(np.linalg.eigvals(A).real > 0.5)
    B = _spd(rng, D, 0.3)
    v = -0.8
    Sstar, Pstar = lyapunov_equilibrium(A, B, v)
    np.testing.assert_allclose(A.T @ Pstar + Pstar @ A, -v * (B + B.T), atol=1e-12)
    sol = solve_moments(np.ones(D), 0.5 * np.eye(D), A=A, B=B, V=v * np.eye(D), t1=40.0, **KWS)
    assert int(sol.status) == status_code("successful")
    np.testing.assert_allclose(np.asarray(sol.cov_final), np.asarray(Sstar), atol=1e-8)


# ----------------------------------------------------------------------------- invariants


@pytest.mark.slow_dtype("f32")  # f32: a second set of solver compilations (4.6 CPU-s); f64 (tighter) by default
# (solve_moments in float32 by default: the README tour, tests/test_readme.py, T* to 1e-6)
def test_rank_preserved_and_symmetric(dtype):
    rng = np.random.default_rng(5)
    u = rng.standard_normal((D, 2)).astype(dtype)
    S0 = u @ u.T  # rank 2 in d = 3
    B = rng.standard_normal((D, D)).astype(dtype) * 0.5
    A = (0.3 * rng.standard_normal((D, D))).astype(dtype)
    V = (np.eye(D) * 0.6).astype(dtype)
    sol = solve_moments(None, S0, A=A, B=B, V=V, t1=0.5, saveat=N_SAVE, **_tols(dtype))
    assert int(sol.status) == status_code("successful")
    covs = np.asarray(sol.cov)
    assert np.array_equal(covs, np.swapaxes(covs, -1, -2))  # exactly symmetric
    for S in covs:
        w = np.linalg.eigvalsh(S.astype(np.float64))
        assert w[1] > 1e-3 * w[-1]  # rank 2 kept ...
        assert abs(w[0]) <= tol(dtype, 1e-5, 1e-9) * w[-1]  # ... and not more
    # V = vI with A = 0: closed form valid for singular S0 (R = S0^{1/2}).
    sol0 = solve_moments(None, S0, A=np.zeros((D, D), dtype), B=B, V=V, t1=0.3, saveat=N_SAVE,
                         **_tols(dtype))
    ref = np.asarray(_vi_covariance(0.3, S0.astype(np.float64), B.astype(np.float64), 0.6))
    np.testing.assert_allclose(np.asarray(sol0.cov_final), ref, atol=tol(dtype, 1e-5, 1e-10) * np.abs(ref).max())


@pytest.mark.slow
def test_invalid_S0_rejected_with_numbers():
    with pytest.raises(ValueError, match=r"S0 must be symmetric.*= 1\.000e-01"):
        solve_moments(None, np.array([[1.0, 0.1], [0.0, 1.0]]), A=np.zeros((2, 2)), B=np.eye(2),
                      V=np.eye(2), t1=1.0)
    with pytest.raises(ValueError, match=r"S0 must be positive semi-definite.*-1\.000e\+00"):
        solve_moments(None, np.diag([1.0, -1.0]), A=np.zeros((2, 2)), B=np.eye(2), V=np.eye(2), t1=1.0)
    with pytest.raises(ValueError, match=r"S0 must be positive semi-definite: member 1"):
        solve_moments_batch(None, np.stack([np.eye(2), np.diag([1.0, -1.0])]), A=np.zeros((2, 2)),
                            B=np.eye(2), V=np.eye(2), t1=1.0)
    with pytest.raises(ValueError, match="B must have shape"):
        solve_moments(None, np.eye(2), A=np.zeros((2, 2)), B=np.eye(3), V=np.eye(2), t1=1.0)
    # Under vmap the check cannot raise: the status says it.
    S = jnp.stack([jnp.eye(2), jnp.diag(jnp.array([1.0, -1.0]))])
    st = jax.vmap(lambda s: solve_moments(None, s, A=jnp.zeros((2, 2)), B=jnp.eye(2) * 0.1,
                                          V=jnp.eye(2), t1=0.1).status)(S)
    assert list(np.asarray(st)) == [status_code("successful"), status_code("invalid_input")]


# ----------------------------------------------------------------------------- controls and grad


@pytest.mark.slow  # ~10 s of compilation; piecewise controls also run in test_control
def test_piecewise_control_equals_restarted_solves():
    rng = np.random.default_rng(6)
    A1, A2 = 0.4 * rng.standard_normal((2, D, D))
    B = 0.3 * rng.standard_normal((D, D))
    V = 0.3 * rng.standard_normal((D, D))
    b = 0.3 * rng.standard_normal(D)
    m0, S0 = 0.2 * np.ones(D), np.eye(D)
    kw = KWS
    ctrl = Control(np.stack([A1, A2]), t1=1.0)
    sol = solve_moments(m0, S0, A=ctrl, B=B, V=V, b=b, t1=1.0, **kw)
    h1 = solve_moments(m0, S0, A=A1, B=B, V=V, b=b, t1=0.5, **kw)
    h2 = solve_moments(np.asarray(h1.mean_final), np.asarray(h1.cov_final), A=A2, B=B, V=V, b=b,
                       t1=0.5, **kw)
    np.testing.assert_allclose(np.asarray(sol.cov_final), np.asarray(h2.cov_final), rtol=1e-9)
    np.testing.assert_allclose(np.asarray(sol.mean_final), np.asarray(h2.mean_final), rtol=1e-9, atol=1e-12)
    # linear interpolation between equal nodes is the constant control
    lin = Control(np.stack([A1, A1, A1]), t1=1.0, kind="linear")
    s_lin = solve_moments(m0, S0, A=lin, B=B, V=V, b=b, t1=0.5, **kw)
    np.testing.assert_allclose(np.asarray(s_lin.cov_final), np.asarray(h1.cov_final), rtol=1e-10)


# default: the one jax.grad through solve_moments' diffrax solve, against finite differences
def test_grad_through_control_matches_finite_differences():
    rng = np.random.default_rng(7)
    vals = 0.3 * rng.standard_normal((3, D, D))
    B, V = 0.3 * np.eye(D), -0.5 * np.eye(D)

    def loss(vals):  # Tsit5: a lighter compile than the default Dopri8 for this one test
        sol = solve_moments(jnp.zeros(D), jnp.eye(D), A=Control(vals, t1=1.0), B=B, V=V, t1=1.0,
                            solver=diffrax.Tsit5(), **KW64)
        return jnp.trace(sol.cov_final)

    # one compiled program: the gradient, and the two losses of the difference as its values
    value_and_grad = jax.jit(jax.value_and_grad(loss))
    g = np.asarray(value_and_grad(jnp.asarray(vals))[1])
    E = np.zeros_like(vals)
    E[1, 0, 2] = 1.0
    eps = 1e-5
    fd = (float(value_and_grad(jnp.asarray(vals + eps * E))[0])
          - float(value_and_grad(jnp.asarray(vals - eps * E))[0])) / (2 * eps)
    assert np.isfinite(g).all()
    np.testing.assert_allclose(g[1, 0, 2], fd, rtol=1e-5)


@pytest.mark.slow  # ~7 s
def test_vmap_over_parameter_stack_and_curves():
    rng = np.random.default_rng(8)
    vs = jnp.asarray([0.5, 1.0, 2.0])
    B = jnp.asarray(_spd(rng, D))
    S0 = jnp.eye(D)
    T = jax.vmap(lambda v: solve_moments(None, S0, A=jnp.zeros((D, D)), B=B, V=v * jnp.eye(D),
                                         t1=10.0, **KW64).blowup_time)(vs)
    ref = [float(vi_blowup_time(np.eye(D), np.asarray(B), float(v))) for v in vs]
    np.testing.assert_allclose(np.asarray(T), ref, rtol=1e-8)
    ts, trace, cov, mean, sol = covariance_curves(None, S0, A=jnp.zeros((D, D)), B=B,
                                                  V=0.5 * jnp.eye(D), t1=1.0, n_save=N_SAVE, **KW64)
    assert ts.shape == (N_SAVE,) and trace.shape == (N_SAVE,)
    np.testing.assert_allclose(np.asarray(trace), np.trace(np.asarray(cov), axis1=1, axis2=2))


# ----------------------------------------------------------------------------- stationary points


def test_bernoulli_solver_matches_lyapunov_for_vI_and_is_stable():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((D, D))
    A = X @ X.T / D + 0.6 * np.eye(D) + 0.3 * (X - X.T)
    B = _spd(rng, D, 0.3)
    v = -0.8
    # b = 0 given (the stationary mean solved too, 0 here): the program of the general-V test
    st = stationary_covariance(A, B, v * np.eye(D), np.zeros(D))
    Sstar, _ = lyapunov_equilibrium(A, B, v)
    assert bool(st.converged) and float(st.residual) < 1e-12
    np.testing.assert_array_equal(np.asarray(st.mean), 0.0)
    np.testing.assert_allclose(np.asarray(st.cov), np.asarray(Sstar), atol=1e-10)
    assert bool(st.stable) and bool(st.psd)


def test_bernoulli_solver_general_V_is_the_long_time_limit():
    rng = np.random.default_rng(9)
    X = rng.standard_normal((D, D))
    A = X @ X.T / D + 0.6 * np.eye(D) + 0.2 * (X - X.T)
    B = _spd(rng, D, 0.3)
    V = -np.eye(D) + 0.2 * rng.standard_normal((D, D))
    b = 0.5 * rng.standard_normal(D)
    st = stationary_covariance(A, B, V, b)
    assert bool(st.converged) and float(st.rel_residual) < 1e-12 and bool(st.psd)
    assert bool(st.stable)
    sol = solve_moments(np.zeros(D), np.eye(D), A=A, B=B, V=V, b=b, t1=60.0, **KWS)
    np.testing.assert_allclose(np.asarray(sol.cov_final), np.asarray(st.cov), atol=1e-8)
    np.testing.assert_allclose(np.asarray(sol.mean_final), np.asarray(st.mean), atol=1e-8)


# ----------------------------------------------------------------------------- regimes


def test_classify_rules_and_bounds_hold_numerically():
    rng = np.random.default_rng(10)
    A = 0.2 * rng.standard_normal((D, D))
    Bp = _spd(rng, D, 0.5)
    Vp = _spd(rng, D, 0.5)
    S0 = np.eye(D)
    # same sign: blow-up, and the numerical T* is below the bound
    r = classify(A, Bp, Vp, S0)
    assert r.regime == "blow-up" and np.isfinite(r.blowup_bound)
    sol = solve_moments(None, S0, A=A, B=Bp, V=Vp, t1=r.blowup_bound * 1.01, **KWS)
    assert int(sol.status) == status_code("blowup") and float(sol.blowup_time) <= r.blowup_bound
    # opposite sign: bounded trace, checked along a long trajectory
    r = classify(A, Bp, -Vp, S0)
    assert r.regime == "stable" and np.isfinite(r.trace_bound)
    ts, trace, *_ = covariance_curves(None, S0, A=A, B=Bp, V=-Vp, t1=30.0, n_save=N_SAVE, **KW64)
    assert np.all(np.asarray(trace) <= r.trace_bound * (1 + 1e-9))
    # exact V = vI, A = 0 rule
    r = classify(np.zeros((D, D)), Bp, 0.5 * np.eye(D), S0)
    assert r.regime == "blow-up"
    np.testing.assert_allclose(r.blowup_bound, float(vi_blowup_time(S0, Bp, 0.5)))
    # indefinite sym(V): honest "other"
    assert classify(A, Bp, np.diag([1.0, -1.0, 0.5]), S0).regime == "other"
    # large skew part breaks the trace argument
    Vsk = 0.1 * np.eye(D) + 5.0 * (lambda X: X - X.T)(rng.standard_normal((D, D)))
    Bsk = 0.1 * np.eye(D) + 5.0 * (lambda X: X - X.T)(rng.standard_normal((D, D)))
    assert classify(A, Bsk, Vsk, S0).regime == "other"


# ----------------------------------------------------------------------------- batched solver


def _workload(n, seed=0, d=D, scale=0.3):
    rng = np.random.default_rng(seed)
    A, B, V = (scale * rng.standard_normal((n, d, d)) for _ in range(3))
    b = scale * rng.standard_normal((n, d))
    m0 = scale * rng.standard_normal((n, d))
    return A, B, V, b, m0


@pytest.mark.slow
def test_batch_agrees_with_diffrax_and_closed_forms():
    n = 64
    A, B, V, b, m0 = _workload(n, seed=11)
    # members 0..7: V = vI, A = 0, B random → closed-form blow-up times
    rng = np.random.default_rng(12)
    for i in range(8):
        A[i] = 0.0
        V[i] = (0.5 + rng.random()) * np.eye(D)
        B[i] = rng.standard_normal((D, D)) + 1.0 * np.eye(D)
    S0 = 2.0 * np.eye(D)
    kw = KW64
    sol = solve_moments_batch(m0, S0, A=A, B=B, V=V, b=b, t1=1.0, **kw)
    st = np.asarray(sol.status)
    assert set(np.unique(st)) <= {status_code("successful"), status_code("blowup")}
    Tref = np.array([float(vi_blowup_time(S0, B[i], V[i, 0, 0])) for i in range(8)])
    blew = Tref < 1.0
    assert blew.sum() >= 3
    assert np.all(st[:8][blew] == status_code("blowup")) and np.all(st[:8][~blew] == status_code("successful"))
    np.testing.assert_allclose(sol.blowup_time[:8][blew], Tref[blew], rtol=1e-9)
    # per-member diffrax on all members
    ref = jax.vmap(lambda m, a, bb, v, c: solve_moments(m, S0, A=a, B=bb, V=v, b=c, t1=1.0, **kw))(
        m0, A, B, V, b)
    np.testing.assert_array_equal(st, np.asarray(ref.status))
    ok = st == status_code("successful")
    assert ok.sum() > n // 2
    err = np.abs(sol.cov_final[ok] - np.asarray(ref.cov_final)[ok]).max(axis=(1, 2)) / np.abs(sol.cov_final[ok]).max(axis=(1, 2))
    assert err.max() < 1e-8
    np.testing.assert_allclose(sol.mean_final[ok], np.asarray(ref.mean_final)[ok], rtol=1e-7, atol=1e-9)
    bu = st == status_code("blowup")
    np.testing.assert_allclose(sol.blowup_time[bu], np.asarray(ref.blowup_time)[bu], rtol=1e-8)
    assert np.all(np.isinf(sol.blowup_time[ok]))
    assert np.array_equal(sol.cov_final, np.swapaxes(sol.cov_final, -1, -2))


@pytest.mark.slow
def test_batch_stiff_stage_matches_explicit_stage():
    """Force every member into the Rodas5 stage (1 explicit iteration): it must reproduce
    the explicit results and the closed-form blow-up times."""
    n = 16
    A, B, V, b, m0 = _workload(n, seed=13)
    A[0], V[0], B[0] = 0.0, 0.8 * np.eye(D), np.eye(D)  # T* = 1/(2·0.8·2) = 0.3125
    kw = KW64
    full = solve_moments_batch(m0, 2 * np.eye(D), A=A, B=B, V=V, b=b, t1=1.0, **kw)
    forced = solve_moments_batch(m0, 2 * np.eye(D), A=A, B=B, V=V, b=b, t1=1.0,
                                 max_explicit_iterations=1, **kw)
    assert forced.stiff.all() and int(forced.stats["stiff_iterations"]) > 0
    np.testing.assert_array_equal(full.status, forced.status)
    assert int(forced.status[0]) == status_code("blowup")
    np.testing.assert_allclose(forced.blowup_time[0], 0.3125, rtol=1e-8)
    ok = full.status == status_code("successful")
    rel = np.abs(full.cov_final[ok] - forced.cov_final[ok]).max(axis=(1, 2)) / np.abs(full.cov_final[ok]).max(axis=(1, 2))
    assert rel.max() < 1e-7
    off = solve_moments_batch(m0, 2 * np.eye(D), A=A, B=B, V=V, b=b, t1=1.0, stiff=False,
                              max_explicit_iterations=1, **kw)
    assert np.all(off.status == status_code("stiff"))
    assert set(off.names) == {"stiff"} and "stiff=True" in off.messages[0]


@pytest.mark.slow
def test_batch_sweep_with_blowups_finishes_with_statuses():
    n = 256
    A, B, V, b, m0 = _workload(n, seed=0)
    sol = solve_moments_batch(m0, 2 * np.eye(D), A=A, B=B, V=V, b=b, t1=1.0, **KW64)
    st = np.asarray(sol.status)
    counts = sol.counts()
    assert counts["blowup"] >= 10 and counts["successful"] >= n // 2
    assert "max_steps_reached" not in counts and "nonfinite" not in counts
    assert sum(counts.values()) == n
    bu = st == status_code("blowup")
    assert np.all(sol.blowup_time[bu] < 1.0) and np.all(sol.t_final[bu] <= sol.blowup_time[bu])
    assert np.all(sol.t_final[st == status_code("successful")] == 1.0)
    # compaction happened: later rounds are smaller than the batch
    assert len(sol.stats["round_sizes"]) >= 2 and sol.stats["round_sizes"][-1] < n
    # one status per member, with messages; the result is a pytree of arrays (timings are
    # stats, not static fields); throw=True names the first member that is not successful
    assert isinstance(sol, BatchSolution) and sol.status.shape == (n,)
    assert all(sol.names[bu] == "blowup") and "blowup_time" in sol.messages[bu][0]
    assert np.array_equal(sol.ok, st == status_code("successful"))
    leaves = jax.tree.leaves(sol)
    assert all(hasattr(x, "shape") for x in leaves)
    first = int(np.flatnonzero(st != status_code("successful"))[0])
    with pytest.raises(RuntimeError, match=f"member {first}; .*Finite-time blow-up|member {first}"):
        solve_moments_batch(m0, 2 * np.eye(D), A=A, B=B, V=V, b=b, t1=1.0, throw=True, **KW64)


@pytest.mark.slow  # a second dtype's compilations of the batched solver
def test_batch_float32_runs():
    A, B, V, b, m0 = _workload(64, seed=2)
    f = np.float32
    sol = solve_moments_batch(m0.astype(f), 2 * np.eye(D, dtype=f), A=A.astype(f), B=B.astype(f),
                              V=V.astype(f), b=b.astype(f), t1=1.0, rtol=1e-6, atol=1e-8)
    # the reference: SciPy's DOP853 in float64 (tests/_references.py), member by member
    ref = [moment_ode_final(m0[i], 2 * np.eye(D), A[i], B[i], V[i], b[i], 1.0) for i in range(64)]
    assert sol.cov_final.dtype == np.float32
    ok = (sol.status == status_code("successful")) & np.array([r[2] for r in ref])
    assert ok.sum() >= 40
    S_ref = np.stack([r[1] for r in ref])[ok]
    rel = np.abs(sol.cov_final[ok] - S_ref).max(axis=(1, 2)) / np.abs(S_ref).max(axis=(1, 2))
    assert rel.max() < 1e-4


# ----------------------------------------------------------------------------- grids


@pytest.mark.slow  # ~6 s; the grids' closed forms are checked one by one above
def test_scalar_and_vi_grids_match_theory():
    g = scalar_grid(np.linspace(-1, 1, 5), np.linspace(-1, 1, 6), 1.0, t1=1.0, **KW64)
    bu = g.status == status_code("blowup")
    np.testing.assert_array_equal(bu, g.theory_blowup_time < 1.0)
    np.testing.assert_allclose(g.blowup_time[bu], g.theory_blowup_time[bu], rtol=1e-9)
    ok = g.status == status_code("successful")
    np.testing.assert_allclose(g.trace_final[ok], g.theory_trace[ok], rtol=1e-9)
    S0 = np.diag([0.5, 1.0, 2.0])
    g = vi_grid(np.linspace(-1, 1, 4), np.linspace(0.1, 1, 4), S0, t1=1.0, a=0.2, **KW64)
    bu = g.status == status_code("blowup")
    np.testing.assert_array_equal(bu, g.theory_blowup_time < 1.0)
    np.testing.assert_allclose(g.blowup_time[bu], g.theory_blowup_time[bu], rtol=1e-9)
    ok = g.status == status_code("successful")
    np.testing.assert_allclose(g.trace_final[ok], g.theory_trace[ok], rtol=1e-9)


@pytest.mark.slow
def test_poles_in_one_direction_and_just_after_t1():
    """Both solvers, two members of closed form (A = 0, diagonal V, B, S0: σ_k' = 2 V_kk B_kk σ_k²):
    (0) V = diag(1, 10⁴, 1), B = diag(1, −10⁻⁴, −1): σ_1 blows up at T* = 0.5, the other
    directions stay bounded; the pole test's scale is q's own in the blowing direction (the
    scale ‖V‖_F ‖B‖_F, 10⁴ here, called this exact pole ``large``); (1) V = B = I with
    T* = t1 (1 + 10⁻⁷): ‖Σ‖ passes the threshold before t1 but the solution is finite on
    [0, t1], so no blow-up is claimed (``large``, blowup_time inf; it was ``blowup`` with
    T* > t1)."""
    t1 = 0.6
    s0 = 1.0 / (2 * t1 * (1 + 1e-7))
    S0 = np.stack([np.eye(D), np.diag([s0, 0.5, 0.5])])
    V = np.stack([np.diag([1.0, 1e4, 1.0]), np.eye(D)])
    B = np.stack([np.diag([1.0, -1e-4, -1.0]), np.eye(D)])
    A = np.zeros((2, D, D))
    batch = solve_moments_batch(None, S0, A=A, B=B, V=V, t1=t1, **KW64)
    for i, (status, tstar) in enumerate([(status_code("blowup"), 0.5),
                                         (status_code("large"), np.inf)]):
        one = solve_moments(None, S0[i], A=A[i], B=B[i], V=V[i], t1=t1, **KW64)
        for sol in (one, batch):
            st = int(sol.status) if sol is one else int(sol.status[i])
            T = float(sol.blowup_time) if sol is one else float(sol.blowup_time[i])
            assert st == status, (i, sol.names)
            if np.isfinite(tstar):
                assert abs(T - tstar) < 1e-8, (i, T)
            else:
                assert T == np.inf
    # saveat = 1: the one saved time is t1 (it was t = 0, the input itself)
    one = solve_moments(None, S0[1], A=A[1], B=B[1], V=V[1], t1=0.5, saveat=1, **KW64)
    assert np.asarray(one.ts).tolist() == [0.5]
    np.testing.assert_allclose(np.asarray(one.cov[0]), np.asarray(one.cov_final), rtol=1e-13)
    # an integer S0 is refused by both solvers (the batch ran it in float32)
    for solve in (solve_moments, solve_moments_batch):
        with pytest.raises(ValueError, match="S0 must have a floating dtype"):
            solve(None, np.eye(D, dtype=np.int64), A=A[1], B=B[1], V=V[1], t1=0.5)


def test_pole_scale_is_scale_free_and_finite_in_float32():
    # it formed ‖VΣ‖ ‖BΣ‖ / ‖Σ‖² from Σ itself: ‖Σ‖⁴ overflowed float32 at the detection point
    # (S0 = 1e6 I, V = B = I in float32 was called large)
    from jaxdyn.gaussian._solve import pole_scale

    rng = np.random.default_rng(3)
    S = _spd(rng, D).astype(np.float32)
    V, B = (rng.standard_normal((D, D)).astype(np.float32) for _ in range(2))
    scale = jax.jit(pole_scale)  # one program (op by op, each small op compiles)
    # the reference: ‖V Σ̂‖_F ‖B Σ̂‖_F with Σ̂ = Σ/‖Σ‖_F, in float64 NumPy at c = 1
    S64, V64, B64 = (np.asarray(x, np.float64) for x in (S, V, B))
    Sh = S64 / np.linalg.norm(S64)
    ref = float(np.linalg.norm(V64 @ Sh) * np.linalg.norm(B64 @ Sh))
    for c in (1.0, 1e10, 1e18):  # (‖Σ‖² itself overflows float32 past 1e19)
        got = float(scale(jnp.asarray(c * S), jnp.asarray(V), jnp.asarray(B)))
        assert got == pytest.approx(ref, rel=1e-5), c
