"""Spectral tools (Paper A): Assumption 1 checks, the projection Π, the Lyapunov functional,
eigenspaces and the weight builders. Checked against closed forms, the exact flow
e^{sM}x/|e^{sM}x| and the zero-temperature particle flow."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from conftest import tol
from jaxdyn.spectral import (
    Projection,
    angle_to_subspace,
    check_assumptions,
    lyapunov,
    mass_near,
    projection,
    rotation_matrix,
    spectral_weights,
    subspace_angle,
    top_eigenspace,
)


def _unit(a):
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


# ------------------------------------------------------------------- check_assumptions


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_assumptions_hold_for_a_built_example(dtype):
    w = spectral_weights([1.0, 0.4, -0.2], rotation=0.6, seed=0, dtype=dtype)
    r = check_assumptions(w.Q, w.K, w.V)
    assert r.ok and r.failures == () and r.failed_parts == ()
    assert r.invertible and r.symmetric and r.has_gap
    assert r.cond_B == pytest.approx(1.0, rel=tol(dtype, 1e-5, 1e-12))  # B is a rotation
    assert r.eigenvalues == pytest.approx((1.0, 0.4, -0.2), abs=tol(dtype, 1e-5, 1e-12))
    assert r.gap == pytest.approx(0.6, abs=tol(dtype, 1e-5, 1e-12))
    assert r.dim_E == 1
    assert "holds" in str(r)


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_singular_B_fails_only_invertibility(dtype):
    Q = np.eye(3, dtype=dtype)
    K = np.diag([1.0, 2.0, 0.0]).astype(dtype)  # B = K singular
    V = np.eye(3, dtype=dtype)  # M = V Bᵀ = diag(1, 2, 0): symmetric with a gap
    r = check_assumptions(Q, K, V)
    assert not r.ok
    assert r.failed_parts == ("invertible",)
    assert len(r.failures) == 1 and "singular" in r.failures[0]
    assert math.isinf(r.cond_B)
    assert r.symmetric and r.has_gap and r.gap == pytest.approx(1.0)
    assert "FAILS (1 of 3 parts)" in str(r)


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_asymmetric_M_fails_only_symmetry_and_reports_the_norm(dtype):
    Q = K = np.eye(3, dtype=dtype)
    V = np.array([[1.0, 1.0, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 0.1]], dtype=dtype)
    r = check_assumptions(Q, K, V)
    assert r.failed_parts == ("symmetric",)
    assert r.asymmetry_norm == pytest.approx(math.sqrt(2.0), rel=1e-6)  # ‖M − Mᵀ‖_F
    assert r.asymmetry == pytest.approx(math.sqrt(2.0) / np.linalg.norm(V.astype(float)), rel=1e-6)
    assert "‖M − Mᵀ‖_F = 1.414" in r.failures[0]
    assert r.invertible and r.has_gap
    # eigenvalues are those of the symmetric part, largest first by value
    ref = np.sort(np.linalg.eigvalsh(0.5 * (V + V.T).astype(float)))[::-1]
    assert r.eigenvalues == pytest.approx(tuple(ref), abs=1e-6)


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_missing_gap_fails_only_the_gap(dtype):
    Q = K = np.eye(3, dtype=dtype)
    V = 2.0 * np.eye(3, dtype=dtype)
    r = check_assumptions(Q, K, V)
    assert r.failed_parts == ("gap",)
    assert "no spectral gap" in r.failures[0]
    assert r.dim_E == 3 and r.gap == 0.0
    assert r.invertible and r.symmetric


def test_eigenvalue_clusters_and_gap():
    # μ1 repeated (up to 1e-10, inside rtol) -> dim E = 2 and γ = μ1 − μ3
    w = spectral_weights([1.0, 1.0 - 1e-10, 0.3, -0.5], seed=3, dtype=np.float64)
    r = check_assumptions(w.Q, w.K, w.V)
    assert r.ok and r.dim_E == 2
    assert r.gap == pytest.approx(0.7, rel=1e-9)
    # a strict tolerance separates them again
    r2 = check_assumptions(w.Q, w.K, w.V, rtol=1e-13)
    assert r2.dim_E == 1 and r2.gap == pytest.approx(1e-10, rel=1e-3)


def test_check_assumptions_structural_errors():
    with pytest.raises(ValueError, match=r"K must be a square matrix of shape \(3, 3\)"):
        check_assumptions(np.eye(3), np.eye(2), np.eye(3))
    with pytest.raises(ValueError, match="Q must be a square matrix"):
        check_assumptions(np.ones((3, 2)), np.eye(3), np.eye(3))


# ------------------------------------------------------------------------- projection


def _exact_flow(M, x0, s):
    """Zero-temperature trajectories for symmetric M: e^{sM} x0 / |e^{sM} x0| (docs/math.md §A.3)."""
    y = x0 @ scipy.linalg.expm(s * M).T
    return y / np.linalg.norm(y, axis=-1, keepdims=True)


def test_projection_properties(dtype):
    w = spectral_weights([1.0, 1.0, 0.3, -0.5], seed=1, dtype=dtype)  # dim E = 2
    Pi = projection(w.Q, w.K, w.V)
    assert isinstance(Pi, Projection) and Pi.dim_E == 2 and Pi.dim == 4
    P = np.asarray(Pi.projector, dtype=np.float64)
    t = tol(dtype, 1e-5, 1e-12)
    assert np.allclose(P @ P, P, atol=t) and np.allclose(P, P.T, atol=t)
    assert np.trace(P) == pytest.approx(2.0, abs=t)
    # independent: E spanned by the first two columns of U
    U = np.asarray(w.U, dtype=np.float64)
    assert np.allclose(P, U[:, :2] @ U[:, :2].T, atol=t)
    x = _unit(np.random.default_rng(0).standard_normal((100, 4))).astype(dtype)
    y = np.asarray(Pi(jnp.asarray(x)))
    assert y.dtype == dtype
    assert np.allclose(np.linalg.norm(y, axis=-1), 1.0, atol=t)  # unit norm
    assert np.allclose(np.asarray(Pi(jnp.asarray(y))), y, atol=10 * t)  # idempotent
    ref = x.astype(np.float64) @ P
    ref /= np.linalg.norm(ref, axis=-1, keepdims=True)
    assert np.allclose(y, ref, atol=10 * t)  # = P_E x / |P_E x|
    assert np.allclose(lyapunov(jnp.asarray(y), Pi), 0.0, atol=100 * t)  # Π(x) ∈ E


def test_projection_is_the_limit_of_the_exact_zero_temperature_flow():
    # dim E = 1: Π(x) = ±u; dim E = 2: the normalised projection; both against e^{sM}x/|e^{sM}x|
    rng = np.random.default_rng(2)
    for mu in ([1.0, 0.4, -0.2], [1.0, 1.0, 0.3, -0.5]):
        w = spectral_weights(mu, seed=4, dtype=np.float64)
        M = np.asarray(w.M)
        x0 = _unit(rng.standard_normal((50, len(mu))))
        Pi = projection(w.Q, w.K, w.V)
        gap = 0.6 if len(mu) == 3 else 0.7
        s = math.log(1e14) / gap  # e^{-γ s} = 1e-14
        assert np.allclose(_exact_flow(M, x0, s), np.asarray(Pi(x0)), atol=1e-12)


def test_projection_refuses_when_assumption_fails_unless_forced():
    Q = K = np.eye(3)
    V = np.array([[1.0, 1.0, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 0.1]])
    with pytest.raises(ValueError, match="not symmetric"):
        projection(Q, K, V)
    with pytest.raises(ValueError, match="singular"):
        projection(Q, np.diag([1.0, 1.0, 0.0]), V @ V.T)
    with pytest.raises(ValueError, match="no spectral gap"):
        projection(Q, K, np.eye(3))
    Pi = projection(Q, K, V, force=True)  # top eigenvector of (V + Vᵀ)/2
    es = np.linalg.eigh(0.5 * (V + V.T))[1][:, -1]
    assert np.allclose(np.asarray(Pi.projector), np.outer(es, es), atol=1e-12)
    assert not Pi.report.ok


def test_projection_undefined_on_E_perp_gives_nan():
    Pi = projection(np.eye(3), np.eye(3), np.diag([1.0, 0.2, 0.1]))
    y = np.asarray(Pi(jnp.asarray([[0.0, 1.0, 0.0]])))
    assert np.all(np.isnan(y))


def test_projection_matches_long_time_zero_temperature_particle_flow():
    # d = 4, dim E = 2, B ≠ I (rotation times a diagonal: not orthogonal, so |Bᵀx| ≠ 1 and the
    # time change ds/dt = 1/|Bᵀx| is not trivial). The lead's ZeroTemperature model and RK4.
    from jaxdyn.models._fields import ZeroTemperature
    from jaxdyn.simulation._simulate import simulate

    d = 4
    U = np.linalg.qr(np.random.default_rng(5).standard_normal((d, d)))[0]
    B = rotation_matrix(d, 0.5, (0, 2), basis=U) @ np.diag([1.0, 1.25, 0.8, 1.1])
    w = spectral_weights([1.0, 1.0, 0.3, -0.5], B=B, U=U, dtype=np.float64)
    r = check_assumptions(w.Q, w.K, w.V)
    assert r.ok and r.dim_E == 2 and r.cond_B > 1.2
    Pi = projection(w.Q, w.K, w.V)
    x0 = jnp.asarray(_unit(np.random.default_rng(6).standard_normal((64, d))))
    # rate of L: 2γ/‖B‖ = 2·0.7/1.25; angle ~ sqrt(L) ~ e^{-0.56 t}: t = 45 gives ~1e-11
    traj = simulate(ZeroTemperature(w.Q, w.K, w.V), x0, t1=45.0, dt=0.02, method="rk4", save_every=75)
    assert bool(traj.ok), traj.messages
    xT = np.asarray(traj.xs[-1])
    assert np.max(np.abs(xT - np.asarray(Pi(x0)))) < 1e-6
    # Lyapunov bound along the flow: L(t) <= L(0) e^{-2γ t/‖B‖}
    L = np.asarray(lyapunov(traj.xs, Pi))
    ts = np.asarray(traj.ts)
    rate = 2 * r.gap / np.linalg.norm(B, 2)
    bound = L[0][None, :] * np.exp(-rate * ts)[:, None]
    assert np.all(L <= bound * (1 + 1e-6) + 1e-20)


# ---------------------------------------------------------------- Lyapunov, mass, angles


def test_lyapunov_closed_form(dtype):
    P = np.diag([1.0, 0.0, 0.0]).astype(dtype)
    th = np.array([0.1, 0.7, 1.2], dtype=dtype)
    x = np.stack([np.cos(th), np.sin(th), np.zeros_like(th)], axis=-1)
    L = np.asarray(lyapunov(jnp.asarray(x), jnp.asarray(P)))
    assert np.allclose(L, np.tan(th.astype(np.float64)) ** 2, rtol=tol(dtype, 1e-5, 1e-12))


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_angle_to_subspace_and_mass_near(dtype):
    # points at known angles to the plane E = span(e1, e2) in R^3
    th = np.array([0.0, 0.05, 0.1, 0.3, 0.6, 1.0, 1.5, math.pi / 2], dtype=np.float64)
    phi = np.linspace(0, 2 * np.pi, th.size, endpoint=False)
    x = np.stack([np.cos(th) * np.cos(phi), np.cos(th) * np.sin(phi), np.sin(th)], -1).astype(dtype)
    basis = np.eye(3)[:, :2].astype(dtype)
    # jitted (the radius traced): a program a shape, not each small op compiled on its own
    angle, near = jax.jit(angle_to_subspace), jax.jit(mass_near)
    ang = np.asarray(angle(jnp.asarray(x), jnp.asarray(basis)))
    assert np.allclose(ang, th, atol=tol(dtype, 1e-6, 1e-14))
    assert float(near(jnp.asarray(x), jnp.asarray(basis), 0.2)) == pytest.approx(3 / 8)
    assert float(near(jnp.asarray(x), jnp.asarray(basis), 1.2)) == pytest.approx(6 / 8)
    # batched over a trajectory axis, and a 1-D basis (a line)
    xs = jnp.stack([jnp.asarray(x)] * 2)
    assert near(xs, jnp.asarray(basis), 0.2).shape == (2,)
    line = np.array([0.0, 0.0, 1.0], dtype=dtype)
    assert float(near(jnp.asarray(x), jnp.asarray(line), 0.1)) == pytest.approx(2 / 8)


def test_subspace_angle():
    e = np.eye(3)
    assert subspace_angle(e[:, :1], e[:, 1:2]) == pytest.approx(math.pi / 2)
    a = 0.3
    assert subspace_angle(e[:, 0], np.array([math.cos(a), math.sin(a), 0.0])) == pytest.approx(a, abs=1e-12)
    assert subspace_angle(e[:, 0], e[:, :2]) == pytest.approx(0.0, abs=1e-12)  # contained
    assert subspace_angle(2 * e[:, :2], e[:, :2] @ rotation_matrix(2, 0.4)) == pytest.approx(0.0, abs=1e-7)


# ------------------------------------------------------------------- eigenspaces, builders


def test_top_eigenspace_symmetric_and_general():
    w = spectral_weights([0.2, 1.5, -3.0], seed=7, dtype=np.float64)
    es = top_eigenspace(np.asarray(w.M))
    U = np.asarray(w.U)
    assert es.dim == 1 and es.value == pytest.approx(1.5)  # largest by value, not |μ| = 3
    assert abs(float(es.basis[:, 0] @ U[:, 1])) == pytest.approx(1.0, abs=1e-12)
    # general matrix with a dominant complex pair a ± ib: the real invariant plane
    Vc = np.array([[0.5, -2.0, 0.0], [2.0, 0.5, 0.0], [0.0, 0.0, 0.3]])
    ec = top_eigenspace(Vc, symmetric=False)
    assert ec.dim == 2 and ec.value == pytest.approx(0.5)
    assert subspace_angle(ec.basis, np.eye(3)[:, :2]) == pytest.approx(0.0, abs=1e-12)
    # general matrix with real eigenvalues: the top eigenvector of a triangular matrix
    Vt = np.array([[2.0, 1.0], [0.0, 1.0]])
    et = top_eigenspace(Vt, symmetric=False)
    assert et.dim == 1 and subspace_angle(et.basis, np.array([1.0, 0.0])) == pytest.approx(0.0, abs=1e-12)


def test_rotation_matrix():
    U = np.linalg.qr(np.random.default_rng(8).standard_normal((4, 4)))[0]
    R = rotation_matrix(4, 0.7, (1, 3), basis=U)
    assert np.allclose(R.T @ R, np.eye(4), atol=1e-14) and np.linalg.det(R) == pytest.approx(1.0)
    assert np.allclose(R @ U[:, 1], math.cos(0.7) * U[:, 1] + math.sin(0.7) * U[:, 3], atol=1e-14)
    assert np.allclose(R @ U[:, 0], U[:, 0], atol=1e-14)
    with pytest.raises(ValueError, match="plane"):
        rotation_matrix(3, 0.1, (1, 1))


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_builder_gives_requested_spectrum(dtype):
    mu = [1.0, 0.4, -0.2, 0.1]
    w = spectral_weights(mu, rotation=0.5, key=jax.random.PRNGKey(0), dtype=dtype)
    t = tol(dtype, 1e-5, 1e-12)
    M = np.asarray(w.M, dtype=np.float64)
    assert np.allclose(M, M.T, atol=t)
    assert np.allclose(np.linalg.eigvalsh(M), np.sort(mu), atol=t)
    assert np.allclose(np.asarray(w.Q), np.eye(4)) and np.array_equal(np.asarray(w.K), np.asarray(w.B))
    V, B = np.asarray(w.V, np.float64), np.asarray(w.B, np.float64)
    assert np.allclose(V @ B.T, M, atol=10 * t)  # V Bᵀ = M
    U = np.asarray(w.U, np.float64)
    assert np.allclose(U.T @ U, np.eye(4), atol=t)
    assert np.allclose(M @ U, U * np.asarray(mu), atol=10 * t)  # column i belongs to mu[i]


def _closed_form_angle(mu_i, mu_j, theta):
    """Angle between e_i and the top eigenvector of diag(μ_i, μ_j) R(θ) (real eigenvalues).

    The eigenvector (1, t) solves μ_i s t² + (μ_j − μ_i) c t + μ_j s = 0, λ = μ_i (c − s t)."""
    c, s = math.cos(theta), math.sin(theta)
    a, b, cc = mu_i * s, (mu_j - mu_i) * c, mu_j * s
    disc = b * b - 4 * a * cc
    assert disc > 0
    roots = [(-b + sg * math.sqrt(disc)) / (2 * a) for sg in (1, -1)]
    t = max(roots, key=lambda t: mu_i * (c - s * t))
    return abs(math.atan(t))


@pytest.mark.parametrize("theta", [0.2, 0.6, 1.2])
def test_builder_angle_matches_closed_form(theta):
    # U = I, B rotates e1 towards e3 (μ = 1 and −0.2): V = M B^{-T} acts on that plane as
    # diag(1, −0.2) R(θ), with real eigenvalues; its top eigenvector is at a closed-form angle.
    w = spectral_weights([1.0, 0.4, -0.2], rotation=theta, plane=(0, 2), dtype=np.float64)
    assert w.rotation_angle == theta
    assert w.angle == pytest.approx(_closed_form_angle(1.0, -0.2, theta), abs=1e-12)
    assert w.angle > 0


@pytest.mark.parametrize("plane", [(0, 1), (0, 2)])
def test_builder_reaches_a_requested_eigenspace_angle(plane):
    target = math.radians(8.0)  # docs/math.md §A.9: about 8° showed the metastable phase
    w = spectral_weights([1.0, 0.4, -0.2], eigenspace_angle=target, plane=plane, seed=0, dtype=np.float64)
    assert w.angle == pytest.approx(target, abs=1e-10)
    # independent check of the reported angle
    V = np.asarray(w.V)
    lam, vec = np.linalg.eig(V)
    top = vec[:, np.argmax(lam.real)].real
    u1 = np.asarray(w.U)[:, 0]
    assert math.acos(min(1.0, abs(top @ u1) / np.linalg.norm(top))) == pytest.approx(target, abs=1e-9)
    assert check_assumptions(w.Q, w.K, w.V).ok


def test_builder_rejects_bad_requests():
    with pytest.raises(ValueError, match="at most one"):
        spectral_weights([1.0, 0.5], B=np.eye(2), rotation=0.1)
    with pytest.raises(ValueError, match="B must be invertible"):
        spectral_weights([1.0, 0.5], B=np.diag([1.0, 0.0]))
    with pytest.raises(ValueError, match="not reached"):
        spectral_weights([1.0, 0.4, -0.2], eigenspace_angle=1.5, plane=(0, 1))
    with pytest.raises(ValueError, match="mu must be"):
        spectral_weights([1.0])


# ------------------------------------------------------------------- jit / vmap / grad


def _spectral_example():
    sw = spectral_weights([1.0, 0.4, -0.2], rotation=0.5, plane=(0, 2), seed=3, dtype=jnp.float64)
    return [np.asarray(a) for a in (sw.Q, sw.K, sw.V)]


def _fd_check(f, x, r, h=1e-6):
    """jax.grad of sum(f(x)·r) against central differences along a random direction."""
    g = np.asarray(jax.jit(jax.grad(lambda y: jnp.sum(f(y) * r)))(x))
    u = np.random.default_rng(11).standard_normal(x.shape)
    fd = (float(jnp.sum(f(x + h * u) * r)) - float(jnp.sum(f(x - h * u) * r))) / (2 * h)
    assert abs(np.sum(g * u) - fd) <= 1e-6 * max(1.0, abs(fd)), (np.sum(g * u), fd)


def test_projection_and_lyapunov_jit_vmap_grad():
    """Π, L, the angle to E and the mass near E are JAX functions of the points: under jit and
    vmap they equal the eager values, and jax.grad (Π, L, the angle) matches central
    differences in float64. Π may be built inside jit from concrete (NumPy) weights."""
    Q, K, V = _spectral_example()
    P = projection(Q, K, V)
    x = _unit(np.random.default_rng(2).standard_normal((2, 5, 3)))
    r = np.random.default_rng(4).standard_normal(x.shape)
    for f in (lambda y: P(y), lambda y: lyapunov(y, P), lambda y: angle_to_subspace(y, P)):
        eager = np.asarray(f(jnp.asarray(x)))
        np.testing.assert_allclose(np.asarray(jax.jit(f)(x)), eager, rtol=1e-13, atol=1e-15)
        # (vmap jitted: one program, not each small op of the batched trace compiled on its own)
        np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(f))(x)), eager, rtol=1e-13, atol=1e-15)
        _fd_check(f, x, r[..., 0] if eager.ndim == 2 else r)
    inside = jax.jit(lambda y: projection(Q, K, V)(y))(x)
    np.testing.assert_allclose(np.asarray(inside), np.asarray(P(jnp.asarray(x))), rtol=1e-13)
    m = jax.jit(jax.vmap(lambda y, a: mass_near(y, P, a)))(x, jnp.array([0.3, 1.2]))
    np.testing.assert_array_equal(np.asarray(m), [float(mass_near(x[0], P, 0.3)),
                                                 float(mass_near(x[1], P, 1.2))])


def test_host_only_tools_refuse_traced_weights_clearly():
    """check_assumptions, projection and spectral_weights are set-up steps in float64 NumPy:
    traced weights get a ValueError that says so (not a tracer conversion error)."""
    Q, K, V = _spectral_example()
    with pytest.raises(ValueError, match="concrete array.*host"):
        jax.jit(lambda q: check_assumptions(q, K, V).gap)(Q)
    with pytest.raises(ValueError, match="concrete array.*host"):
        jax.jit(lambda v: projection(Q, K, v).projector)(V)
    with pytest.raises(ValueError, match="concrete array.*host"):
        jax.jit(lambda mu: spectral_weights(mu).V)(jnp.array([1.0, 0.5]))
