"""The Gaussian moment drivers compose with jax.jit, jax.vmap and jax.grad: traced inputs give
the numbers of the concrete call, and gradients agree with central finite differences in
float64 (relative ~1e-6)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdyn import status_code
from jaxdyn.gaussian import (lyapunov_equilibrium, scalar_blowup_time, scalar_variance,
                             solve_moments, solve_moments_batch, stationary_covariance,
                             vi_blowup_time, vi_covariance)

D = 3
KW = dict(rtol=1e-12, atol=1e-14)


def _params(seed, n=None, scale=0.3):
    rng = np.random.default_rng(seed)
    shape = (D, D) if n is None else (n, D, D)
    A, B, V = (scale * rng.standard_normal(shape) for _ in range(3))
    b = scale * rng.standard_normal(shape[:-1])
    return A, B, V, b


def _fd(f, x, E, h):
    """Central difference of the scalar ``f`` at ``x`` in the direction ``E``."""
    return (float(f(x + h * E)) - float(f(x - h * E))) / (2 * h)


def _check_grad(f, x, h=1e-4, rtol=1e-6, seed=0, jit=False):
    """``jax.grad(f)(x)`` against central differences along two random directions.

    ``jit=True``: the gradient and the differences through one ``jax.jit`` program of
    ``jax.value_and_grad`` (instead of every small op compiled on its own).
    """
    if jit:
        vg = jax.jit(jax.value_and_grad(f))
        grad, f = (lambda x: vg(x)[1]), (lambda x: vg(x)[0])
    else:
        grad = jax.grad(f)
    g = np.asarray(grad(jnp.asarray(x)))
    assert np.all(np.isfinite(g))
    rng = np.random.default_rng(seed)
    for _ in range(2):
        E = rng.standard_normal(np.shape(x))
        fd = _fd(f, np.asarray(x), E, h)
        np.testing.assert_allclose(float(np.sum(g * E)), fd, rtol=rtol, atol=1e-12 * abs(fd))


@pytest.mark.slow
def test_solve_moments_under_jit_and_grad():
    A, B, V, b = _params(1)
    S0 = np.eye(D)

    def solve(A, **kw):
        return solve_moments(np.zeros(D), S0, A=A, B=B, V=V, b=b, t1=1.0, saveat=3, **KW, **kw)

    ref = solve(A)
    assert int(ref.status) == status_code("successful")
    traced = jax.jit(solve)(jnp.asarray(A))
    np.testing.assert_allclose(np.asarray(traced.cov), np.asarray(ref.cov), rtol=1e-13, atol=1e-15)
    assert int(traced.status) == int(ref.status)
    assert int(traced.num_accepted_steps) <= int(traced.num_steps)
    _check_grad(lambda A: jnp.trace(solve(A).cov_final) + jnp.sum(solve(A).mean[1]), A)


@pytest.mark.slow  # vmap of solve_moments by default: test_gaussian.py::test_scalar_blowup_time_matches_closed_form
def test_solve_moments_vmaps_over_initial_covariances():
    A, B, V, b = _params(2)
    rng = np.random.default_rng(3)
    X = rng.standard_normal((4, D, D))
    S0 = X @ np.swapaxes(X, 1, 2) / D + 0.1 * np.eye(D)
    one = lambda S: solve_moments(None, S, A=A, B=B, V=V, b=b, t1=0.5, **KW)  # noqa: E731
    sols = jax.vmap(one)(jnp.asarray(S0))
    assert sols.cov_final.shape == (4, D, D) and sols.cov.shape == (4, 1, D, D)
    for i in range(4):
        np.testing.assert_allclose(np.asarray(sols.cov_final[i]), np.asarray(one(S0[i]).cov_final),
                                   rtol=1e-12)


@pytest.mark.slow
def test_batch_under_jit_gives_the_concrete_statuses():
    """The composable path (traced inputs) and the fast path (concrete inputs) of
    solve_moments_batch: the same statuses, blow-up times and final states within the
    tolerances, on members that blow up, stay bounded and turn stiff."""
    n = 24
    A, B, V, b = _params(0, n)
    m0 = 0.3 * np.random.default_rng(1).standard_normal((n, D))
    A[0], V[0], B[0] = 0.0, 0.8 * np.eye(D), np.eye(D)  # T* = 1/(2·0.8·2) = 0.3125
    kw = dict(t1=1.0, rtol=1e-10, atol=1e-12)
    fast = solve_moments_batch(m0, 2 * np.eye(D), A=A, B=B, V=V, b=b, **kw)
    comp = jax.jit(lambda A: solve_moments_batch(m0, 2 * np.eye(D), A=A, B=B, V=V, b=b, **kw))(
        jnp.asarray(A))
    st = np.asarray(fast.status)
    np.testing.assert_array_equal(np.asarray(comp.status), st)
    assert {"successful", "blowup"} <= set(fast.counts())
    bu = st == status_code("blowup")
    np.testing.assert_allclose(np.asarray(comp.blowup_time)[bu], np.asarray(fast.blowup_time)[bu],
                               rtol=1e-9)
    np.testing.assert_allclose(float(comp.blowup_time[0]), 0.3125, rtol=1e-9)
    ok = st == status_code("successful")
    rel = (np.abs(np.asarray(comp.cov_final)[ok] - np.asarray(fast.cov_final)[ok]).max(axis=(1, 2))
           / np.abs(np.asarray(fast.cov_final)[ok]).max(axis=(1, 2)))
    assert rel.max() < 1e-7
    # one convention for both drivers: trajectories at ts, the final state apart
    assert comp.cov.shape == fast.cov.shape == (n, 1, D, D)
    np.testing.assert_array_equal(np.asarray(fast.cov)[ok, 0], np.asarray(fast.cov_final)[ok])
    assert np.all(np.isnan(np.asarray(comp.cov)[bu]))
    assert np.all(np.asarray(comp.num_accepted_steps) <= np.asarray(comp.num_steps))


@pytest.mark.slow  # a second compilation of the composable batch path (~1 min)
def test_batch_vmaps_and_saves_trajectories():
    n = 4
    A, B, V, b = _params(5, n)
    kw = dict(t1=0.5, rtol=1e-10, atol=1e-12)
    bs = jnp.stack([jnp.asarray(b), -jnp.asarray(b)])
    sols = jax.vmap(lambda b: solve_moments_batch(None, np.eye(D), A=A, B=B, V=V, b=b, saveat=3,
                                                  **kw))(bs)
    assert sols.cov.shape == (2, n, 3, D, D) and sols.ts.shape == (2, n, 3)
    for k in range(2):
        for i in range(n):
            one = solve_moments(None, np.eye(D), A=A[i], B=B[i], V=V[i], b=bs[k, i], saveat=3, **kw)
            np.testing.assert_allclose(np.asarray(sols.cov[k, i]), np.asarray(one.cov), rtol=1e-8,
                                       atol=1e-12)


@pytest.mark.slow  # the reverse-mode compilation of the composable batch path (~2 min)
def test_batch_grad_matches_finite_differences():
    n = 3
    A, B, V, b = _params(6, n)

    def loss(A):
        sol = solve_moments_batch(None, np.eye(D), A=A, B=B, V=V, b=b, t1=0.5, **KW)
        return jnp.sum(jnp.trace(sol.cov_final, axis1=-2, axis2=-1))

    sol = solve_moments_batch(None, np.eye(D), A=A, B=B, V=V, b=b, t1=0.5, **KW)
    assert np.all(np.asarray(sol.ok))
    _check_grad(loss, A)


@pytest.mark.slow
def test_stationary_covariance_under_jit_vmap_and_grad():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((D, D))
    A = X @ X.T / D + 0.6 * np.eye(D) + 0.3 * (X - X.T)
    Y = rng.standard_normal((D, D))
    B = Y @ Y.T / D + 0.3 * np.eye(D)
    V = -np.eye(D) + 0.2 * rng.standard_normal((D, D))
    st = stationary_covariance(A, B, V)
    assert bool(st.converged) and bool(st.stable)
    jitted = jax.jit(lambda A: stationary_covariance(A, B, V).cov)(jnp.asarray(A))
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(st.cov), rtol=1e-12, atol=1e-14)
    As = jnp.stack([jnp.asarray(A), jnp.asarray(A) + 0.05 * jnp.eye(D)])
    covs = jax.vmap(lambda A: stationary_covariance(A, B, V).cov)(As)
    np.testing.assert_allclose(np.asarray(covs[0]), np.asarray(st.cov), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(covs[1]), np.asarray(stationary_covariance(As[1], B, V).cov),
                               rtol=1e-12, atol=1e-14)
    _check_grad(lambda A: jnp.trace(stationary_covariance(A, B, V).cov), A, h=1e-5)


def test_closed_forms_compose():
    # scalar law: T* and σ(t) under jit/vmap, derivatives against central differences
    a = jnp.asarray([0.3, 0.0, -0.4])
    c = jnp.asarray([0.5, 0.7, 1.0])
    s0 = jnp.asarray([1.0, 0.5, 2.0])
    T = jax.jit(jax.vmap(scalar_blowup_time))(s0, a, c)
    one = jax.jit(scalar_blowup_time)  # the unbatched call (one program, not op by op)
    np.testing.assert_allclose(np.asarray(T), [float(one(*x)) for x in zip(s0, a, c)], rtol=1e-14)
    for f in (lambda x: scalar_blowup_time(x[0], x[1], x[2]),
              lambda x: scalar_variance(0.2, x[0], x[1], x[2])):
        _check_grad(f, np.asarray([1.0, 0.3, 0.5]), h=1e-5, jit=True)
    # V = vI: T* and Σ(t) in B
    rng = np.random.default_rng(7)
    B = rng.standard_normal((D, D)) + np.eye(D)
    S0 = np.eye(D) + 0.2 * np.ones((D, D))
    _check_grad(lambda B: vi_blowup_time(S0, B, 0.7), B, h=1e-5, jit=True)
    _check_grad(lambda B: jnp.sum(vi_covariance(0.1, S0, B, 0.7)), B, h=1e-5, jit=True)
    X = rng.standard_normal((D, D))
    A = X @ X.T / D + 0.6 * np.eye(D)
    _check_grad(lambda A: jnp.trace(lyapunov_equilibrium(A, np.eye(D), -0.8)[0]), A, h=1e-5, jit=True)


@pytest.mark.slow
def test_solve_moments_with_rodas5_matches_dopri8():
    """The shared Rodas5 as solve_moments' solver: the same blow-up time and states."""
    from jaxdyn.integrators.rodas5 import Rodas5

    A, B, V, b = _params(8)
    S0 = 2 * np.eye(D)
    ref = solve_moments(None, S0, A=A, B=B, V=V, b=b, t1=2.0, saveat=5, **KW)
    ros = solve_moments(None, S0, A=A, B=B, V=V, b=b, t1=2.0, saveat=5, solver=Rodas5(),
                        rtol=1e-11, atol=1e-13)
    assert ros.names == ref.names
    ok = np.isfinite(np.asarray(ref.cov))
    np.testing.assert_allclose(np.asarray(ros.cov)[ok], np.asarray(ref.cov)[ok], rtol=1e-8, atol=1e-10)
    if ref.names == "blowup":
        np.testing.assert_allclose(float(ros.blowup_time), float(ref.blowup_time), rtol=1e-9)
