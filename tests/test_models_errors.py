"""Bad input gets a clear error naming the problem; sampling laws are right."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn


def test_model_shape_errors():
    I3 = jnp.eye(3)
    with pytest.raises(ValueError, match=r"Q must be a square matrix"):
        jaxdyn.SphereAttention(jnp.ones((3, 2)), I3, I3, 1.0)
    with pytest.raises(ValueError, match=r"V must be a square matrix of shape \(3, 3\)"):
        jaxdyn.SphereAttention(I3, I3, jnp.eye(4), 1.0)
    with pytest.raises(ValueError, match="beta .* must be > 0"):
        jaxdyn.SphereAttention(I3, I3, I3, 0.0)
    with pytest.raises(ValueError, match="beta .* must be > 0"):
        jaxdyn.SphereAttention(I3, I3, I3, -2.0)
    with pytest.raises(ValueError, match="b must have shape"):
        jaxdyn.EuclideanAttention(I3, I3, I3, jnp.ones(2))


def test_simulate_errors():
    I3 = jnp.eye(3)
    m = jaxdyn.SphereAttention(I3, I3, I3, 1.0)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 5, 3)
    with pytest.raises(ValueError, match="dt .* must be > 0"):
        jaxdyn.simulate(m, x0, t1=1.0, dt=0.0)
    with pytest.raises(ValueError, match="dt .* must be > 0"):
        jaxdyn.simulate(m, x0, t1=1.0, dt=-0.1)
    with pytest.raises(ValueError, match=r"x0 must have shape \(N, 3\)"):
        jaxdyn.simulate(m, jnp.ones((5, 4)), t1=1.0, dt=0.1)
    with pytest.raises(ValueError, match="unit vectors"):
        jaxdyn.simulate(m, 2 * x0, t1=1.0, dt=0.1)
    with pytest.raises(ValueError, match="method must be one of"):
        jaxdyn.simulate(m, x0, t1=1.0, dt=0.1, method="leapfrog")
    with pytest.raises(ValueError, match="n .* must be an integer >= 1"):
        jaxdyn.sample_sphere(jax.random.PRNGKey(0), 0, 3)


def test_nonfinite_is_a_status_not_an_exception():
    I3 = jnp.eye(3)
    m = jaxdyn.SphereAttention(I3, I3, jnp.full((3, 3), jnp.nan), 1.0)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 5, 3)
    tr = jaxdyn.simulate(m, x0, t1=1.0, dt=0.1)
    assert tr.names == "nonfinite" and not bool(tr.ok)


def test_vmf_mean_resultant_length():
    # On S², E⟨x, μ⟩ = coth κ − 1/κ.
    mu = jnp.array([0.0, 0.6, 0.8])
    for kappa in [1.0, 10.0, 100.0]:
        x = jaxdyn.sample_vmf(jax.random.PRNGKey(1), 40_000, mu, kappa, jnp.float64)
        expect = 1 / np.tanh(kappa) - 1 / kappa
        w = np.asarray(x @ mu)
        se = w.std() / np.sqrt(w.size)
        assert abs(w.mean() - expect) < 4 * se, (kappa, w.mean(), expect, se)
        assert float(jnp.max(jnp.abs(jnp.linalg.norm(x, axis=1) - 1))) < 1e-12


def test_uniform_and_mixture_moments():
    x = jaxdyn.sample_sphere(jax.random.PRNGKey(2), 50_000, 4, jnp.float64)
    np.testing.assert_allclose(np.asarray(x.T @ x / x.shape[0]), np.eye(4) / 4, atol=6e-3)
    mu = jnp.array([1.0, 0, 0, 0])
    xm = jaxdyn.sample_mixture(jax.random.PRNGKey(3), 50_000, 4, mu=mu, kappa=5.0, weight=0.5,
                               dtype=jnp.float64)
    # Mixture mean along μ: 0.5 · A_4(5) with A_4(κ) = I_2(κ)/I_1(κ).
    from scipy.special import iv
    expect = 0.5 * iv(2, 5.0) / iv(1, 5.0)
    w = np.asarray(xm @ mu)
    assert abs(w.mean() - expect) < 4 * w.std() / np.sqrt(w.size)
    with pytest.raises(ValueError, match="weight"):
        jaxdyn.sample_mixture(jax.random.PRNGKey(3), 10, 4, weight=1.0)


def test_traced_beta_is_checked_under_jit():
    """A β computed inside jit cannot raise at construction; eqx.error_if raises at run time."""
    import equinox as eqx

    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 8, 3)

    @jax.jit
    def run(beta):
        m = jaxdyn.SphereAttention(jnp.eye(3), jnp.eye(3), jnp.eye(3), beta)
        return m(0.0, x0)

    assert np.all(np.isfinite(np.asarray(run(2.0))))
    # equinox raises EquinoxRuntimeError; through XLA:CPU's callback it can arrive wrapped in
    # the runtime's ValueError — either way the message names the field
    with pytest.raises((eqx.EquinoxRuntimeError, ValueError),
                       match=r"beta \(inverse temperature\) must be > 0"):
        jax.block_until_ready(run(-1.0))
