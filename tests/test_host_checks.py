"""The diffrax solves (Gaussian closure, density on S¹) check concrete times on the host (a clear
ValueError before any tracing); under a user's jit the same solve keeps diffrax's in-program
checks and gives the same numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdyn import pde
from jaxdyn.gaussian import solve_moments


@pytest.mark.slow
def test_traced_times_give_the_concrete_solve():
    eye = jnp.eye(3, dtype=jnp.float32)
    A, B = -eye, 0.1 * eye
    sol = solve_moments(None, eye, A=A, B=B, V=eye, t1=0.5, saveat=7)
    assert int(sol.status) == 0
    ts = jnp.linspace(0.0, 0.5, 7, dtype=jnp.float32)
    traced = jax.jit(lambda ts: solve_moments(None, eye, A=A, B=B, V=eye, t1=0.5,
                                              saveat=ts).cov)(ts)
    np.testing.assert_array_equal(np.asarray(traced), np.asarray(sol.cov))


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
