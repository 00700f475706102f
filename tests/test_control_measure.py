"""Measure-to-measure control: kernel, gradients, replays, statuses; slow: Gaussian, depth, step.

The slow cases: the Gaussian consistency with ``reach``, W2 against depth, the replay of
optimised controls at a finer step, and the gradient's error against Sinkhorn's threshold.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from _jaxpr import largest_array
import pytest

import jaxdyn
from jaxdyn.control import (
    MeasureControlOptions,
    default_controls,
    measure_control,
    measure_flow,
    measure_loss,
    moment_controls,
    replay,
)
from jaxdyn.kernels import attend
from jaxdyn.distances import w2_exact


def _sphere(rng, n, d=3):
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _perturbed(model, d, n_layers, rng, scale=0.3):
    c = default_controls(model, d, n_layers, jnp.float64)
    c = {k: v + scale * rng.standard_normal(v.shape) for k, v in c.items()}
    if model == "sphere":
        c["beta"] = jnp.abs(c["beta"]) + 0.5
    return c


@pytest.mark.parametrize("dtype,tol", [
    # float32 under -m slow (1.3 CPU-s); the blocked core's cotangents in float32 by default:
    # tests/test_blocked_vjp.py::test_sphere_attention_gradient_equals_dense[f32]
    pytest.param(jnp.float32, 2e-5, marks=pytest.mark.slow), (jnp.float64, 1e-12)])
def test_kernel_matches_dense_forward_and_reverse(dtype, tol):
    """The blocked kernel equals dense softmax attention, value and all four cotangents."""
    rng = np.random.default_rng(0)
    n, m, p, e = 37, 29, 3, 2  # sizes that are not multiples of the tiles
    q, k, v, c = (jnp.asarray(rng.standard_normal(s), dtype)
                  for s in [(n, p), (m, p), (m, e), (m,)])
    g = jnp.asarray(rng.standard_normal((n, e)), dtype)

    def dense(q, k, v, c):
        return jax.nn.softmax(q @ k.T + c[None], axis=1) @ v

    def both(q, k, v, c):  # values and cotangents of both, one program
        grad = lambda f: jax.grad(lambda *a: jnp.sum(f(*a) * g), argnums=(0, 1, 2, 3))  # noqa: E731
        blocked = lambda *a: attend(*a, 8, 5)  # noqa: E731
        return (blocked(q, k, v, c), dense(q, k, v, c), grad(blocked)(q, k, v, c),
                grad(dense)(q, k, v, c))

    out, ref, ga, gd = jax.jit(both)(q, k, v, c)
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)
    for a, b in zip(ga, gd):
        np.testing.assert_allclose(a, b, rtol=10 * tol, atol=10 * tol)


def test_kernel_reverse_pass_holds_no_n_by_n_array():
    """No array of the reverse pass's program is as large as N × N / 4."""
    # every intermediate of the reverse pass is at most a tile or a row stack
    n, blk = 600, 64
    x = jnp.ones((n, 3), jnp.float32)
    jaxpr = jax.make_jaxpr(jax.grad(lambda x: jnp.sum(attend(x, x, x, jnp.zeros((n,)), blk,
                                                            blk))))(x)

    assert largest_array(jaxpr) < n * n / 4


@pytest.mark.parametrize("model", ["sphere", pytest.param("euclidean", marks=pytest.mark.slow)])
def test_gradient_matches_central_differences(model):
    """Each control family against central differences, float64, relative 1e-6."""
    rng = np.random.default_rng(1)
    n, d, n_layers = 10, 3, 2
    x0, y = rng.standard_normal((n, d)), rng.standard_normal((n + 3, d)) + 0.5
    if model == "sphere":
        x0, y = _sphere(rng, n), _sphere(rng, n + 3)
    c = _perturbed(model, d, n_layers, rng)
    kw = dict(model=model, epsilon=0.05, sinkhorn_threshold=1e-13,
              sinkhorn_max_iterations=20000, cost="jump", cost_weight=0.1, steps_per_layer=2,
              q_block=4, k_block=4)

    def f(cc):
        return measure_loss(cc, x0, y, **kw)

    vg = jax.jit(jax.value_and_grad(f))  # one program for the gradient and the differences
    g = vg(c)[1]
    for name in c:
        v = np.asarray(c[name])
        direction = rng.standard_normal(v.shape)
        h = 1e-5
        up = dict(c, **{name: jnp.asarray(v + h * direction)})
        down = dict(c, **{name: jnp.asarray(v - h * direction)})
        fd = (float(vg(up)[0]) - float(vg(down)[0])) / (2 * h)
        an = float(jnp.sum(g[name] * direction))
        assert abs(fd - an) <= 1e-6 * abs(fd), (name, fd, an)


@pytest.mark.parametrize("model", ["sphere", pytest.param("euclidean", marks=pytest.mark.slow)])
def test_flow_equals_simulate_layer_by_layer(model):
    """The layer flow equals jaxdyn.simulate run layer by layer on jaxdyn's own models."""
    rng = np.random.default_rng(2)
    x0 = _sphere(rng, 40) if model == "sphere" else rng.standard_normal((40, 3))
    c = _perturbed(model, 3, 2, rng)
    a = measure_flow(c, x0, model=model, steps_per_layer=4)
    b = replay(c, x0, model=model, steps_per_layer=4)
    assert a.shape == (3, 40, 3)
    np.testing.assert_allclose(a, b, atol=1e-12)
    if model == "sphere":
        np.testing.assert_allclose(np.linalg.norm(a, axis=-1), 1.0, atol=1e-12)


def test_flow_runs_under_jit_and_vmap():
    """The flow under jit and vmap equals the single call."""
    rng = np.random.default_rng(3)
    x0 = jnp.asarray(rng.standard_normal((3, 20, 2)))
    c = _perturbed("euclidean", 2, 1, rng)
    out = jax.jit(jax.vmap(lambda x: measure_flow(c, x, steps_per_layer=1)[-1]))(x0)
    ref = measure_flow(c, x0[1], steps_per_layer=1)[-1]
    np.testing.assert_allclose(out[1], ref, atol=1e-12)


def test_moment_controls_are_the_layers_of_the_euclidean_model():
    """The moment controls are B = KᵀQ and A of the layer the time lies in."""
    rng = np.random.default_rng(4)
    c = _perturbed("euclidean", 2, 4, rng)
    mc = moment_controls(c, t1=2.0)
    l = 2  # t = 1.1 lies in layer 2 of [0, 2] cut into 4
    np.testing.assert_allclose(mc["B"](1.1), c["K"][l].T @ c["Q"][l], atol=1e-14)
    np.testing.assert_allclose(mc["A"](1.1), c["A"][l], atol=0)


@pytest.mark.slow
def test_measure_control_decreases_the_loss_and_reports_its_status():
    """The optimiser lowers the loss and W2; budget and non-finite starts have their statuses."""
    rng = np.random.default_rng(5)
    n = 24
    x0 = rng.standard_normal((n, 2))
    y = rng.standard_normal((n, 2)) * 0.5 + np.array([1.0, 0.0])
    opts = MeasureControlOptions(free=("A", "b", "V"), epsilon=0.05, adam_steps=10,
                                 lbfgs_steps=5, steps_per_layer=1, sinkhorn_threshold=1e-8)
    res = measure_control(x0, y, n_layers=2, model="euclidean", options=opts)
    hist = np.asarray(res.loss_history)
    assert np.isfinite(hist[0]) and res.loss < hist[0] / 3
    assert res.controls["A"].shape == (2, 2, 2) and res.xs.shape == (3, n, 2)
    # 5 L-BFGS iterations do not reach a stationary point: the budget ran out
    assert res.names == "not_converged" and int(res.stats["stop"]) == 2
    assert res.num_steps == 15
    w2 = w2_exact(np.asarray(res.xs[-1]), y).value
    assert w2 < w2_exact(x0, y).value
    # the same problem with a non-finite start: reported, not raised
    bad = measure_control(x0, y, n_layers=2, model="euclidean",
                          options=dataclasses.replace(opts, init={"A": np.full((2, 2, 2), 1e200)}))
    assert bad.names == "nonfinite" and bad.status == jaxdyn.status_code("nonfinite")


def test_host_checks_name_the_argument():
    """Concrete inputs are checked on the host; the message names the argument."""
    x = np.zeros((5, 3))
    with pytest.raises(ValueError, match="model"):
        measure_control(x, x, n_layers=2, model="torus")
    u = _sphere(np.random.default_rng(0), 5)
    with pytest.raises(ValueError, match="free"):
        measure_control(u, u, n_layers=2, model="sphere",
                        options=MeasureControlOptions(free=("A",)))
    with pytest.raises(ValueError, match="unit rows"):
        measure_control(x + 2.0, x + 2.0, n_layers=2, model="sphere")
    with pytest.raises(ValueError, match="target"):
        measure_control(x, np.zeros((5, 2)), n_layers=2)
    with pytest.raises(ValueError, match="n_layers"):
        measure_control(x, x, n_layers=0)
    with pytest.raises(ValueError, match="one L"):
        measure_flow({"Q": np.zeros((2, 3, 3)), "V": np.zeros((3, 3, 3))}, x)
    with pytest.raises(ValueError, match="must have shape"):
        measure_flow({"Q": np.zeros((2, 3, 2))}, x)


def _gaussian_problem(n=256, pieces=4):
    rng = np.random.default_rng(0)
    m1, S1 = np.array([1.0, 0.5]), np.array([[0.5, 0.2], [0.2, 1.5]])
    x0 = rng.standard_normal((n, 2))
    y = m1 + rng.standard_normal((n, 2)) @ np.linalg.cholesky(S1).T
    return x0, y, m1, S1


@pytest.mark.slow
def test_gaussian_particle_optimum_beats_transferred_reach_and_replays_on_the_moment_ode():
    """Gaussians: the particle optimum beats reach's transfer; the moment ODE lands on ν.

    μ0 = N(0, I), ν = N(m1, S1) sampled: the particle-level optimum (started from reach's
    controls) reaches the target sample at least as well in exact W2 as reach's controls
    transferred to the particles, and its controls drive the moment ODE to within the sampling
    error of (m1, S1).
    """
    from jaxdyn.control import reach, transfer_particles
    from jaxdyn.gaussian import solve_moments

    n, pieces = 256, 4
    x0, y, m1, S1 = _gaussian_problem(n, pieces)
    r = reach(np.zeros(2), np.eye(2), m1, S1, t1=1.0, n_pieces=pieces)
    assert r.names == "successful"
    w_reach = w2_exact(np.asarray(transfer_particles(r.controls, x0, t1=1.0)[-1]), y).value
    c = r.controls
    init = {"Q": np.asarray(c["B"].values), "K": np.broadcast_to(np.eye(2), (pieces, 2, 2)),
            "V": np.asarray(c["V"].values), "A": np.asarray(c["A"].values),
            "b": np.asarray(c["b"].values)}
    opts = MeasureControlOptions(init=init, epsilon=0.005, adam_steps=0, lbfgs_steps=100,
                                 steps_per_layer=4, sinkhorn_threshold=1e-7)
    res = measure_control(x0, y, n_layers=pieces, model="euclidean", options=opts)
    w_opt = w2_exact(np.asarray(res.xs[-1]), y).value
    assert w_opt <= w_reach
    ms = solve_moments(np.zeros(2), np.eye(2), t1=1.0, **moment_controls(res.controls, t1=1.0))
    assert ms.names == "successful"
    # two independent samples (x0 and y) of N points: 3 standard deviations of their combined
    # sampling error of the covariance (Frobenius) and of the mean
    sd_cov = np.sqrt(2 * (np.trace(S1) ** 2 + np.trace(S1 @ S1)) / n)
    sd_mean = np.sqrt(2 * np.trace(S1) / n)
    assert np.linalg.norm(np.asarray(ms.cov_final) - S1) <= 3 * sd_cov
    assert np.linalg.norm(np.asarray(ms.mean_final) - m1) <= 3 * sd_mean


def _depth_sweep(problem, layers, n=96):
    """W2 reached at each depth, each depth started from the last one's optimum (repeated)."""
    from jaxdyn.control import repeat_layers
    from jaxdyn.experiments.control.run import clouds, resampled_target

    pc = dict(problem=problem, seed=0, n_particles=n,
              target=dict(clusters=2 if problem == "gaussian_to_mixture" else 3,
                          separation=2.0, spread=0.3, kappa=20.0))
    x0, y = clouds(pc)
    model = "euclidean" if problem == "gaussian_to_mixture" else "sphere"
    # R^2: a small ∫|θ|² keeps the weights where 16 RK4 steps resolve the flow
    cost = dict(cost="energy", cost_weight=1e-3) if model == "euclidean" else {}
    out, prev, prev_L = {}, None, None
    for L in layers:
        s = max(2, 16 // L)  # 16 RK4 steps over [0, T] at least, 2 a layer at least
        kw = dict(epsilon=0.01, steps_per_layer=s, seed=0, lbfgs_steps=40, **cost)
        if prev is None:
            opts = MeasureControlOptions(epsilon_start=0.1, adam_steps=80, **kw)
        else:
            opts = MeasureControlOptions(init=repeat_layers(prev, L // prev_L),
                                         epsilon_start=0.01, adam_steps=30, adam_lr=0.01, **kw)
        r = measure_control(x0, y, n_layers=L, model=model, options=opts)
        assert r.names in ("successful", "not_converged"), r.message
        prev, prev_L = r.controls, L
        same = measure_loss(r.controls, x0, y, model=model, epsilon=0.01, steps_per_layer=s,
                            free=())
        fine = measure_loss(r.controls, x0, y, model=model, epsilon=0.01,
                            steps_per_layer=4 * s, free=())
        out[L] = (w2_exact(np.asarray(r.xs[-1]), y).value, float(same), float(fine))
        print(f"{problem} N = {n} L = {L}: W2 {out[L][0]:.4f}, S_eps {same:.3e} (4x steps "
              f"{float(fine):.3e}), {r.names}, stop {int(r.stats['stop'])}, "
              f"{int(r.stats['iterations'])} iterations")
    floor = w2_exact(y, resampled_target(pc)).value
    print(f"{problem} N = {n}: start {w2_exact(x0, y).value:.4f}, floor W2(y, y') {floor:.4f}")
    return w2_exact(x0, y).value, out


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["gaussian_to_mixture", "sphere_clusters"])
def test_w2_reached_falls_with_depth_and_survives_a_finer_step(problem):
    """W2 reached falls with depth; a replay at 4x the steps gives the same divergence.

    A Gaussian onto two clusters in R^2, the uniform measure on S^2 onto three vMF clusters:
    the W2 reached falls with the depth L = 1, 2, 4, 8, 16, and the optimised controls replayed
    at 4x the steps give the same divergence (the optimisation does not exploit the steps).
    """
    w_start, out = _depth_sweep(problem, (1, 2, 4, 8, 16))
    w = [out[L][0] for L in (1, 2, 4, 8, 16)]
    assert w[0] < w_start
    assert w[-1] < 0.6 * w[0]
    for a, b in zip(w, w[1:]):
        assert b <= 1.1 * a  # falls with L (up to the optimiser's 10 % spread)
    slope = np.polyfit(np.log([1, 2, 4, 8, 16]), np.log(w), 1)[0]  # least squares, 5 points
    print(f"{problem}: W2 against L, log-log slope {slope:.3f}")
    assert slope < -0.15
    for L, (_, same, fine) in out.items():
        assert abs(fine - same) <= 0.05 * same + 1e-3, (L, same, fine)


@pytest.mark.slow
def test_gradient_error_is_within_the_sinkhorn_threshold():
    """The loss's gradient at Sinkhorn threshold τ is within τ (relative) of the converged
    one, and tighter with τ: the control kind's default (τ = 1e-4) rests on this. A problem
    shaped like control_gaussian_to_mixture (R², N(0, I) to two clusters, ε = 0.01)."""
    rng = np.random.default_rng(3)
    n = 48
    x0 = rng.standard_normal((n, 2))
    centres = np.array([[2.0, 0.0], [-2.0, 0.0]])
    y = centres[rng.integers(0, 2, n)] + 0.3 * rng.standard_normal((n, 2))
    c = _perturbed("euclidean", 2, 2, rng)

    def grad(tau):
        g = jax.grad(lambda c: measure_loss(c, x0, y, epsilon=0.01, steps_per_layer=2,
                                            sinkhorn_threshold=tau,
                                            sinkhorn_max_iterations=200_000))(c)
        return np.concatenate([np.ravel(g[k]) for k in sorted(g)])

    ref = grad(1e-10)
    err = {tau: np.linalg.norm(grad(tau) - ref) / np.linalg.norm(ref) for tau in (1e-3, 1e-5)}
    assert err[1e-3] <= 1e-3 and err[1e-5] <= 1e-5, err
    assert err[1e-5] < err[1e-3] / 10, err
