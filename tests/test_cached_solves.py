"""The diffrax solves (Gaussian closure, density on S¹) check concrete times on the host (a clear
ValueError before tracing), and leave equinox's in-program checks on: a solve must not switch
off ``equinox.error_if`` for the rest of the process (an earlier attempt at making these programs
cacheable did, through equinox's module-level default; see jaxdyn/_host_checked.py)."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdyn import pde
from jaxdyn.gaussian import solve_moments


def test_solves_leave_equinox_checks_on():
    d = 3
    eye = jnp.eye(d, dtype=jnp.float32)
    sol = solve_moments(None, eye, A=-eye, B=0.1 * eye, V=eye, t1=0.5, saveat=7)
    assert int(sol.status) == 0
    th = (np.arange(37) + 0.5) * 2 * np.pi / 37
    model = pde.CircleDensity(np.eye(2), np.eye(2), np.eye(2), 2.0, 37, sigma=0.1)
    dens = pde.solve_density(model, (1 + 0.1 * np.cos(th)) / (2 * np.pi), t1=0.25, n_save=3)
    assert int(dens.result._value) == 0
    # a user's own check, jitted after those solves, still raises
    f = jax.jit(lambda x: eqx.error_if(x, x > 0, "positive"))
    with pytest.raises(Exception, match="positive"):
        jax.block_until_ready(f(jnp.float32(1.0)))
    # and diffrax's own checks of the save times, traced inside a user's jit with the same
    # shapes as the closure solve's (7 float32 times on [0, 0.5]: the case that leaked), raise
    @jax.jit
    def user_solve(ts):
        term = diffrax.ODETerm(lambda t, y, args: -y)
        return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 0.5, 0.05, jnp.float32(1.0),
                                   saveat=diffrax.SaveAt(ts=ts)).ys
    for bad in ([0.0, 0.1, 0.3, 0.2, 0.4, 0.45, 0.5], [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.9]):
        with pytest.raises(Exception):
            jax.block_until_ready(user_solve(jnp.asarray(bad, jnp.float32)))


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
