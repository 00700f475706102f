"""The diffrax solves (Gaussian closure, density on S¹) are traced without host callbacks when
their times are concrete, so JAX writes them to the persistent compilation cache (a program
with a host callback is never written: it was compiled again in every process); the times are
checked on the host instead, and a traced time keeps diffrax's own checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn import pde
from jaxdyn._cache import disable_compilation_cache
from jaxdyn.gaussian import solve_moments


@pytest.fixture
def cache(tmp_path):
    folder = jaxdyn.enable_compilation_cache(tmp_path / "cache")
    try:
        yield folder
    finally:
        disable_compilation_cache()


def _written(folder, name):
    return [p.name for p in folder.iterdir() if name in p.name]


def test_closure_and_density_solves_are_written_to_the_cache(cache):
    # shapes no other test uses, and the in-memory caches cleared (an earlier test of the same
    # worker may have compiled the same program): the programs are compiled here
    jax.clear_caches()
    d = 3
    eye = jnp.eye(d, dtype=jnp.float32)
    sol = solve_moments(None, eye, A=-eye, B=0.1 * eye, V=eye, t1=0.5, saveat=7)
    assert int(sol.status) == 0
    assert _written(cache, "_solve_jit"), sorted(p.name for p in cache.iterdir())
    th = (np.arange(37) + 0.5) * 2 * np.pi / 37
    model = pde.CircleDensity(np.eye(2), np.eye(2), np.eye(2), 2.0, 37, sigma=0.1)
    dens = pde.solve_density(model, (1 + 0.1 * np.cos(th)) / (2 * np.pi), t1=0.25, n_save=3)
    assert int(dens.result._value) == 0
    assert _written(cache, "jit__solve-"), sorted(p.name for p in cache.iterdir())


def test_bad_save_times_raise_on_the_host():
    eye = jnp.eye(2)
    with pytest.raises(ValueError, match="non-decreasing"):
        solve_moments(None, eye, A=-eye, B=eye, V=eye, t1=1.0, saveat=jnp.array([0.0, 0.5, 0.25]))
    with pytest.raises(ValueError, match=r"must lie in \[0.0, 1.0\]"):
        solve_moments(None, eye, A=-eye, B=eye, V=eye, t1=1.0, saveat=jnp.array([0.0, 1.5]))
    model = pde.CircleDensity(np.eye(2), np.eye(2), np.eye(2), 2.0, 8)
    with pytest.raises(ValueError, match="non-decreasing"):
        pde.solve_density(model, np.full(8, 1 / (2 * np.pi)), t1=1.0, ts=[0.0, 1.0, 0.5])
    with pytest.raises(ValueError, match="dt must be > 0"):
        pde.solve_density(model, np.full(8, 1 / (2 * np.pi)), t1=1.0, dt=-0.1)
