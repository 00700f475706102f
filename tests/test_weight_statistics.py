"""Per-query weight statistics of one attention layer against a direct NumPy computation, and
the exact self-weight of equiangular tokens against the layer's output."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn.kernels import weight_statistics


def _numpy_stats(x, y, B, beta):
    """The statistics from the full (n, m) weights in float64."""
    x, y, B = (np.asarray(a, np.float64) for a in (x, y, B))
    l = beta * x @ B @ y.T
    l = l - l.max(axis=1, keepdims=True)
    w = np.exp(l)
    w /= w.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.sum(np.where(w > 0, w * np.log(w), 0.0), axis=1)
    top = np.argmax(w, axis=1)
    d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    rank = np.array([np.sum(d2[i] < d2[i, top[i]]) for i in range(len(x))])
    return w.max(axis=1), ent, 1.0 / np.sum(w * w, axis=1), top, rank


@pytest.mark.parametrize("beta", [0.5, 8.0, 300.0])
def test_statistics_match_numpy_on_the_sphere_with_a_general_form(beta):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(150, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = rng.normal(size=(333, 3))
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    B = rng.normal(size=(3, 3))
    # blocks that divide neither size: the padding must count for nothing
    got = weight_statistics(jnp.asarray(x), jnp.asarray(y), jnp.asarray(B), beta, q_block=64,
                            k_block=100)
    ref = _numpy_stats(x, y, B, beta)
    np.testing.assert_allclose(got.max_weight, ref[0], rtol=1e-10)
    np.testing.assert_allclose(got.entropy, ref[1], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.effective_keys, ref[2], rtol=1e-10)
    np.testing.assert_array_equal(got.top_key, ref[3])
    np.testing.assert_array_equal(got.top_rank, ref[4])
    # bounds every distribution obeys
    assert np.all(np.asarray(got.effective_keys) >= 1 - 1e-12)
    assert np.all(np.asarray(got.entropy) <= np.log(333) + 1e-12)


def test_identity_form_the_top_key_is_the_nearest_and_float32_agrees():
    x = jaxdyn.sample_sphere(jax.random.PRNGKey(1), 500, 4)
    st = weight_statistics(x, beta=50.0)            # self-attention, B = I
    assert np.all(np.asarray(st.top_rank) == 0)     # on the sphere the nearest key: itself
    np.testing.assert_array_equal(st.top_key, np.arange(500))
    ref = _numpy_stats(np.asarray(x), np.asarray(x), np.eye(4), 50.0)
    np.testing.assert_allclose(st.max_weight, ref[0], rtol=1e-5)
    np.testing.assert_allclose(st.entropy, ref[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(st.effective_keys, ref[2], rtol=1e-5)


@pytest.mark.parametrize("rho,beta", [(0.3, 4.0), (0.8, 40.0), (0.0, 1.0)])
def test_equiangular_tokens_exact_self_weight(rho, beta):
    n = 64
    G = (1 - rho) * np.eye(n) + rho * np.ones((n, n))
    x = jnp.asarray(np.linalg.cholesky(G))           # unit rows, pairwise inner product rho
    exact = 1.0 / (1.0 + (n - 1) * np.exp(-beta * (1 - rho)))
    st = weight_statistics(x, beta=beta)
    np.testing.assert_allclose(st.max_weight, exact, rtol=1e-12)
    # the layer's output: m_i = w x_i + (1 − w)/(n − 1) Σ_{j≠i} x_j, so m_i · x_i = w + (1 − w) ρ
    m = jaxdyn.interaction(x, x, jnp.eye(n), beta, kernel="blocked")
    w = (np.sum(np.asarray(m) * np.asarray(x), axis=1) - rho) / (1 - rho)
    np.testing.assert_allclose(w, exact, rtol=1e-10)


def test_traced_beta_vmap_jit_and_bad_shapes():
    x = jaxdyn.sample_sphere(jax.random.PRNGKey(2), 128, 3)
    betas = jnp.asarray([1.0, 30.0])
    out = jax.jit(jax.vmap(lambda b: weight_statistics(x, beta=b).max_weight))(betas)
    for i, b in enumerate([1.0, 30.0]):  # float32 points: the batched program rounds apart
        np.testing.assert_allclose(out[i], weight_statistics(x, beta=float(b)).max_weight,
                                   rtol=1e-6)
    with pytest.raises(ValueError, match="share d"):
        weight_statistics(x, jnp.ones((5, 4)))
    with pytest.raises(ValueError, match="B must have shape"):
        weight_statistics(x, B=jnp.eye(4))
    with pytest.raises(ValueError, match="q_block and k_block"):
        weight_statistics(x, q_block=0)
