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


# One sample size and dimension for every vMF draw of this file: the rejection sampler (a
# Beta draw in a while loop, ≈ 3 CPU-s to compile) is compiled once, for (N, d) = (5·10⁴, 4).
# d = 4 samples Beta(3/2, 3/2), not S²'s degenerate Beta(1, 1) = uniform.
N_VMF, D_VMF = 50_000, 4


@pytest.mark.slow
def test_vmf_mean_resultant_length():
    # On S^{d-1}, E⟨x, μ⟩ = A_d(κ) = I_{d/2}(κ)/I_{d/2-1}(κ); on S³ (d = 4) I_2(κ)/I_1(κ).
    from scipy.special import ive

    mu = jnp.array([0.0, 0.6, 0.0, 0.8])
    for kappa in [1.0, 10.0, 100.0]:
        x = jaxdyn.sample_vmf(jax.random.PRNGKey(1), N_VMF, mu, kappa, jnp.float64)
        expect = ive(2, kappa) / ive(1, kappa)
        w = np.asarray(x @ mu)
        se = w.std() / np.sqrt(w.size)
        assert abs(w.mean() - expect) < 4 * se, (kappa, w.mean(), expect, se)
        assert float(jnp.max(jnp.abs(jnp.linalg.norm(x, axis=1) - 1))) < 1e-12


def test_uniform_and_mixture_moments():
    # (the moments in NumPy: no eager device ops to compile)
    x = np.asarray(jaxdyn.sample_sphere(jax.random.PRNGKey(2), N_VMF, D_VMF, jnp.float64))
    np.testing.assert_allclose(x.T @ x / x.shape[0], np.eye(4) / 4, atol=6e-3)
    mu = np.array([1.0, 0, 0, 0])
    # jitted (the parameters concrete, checked on the host): one program, not its ops one by one
    mixture = jax.jit(lambda key: jaxdyn.sample_mixture(key, N_VMF, D_VMF, mu=mu, kappa=5.0,
                                                        weight=0.5, dtype=jnp.float64))
    xm = np.asarray(mixture(jax.random.PRNGKey(3)))
    # Mixture mean along μ: 0.5 · A_4(5) with A_4(κ) = I_2(κ)/I_1(κ).
    from scipy.special import iv
    expect = 0.5 * iv(2, 5.0) / iv(1, 5.0)
    w = np.asarray(xm @ mu)
    assert abs(w.mean() - expect) < 4 * w.std() / np.sqrt(w.size)
    with pytest.raises(ValueError, match="weight"):
        jaxdyn.sample_mixture(jax.random.PRNGKey(3), 10, 4, weight=1.0)


@pytest.mark.slow
def test_sampling_programs_are_bucketed_and_give_the_direct_numbers(monkeypatch):
    # one generator program per power-of-two row count, the numbers of the direct call bit for
    # bit (a sweep over N compiles a few generators, not one per N); a typed key, a traced key
    # (vmap) and the non-partitionable stream (whose prefixes differ) give the direct numbers.
    # (Each direct draw of a new shape compiles a ~0.3 s program: few shapes here.)
    from jaxdyn.sphere import _sampling as S

    program, shapes = S._normal_rows_program, []

    def recording(key, rows, d, dtype):  # the static arguments a program is compiled for
        shapes.append((rows, d, jnp.dtype(dtype).name))
        return program(key, rows, d, dtype)

    monkeypatch.setattr(S, "_normal_rows_program", recording)
    for n, dtype in [(100, np.float32), (127, np.float32), (100, np.float64)]:
        key = jax.random.PRNGKey(n)
        got = jaxdyn.sample_sphere(key, n, 3, dtype)
        ref = jaxdyn.normalize(jax.random.normal(key, (n, 3), dtype))
        assert got.shape == (n, 3) and got.dtype == dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
    assert sorted(set(shapes)) == [(128, 3, "float32"), (128, 3, "float64")]
    key = jax.random.key(7)
    np.testing.assert_array_equal(np.asarray(S.normal_rows(key, 100, 3, jnp.float32)),
                                  np.asarray(jax.random.normal(key, (100, 3), jnp.float32)))
    keys = jax.random.split(jax.random.PRNGKey(1), 2)
    got = jax.vmap(lambda k: jaxdyn.sample_sphere(k, 100, 3))(keys)
    np.testing.assert_array_equal(np.asarray(got[1]),
                                  np.asarray(jaxdyn.sample_sphere(keys[1], 100, 3)))
    with jax.threefry_partitionable(False):  # the older stream: prefixes differ
        key = jax.random.PRNGKey(3)
        n_before = len(shapes)
        direct = np.asarray(jax.random.normal(key, (5, 4), jnp.float32))
        assert not np.array_equal(
            np.asarray(jax.random.normal(key, (64, 4), jnp.float32)[:5]), direct)
        np.testing.assert_array_equal(np.asarray(S.normal_rows(key, 5, 4, jnp.float32)), direct)
    assert len(shapes) == n_before  # not through the bucketed program


def test_traced_beta_is_flagged_by_invalid_under_jit():
    """A β computed inside jit cannot raise at construction (nor through a host callback):
    the model's invalid() flag reports it, which the drivers turn into RESULTS.invalid_input."""
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 8, 3)

    @jax.jit
    def run(beta):
        m = jaxdyn.SphereAttention(jnp.eye(3), jnp.eye(3), jnp.eye(3), beta)
        return m(0.0, x0), m.invalid()

    field, bad = run(2.0)
    assert np.all(np.isfinite(np.asarray(field))) and not bool(bad)
    for beta in (-1.0, 0.0, np.nan, np.inf):
        assert bool(run(beta)[1]), beta