"""The density solver and its statistics as JAX functions: models built inside ``jax.jit`` from
NumPy weights, ``solve_density`` under jit and vmap with traced inputs (the same numbers as the
concrete call), traced inputs out of range flagged in the result, ``jax.grad`` against central
finite differences (float64), the rates traced in β, the density cluster counts traced."""

import math
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn import pde

I2, I3 = np.eye(2), np.eye(3)
DIAG2 = np.diag([1.0, 0.6])
M = 32


def _rho0(m=M, eps=0.3, seed=0):
    return pde.perturbed_uniform(m, eps, jax.random.PRNGKey(seed), k_max=4)


def _status(name):
    return jaxdyn.status_code(name)


# ------------------------------------------------------------------ models inside jit

@pytest.mark.slow
def test_models_built_inside_jit_from_numpy_weights():
    rho = jnp.asarray(_rho0())
    seen = {}

    def velocity(rho, K):
        model = pde.CircleDensity(I2, K, I2, 5.0, M)
        seen[K is I2] = model.kernel
        return model.velocity(rho)

    for K in (I2, DIAG2):
        inside = jax.jit(lambda r: velocity(r, K))(rho)
        outside = eqx.filter_jit(pde.CircleDensity(I2, K, I2, 5.0, M).velocity)(rho)
        np.testing.assert_allclose(np.asarray(inside), np.asarray(outside), rtol=1e-13, atol=1e-15)
    assert seen == {True: "fft", False: "dense"}  # 'auto' resolved from the NumPy weights
    rho2 = jnp.full((4, 8), 1 / (4 * math.pi)) * (1 + 0.1 * jnp.arange(8) / 8)
    f2 = jax.jit(lambda r: pde.SphereDensity(I3, I3, I3, 2.0, 4, 8)(0.0, r))(rho2)
    outside = eqx.filter_jit(pde.SphereDensity(I3, I3, I3, 2.0, 4, 8))(0.0, rho2)
    np.testing.assert_allclose(np.asarray(f2), np.asarray(outside), rtol=1e-12, atol=1e-14)


def test_auto_kernel_of_traced_weights_is_dense_and_concrete_checks_stay():
    kernels = []

    def f(Q):
        model = pde.CircleDensity(Q, I2, I2, 2.0, M)
        kernels.append(model.kernel)
        s = pde.SphereDensity(jnp.eye(3) * Q[0, 0], I3, I3, 2.0, 4, 8)
        kernels.append(s.kernel)
        return model.velocity(jnp.asarray(_rho0()))

    v = jax.jit(f)(jnp.asarray(I2))
    assert kernels == ["dense", "dense"]
    fft = eqx.filter_jit(pde.CircleDensity(I2, I2, I2, 2.0, M).velocity)(jnp.asarray(_rho0()))
    np.testing.assert_allclose(np.asarray(v), np.asarray(fft), rtol=1e-11, atol=1e-13)
    # concrete values are still checked inside jit (NumPy on the host), traced ones are not
    with pytest.raises(ValueError, match="beta"):
        jax.jit(lambda r: pde.CircleDensity(I2, I2, I2, -1.0, M).velocity(r))(jnp.asarray(_rho0()))
    with pytest.raises(ValueError, match="kernel='fft' needs B"):
        jax.jit(lambda r: pde.CircleDensity(I2, DIAG2, I2, 1.0, M, kernel="fft").velocity(r))(
            jnp.asarray(_rho0()))
    with pytest.warns(UserWarning, match="does not resolve"):
        jax.jit(lambda r: pde.CircleDensity(I2, I2, I2, 1000.0, 64).velocity(r))(jnp.zeros(64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # traced β: no warning, no error
        jax.jit(lambda b: pde.CircleDensity(I2, I2, I2, b, 64).beta)(1000.0)


@pytest.mark.slow
def test_circle_attention_inside_jit_and_traced_beta():
    x = jnp.asarray(pde.quantile_points(_rho0(), 24))
    ref = pde.CircleAttention(I2, DIAG2, I2, 3.0)
    inside = jax.jit(lambda x: pde.CircleAttention(I2, DIAG2, I2, 3.0)(0.0, x))(x)
    np.testing.assert_allclose(np.asarray(inside), np.asarray(ref(0.0, x)), rtol=1e-13, atol=1e-15)
    with pytest.raises(ValueError, match="n_modes"):
        jax.jit(lambda b: pde.CircleAttention(I2, I2, I2, b)(0.0, x))(3.0)
    betas = jnp.asarray([1.0, 3.0])
    fields = jax.vmap(lambda b: pde.CircleAttention(I2, DIAG2, I2, b, n_modes=ref.n_modes)(0.0, x))(betas)
    for b, v in zip(betas, fields):
        np.testing.assert_allclose(np.asarray(v), np.asarray(pde.CircleAttention(
            I2, DIAG2, I2, float(b), n_modes=ref.n_modes)(0.0, x)), rtol=1e-13, atol=1e-15)


# ------------------------------------------------------------------ solve_density traced

@pytest.mark.slow
@pytest.mark.parametrize("dtype,rtol", [(jnp.float64, 1e-12), (jnp.float32, 1e-5)])
def test_solve_under_jit_with_traced_inputs_equals_the_concrete_solve(dtype, rtol):
    rho0 = np.asarray(_rho0(), dtype)
    ts = np.linspace(0.0, 1.0, 3)

    def solve(beta, sigma, rho0, ts, dt):
        model = pde.CircleDensity(I2, I2, I2, beta, M, sigma=sigma, dtype=dtype)
        return pde.solve_density(model, rho0, t1=1.0, ts=ts, dt=dt)

    traced = jax.jit(solve)(dtype(4.0), dtype(0.1), rho0, ts, dtype(0.02))
    plain = solve(4.0, 0.1, rho0, ts, 0.02)
    assert traced.rho.dtype == dtype and traced.names == "successful"
    np.testing.assert_allclose(np.asarray(traced.rho), np.asarray(plain.rho), rtol=rtol, atol=rtol * 1e-2)
    assert int(traced.num_steps) == int(plain.num_steps) == 50
    assert int(traced.num_accepted_steps) == 50
    if dtype != jnp.float64:
        return
    # the default (CFL) step computed in the program; t1 traced
    model = pde.CircleDensity(I2, I2, I2, 4.0, M, sigma=0.1, dtype=dtype)
    a = jax.jit(lambda t1: pde.solve_density(model, rho0, t1=t1, n_save=3))(dtype(1.0))
    b = pde.solve_density(model, rho0, t1=1.0, n_save=3)
    np.testing.assert_allclose(np.asarray(a.ts), np.asarray(b.ts), rtol=rtol)
    np.testing.assert_allclose(np.asarray(a.rho), np.asarray(b.rho), rtol=rtol, atol=rtol * 1e-2)
    assert float(a.stats["dt"]) == pytest.approx(float(pde.cfl_dt(model)), rel=rtol)


@pytest.mark.slow
def test_solve_under_vmap_over_rho0_beta_dt_and_sphere():
    rho0s = jnp.stack([jnp.asarray(_rho0(seed=s)) for s in range(3)])
    betas = jnp.asarray([1.0, 4.0, 9.0])
    dts = jnp.asarray([0.05, 0.02, 0.04])
    out = jax.vmap(lambda r, b, dt: pde.solve_density(pde.CircleDensity(I2, I2, I2, b, M), r, t1=0.6,
                                                      n_save=2, dt=dt))(rho0s, betas, dts)
    assert out.rho.shape == (3, 2, M) and out.status.shape == (3,)
    for i in range(3):
        one = pde.solve_density(pde.CircleDensity(I2, I2, I2, float(betas[i]), M), rho0s[i], t1=0.6,
                                n_save=2, dt=float(dts[i]))
        np.testing.assert_allclose(np.asarray(out.rho[i]), np.asarray(one.rho), rtol=1e-12, atol=1e-14)
        assert int(out.num_steps[i]) == int(one.num_steps)
    rho2 = jnp.full((4, 8), 1 / (4 * math.pi)) * (1 + 0.2 * jnp.cos(jnp.arange(8) * math.pi / 4))
    sig = jnp.asarray([0.0, 0.3])
    s2 = jax.vmap(lambda s: pde.solve_density(pde.SphereDensity(I3, I3, I3, 2.0, 4, 8, sigma=s),
                                              rho2, t1=0.2, n_save=2).rho)(sig)
    for i in range(2):
        one = pde.solve_density(pde.SphereDensity(I3, I3, I3, 2.0, 4, 8, sigma=float(sig[i])), rho2,
                                t1=0.2, n_save=2).rho
        np.testing.assert_allclose(np.asarray(s2[i]), np.asarray(one), rtol=1e-12, atol=1e-14)


@pytest.mark.slow
def test_traced_inputs_out_of_range_are_flagged_not_raised():
    rho0 = jnp.asarray(_rho0())
    model = pde.CircleDensity(I2, I2, I2, 2.0, M)

    @jax.jit
    def solve(beta, sigma, rho0, ts, dt):
        m = pde.CircleDensity(I2, I2, I2, beta, M, sigma=sigma)
        return pde.solve_density(m, rho0, t1=1.0, ts=ts, dt=dt).status

    ok = (2.0, 0.0, rho0, jnp.linspace(0.0, 1.0, 3), 0.05)
    assert int(solve(*ok)) == _status("successful")
    bad = {0: -1.0, 1: -0.1, 2: rho0.at[3].set(-1.0), 3: jnp.asarray([0.0, 1.0, 0.5]), 4: -0.05}
    bad_nan = {2: rho0.at[0].set(jnp.nan), 3: jnp.asarray([0.0, jnp.nan, 1.0]), 4: jnp.inf}
    for changes in (bad, bad_nan):
        for i, v in changes.items():
            args = list(ok)
            args[i] = v
            assert int(solve(*args)) == _status("invalid_input"), i
    t1 = jax.jit(lambda t1: pde.solve_density(model, rho0, t1=t1, n_save=3).status)
    assert int(t1(-1.0)) == _status("invalid_input") and int(t1(1.0)) == _status("successful")
    # the same inputs, concrete: a ValueError naming them
    with pytest.raises(ValueError, match="rho0"):
        pde.solve_density(model, np.asarray(rho0).clip(-1, None) - 1.0, t1=1.0)
    with pytest.raises(ValueError, match="non-decreasing"):
        pde.solve_density(model, rho0, t1=1.0, ts=[0.0, 1.0, 0.5])
    with pytest.raises(ValueError, match="dt"):
        pde.solve_density(model, rho0, t1=1.0, dt=-0.05)
    with pytest.raises(ValueError, match="t1"):
        pde.solve_density(model, rho0, t1=-1.0)


@pytest.mark.slow
def test_density_solution_is_a_pytree_of_arrays():
    sol = pde.solve_density(pde.CircleDensity(I2, I2, I2, 2.0, M), _rho0(), t1=0.3, n_save=2)
    leaves = jax.tree.leaves(sol)
    assert leaves and all(isinstance(x, jax.Array) for x in leaves)
    assert set(sol.stats) == {"num_steps", "num_accepted_steps", "dt", "mass_error", "min_rho", "mass"}
    assert sol.num_steps is sol.stats["num_steps"] and sol.num_accepted_steps is sol.stats["num_accepted_steps"]
    np.testing.assert_allclose(np.asarray(sol.mass), 1.0, rtol=1e-12)
    assert sol.names == "successful" and "successful" in repr(sol.names)
    again = eqx.filter_jit(lambda s: s)(sol)
    np.testing.assert_array_equal(np.asarray(again.rho), np.asarray(sol.rho))


# ------------------------------------------------------------------ gradients

def _central(f, x, h):
    return (f(x + h) - f(x - h)) / (2 * h)


@pytest.mark.parametrize("kernel", ["fft", pytest.param("dense", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_grad_of_a_functional_of_the_final_density_matches_finite_differences(kernel):
    """d/dβ, d/dσ and d/dQ of F = Σ_j w_j ρ_j(t1) (a fixed-step Heun solve, float64)."""
    rho0 = jnp.asarray(_rho0())
    w = jnp.cos(2 * jnp.asarray(pde.circle_grid(M)[0])) + 0.3 * jnp.sin(jnp.asarray(pde.circle_grid(M)[0]))

    def F(beta, sigma, Q):
        model = pde.CircleDensity(Q, I2, I2, beta, M, sigma=sigma, kernel=kernel)
        return jnp.sum(w * pde.solve_density(model, rho0, t1=0.5, n_save=1, dt=0.01).rho[-1])

    beta, sigma, Q = 3.0, 0.2, jnp.asarray([[1.0, 0.1], [-0.1, 0.9]])
    if kernel == "dense":
        Q = jnp.asarray([[1.0, 0.3], [0.1, 0.8]])
    gb, gs, gq = jax.jit(jax.grad(F, argnums=(0, 1, 2)))(beta, sigma, Q)
    Fj = jax.jit(F)
    fb = _central(lambda b: Fj(b, sigma, Q), beta, 1e-5)
    fs = _central(lambda s: Fj(beta, s, Q), sigma, 1e-5)
    assert float(gb) == pytest.approx(float(fb), rel=1e-6)
    assert float(gs) == pytest.approx(float(fs), rel=1e-6)
    E = jnp.asarray([[0.0, 1.0], [0.0, 0.0]]) if kernel == "dense" else jnp.asarray([[1.0, 0.0], [0.0, 1.0]])
    fq = _central(lambda e: Fj(beta, sigma, Q + e * E), 0.0, 1e-5)
    assert float(jnp.sum(gq * E)) == pytest.approx(float(fq), rel=1e-6)


@pytest.mark.slow
def test_grad_through_the_dense_kernel_at_a_rotation_and_through_rho0():
    """At Q = K = I (traced Q: the dense kernel) the gradient in a direction off the rotations
    aI + bJ is the whole derivative; the gradient in ρ0 is the adjoint's."""
    rho0 = jnp.asarray(_rho0())
    w = jnp.sin(3 * jnp.asarray(pde.circle_grid(M)[0]))

    def F(Q, rho0):
        model = pde.CircleDensity(Q, I2, I2, 4.0, M)
        return jnp.sum(w * pde.solve_density(model, rho0, t1=0.4, n_save=1, dt=0.02).rho[-1])

    gq, gr = jax.jit(jax.grad(F, argnums=(0, 1)))(jnp.asarray(I2), rho0)
    Fj = jax.jit(F)
    E = jnp.asarray([[1.0, 0.0], [0.0, -1.0]])  # the cos(θ+φ) direction
    fq = _central(lambda e: Fj(jnp.asarray(I2) + e * E, rho0), 0.0, 1e-5)
    assert np.all(np.isfinite(np.asarray(gq)))
    assert float(jnp.sum(gq * E)) == pytest.approx(float(fq), rel=1e-6, abs=1e-10)
    d = jnp.cos(jnp.asarray(pde.circle_grid(M)[0]))
    fr = _central(lambda e: Fj(jnp.asarray(I2), rho0 + e * d), 0.0, 1e-4)
    assert float(jnp.sum(gr * d)) == pytest.approx(float(fr), rel=1e-6)


@pytest.mark.slow  # two gradient programs; default-suite counterparts: the two S¹ gradient tests above
def test_grad_on_the_sphere_and_of_the_growth_rate():
    rho2 = jnp.full((4, 8), 1 / (4 * math.pi)) * (1 + 0.2 * jnp.cos(jnp.arange(8) * math.pi / 4))

    def F(beta):
        model = pde.SphereDensity(I3, I3, I3, beta, 4, 8)
        return jnp.sum(pde.solve_density(model, rho2, t1=0.2, n_save=1, dt=0.02).rho[-1][0])

    g = jax.jit(jax.grad(F))(2.0)
    assert float(g) == pytest.approx(float(_central(jax.jit(F), 2.0, 1e-5)), rel=1e-6)
    # the solver's rate equals λ_k to rounding: so does its derivative in β
    m = 128
    lam = jax.jit(jax.grad(lambda b: pde.growth_rate(pde.CircleDensity(I2, I2, I2, b, m), 3)))(5.0)
    ref = _central(lambda b: pde.linear_rates(b, [3])[0], 5.0, 1e-4)
    assert float(lam) == pytest.approx(ref, rel=1e-6)


# ------------------------------------------------------------------ rates and cluster counts

@pytest.mark.slow
def test_rates_traced_in_beta():
    betas = jnp.asarray([2.0, 8.0])
    rates = jax.vmap(lambda b: pde.growth_rate(pde.CircleDensity(I2, I2, I2, b, 64), [1, 2, 3]))(betas)
    zon = jax.jit(lambda b: pde.zonal_growth_rate(pde.SphereDensity(I3, I3, I3, b, 4, 8), [1, 2]))(2.0)
    for i, b in enumerate(np.asarray(betas)):
        np.testing.assert_allclose(np.asarray(rates[i]), np.asarray(
            pde.growth_rate(pde.CircleDensity(I2, I2, I2, float(b), 64), [1, 2, 3])), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(zon), np.asarray(
        pde.zonal_growth_rate(pde.SphereDensity(I3, I3, I3, 2.0, 4, 8), [1, 2])), rtol=1e-12)


@pytest.mark.slow
def test_density_cluster_counts_traced_equal_the_host_counts():
    m = 128
    th = 2 * np.pi * np.arange(m) / m
    frames = [np.full(m, 1 / (2 * np.pi))]
    for k in (5, 3, 2, 1):  # k flat clusters (mass 1/k each), nothing between them
        r = (np.cos(k * (th - 0.3)) > 0.9).astype(float)
        frames.append(r / (r.sum() * 2 * np.pi / m))
    rho_t = np.stack(frames)
    ts = np.arange(len(frames)) * 0.5
    host = pde.cluster_counts(rho_t)
    assert isinstance(host, np.ndarray) and host.tolist() == [0, 5, 3, 2, 1]
    np.testing.assert_array_equal(np.asarray(jax.jit(pde.cluster_counts)(rho_t)), host)
    per_level = jax.vmap(lambda lv: pde.cluster_counts(rho_t, level=lv))(jnp.asarray([0.5, 0.25]))
    np.testing.assert_array_equal(np.asarray(per_level[1]), pde.cluster_counts(rho_t, level=0.25))
    t, c = jax.jit(pde.first_clusters)(ts, rho_t)
    assert (float(t), int(c)) == pde.first_clusters(ts, rho_t) == (0.5, 5)
    t, c = jax.jit(pde.first_clusters)(ts[:1], rho_t[:1])
    assert math.isnan(float(t)) and int(c) == 0
    for fn in (lambda r: pde.merge_times(ts, r), lambda r: pde.clusters(r[1])):
        with pytest.raises(ValueError, match="host"):
            jax.jit(fn)(rho_t)
    assert pde.merge_times(ts, rho_t) == [(1.0, 5, 3), (1.5, 3, 2), (2.0, 2, 1)]
    key = jax.random.PRNGKey(4)
    traced = jax.jit(lambda e, k: pde.perturbed_uniform(m, e, k))(0.2, key)
    np.testing.assert_allclose(np.asarray(traced), pde.perturbed_uniform(m, 0.2, key), rtol=1e-14)
