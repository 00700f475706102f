"""The diffrax solves (Gaussian closure, density on S¹) with concrete times are checked on the host
and traced without host callbacks, inside a JAX user context (jaxdyn/_host_checked.py), so their
executables are kept across processes (jaxdyn._cache.cached_program and JAX's persistent cache;
a program with a host callback never is). The
switch must not leak: equinox's ``error_if`` and diffrax's own checks keep raising in user code
traced before and after those solves (session 6's first attempt, without the context, silenced
them for the rest of the process: the second test failed on that code)."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn import pde
from jaxdyn._cache import compile_stats, disable_compilation_cache
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


def _closure_solve():
    eye = jnp.eye(3, dtype=jnp.float32)
    return solve_moments(None, eye, A=-eye, B=0.1 * eye, V=eye, t1=0.5, saveat=7)


def _density_solve():
    th = (np.arange(37) + 0.5) * 2 * np.pi / 37
    model = pde.CircleDensity(np.eye(2), np.eye(2), np.eye(2), 2.0, 37, sigma=0.1)
    return pde.solve_density(model, (1 + 0.1 * np.cos(th)) / (2 * np.pi), t1=0.25, n_save=3)


@jax.jit
def _user_solve(ts):
    # diffrax's own checks of the save times, traced in a user's jit with the same shapes as the
    # closure solve's (7 float32 times on [0, 0.5]: the case that leaked in session 6)
    term = diffrax.ODETerm(lambda t, y, args: -y)
    return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 0.5, 0.05, jnp.float32(1.0),
                               saveat=diffrax.SaveAt(ts=ts)).ys


_user_check = jax.jit(lambda x: eqx.error_if(x, x > 0, "positive"))
_BAD_TS = ([0.0, 0.1, 0.3, 0.2, 0.4, 0.45, 0.5], [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.9])


def _user_checks_raise():
    with pytest.raises(Exception, match="positive"):
        jax.block_until_ready(_user_check(jnp.float32(1.0)))
    for bad in _BAD_TS:
        with pytest.raises(Exception):
            jax.block_until_ready(_user_solve(jnp.asarray(bad, jnp.float32)))


def test_solves_are_cached_and_leave_equinox_checks_on(cache):
    # the in-memory caches cleared (an earlier test of the same worker may have compiled the
    # same programs): the programs are traced and compiled here. User checks are traced BEFORE
    # the solves (their traces must not be reused inside the solves, nor the solves' traces
    # outside), then the solves, then the same user functions again.
    jax.clear_caches()
    _user_checks_raise()
    programs = cache / "jaxdyn-programs"
    before = compile_stats()["programs_written"]
    sol = _closure_solve()
    assert int(sol.status) == 0
    # the executable itself (traced once across processes: jaxdyn._cache.cached_program) and
    # JAX's persistent cache entry
    assert compile_stats()["programs_written"] == before + 1
    assert _written(cache, "jit_flat_fn-"), sorted(p.name for p in cache.iterdir())
    dens = _density_solve()
    assert int(dens.result._value) == 0
    # the density solve's program and its step bound's ‖V‖₂ (jaxdyn.pde._circle.spectral_norm)
    assert compile_stats()["programs_written"] == before + 3
    assert len(list(programs.glob("*.jaxexe"))) == 3
    _user_checks_raise()
    # the same numbers as the checked program (traced times: a solve under the user's own jit
    # keeps diffrax's checks)
    eye = jnp.eye(3, dtype=jnp.float32)
    A, B = -eye, 0.1 * eye
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
