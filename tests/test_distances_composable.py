"""The W2 family under JAX's transformations: ``w2_sinkhorn``, ``w2_coupling``, ``bures_w2`` (and
``w2`` with those methods) run under ``jax.jit`` and ``jax.vmap`` with traced inputs and
differentiate (checked against central finite differences in float64); ``w2_exact`` refuses
traced input with a clear error; traced options out of range are flagged ``invalid_input``;
the bias bound of every method holds against the exact assignment."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from _references import sinkhorn_divergence_gradient
from conftest import tol
from jaxdyn.distances import (
    W2Solution,
    bures_w2,
    bures_w2_squared,
    w2,
    w2_coupling,
    w2_exact,
    w2_sinkhorn,
)


def _clouds(n=40, m=30, d=2, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    y = 0.8 * rng.standard_normal((m, d)) + 0.5
    return jnp.asarray(x, dtype), jnp.asarray(y, dtype)


def _fd(f, x, h, entries):
    """Central differences of the scalar f at x along the given (i, j) entries."""
    out = []
    for i, j in entries:
        e = np.zeros(x.shape)
        e[i, j] = h
        out.append((float(f(x + e)) - float(f(x - e))) / (2 * h))
    return np.array(out)


# a fixed ε and a tight tolerance: S_ε as a smooth function of the points
TIGHT = dict(epsilon=0.05, threshold=1e-11, max_iterations=100_000)


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [None, 8], ids=["dense", "online"])
def test_sinkhorn_gradient_matches_finite_differences(batch_size):
    x, y = _clouds()
    f = lambda a, b: w2_sinkhorn(a, b, batch_size=batch_size, **TIGHT).divergence  # noqa: E731
    gx = np.asarray(jax.grad(f, argnums=0)(x, y))
    gy = np.asarray(jax.grad(f, argnums=1)(x, y))
    entries = [(0, 0), (3, 1), (17, 0), (29, 1), (39, 0)]
    fdx = _fd(lambda a: f(a, y), np.asarray(x), 1e-5, entries)
    fdy = _fd(lambda b: f(x, b), np.asarray(y), 1e-5, entries[:4])
    got_x = np.array([gx[i, j] for i, j in entries])
    got_y = np.array([gy[i, j] for i, j in entries[:4]])
    np.testing.assert_allclose(got_x, fdx, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got_y, fdy, rtol=1e-6, atol=1e-9)
    if batch_size is not None:
        return
    # forward mode agrees with reverse mode along a direction
    v = np.random.default_rng(1).standard_normal(x.shape)
    _, tangent = jax.jvp(lambda a: f(a, y), (x,), (jnp.asarray(v),))
    assert float(tangent) == pytest.approx(float(np.sum(gx * v)), rel=1e-9)


@pytest.mark.slow
def test_sinkhorn_value_gradient_and_float32():
    # the gradient of W2 = sqrt(S) is that of S over 2 W2; the gradient of S in float64 and in
    # float32 against the envelope-theorem gradient of a NumPy Sinkhorn (tests/_references.py)
    x, y = _clouds()
    ref = sinkhorn_divergence_gradient(np.asarray(x), np.asarray(y), TIGHT["epsilon"])
    sol = w2_sinkhorn(x, y, **TIGHT)
    g_val = np.asarray(jax.grad(lambda a: w2_sinkhorn(a, y, **TIGHT).value)(x))
    g_div = np.asarray(jax.grad(lambda a: w2_sinkhorn(a, y, **TIGHT).divergence)(x))
    np.testing.assert_allclose(g_div, ref, rtol=0, atol=1e-6 * np.abs(ref).max())
    np.testing.assert_allclose(g_val, g_div / (2 * float(sol.value)), rtol=1e-9, atol=1e-14)
    x32, y32 = x.astype(jnp.float32), y.astype(jnp.float32)
    g32 = np.asarray(jax.grad(
        lambda a: w2_sinkhorn(a, y32, epsilon=0.05, threshold=1e-5).divergence)(x32))
    assert g32.dtype == np.float32
    np.testing.assert_allclose(g32, ref, rtol=0, atol=2e-3 * np.abs(ref).max())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sinkhorn_under_jit_equals_the_concrete_call_and_the_exact_value(dtype):
    x, y = _clouds(n=60, m=60, d=3, seed=2, dtype=dtype)
    ref = w2_sinkhorn(x, y)  # the default ε rule
    jitted = jax.jit(lambda a, b: w2_sinkhorn(a, b))(x, y)
    assert isinstance(jitted, W2Solution) and jitted.names == "successful"
    assert jitted.value.dtype == dtype
    assert float(jitted.value) == pytest.approx(float(ref.value), rel=tol(dtype, 1e-5, 1e-12))
    assert int(jitted.num_steps) == int(ref.num_steps)
    exact = float(w2_exact(np.asarray(x), np.asarray(y)).value)
    assert abs(float(jitted.value) / exact - 1) < 0.02
    assert abs(float(jitted.divergence) - exact ** 2) <= float(jitted.bias_bound)


@pytest.mark.slow
def test_sinkhorn_under_vmap_is_per_member():
    # a batch of clouds, one of them with a NaN: one code per member, the others unaffected
    x, y = _clouds(n=30, m=20, seed=3)
    xs = jnp.stack([x, x + 0.2, x.at[0, 0].set(jnp.nan), 1.3 * x])
    res = jax.vmap(lambda a: w2_sinkhorn(a, y))(xs)
    assert res.value.shape == (4,) and res.stats["epsilons"].shape == (4, 8)
    assert list(res.names) == ["successful", "successful", "nonfinite", "successful"]
    for k in (0, 1, 3):
        one = w2_sinkhorn(xs[k], y)
        assert float(res.value[k]) == pytest.approx(float(one.value), rel=1e-9)
        assert float(res.epsilon[k]) == pytest.approx(float(one.epsilon), rel=1e-9)
    assert math.isnan(float(res.value[2]))
    # a vmapped (traced) ε: each member solved at its own ε
    eps = jnp.asarray([0.3, 0.1, 0.03])
    byeps = jax.vmap(lambda e: w2_sinkhorn(x, y, epsilon=e))(eps)
    for k in range(3):
        assert float(byeps.epsilon[k]) == pytest.approx(float(eps[k]), rel=1e-12)
        one = w2_sinkhorn(x, y, epsilon=float(eps[k]))
        assert float(byeps.divergence[k]) == pytest.approx(float(one.divergence), rel=1e-9)


@pytest.mark.slow
def test_traced_options_out_of_range_are_flagged_and_concrete_ones_raise():
    x, y = _clouds(n=20, m=20, seed=4)
    bad = jax.jit(lambda e: w2_sinkhorn(x, y, epsilon=e))(-1.0)
    assert bad.names == "invalid_input" and math.isnan(float(bad.value))
    bad = jax.jit(lambda r: w2_sinkhorn(x, y, rel_epsilon=r))(jnp.nan)
    assert bad.names == "invalid_input"
    with pytest.raises(ValueError, match="epsilon must be a positive number"):
        w2_sinkhorn(x, y, epsilon=-1.0)
    with pytest.raises(ValueError, match="epsilon_floor must be a positive number"):
        w2_sinkhorn(x, y, epsilon_floor=0.0)
    with pytest.raises(ValueError, match="multiscale=True needs concrete clouds"):
        jax.jit(lambda a: w2_sinkhorn(a, y, multiscale=True))(x)
    # throw=True under jit: raised when the program runs
    with pytest.raises(Exception, match="tolerance"):
        jax.block_until_ready(jax.jit(
            lambda a: w2_sinkhorn(a, y, max_iterations=3, max_rounds=1, throw=True))(x))


@pytest.mark.slow
def test_identical_point_clouds_and_degenerate_input_under_jit():
    # all points at one place: W2 = 0 without a solve; a NaN: nonfinite
    z = jnp.ones((5, 2))
    res = jax.jit(lambda a, b: w2_sinkhorn(a, b))(z, z)
    assert res.names == "successful" and float(res.value) == 0.0
    assert int(res.stats["num_rounds"]) == 0
    g = jax.grad(lambda a: w2_sinkhorn(a, z).divergence)(z)
    assert np.all(np.asarray(g) == 0.0)


def test_exact_refuses_traced_input():
    x, y = _clouds(n=10, m=10)
    with pytest.raises(TypeError, match="does not compose with jax.jit"):
        jax.jit(w2_exact)(x, y)
    with pytest.raises(TypeError, match="does not compose"):
        jax.jit(lambda a, b: w2(a, b))(x, y)


def test_coupling_jit_vmap_grad():
    x, y = _clouds(n=25, m=25, d=3, seed=5)
    res = jax.jit(w2_coupling)(x, y)
    c = float(res.value)
    assert c == pytest.approx(math.sqrt(np.mean(np.sum((np.asarray(x) - np.asarray(y)) ** 2, 1))),
                              rel=1e-12)
    # d C / d x = (x - y) / (N C), in closed form
    g = np.asarray(jax.grad(lambda a: w2_coupling(a, y).value)(x))
    np.testing.assert_allclose(g, (np.asarray(x) - np.asarray(y)) / (25 * c), rtol=1e-12)
    # gradient 0 (not NaN) at coincidence
    assert np.all(np.asarray(jax.grad(lambda a: w2_coupling(a, x).value)(x)) == 0.0)
    xs = jnp.stack([x, 2 * x])
    batched = jax.vmap(lambda a: w2(a, y, method="coupling"))(xs)
    np.testing.assert_allclose(np.asarray(batched.value),
                               [float(w2_coupling(a, y).value) for a in xs], rtol=1e-12)


@pytest.mark.slow  # Bures gradients against finite differences by default: tests/test_distances.py::test_bures_gradient_matches_finite_differences; under jit and vmap: tests/test_distances.py::test_bures_is_symmetric_and_jit_vmap[f64]
def test_bures_value_gradient_matches_finite_differences():
    rng = np.random.default_rng(6)
    d = 3
    a0, a1 = rng.standard_normal((d, d)), rng.standard_normal((d, d))
    S0, S1 = a0 @ a0.T + np.eye(d), a1 @ a1.T + 0.5 * np.eye(d)
    m0, m1 = rng.standard_normal(d), rng.standard_normal(d)
    f = lambda m: bures_w2(m, S0, m1, S1).value  # noqa: E731
    g = np.asarray(jax.grad(f)(jnp.asarray(m0)))
    h = 1e-6
    fd = [(float(f(m0 + h * e)) - float(f(m0 - h * e))) / (2 * h) for e in np.eye(d)]
    np.testing.assert_allclose(g, fd, rtol=1e-6)
    # value = sqrt(W2^2) of the smooth square, under jit and vmap
    res = jax.jit(jax.vmap(bures_w2, in_axes=(0, None, None, None)))(
        jnp.stack([jnp.asarray(m0), jnp.asarray(m1)]), S0, m1, S1)
    assert float(res.value[0]) == pytest.approx(
        math.sqrt(float(bures_w2_squared(m0, S0, m1, S1))), rel=1e-12)
    assert list(res.names) == ["successful", "successful"]


@pytest.mark.slow
@pytest.mark.parametrize("eps", [3e-3, 1e-3, 1e-4])
def test_sinkhorn_bias_bound_holds_against_the_exact_value(eps):
    # near-concentrated clouds, where a fixed ε is strongly biased (the sibling test in
    # test_distances.py: > 5 % at 1e-3): |S_ε - W2^2| <= ε log N still holds
    rng = np.random.default_rng(7)
    n = 300
    x = np.zeros((n, 3))
    x[:, 0] = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    y = x + 0.05 * rng.standard_normal((n, 3))
    exact = float(w2_exact(x, y).value)
    res = w2_sinkhorn(x, y, epsilon=eps, threshold=1e-6)
    assert res.ok
    assert float(res.bias_bound) == pytest.approx(eps * math.log(n), rel=1e-9)
    assert abs(float(res.divergence) - exact ** 2) <= float(res.bias_bound)
    assert jaxdyn.status_code("successful") == int(res.status)
