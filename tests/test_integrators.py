"""Integrators: invariants, convergence order against diffrax, equivariance, clustering, vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from conftest import tol


def _qkv(dtype, d=3, seed=0, scale=0.6):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(scale * rng.normal(size=(d, d)), dtype) for _ in range(3)]


@pytest.mark.parametrize("method", ["euler", "rk4", "exp_euler"])
def test_unit_norm_after_1e4_steps(dtype, method):
    Q, K, V = _qkv(dtype)
    model = jaxdyn.SphereAttention(Q, K, V, 5.0)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(1), 64, 3, dtype)
    tr = jaxdyn.simulate(model, x0, t1=10.0, dt=1e-3, save_every=2500, method=method)
    assert int(tr.n_steps) == 10_000
    assert tr.status == "ok"
    err = float(jnp.max(jnp.abs(jnp.linalg.norm(tr.xs, axis=-1) - 1.0)))
    assert err < tol(dtype, 1e-6, 1e-12), err


def _order(model, x0, method, dts, ref):
    errs = []
    for dt in dts:
        tr = jaxdyn.simulate(model, x0, t1=1.0, dt=dt, save_every=10**9, method=method)
        errs.append(float(jnp.max(jnp.abs(tr.xs[-1] - ref))))
    slope = np.polyfit(np.log(dts), np.log(errs), 1)[0]
    return slope, errs


@pytest.mark.parametrize("method,expected,dts32,dts64", [
    ("euler", 1.0, [0.04, 0.02, 0.01], [0.004, 0.002, 0.001]),
    ("exp_euler", 1.0, [0.04, 0.02, 0.01], [0.004, 0.002, 0.001]),
    ("rk4", 4.0, [0.5, 0.25, 0.125], [0.1, 0.05, 0.025]),
])
def test_convergence_order_against_diffrax(dtype, method, expected, dts32, dts64):
    Q, K, V = _qkv(np.float64, seed=2)
    model64 = jaxdyn.SphereAttention(Q, K, V, 2.0)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(5), 12, 3, jnp.float64)
    ref = jaxdyn.simulate(model64, x0, t1=1.0, dt=0.01, method="dopri8", rtol=1e-13, atol=1e-13,
                          save_every=10**9)
    assert ref.status == "ok"
    model = jax.tree.map(lambda a: a.astype(dtype) if hasattr(a, "astype") else a, model64)
    slope, errs = _order(model, x0.astype(dtype), method,
                         dts32 if dtype == np.float32 else dts64, ref.xs[-1])
    assert abs(slope - expected) < 0.25, (slope, errs)


def test_diffrax_reference_stays_on_sphere():
    Q, K, V = _qkv(np.float64, seed=2)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(5), 12, 3, jnp.float64)
    tr = jaxdyn.simulate(jaxdyn.SphereAttention(Q, K, V, 2.0), x0, t1=3.0, dt=0.01,
                         method="tsit5", rtol=1e-10, atol=1e-10)
    assert float(jnp.max(jnp.abs(jnp.linalg.norm(tr.xs, axis=-1) - 1))) < 1e-8


@pytest.mark.slow_dtype("f32")
def test_rotation_equivariance_identity_weights(dtype):
    d = 3
    eye = jnp.eye(d, dtype=dtype)
    model = jaxdyn.SphereAttention(eye, eye, eye, 4.0)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(2), 50, d, dtype)
    R, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(d, d)))
    R = jnp.asarray(R, dtype)
    a = jaxdyn.simulate(model, x0, t1=2.0, dt=0.01, method="rk4").xs
    b = jaxdyn.simulate(model, x0 @ R.T, t1=2.0, dt=0.01, method="rk4").xs
    np.testing.assert_allclose(np.asarray(a @ R.T), np.asarray(b), atol=tol(dtype, 2e-5, 1e-12))


@pytest.mark.slow_dtype("f32")
def test_single_cluster_identity_weights(dtype):
    """GLPR: for Q = K = V = I, d = 3, almost every start collapses to one cluster."""
    eye = jnp.eye(3, dtype=dtype)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(11), 200, 3, dtype)
    tr = jaxdyn.simulate(jaxdyn.SphereAttention(eye, eye, eye, 1.0), x0, t1=40.0, dt=0.05,
                         method="rk4", save_every=100)
    G0 = x0 @ x0.T
    G = tr.xs[-1] @ tr.xs[-1].T
    assert float(jnp.min(G0)) < -0.9
    assert float(jnp.min(G)) > 1 - tol(dtype, 1e-5, 1e-9)
    mean_ip = jnp.mean(tr.xs @ jnp.swapaxes(tr.xs, 1, 2), axis=(1, 2))
    assert bool(jnp.all(jnp.diff(mean_ip) > -1e-6))  # monotone approach


@pytest.mark.slow_dtype("f32")
def test_vmap_over_beta_equals_separate_runs(dtype):
    Q, K, V = _qkv(dtype, seed=4)
    betas = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(3), 40, 3, dtype)
    models = [jaxdyn.SphereAttention(Q, K, V, b) for b in betas]
    stacked = jaxdyn.stack_models(models)
    run = lambda m: jaxdyn.simulate(m, x0, t1=2.0, dt=0.02, method="rk4", save_every=25).xs
    batched = jax.vmap(run)(stacked)
    for i, m in enumerate(models):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(run(m)),
                                   atol=tol(dtype, 1e-5, 1e-13), rtol=0)


@pytest.mark.slow_dtype("f32")
def test_vmap_over_initial_conditions(dtype):
    Q, K, V = _qkv(dtype, seed=4)
    model = jaxdyn.SphereAttention(Q, K, V, 3.0)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    x0s = jax.vmap(lambda k: jaxdyn.sample_sphere(k, 30, 3, dtype))(keys)
    run = lambda x: jaxdyn.simulate(model, x, t1=1.0, dt=0.05).xs
    batched = jax.vmap(run)(x0s)
    for i in range(4):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(run(x0s[i])),
                                   atol=tol(dtype, 1e-5, 1e-13), rtol=0)


def test_saveat_and_save_every():
    eye = jnp.eye(3)
    model = jaxdyn.SphereAttention(eye, eye, eye, 1.0)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 10, 3)
    tr = jaxdyn.simulate(model, x0, t1=1.0, dt=0.1, save_every=3)
    np.testing.assert_allclose(np.asarray(tr.ts), [0, 0.3, 0.6, 0.9, 1.0], atol=1e-6)
    tr2 = jaxdyn.simulate(model, x0, t1=1.0, dt=0.1, saveat=[0.0, 0.3, 0.6, 0.9, 1.0])
    np.testing.assert_allclose(np.asarray(tr.xs), np.asarray(tr2.xs), atol=1e-7)
    with pytest.raises(ValueError, match="not on the step grid"):
        jaxdyn.simulate(model, x0, t1=1.0, dt=0.1, saveat=[0.05])
    # saveat not starting at t0: each frame is the state at its own time
    for method in ("euler", "rk4", "exp_euler", "dopri5"):
        full = jaxdyn.simulate(model, x0, t1=1.0, dt=0.1, save_every=3, method=method)
        late = jaxdyn.simulate(model, x0, t1=1.0, dt=0.1, saveat=[0.3, 0.9, 1.0], method=method)
        np.testing.assert_allclose(np.asarray(late.ts), [0.3, 0.9, 1.0], atol=1e-6)
        np.testing.assert_allclose(np.asarray(late.xs), np.asarray(full.xs)[[1, 3, 4]],
                                   atol=1e-7 if method != "dopri5" else 1e-5, err_msg=method)


def test_zero_temperature_converges_to_power_iteration():
    """For symmetric M, X_∞ trajectories are time changes of e^{sM}x0/|e^{sM}x0|: the flow
    ends at Π(x0) = P_E x0/|P_E x0|."""
    rng = np.random.default_rng(0)
    U, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    M = U @ np.diag([1.0, 0.3, -0.4]) @ U.T
    Q, K = np.eye(3), np.eye(3)  # B = I, V = M
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(1), 20, 3, jnp.float64)
    tr = jaxdyn.simulate(jaxdyn.ZeroTemperature(Q, K, M), x0, t1=40.0, dt=0.01, method="rk4")
    u = U[:, 0]
    target = np.sign(np.asarray(x0) @ u)[:, None] * u[None, :]
    np.testing.assert_allclose(np.asarray(tr.xs[-1]), target, atol=1e-9)


def test_euclidean_model_runs_without_retraction():
    d = 2
    A = -0.5 * jnp.eye(d, dtype=jnp.float64)
    model = jaxdyn.EuclideanAttention(A, 0.0 * A, 0.0 * A, jnp.array([1.0, 0.0]))
    x0 = jnp.zeros((3, d), jnp.float64)
    tr = jaxdyn.simulate(model, x0, t1=1.0, dt=0.01, method="rk4")
    # ẋ = −x/2 + b ⇒ x(t) = 2 b (1 − e^{−t/2})
    np.testing.assert_allclose(np.asarray(tr.xs[-1, 0]), [2 * (1 - np.exp(-0.5)), 0], atol=1e-10)
