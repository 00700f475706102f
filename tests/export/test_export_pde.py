"""Export cases of the density solver and the cluster statistics: every traceable public function
of ``jaxdyn.pde`` and ``jaxdyn.clusters`` lowers for cuda and tpu, the models built inside the
function from NumPy weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn import clusters as C
from jaxdyn import pde

from ._export import export_check

I2, I3 = np.eye(2), np.eye(3)
DIAG2 = np.diag([1.0, 0.6])   # B not of the form aI + bJ: the dense kernel
M = 32


def _rho0(dtype=jnp.float64):
    return jnp.asarray(pde.perturbed_uniform(M, 0.1, jax.random.PRNGKey(0), k_max=4), dtype)


def _rho0_s2(nl=4, nn=8):
    return jnp.full((nl, nn), 1 / (4 * np.pi), jnp.float64)


@pytest.mark.parametrize("K,method", [(I2, "heun"), (DIAG2, "heun"), (I2, "dopri5")])
def test_solve_density_circle_built_inside(K, method):
    def f(rho0, beta):
        model = pde.CircleDensity(I2, K, np.array([[1.0, 0.2], [0.0, 0.9]]), 5.0, M, sigma=0.1)
        traced = pde.CircleDensity(I2, K, I2, beta, M)  # a traced β beside NumPy weights
        a = pde.solve_density(model, rho0, t1=0.5, n_save=3, method=method)
        b = pde.solve_density(traced, rho0, t1=0.5, n_save=2, dt=0.01)
        return a, b

    assert export_check(f, _rho0(), jnp.float64(3.0))


def test_solve_density_traced_model_times_and_step():
    model = pde.CircleDensity(I2, I2, I2, 4.0, M, sigma=0.05, dtype=jnp.float32)

    def f(model, rho0, ts, dt):
        return pde.solve_density(model, rho0, t1=1.0, ts=ts, dt=dt)

    assert export_check(f, model, _rho0(jnp.float32), jnp.linspace(0.0, 1.0, 4, dtype=jnp.float32),
                 jnp.float32(0.02))
    assert export_check(lambda t1: pde.solve_density(model, _rho0(jnp.float32), t1=t1, n_save=3),
                 jnp.float32(0.7))


@pytest.mark.parametrize("K", [I3, np.diag([1.0, 0.8, 0.5])])
def test_solve_density_sphere_built_inside(K):
    def f(rho0):
        model = pde.SphereDensity(I3, K, I3, 2.0, 4, 8, sigma=0.1)
        return pde.solve_density(model, rho0, t1=0.2, n_save=2)

    assert export_check(f, _rho0_s2())


def test_rates_built_inside():
    def f(beta):
        circ = pde.CircleDensity(I2, I2, I2, beta, M)
        sph = pde.SphereDensity(I3, I3, I3, beta, 4, 8, kernel="fft")
        return pde.growth_rate(circ, [1, 2, 3]), pde.zonal_growth_rate(sph, [1, 2])

    assert export_check(f, jnp.float64(3.0))


def test_circle_attention_field_built_inside():
    x = jnp.asarray(pde.quantile_points(np.asarray(_rho0()), 16))

    def f(x, beta):
        field = pde.CircleAttention(I2, DIAG2, I2, 4.0)
        traced = pde.CircleAttention(I2, I2, I2, beta, n_modes=12, normalization="unnormalized")
        return field(0.0, x), traced(0.0, x)

    assert export_check(f, x, jnp.float64(2.0))


def test_density_cluster_statistics():
    rho_t = jnp.stack([_rho0(), jnp.asarray(pde.perturbed_uniform(M, 5.0, jax.random.PRNGKey(1), k_max=3))])
    ts = jnp.asarray([0.0, 1.0])

    def f(rho_t, ts, eps, key):
        n = pde.cluster_counts(rho_t).astype(rho_t.dtype)
        t, c = pde.first_clusters(ts, rho_t)
        return n, t, c.astype(t.dtype), pde.perturbed_uniform(M, eps, key)

    assert export_check(f, rho_t, ts, jnp.float64(0.1), jax.random.PRNGKey(2))


def test_particle_cluster_statistics():
    xs = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 3 * 12, 3, dtype=jnp.float64).reshape(3, 12, 3)
    ts = jnp.asarray([0.0, 1.0, 2.0])

    def f(xs, beta, delta):
        counts = C.cluster_count(xs, delta)
        ints = (counts, C.cluster_labels(xs, delta), C.gram_rank(xs), C.span_dimension(xs))
        return (tuple(a.astype(xs.dtype) for a in ints) + (
            C.gram(xs), C.pair_fraction(xs, 0.9), C.pair_fraction(xs, 0.9, include_self=True),
            C.cluster_masses(xs, delta), C.cluster_centres(xs, delta),
            C.interaction_energy(xs, beta), C.log_partition_energy(xs, beta, I3 * 0.5),
            C.hitting_times(ts, counts, jnp.asarray([1, 2]))))

    assert export_check(f, xs, jnp.float64(2.0), jnp.float64(0.05))
