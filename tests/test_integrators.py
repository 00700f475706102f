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


@pytest.mark.parametrize("method", [
    # projected Euler retracts as projected RK4 does (x/|x|): its 1e4 steps under -m slow; its
    # unit rows by default in the order test (test_convergence_order_against_diffrax)
    pytest.param("euler", marks=pytest.mark.slow), "rk4", "exp_euler"])
@pytest.mark.slow_dtype("f64")  # the retraction in f32 (the runs' default dtype, where 1e4 steps
# of drift would show) in the default suite, f64 under -m slow
def test_unit_norm_after_1e4_steps(dtype, method):
    Q, K, V = _qkv(dtype)
    model = jaxdyn.SphereAttention(Q, K, V, 5.0)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(1), 64, 3, dtype)
    tr = jaxdyn.simulate(model, x0, t1=10.0, dt=1e-3, save_every=2500, method=method)
    assert int(tr.num_steps) == int(tr.num_accepted_steps) == 10_000
    assert bool(tr.ok) and tr.names == "successful"
    xs = np.asarray(tr.xs)
    assert xs.dtype == dtype
    err = float(np.max(np.abs(np.linalg.norm(xs, axis=-1) - 1.0)))
    assert err < tol(dtype, 1e-6, 1e-12), err


def _order(model, x0, method, dts, ref):
    # the solves at the three steps as one compiled program (three separate ones compile in
    # about 1.3 times its CPU time)
    runs = jax.jit(lambda x0: [jaxdyn.simulate(model, x0, t1=1.0, dt=dt, save_every=10**9,
                                               method=method).xs for dt in dts])(x0)
    errs = []
    for dt, xs in zip(dts, runs):
        xs = np.asarray(xs)
        # unit rows at every saved state, to the dtype's rounding
        norm_err = float(np.max(np.abs(np.linalg.norm(xs, axis=-1) - 1.0)))
        assert norm_err < tol(xs.dtype, 1e-6, 1e-12), (method, dt, norm_err)
        errs.append(float(np.max(np.abs(xs[-1] - np.asarray(ref)))))
    slope = np.polyfit(np.log(dts), np.log(errs), 1)[0]
    return slope, errs


@pytest.mark.parametrize("method,expected,dts32,dts64", [
    ("euler", 1.0, [0.04, 0.02, 0.01], [0.004, 0.002, 0.001]),
    ("exp_euler", 1.0, [0.04, 0.02, 0.01], [0.004, 0.002, 0.001]),
    ("rk4", 4.0, [0.5, 0.25, 0.125], [0.1, 0.05, 0.025]),
])
@pytest.mark.slow_dtype("f64")  # the order in f32 in the default suite (the dts chosen for it), f64 under -m slow
def test_convergence_order_against_diffrax(dtype, method, expected, dts32, dts64):
    Q, K, V = _qkv(np.float64, seed=2)
    model64 = jaxdyn.SphereAttention(Q, K, V, 2.0)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(5), 12, 3, jnp.float64)
    ref = jaxdyn.simulate(model64, x0, t1=1.0, dt=0.01, method="dopri8", rtol=1e-13, atol=1e-13,
                          save_every=10**9)
    assert bool(ref.ok), ref.messages
    model = jax.tree.map(lambda a: a.astype(dtype) if hasattr(a, "astype") else a, model64)
    slope, errs = _order(model, x0.astype(dtype), method,
                         dts32 if dtype == np.float32 else dts64, ref.xs[-1])
    assert abs(slope - expected) < 0.25, (slope, errs)


@pytest.mark.slow
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
    x0, xs = np.asarray(x0), np.asarray(tr.xs)  # the checks in NumPy (no eager programs)
    G0 = x0 @ x0.T
    G = xs[-1] @ xs[-1].T
    assert float(np.min(G0)) < -0.9
    assert float(np.min(G)) > 1 - tol(dtype, 1e-5, 1e-9)
    mean_ip = np.mean(xs @ np.swapaxes(xs, 1, 2), axis=(1, 2))
    assert bool(np.all(np.diff(mean_ip) > -1e-6))  # monotone approach


@pytest.mark.slow_dtype("f32")
@pytest.mark.slow  # default-suite counterpart: tests/test_simulation_composable.py's
# test_simulate_under_jit_and_vmap_with_traced_inputs (vmap over β and x0, f64, 1e-13)
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


@pytest.mark.slow  # default-suite counterpart: tests/test_simulation_composable.py's
# test_simulate_under_jit_and_vmap_with_traced_inputs (vmap over x0 and β, f64, 1e-13)
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


@pytest.mark.slow
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


@pytest.mark.slow  # default-suite counterpart: tests/test_spectral.py's
# test_projection_matches_long_time_zero_temperature_particle_flow (ZeroTemperature, rk4,
# float64, B not orthogonal: the flow ends at the projection Π(x0), 1e-6)
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


@pytest.mark.slow  # default-suite counterparts: test_geometry_defaults_to_the_fields_manifold
# (a scheme on EuclideanAttention takes its geometry: no retraction) and the rk4 order test
def test_euclidean_model_runs_without_retraction():
    d = 2
    A = -0.5 * jnp.eye(d, dtype=jnp.float64)
    model = jaxdyn.EuclideanAttention(A, 0.0 * A, 0.0 * A, jnp.array([1.0, 0.0]))
    x0 = jnp.zeros((3, d), jnp.float64)
    tr = jaxdyn.simulate(model, x0, t1=1.0, dt=0.01, method="rk4")
    # ẋ = −x/2 + b ⇒ x(t) = 2 b (1 − e^{−t/2})
    np.testing.assert_allclose(np.asarray(tr.xs[-1, 0]), [2 * (1 - np.exp(-0.5)), 0], atol=1e-10)


# ------------------------------------------------------------------ one integrator set


@pytest.mark.parametrize("method", ["euler", "rk4", "exp_euler"])
@pytest.mark.slow_dtype("f64")  # a code-path identity: f32 (the runs' default dtype) in the default suite, f64 under -m slow
@pytest.mark.slow
def test_ensemble_step_is_the_integrator_class(dtype, method):
    """simulate_ensemble's batch-minor chunk steps with the integrator class on
    Sphere(axis=1): bitwise equal to the class stepping the chunk field, and equal to the
    class stepping each system in the (N, d) layout of simulate."""
    from jaxdyn.integrators import INTEGRATORS, Sphere, scheme_step
    from jaxdyn.simulation._ensemble import _ChunkField, _chunk_run, _field

    rng = np.random.default_rng(3)
    n, d, c = 9, 3, 5
    x = rng.standard_normal((n, d, c))
    x = jnp.asarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype)
    B = jnp.asarray(rng.standard_normal((d, d, c)), dtype)
    V = jnp.asarray(rng.standard_normal((d, d, c)), dtype)
    beta = jnp.asarray(rng.uniform(0.5, 3.0, c), dtype)
    dt = jnp.asarray(0.05, dtype)

    got = jax.jit(lambda y: _chunk_run(y, B, V, beta, method=method, dt=0.05, idx=(0, 1),
                                       normalization="softmax", safe=1e30)[1])(x)
    field = _ChunkField(B, V, beta, "softmax", 1e30)
    cls = jax.jit(lambda y: scheme_step(INTEGRATORS[method](Sphere(axis=1)), field, 0.0, y,
                                        dt))(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(cls))

    def f(y):
        return _field(y, B, V, beta, "softmax", 1e30)

    # the same scheme in simulate's layout, one system at a time (eager: op by op)
    for s in range(c):
        xs = x[..., s]
        f_s = lambda t, y, a, s=s: f(jnp.where(jnp.arange(c) == s, y[..., None], x))[..., s]
        one = scheme_step(INTEGRATORS[method](Sphere()), f_s, 0.0, xs, dt)
        np.testing.assert_allclose(np.asarray(one), np.asarray(got[..., s]),
                                   rtol=0, atol=tol(dtype, 1e-6, 1e-15))


def test_geometry_defaults_to_the_fields_manifold():
    from jaxdyn.integrators import Euclidean, ProjectedEuler, Sphere, geometry_of, scheme_step

    Q = jnp.eye(3)
    assert geometry_of(jaxdyn.SphereAttention(Q, Q, Q, 1.0)) == Sphere()
    assert geometry_of(jaxdyn.EuclideanAttention(Q, Q, Q)) == Euclidean()
    assert geometry_of(lambda t, x, a: x) == Euclidean()
    x = jnp.asarray([[3.0, 4.0]])
    f = jaxdyn.EuclideanAttention(jnp.eye(2), 0 * jnp.eye(2), 0 * jnp.eye(2))
    np.testing.assert_allclose(scheme_step(ProjectedEuler(), f, 0.0, x, 0.5), 1.5 * x)
    np.testing.assert_allclose(scheme_step(ProjectedEuler(Sphere()), f, 0.0, x, 0.5), [[0.6, 0.8]])
    # the geometry is an argument: a scheme without one takes the model's
    assert ProjectedEuler().on(jaxdyn.SphereAttention(Q, Q, Q, 1.0)).geometry == Sphere()
    assert ProjectedEuler(Euclidean()).on(jaxdyn.SphereAttention(Q, Q, Q, 1.0)).geometry == Euclidean()


def _pair_ode(y):
    # u' = v, v' = -u (harmonic), w' = -w² : u = cos t, v = -sin t, w = 1/(1 + t)
    (u, v), w = y
    return (v, -u), -w * w


def _pair_exact(t):
    return np.array([np.cos(t), -np.sin(t), 1.0 / (1.0 + t)])


def test_dopri8_order_and_error_estimate():
    """The Dormand–Prince 8(7) step on a pytree: global error O(h^8) against the exact
    solution; the embedded estimate is O(h^8) per step (a 7th-order companion)."""
    from jaxdyn.integrators.dopri8 import DOPRI8, dopri8_step

    assert len(DOPRI8.b) == 14 and DOPRI8.a[-1] == DOPRI8.b[:-1] and DOPRI8.e[-1] == 0.0
    np.testing.assert_allclose(sum(DOPRI8.b), 1.0, rtol=1e-14)
    np.testing.assert_allclose([sum(r) for r in DOPRI8.a], DOPRI8.c[1:], rtol=1e-13)
    step = jax.jit(lambda y, h: dopri8_step(_pair_ode, y, h)[:2])
    y0 = ((jnp.float64(1.0), jnp.float64(0.0)), jnp.float64(1.0))
    errs, ests = [], []
    T = 2.0
    for n in (2, 4, 8):
        h = jnp.asarray(T / n, jnp.float64)
        y = y0
        for k in range(n):
            y, _ = step(y, h)
        ests.append(max(abs(float(x)) for x in jax.tree.leaves(step(y0, h / 8)[1])))
        got = np.array([float(a) for a in jax.tree.leaves(y)])
        errs.append(np.max(np.abs(got - _pair_exact(T))))
    slopes = np.diff(np.log(errs)) / np.log(0.5)
    assert np.all(slopes > 7.3), (errs, slopes)
    est_slopes = np.diff(np.log(ests)) / np.log(0.5)
    assert np.all(est_slopes > 6.8), (ests, est_slopes)


def test_rodas5_order_and_stiff_decay():
    """Rodas5 on a linear system with a stiff mode: global error O(h^5) against expm, and
    the stiffly accurate step kills an infinitely stiff mode (R(∞) = 0)."""
    import scipy.linalg as sla

    from jaxdyn.integrators.rodas5 import RODAS5, rodas5_step

    assert RODAS5.a.shape == (8, 8) and RODAS5.gamma == 0.19
    J = np.array([[-1.0, 2.0, 0.0], [-2.0, -1.0, 0.0], [0.0, 0.0, -0.5]])
    y0 = np.array([1.0, 0.5, -1.0])
    f = lambda y: jnp.asarray(J) @ y  # noqa: E731
    step = jax.jit(lambda y, h: rodas5_step(f, y, h))
    T = 2.0
    exact = sla.expm(T * J) @ y0
    errs = []
    for n in (8, 16, 32):
        y, h = jnp.asarray(y0), jnp.asarray(T / n)
        for _ in range(n):
            y, _, _ = step(y, h)
        errs.append(np.max(np.abs(np.asarray(y) - exact)))
    slopes = np.diff(np.log(errs)) / np.log(0.5)
    assert np.all((slopes > 4.5) & (slopes < 6.0)), (errs, slopes)
    y1, _, _ = jax.jit(lambda y, h: rodas5_step(lambda z: -1e12 * z, y, h))(
        jnp.asarray([1.0, -2.0]), jnp.asarray(1.0))
    assert np.max(np.abs(np.asarray(y1))) < 1e-9


# ------------------------------------------------------------------ status (jaxdyn.RESULTS)


def _sphere_model(beta=1.0):
    eye = jnp.eye(3)
    return jaxdyn.SphereAttention(eye, eye, eye, beta)


def test_dopri5_max_steps_reports_max_steps_reached():
    """diffrax's own code passes through: a step budget that runs out is max_steps_reached,
    not nonfinite."""
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 8, 3)
    tr = jaxdyn.simulate(_sphere_model(), x0, t1=1.0, dt=0.01, method="dopri5", max_steps=3)
    assert not bool(tr.ok)
    assert int(tr.status) == jaxdyn.status_code("max_steps_reached")
    assert tr.names == "max_steps_reached"
    assert "max_steps" in tr.messages
    with pytest.raises(Exception, match="maximum number of solver steps"):
        jaxdyn.simulate(_sphere_model(), x0, t1=1.0, dt=0.01, method="dopri5", max_steps=3,
                        throw=True)
    # a successful run is successful and does not raise with throw=True: the same solve (one
    # program) from a fixed point of the flow (every particle at e1: the field vanishes, the
    # error estimate is 0 and the steps grow by diffrax's largest factor, 0.01, 0.1, then to
    # t1) finishes within the budget
    fixed = jnp.zeros_like(x0).at[:, 0].set(1.0)
    ok = jaxdyn.simulate(_sphere_model(), fixed, t1=1.0, dt=0.01, method="dopri5", max_steps=3,
                         throw=True)
    assert bool(ok.ok) and ok.names == "successful" and ok.messages.startswith("successful")


@pytest.mark.slow  # a batched Trajectory's names per member: test_simulation_composable.py::test_simulate_sde_under_vmap_over_keys_and_sigma; vmapped simulate's codes per member: test_hostile_library.py::test_simulate_reports_a_traced_negative_beta_of_multihead_attention
def test_vmapped_status_is_an_array_of_codes_with_messages():
    """A batch with a NaN weight in one member: one code per member, a message per member,
    no exception (the old str status raised on batched results)."""
    eye = jnp.eye(3)
    models = jaxdyn.stack_models([jaxdyn.SphereAttention(eye, eye, eye.at[0, 0].set(v), b)
                                  for b, v in ((1.0, 1.0), (1.5, jnp.nan), (2.0, 1.0))])
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 8, 3)
    tr = jax.vmap(lambda m: jaxdyn.simulate(m, x0, t1=0.2, dt=0.02, method="rk4"))(models)
    assert tr.status.shape == (3,)
    assert np.asarray(tr.ok).tolist() == [True, False, True]
    assert list(tr.names) == ["successful", "nonfinite", "successful"]
    assert list(jaxdyn.status_names(tr.result)) == list(tr.names)
    assert "NaN" in tr.messages[1] and tr.messages[0].startswith("successful: ")
    np.testing.assert_array_equal(np.asarray(jaxdyn.status_codes(tr)), np.asarray(tr.status))
    assert tr.counts() == {"successful": 2, "nonfinite": 1}


def test_traced_bad_x0_is_flagged_and_concrete_raises():
    model = _sphere_model()
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 8, 3)
    bad = x0.at[0, 0].set(jnp.nan)
    with pytest.raises(ValueError, match="finite"):
        jaxdyn.simulate(model, bad, t1=0.1, dt=0.01)
    run = jax.jit(lambda x: jaxdyn.simulate(model, x, t1=0.1, dt=0.01))
    assert run(bad).names == "invalid_input"
    assert run(2.0 * x0).names == "invalid_input"  # rows off the sphere
    assert run(x0).names == "successful"
    with pytest.raises(Exception, match="Invalid input"):
        jax.block_until_ready(
            jax.jit(lambda x: jaxdyn.simulate(model, x, t1=0.1, dt=0.01, throw=True).xs)(bad))


@pytest.mark.slow
def test_saveat_ending_before_t1_and_bad_saveat():
    # the adaptive methods saved t1's state under the last saveat time's label (and the
    # diffrax SDE methods ran out of steps): each frame is now the state at its own time
    eye = jnp.eye(3, dtype=jnp.float64)
    model = jaxdyn.SphereAttention(eye, eye, 0.5 * eye + 0.3 * jnp.tril(eye), 2.0)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 12, 3, jnp.float64)
    ref = jaxdyn.simulate(model, x0, t1=1.0, dt=0.01, saveat=[0.0, 0.25, 0.5], method="rk4")
    got = jaxdyn.simulate(model, x0, t1=1.0, dt=0.01, saveat=[0.0, 0.25, 0.5], method="dopri5",
                          rtol=1e-10, atol=1e-12)
    assert bool(got.ok)
    np.testing.assert_array_equal(np.asarray(got.ts), [0.0, 0.25, 0.5])
    np.testing.assert_allclose(np.asarray(got.xs), np.asarray(ref.xs), atol=1e-8)
    sde = jaxdyn.simulate_sde(model, x0, jax.random.PRNGKey(1), sigma=0.0, t1=1.0, dt=0.01,
                              saveat=[0.0, 0.25, 0.5], method="heun")
    assert bool(sde.ok), sde.messages
    np.testing.assert_allclose(np.asarray(sde.ts), [0.0, 0.25, 0.5], atol=1e-12)
    np.testing.assert_allclose(np.asarray(sde.xs), np.asarray(ref.xs), atol=1e-4)  # Heun vs RK4
    for bad in ([], [[0.1]]):
        with pytest.raises(ValueError, match="saveat must hold at least one time"):
            jaxdyn.simulate(model, x0, t1=1.0, dt=0.1, saveat=bad)
    with pytest.raises(ValueError, match="save_every must be an integer"):
        jaxdyn.simulate(model, x0, t1=1.0, dt=0.1, save_every=True)
    # x0 off the sphere under jit: flagged invalid_input by simulate_sde as by simulate
    off = x0.at[0].multiply(1.5)
    run = jax.jit(lambda x: jaxdyn.simulate_sde(model, x, jax.random.PRNGKey(1), sigma=0.1,
                                                t1=0.1, dt=0.05).status)
    assert int(run(off)) == jaxdyn.status_code("invalid_input")
    assert int(run(x0)) == jaxdyn.status_code("successful")
    # the traced check's tolerance is the concrete one's: float16 unit rows (~1e-3) are valid
    from jaxdyn.simulation._simulate import _x0_invalid

    x16 = jaxdyn.normalize(x0.astype(jnp.float16))
    assert not bool(_x0_invalid(model, x16, jnp.float16))
    assert bool(_x0_invalid(model, x16 * 1.05, jnp.float16))


def test_vmf_float32_at_large_kappa():
    # float32 (the default dtype): Wood's test at large κ written with 1 − x0 and 1 − w (x0
    # and w round to 1: from κ ~ 1e7 nothing was accepted and the loop never ended) and one
    # accept decision a draw (a sample marked done without its cosine sat on the equator)
    from scipy.special import ive

    mu = jnp.asarray([0.0, 0.0, 1.0], jnp.float32)
    # one program for the three κ (a traced float32 κ: the sampler casts κ to its dtype); 10⁴
    # samples: the spread's relative standard error is 1 %, its bound below 5 %
    vmf = jax.jit(lambda kappa: jaxdyn.sample_vmf(jax.random.PRNGKey(3), 10_000, mu, kappa))
    for kappa in (3e4, 1e6, 1e9):
        x = vmf(jnp.float32(kappa))
        assert x.dtype == jnp.float32
        x = np.asarray(x, np.float64)
        w = x @ np.asarray(mu, np.float64)
        assert w.min() > 0.99, (kappa, w.min())
        # the spread about μ, from the tangent part (1 − w rounds to 0 in float32 at large κ):
        # on S², 1 − w ~ Exp(κ) as κ → ∞, so E|x − ⟨x,μ⟩μ|² = E(1 − w²) ≈ 2(1 − A_3(κ))
        one_minus_a = 1 - ive(1.5, kappa) / ive(0.5, kappa)  # 1 − A_3(κ) ≈ 1/κ
        tang2 = (x[:, 0] ** 2 + x[:, 1] ** 2).mean()
        assert abs(tang2 / (2 * one_minus_a) - 1) < 0.05, (kappa, tang2, one_minus_a)
        assert np.mean(x[:, 0] == 0) < 1e-3  # none collapsed onto μ (95 % did at κ = 1e8)
    with pytest.raises(ValueError, match="mu must be a nonzero"):
        jaxdyn.sample_vmf(jax.random.PRNGKey(0), 3, np.zeros(3), 1.0)
    with pytest.raises(ValueError, match="kappa must be a finite number"):
        jaxdyn.sample_vmf(jax.random.PRNGKey(0), 3, mu, float("inf"))
