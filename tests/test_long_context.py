"""β as a function of n, the long-context observables against direct NumPy computations, the
exact self-weight and angle ratio of equiangular tokens against one attention layer, and the
Poisson limit law of the ordered weights against a direct finite-n draw."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdyn import long_context as lc
from jaxdyn.kernels import weight_statistics


# ------------------------------------------------------------------------------ β(n)

def test_resolve_beta_scales_and_named_errors():
    assert lc.resolve_beta(3.5, 10) == 3.5
    assert lc.resolve_beta({"scale": "log", "gamma": 2.0}, 1000) == pytest.approx(2 * math.log(1000))
    assert lc.resolve_beta({"scale": "power", "c": 0.5}, 1000, 3) == pytest.approx(500.0)
    assert lc.resolve_beta({"scale": "power", "c": 1.0}, 100, 2) == pytest.approx(1e4)
    assert lc.resolve_beta({"scale": "power", "c": 1.0}, 10 ** 6, 4) == pytest.approx(1e4)
    bad = [(({"scale": "cube", "c": 1}, 10, 3), "scale"),
           (({"scale": "log"}, 10), "exactly the key 'gamma'"),
           (({"scale": "log", "gamma": 1, "c": 2}, 10), "exactly the key"),
           (({"scale": "power", "c": 1.0}, 10), "needs the dimension d"),
           (({"scale": "power", "c": -1.0}, 10, 3), "beta.c must be a finite number > 0"),
           (({"scale": "log", "gamma": float("nan")}, 10), "beta.gamma"),
           ((0.0, 10), "beta must be a finite number > 0"),
           ((True, 10), "beta must be a number"),
           ((2.0, 1), "n .* integer >= 2"),
           (({"scale": "power", "c": 1.0}, 10, 1), "d .* integer >= 2")]
    for args, msg in bad:
        with pytest.raises(ValueError, match=msg):
            lc.resolve_beta(*args)


def test_resolve_beta_traced_gives_nan_for_invalid():
    f = jax.jit(jax.vmap(lambda g: lc.resolve_beta({"scale": "log", "gamma": g}, 100)))
    out = np.asarray(f(jnp.array([2.0, -1.0, 0.0])))
    assert out[0] == pytest.approx(2 * math.log(100), rel=1e-6) and np.isnan(out[1:]).all()
    g = jax.grad(lambda c: lc.resolve_beta({"scale": "power", "c": c}, 1000, 3))(1.0)
    assert float(g) == pytest.approx(1000.0)


# --------------------------------------------------------------- observables vs NumPy

def _np_angle(a, b):
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return np.arccos(np.clip(np.sum(a * b, axis=-1), -1, 1))


def _np_layer(x, beta):
    l = beta * x @ x.T
    w = np.exp(l - l.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    return w @ x


@pytest.mark.slow_dtype("f32")  # one dtype of a model-level statistic by default: float64
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-9), (np.float32, 2e-4)])
def test_layer_angle_ratio_and_mean_inner_product_match_numpy(dtype, rtol):
    x = np.asarray(lc.nearly_equiangular_tokens(jax.random.PRNGKey(0), 200, 24, 0.5, dtype=dtype))
    x64 = x.astype(np.float64)
    assert np.allclose(np.linalg.norm(x64, axis=1), 1, atol=1e-6)
    for beta in (6.0,):
        lam, out = lc.layer_angle_ratio(jnp.asarray(x), beta, q_block=64, k_block=96)
        t = _np_layer(x64, beta)
        ref = np.mean(_np_angle(t, np.roll(t, -1, 0)) / _np_angle(x64, np.roll(x64, -1, 0)))
        assert out.dtype == dtype
        np.testing.assert_allclose(float(lam), ref, rtol=rtol)
    g = x64 @ x64.T
    ref_ip = (g.sum() - np.trace(g)) / (200 * 199)
    np.testing.assert_allclose(float(lc.mean_inner_product(jnp.asarray(x))), ref_ip,
                               rtol=rtol, atol=1e-6 if dtype == np.float32 else 1e-12)
    # λ per system over leading axes (a stack of two clouds)
    two = jnp.stack([jnp.asarray(x), jnp.asarray(x[::-1])])
    assert lc.angle_ratio(two, two).shape == (2,)
    np.testing.assert_allclose(lc.angle_ratio(two, two), 1.0, rtol=10 * rtol)


def test_layer_angle_ratio_traced_beta_nan_and_concrete_error():
    x = lc.nearly_equiangular_tokens(jax.random.PRNGKey(1), 64, 8, 0.3)
    f = jax.jit(jax.vmap(lambda b: lc.layer_angle_ratio(x, b, k_block=64, q_block=64)[0]))
    out = np.asarray(f(jnp.array([3.0, -1.0, jnp.inf])))
    assert np.isfinite(out[0]) and 0 < out[0] < 1 and np.isnan(out[1:]).all()
    with pytest.raises(ValueError, match="beta must be a finite number > 0"):
        lc.layer_angle_ratio(x, -2.0)
    with pytest.raises(ValueError, match="out must have the shape"):
        lc.angle_ratio(x, x[:10])
    with pytest.raises(ValueError, match="rho must lie"):
        lc.nearly_equiangular_tokens(jax.random.PRNGKey(1), 8, 4, 1.0)


def test_circle_cluster_counts_of_separated_arcs():
    rng = np.random.default_rng(0)
    centres = np.array([0.3, 2.0, 4.1])
    th = np.concatenate([c + 0.01 * rng.standard_normal(300) for c in centres])
    xs = np.stack([np.cos(th), np.sin(th)], axis=-1)
    uni = rng.uniform(0, 2 * np.pi, 900)
    us = np.stack([np.cos(uni), np.sin(uni)], axis=-1)
    counts = lc.circle_cluster_counts(jnp.asarray(np.stack([xs, us])), 256)
    np.testing.assert_array_equal(counts, [3, 0])  # 0: not broken up (pde.cluster_counts)
    with pytest.raises(ValueError, match="points of S¹"):
        lc.circle_cluster_counts(jnp.ones((5, 3)), 64)


# ------------------------------------------------------------- equiangular tokens, exactly

@pytest.mark.parametrize("rho,gamma", [(0.5, 1.5), (0.2, 1.1), (0.8, 6.0)])
def test_equiangular_self_weight_and_angle_ratio_against_the_layer(rho, gamma):
    n = 64  # one shape: the three cases share the compiled programs
    x = lc.equiangular_tokens(n, rho)
    g = x @ x.T
    np.testing.assert_allclose(g[~np.eye(n, dtype=bool)], rho, atol=1e-14)
    np.testing.assert_allclose(np.diag(g), 1.0, atol=1e-14)
    beta = lc.resolve_beta({"scale": "log", "gamma": gamma}, n)
    exact = lc.equiangular_self_weight(n, beta, rho)
    assert exact == pytest.approx(1 / (1 + (n - 1) * math.exp(-beta * (1 - rho))), rel=1e-15)
    st = weight_statistics(jnp.asarray(x), beta=beta, q_block=32, k_block=48)
    np.testing.assert_allclose(st.max_weight, exact, rtol=1e-12)
    lam, out = lc.layer_angle_ratio(jnp.asarray(x), beta, q_block=32, k_block=48)
    # the layer's output: T_i = w x_i + (1 − w)/(n − 1) Σ_{j≠i} x_j, so ⟨T_i, x_i⟩ = w + (1 − w)ρ
    w = (np.sum(np.asarray(out) * x, axis=1) - rho) / (1 - rho)
    np.testing.assert_allclose(w, exact, rtol=1e-12)
    np.testing.assert_allclose(float(lam), lc.equiangular_angle_ratio(n, beta, rho), rtol=1e-10)


def test_equiangular_regimes_and_critical_gamma():
    n = 10 ** 8
    rho = 0.5
    gc = float(lc.critical_gamma(rho))
    assert gc == 2.0
    lo, hi = (lc.equiangular_angle_ratio(n, g * math.log(n), rho) for g in (0.7 * gc, 1.3 * gc))
    assert lo < 0.05 and hi > 0.95
    with pytest.raises(ValueError, match="rho"):
        lc.critical_gamma(1.0)
    with pytest.raises(ValueError, match="rho must lie"):
        lc.equiangular_self_weight(10, 1.0, -0.5)


# ------------------------------------------------------------- the Poisson limit law

def test_poisson_limit_matches_a_direct_draw_and_the_cap_constant():
    # on S² a cap of height u has area 2πu of 4π: P(1 − ⟨q, y⟩ ≤ u) = u/2 exactly
    assert lc.cap_constant(3) == pytest.approx(0.5)
    assert lc.cap_constant(2) == pytest.approx(math.sqrt(2) / math.pi)
    rng = np.random.default_rng(0)
    d, c, n = 3, 1.0, 20000
    beta = lc.resolve_beta({"scale": "power", "c": c}, n, d)
    x = np.eye(d)[:1]
    mw = []
    for _ in range(8):
        y = rng.normal(size=(n, d))
        y /= np.linalg.norm(y, axis=1, keepdims=True)
        mw.append(weight_statistics(jnp.asarray(x), jnp.asarray(y), beta=beta,
                                    logits="distance").max_weight[0])
    w, h = lc.poisson_limit_weights(c, d, samples=400, k=3)
    assert np.all(np.diff(w, axis=1) <= 0) and np.all(w > 0) and np.all(h > 0)
    # the mean of 8 finite-n draws within 4 standard errors of the limit's mean
    se = np.std(w[:, 0]) / math.sqrt(8)
    assert abs(np.mean(mw) - np.mean(w[:, 0])) < 4 * se + 0.02
    # the regimes: c → 0 spreads the mass, c → ∞ puts it on the nearest key
    assert lc.poisson_limit_weights(0.02, 3, samples=50)[0][:, 0].mean() < 0.1
    assert lc.poisson_limit_weights(200.0, 3, samples=50)[0][:, 0].mean() > 0.99


def test_first_cluster_count_against_the_maxima_of_random_harmonics():
    """S²: the predicted count l(l+1)/(2√3) against a direct count of the local maxima of random
    degree-l spherical harmonics (Gaussian coefficients, SciPy's harmonics, 40 000 Fibonacci
    points, a maximum above its 8 nearest neighbours); S¹: k* itself."""
    from scipy.spatial import cKDTree
    from scipy.special import sph_harm_y

    m = 40_000
    i = np.arange(m) + 0.5
    theta, phi = np.arccos(1 - 2 * i / m), math.pi * (1 + math.sqrt(5)) * i
    pts = np.stack([np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), np.cos(theta)], 1)
    nb = cKDTree(pts).query(pts, k=9)[1][:, 1:]
    rng = np.random.default_rng(0)
    for deg in (6, 12):
        ys = [sph_harm_y(deg, k, theta, phi) for k in range(deg + 1)]
        counts = []
        for _ in range(8):
            f = ys[0].real * rng.normal()
            for y in ys[1:]:
                f = f + math.sqrt(2) * (rng.normal() * y.real + rng.normal() * y.imag)
            counts.append(np.sum(np.all(f[:, None] > f[nb], axis=1)))
        pred = lc.first_cluster_count(3, deg)
        sem = np.std(counts) / math.sqrt(len(counts))
        assert abs(np.mean(counts) - pred) <= 3 * sem + 0.05 * pred, (deg, counts, pred)
    assert lc.first_cluster_count(2, 17) == 17.0
    for bad in ((4, 3), (3, 0), (2, 2.5)):
        with pytest.raises(ValueError, match="first_cluster_count"):
            lc.first_cluster_count(*bad)
