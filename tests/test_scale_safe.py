"""The W2 functions at any representable scale: homogeneity (W2(s x, s y) = s W2(x, y)) and
translation invariance at scales 1e-20 and 1e20 (1e30 where the dtype holds the values) and
shifts of 1e6, in float32 and float64; a value that overflows is ``nonfinite``; half-precision
input is computed in float32 with a warning; point masses are answered in closed form (no bias,
no solve), also under jit, vmap and grad."""

import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdyn import RESULTS
from jaxdyn.control._measure import measure_loss
from jaxdyn.distances import bures_w2, bures_w2_squared, w2, w2_coupling, w2_exact, w2_sinkhorn

#: relative agreement of a rescaled call with the unit call times the scale
RTOL = {np.float32: 1e-5, np.float64: 1e-10}
DTYPES = [np.float32, np.float64]
IDS = ["f32", "f64"]


def _clouds(n=32, m=32, d=2, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)), 0.7 * rng.standard_normal((m, d)) + 0.5


def _scales(dtype):
    # 1e30 in float32: the points are representable (W2 too), W2² is not
    return (1e-20, 1e20, 1e30)


def _ok(sol):
    return bool(np.all(np.asarray(sol.ok)))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
# the online and multiscale geometries under -m slow (the online solve equals the dense one by
# default: tests/test_distances.py::test_sinkhorn_online_geometry_equals_dense)
@pytest.mark.parametrize("path", ["dense", pytest.param("online", marks=pytest.mark.slow),
                                  pytest.param("multiscale", marks=pytest.mark.slow)])
def test_sinkhorn_is_homogeneous_at_extreme_scales(dtype, path):
    x, y = _clouds()
    opts = {"dense": dict(batch_size=None, multiscale=False),
            "online": dict(batch_size=8, multiscale=False),
            "multiscale": dict(multiscale=True)}[path]
    ref = w2_sinkhorn(x.astype(dtype), y.astype(dtype), **opts)
    assert _ok(ref)
    for s in _scales(dtype):
        sol = w2_sinkhorn((s * x).astype(dtype), (s * y).astype(dtype), **opts)
        assert sol.result == RESULTS.successful, (s, sol.result)
        assert float(sol.value) / s == pytest.approx(float(ref.value), rel=RTOL[dtype])
        # ε (a squared quantity) in the user's units where the dtype holds it
        eps = float(ref.epsilon) * s * s
        if float(np.finfo(dtype).tiny) < eps < float(np.finfo(dtype).max):
            assert float(sol.epsilon) == pytest.approx(eps, rel=RTOL[dtype])
            assert float(sol.bias_bound) == pytest.approx(float(ref.bias_bound) * s * s,
                                                          rel=RTOL[dtype])


@pytest.mark.slow_dtype("f32")  # float32 at extreme scales by default: test_sinkhorn_is_homogeneous_at_extreme_scales[dense-f32]
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_sinkhorn_fixed_epsilon_is_rescaled_with_the_clouds(dtype):
    # a user's ε is absolute (squared units): ε s² at scale s is the unit problem at ε
    x, y = _clouds()
    eps = 0.01
    ref = w2_sinkhorn(x.astype(dtype), y.astype(dtype), epsilon=eps)
    scales = (1e-15, 1e15) if dtype == np.float32 else (1e-20, 1e20, 1e30)
    for s in scales:
        sol = w2_sinkhorn((s * x).astype(dtype), (s * y).astype(dtype), epsilon=eps * s * s)
        assert sol.result == RESULTS.successful
        assert float(sol.value) / s == pytest.approx(float(ref.value), rel=RTOL[dtype])
        assert float(sol.epsilon) == pytest.approx(eps * s * s, rel=RTOL[dtype])
        assert float(sol.divergence) / s / s == pytest.approx(float(ref.divergence),
                                                              rel=RTOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_exact_and_coupling_are_homogeneous(dtype):
    x, y = _clouds()
    ref_e = float(w2_exact(x.astype(dtype), y.astype(dtype)).value)
    ref_c = float(w2_coupling(x.astype(dtype), y.astype(dtype)).value)
    for s in _scales(dtype):
        xs, ys = (s * x).astype(dtype), (s * y).astype(dtype)
        e, c = w2_exact(xs, ys), w2_coupling(xs, ys)
        assert e.result == RESULTS.successful and c.result == RESULTS.successful
        assert float(e.value) / s == pytest.approx(ref_e, rel=RTOL[dtype])
        assert float(c.value) / s == pytest.approx(ref_c, rel=RTOL[dtype])
        assert float(w2(xs, ys).value) / s == pytest.approx(ref_e, rel=RTOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_bures_is_homogeneous(dtype):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    S0, S1 = a @ a.T + 0.1 * np.eye(3), b @ b.T + 0.2 * np.eye(3)
    m0, m1 = rng.standard_normal(3), rng.standard_normal(3)
    cast = lambda *v: [np.asarray(u, dtype) for u in v]  # noqa: E731
    ref = bures_w2(*cast(m0, S0, m1, S1))
    ref_sq = float(bures_w2_squared(*cast(m0, S0, m1, S1)))
    # the covariances scale as s²: 1e20 is the largest float32 holds (1e40 it does not)
    scales = (1e-15, 1e15) if dtype == np.float32 else (1e-20, 1e20, 1e30)
    for s in scales:
        sol = bures_w2(*cast(s * m0, s * s * S0, s * m1, s * s * S1))
        assert sol.result == RESULTS.successful
        assert float(sol.value) / s == pytest.approx(float(ref.value), rel=RTOL[dtype] * 10)
        sq = float(bures_w2_squared(*cast(s * m0, s * s * S0, s * m1, s * s * S1)))
        assert sq / s / s == pytest.approx(ref_sq, rel=RTOL[dtype] * 10)
    # a translation of both means by 1e6 changes nothing (exact up to the means' rounding)
    t = 1e6
    mt0, mt1 = cast(m0 + t, m1 + t)
    sol = bures_w2(mt0, *cast(S0), mt1, *cast(S1))
    ref_t = bures_w2(mt0 - dtype(t), *cast(S0), mt1 - dtype(t), *cast(S1))
    assert float(sol.value) == pytest.approx(float(ref_t.value), rel=RTOL[dtype] * 10)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_translation_by_1e6_keeps_the_digits(dtype):
    # the reference is the same rounded points shifted back (an exact subtraction)
    x, y = _clouds()
    t = dtype(1e6)
    xt, yt = x.astype(dtype) + t, y.astype(dtype) + t
    xb, yb = xt - t, yt - t
    for f in (lambda a, b: w2_sinkhorn(a, b, epsilon=0.01), w2_exact, w2_coupling):
        got, ref = f(xt, yt), f(xb, yb)
        assert got.result == RESULTS.successful
        assert float(got.value) == pytest.approx(float(ref.value), rel=RTOL[dtype])


def test_overflowing_value_is_nonfinite_not_successful():
    # float32 points at ±3e38: W2 = 6e38 is not a float32
    x = np.full((4, 2), 3e38, np.float32)
    y = -x
    for sol in (w2_sinkhorn(x, y), w2_coupling(x, y),
                bures_w2(x[0], np.eye(2, dtype=np.float32), y[0], np.eye(2, dtype=np.float32))):
        assert sol.result == RESULTS.nonfinite, sol.method
        assert not np.isfinite(float(sol.value))
    # W2 representable, W2² not: the value is right, the status follows it
    sol = w2_sinkhorn(np.float32(1e30) * _clouds()[0].astype(np.float32),
                      np.float32(1e30) * _clouds()[1].astype(np.float32))
    assert sol.result == RESULTS.successful and np.isfinite(float(sol.value))
    assert float(sol.divergence) == math.inf


@pytest.mark.parametrize("half", [jnp.float16, jnp.bfloat16], ids=["f16", "bf16"])
def test_half_precision_is_computed_in_float32_with_a_warning(half):
    x, y = _clouds()
    x16, y16 = jnp.asarray(300 * x, half), jnp.asarray(300 * y, half)
    x32, y32 = x16.astype(jnp.float32), y16.astype(jnp.float32)
    with pytest.warns(UserWarning, match="computed in float32"):
        sol = w2_sinkhorn(x16, y16)
    assert sol.value.dtype == jnp.float32 and sol.result == RESULTS.successful
    assert float(sol.value) == float(w2_sinkhorn(x32, y32).value)
    # the true W2 of these points, not 0: within the bias of the solve
    assert float(sol.value) == pytest.approx(float(w2_exact(x32, y32).value), rel=0.02)
    with pytest.warns(UserWarning, match="computed in float32"):
        c = w2_coupling(x16, y16)
    assert c.value.dtype == jnp.float32
    assert float(c.value) == pytest.approx(float(w2_coupling(x32, y32).value), rel=1e-6)
    S = jnp.eye(2, dtype=half)
    with pytest.warns(UserWarning, match="computed in float32"):
        b = bures_w2(x16[0], 300 * S, y16[0], S)
    assert b.value.dtype == jnp.float32 and b.result == RESULTS.successful
    # the exact solver computes in float64 on the host whatever the input dtype
    assert float(w2_exact(x16, y16).value) == pytest.approx(float(w2_exact(x32, y32).value))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_point_masses_in_closed_form(dtype):
    x, _ = _clouds()
    x = x.astype(dtype)
    q = np.array([3.0, -1.0], dtype)
    yq = np.tile(q, (20, 1))
    want = math.sqrt(np.mean(np.sum((x.astype(np.float64) - q) ** 2, 1)))
    # (with multiscale=True too: the closed form answers before any solver runs)
    for sol in (w2_sinkhorn(x, yq), w2_sinkhorn(yq, x), w2_sinkhorn(x, yq, multiscale=True)):
        assert sol.result == RESULTS.successful
        assert float(sol.value) == pytest.approx(want, rel=RTOL[dtype])
        assert float(sol.bias_bound) == 0.0 and float(sol.epsilon) == 0.0
        assert int(sol.stats["num_steps"]) == 0
    assert float(w2_exact(x, yq[:32].repeat(2, 0)[:32]).value) == pytest.approx(want,
                                                                                rel=RTOL[dtype])
    # two point masses, far away and at large scale: |p - q| (the clouds' sizes above, 32 and 20
    # points: the programs of the first solve)
    p = np.zeros((len(x), 2), dtype)
    for s in (1.0, 1e20):
        r = w2_sinkhorn(s * p, (s * np.tile(np.array([3.0, 4.0]), (len(yq), 1))).astype(dtype))
        assert r.result == RESULTS.successful
        assert float(r.value) == pytest.approx(5.0 * s, rel=RTOL[dtype])
    # identical point masses: 0 (20 against 32 points: the programs of the second solve)
    assert float(w2_sinkhorn(yq, np.tile(q, (len(x), 1))).value) == 0.0


def test_large_point_masses_answer_at_once():
    # 10^5 points each: two point masses, W2 = 5 (no solve: far below a second of work)
    x = np.zeros((100_000, 2), np.float32)
    t0 = time.perf_counter()
    sol = w2_sinkhorn(x, x + np.array([3.0, 4.0], np.float32))
    assert float(sol.value) == 5.0 and sol.result == RESULTS.successful
    assert float(w2_exact(x, x + np.array([3.0, 4.0], np.float32)).value) == 5.0
    assert time.perf_counter() - t0 < 60


def _solve(a, b, eps):
    return w2_sinkhorn(a, b, epsilon=eps, threshold=1e-9)


def _solve_and_gradients(a, b, eps):
    return _solve(a, b, eps), jax.grad(lambda a, b: _solve(a, b, eps).divergence,
                                       argnums=(0, 1))(a, b)


#: jit of vmap of the solve and the gradients of its divergence: one compiled program for
#: the two tests below (three members of 20 and 16 points in R², ε traced a member)
_RUN = jax.jit(jax.vmap(_solve_and_gradients))
_N, _M = 20, 16


@pytest.mark.slow  # 9.4 CPU-s (one jit-vmap-grad program); not in the default suite: traced point masses in closed form (concrete ones: test_point_masses_in_closed_form; Sinkhorn under jit and vmap: test_distances.py::test_sinkhorn_result_is_a_pytree_for_jit_and_vmap)
def test_point_mass_traced_jit_vmap_grad():
    # one program: jit of vmap of value-and-grad, over members with a point mass y, a point
    # mass x, and two spread clouds
    x, y = _clouds(n=_N, m=_M)
    q, p = np.array([3.0, -1.0]), np.array([-2.0, 0.5])
    xs = np.stack([x, np.tile(p, (_N, 1)), x])
    ys = np.stack([np.tile(q, (_M, 1)), y, y])
    sols, (gx, gy) = _RUN(xs, ys, np.full(3, 0.05))
    assert np.all(np.isfinite(gx)) and np.all(np.isfinite(gy))
    assert bool(np.all(np.asarray(sols.ok)))
    # the point masses: closed form, no bias, and the gradient 2/N (x_i − q) (y a point mass)
    for k, want in ((0, np.mean(np.sum((x - q) ** 2, 1))), (1, np.mean(np.sum((y - p) ** 2, 1)))):
        assert float(sols.divergence[k]) == pytest.approx(want, rel=1e-12)
        assert float(sols.bias_bound[k]) == 0.0 and float(sols.epsilon[k]) == 0.0
    np.testing.assert_allclose(gx[0], 2.0 / _N * (x - q), rtol=1e-12)
    np.testing.assert_allclose(gy[0], 2.0 / _M * (q - x.mean(0)) * np.ones((_M, 2)), rtol=1e-10)
    np.testing.assert_allclose(gx[1], 2.0 / _N * (p - y.mean(0)) * np.ones((_N, 2)), rtol=1e-10)
    # the spread member is the eager solve's (concrete point masses take no solve at all)
    eager = _solve(x, y, 0.05)
    assert float(sols.value[2]) == pytest.approx(float(eager.value), rel=1e-8)
    one = _solve(x, ys[0], 0.05)
    assert float(one.value) == pytest.approx(float(sols.value[0]), rel=1e-12)
    assert int(one.stats["num_steps"]) == 0


@pytest.mark.slow  # the program of the test above; not in the default suite: gradients at extreme scales (the values: test_sinkhorn_is_homogeneous_at_extreme_scales, test_sinkhorn_fixed_epsilon_is_rescaled_with_the_clouds)
def test_scaled_path_under_jit_vmap_grad():
    # one program over the scales 1e-20, 1, 1e20 (ε scaled with each): the values scale as s,
    # the gradients of W2² as s (that of s² S_ε(x/s, y/s)); the program is
    # test_point_mass_traced_jit_vmap_grad's
    x, y = _clouds(n=_N, m=_M)
    scales = np.array([1e-20, 1.0, 1e20])
    sols, (g, _) = _RUN(scales[:, None, None] * x, scales[:, None, None] * y,
                        0.05 * scales ** 2)
    assert bool(np.all(np.asarray(sols.ok)))
    np.testing.assert_allclose(np.asarray(sols.value) / scales, float(sols.value[1]), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(sols.divergence) / scales ** 2,
                               float(sols.divergence[1]), rtol=1e-10)
    for k in (0, 2):
        np.testing.assert_allclose(np.asarray(g[k]) / scales[k], g[1], rtol=1e-8, atol=1e-12)
    unit = _solve(x, y, 0.05)
    assert float(sols.value[1]) == pytest.approx(float(unit.value), rel=1e-10)
    # coupling and Bures under jit and grad at scale
    s = 1e20
    c = jax.jit(w2_coupling)(s * x[:16], s * y)
    assert float(c.value) / s == pytest.approx(float(w2_coupling(x[:16], y).value), rel=1e-12)
    gc = jax.grad(lambda a: w2_coupling(a, s * y).divergence)(jnp.asarray(s * x[:16]))
    np.testing.assert_allclose(np.asarray(gc) / s, 2 / 16 * (x[:16] - y), rtol=1e-10)
    gb = jax.grad(lambda m: bures_w2_squared(m, s * s * jnp.eye(2), jnp.zeros(2),
                                             s * s * jnp.eye(2)))(jnp.array([s, 0.0]))
    np.testing.assert_allclose(gb, [2 * s, 0.0], rtol=1e-10, atol=1e-6 * s)


@pytest.mark.slow_dtype("f64")  # one compiled program a dtype: f32 by default, f64 under -m slow
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_measure_loss_is_homogeneous(dtype):
    # Q = V = 0: the flow is the identity, the loss S_ε(x0, target); ε in squared units
    x, y = _clouds(n=16, m=12)
    ctl = {"Q": np.zeros((1, 2, 2)), "V": np.zeros((1, 2, 2))}
    ref = float(measure_loss(ctl, x.astype(dtype), y.astype(dtype), epsilon=0.05))
    scales = (1e-15, 1e15) if dtype == np.float32 else (1e-20, 1e20, 1e30)
    for s in scales:
        got = float(measure_loss(ctl, (s * x).astype(dtype), (s * y).astype(dtype),
                                 epsilon=0.05 * s * s))
        assert got / s / s == pytest.approx(ref, rel=RTOL[dtype] * 10)
    t = dtype(1e6)
    xt, yt = x.astype(dtype) + t, y.astype(dtype) + t
    got = float(measure_loss(ctl, xt, yt, epsilon=0.05))
    assert got == pytest.approx(float(measure_loss(ctl, xt - t, yt - t, epsilon=0.05)),
                                rel=RTOL[dtype] * 10)
    if dtype == np.float64:
        g1 = jax.grad(lambda a: measure_loss(ctl, a, y, epsilon=0.05))(jnp.asarray(x))
        s = 1e20
        gs = jax.grad(lambda a: measure_loss(ctl, a, s * y, epsilon=0.05 * s * s))(
            jnp.asarray(s * x))
        np.testing.assert_allclose(np.asarray(gs) / s, g1, rtol=1e-8, atol=1e-14)


def test_measure_loss_half_precision_warns():
    # the sizes of test_measure_loss_is_homogeneous: its float32 program (the input widened)
    x, y = _clouds(n=16, m=12)
    ctl = {"Q": np.zeros((1, 2, 2)), "V": np.zeros((1, 2, 2))}
    with pytest.warns(UserWarning, match="computed in float32"):
        j = measure_loss(ctl, jnp.asarray(x, jnp.float16), y, epsilon=0.05)
    assert j.dtype == jnp.float32 and np.isfinite(float(j))
