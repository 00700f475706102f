"""The particle drivers compose with JAX: ``simulate`` (fixed-step and adaptive),
``simulate_sde``, ``simulate_ensemble``, ``sharded_vmap``, ``query_sharded_field`` /
``query_sharded_interaction`` and ``shard_batch`` under ``jax.jit`` and ``jax.vmap`` with
traced inputs, and ``jax.grad`` through them against central finite differences in float64;
the fixed-step schemes are diffrax solvers (``diffeqsolve`` runs them, diffrax's own solvers
run in ``simulate``), and the SDE's Brownian increments are the draws of ``fold_in(key, k)``."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn.integrators import GeodesicEulerMaruyama, GridODETerm, ProjectedEuler, ProjectedRK4, Sphere
from jaxdyn.sphere import exp_map, tangent_project
from jaxdyn.simulation import (GridBrownianPath, query_sharded_field, query_sharded_interaction,
                               shard_batch, sharded_vmap)

H = 1e-5  # central-difference step (float64)


def _weights(d=3, seed=0):
    rng = np.random.default_rng(seed)
    return [np.eye(d) + 0.4 * rng.standard_normal((d, d)) for _ in range(3)]


def _x0(n=10, d=3, seed=1):
    return jaxdyn.sample_sphere(jax.random.PRNGKey(seed), n, d, jnp.float64)


def _central(f, v):
    return (f(v + H) - f(v - H)) / (2 * H)


def _assert_grad_matches(f, v, rtol=1e-6):
    g = float(jax.grad(f)(v))
    fd = float(_central(f, v))
    assert abs(g - fd) <= rtol * max(abs(fd), 1e-8), (g, fd)
    return g


# ------------------------------------------------------------------ simulate


@pytest.mark.slow
@pytest.mark.parametrize("method", ["euler", "rk4", "exp_euler", "euler_renormalise", "dopri5"])
def test_grad_of_simulate_against_central_differences(method):
    Q, K, V = _weights()
    x0 = _x0()

    def loss(beta):
        model = jaxdyn.SphereAttention(Q, K, V, beta)
        tr = jaxdyn.simulate(model, x0, t1=0.6, dt=0.05, method=method, rtol=1e-12, atol=1e-12)
        return jnp.sum(tr.xs[-1, :, 0] * jnp.arange(1.0, 11.0))

    _assert_grad_matches(loss, 2.0)


# the fixed-step solve the tests below share (one program: the same N, times and scheme)
FIXED = dict(t1=1.0, dt=0.1, save_every=5, method="euler")


def test_simulate_under_jit_and_vmap_with_traced_inputs():
    Q, K, V = _weights()
    x0s = np.stack([np.asarray(_x0(seed=s)) for s in range(3)])
    betas = [0.5, 2.0, 4.0]

    def run(beta, x0):
        return jaxdyn.simulate(jaxdyn.SphereAttention(Q, K, V, beta), x0, **FIXED)

    batched = jax.jit(jax.vmap(run))(jnp.asarray(betas), jnp.asarray(x0s))
    assert batched.xs.shape == (3, 3, 10, 3) and batched.status.shape == (3,)
    assert batched.num_steps.tolist() == [10, 10, 10]
    xs, ts = np.asarray(batched.xs), np.asarray(batched.ts)  # the checks in NumPy
    for i in range(3):
        one = run(betas[i], x0s[i])
        np.testing.assert_allclose(xs[i], np.asarray(one.xs), rtol=0, atol=1e-13)
        np.testing.assert_allclose(ts[i], np.asarray(one.ts), rtol=0, atol=0)


@pytest.mark.slow  # the fixed-step count: test_simulate_under_jit_and_vmap_with_traced_inputs (num_steps 10 a member); not in the default suite: an adaptive run's attempted > accepted steps
def test_step_counts_fixed_and_adaptive():
    Q, K, V = _weights()
    model = jaxdyn.SphereAttention(Q, K, V, 3.0)
    fixed = jaxdyn.simulate(model, _x0(), **FIXED)
    assert int(fixed.num_steps) == int(fixed.num_accepted_steps) == 10
    assert fixed.num_steps is fixed.stats["num_steps"]
    adaptive = jaxdyn.simulate(model, _x0(), t1=1.0, dt=0.5, method="dopri5", rtol=1e-10,
                               atol=1e-10)
    # attempted = accepted + rejected (diffrax's meaning); the first step of 0.5 is rejected
    assert int(adaptive.num_steps) > int(adaptive.num_accepted_steps) > 0
    assert not hasattr(adaptive, "n_steps")


@pytest.mark.slow
def test_a_diffrax_solver_object_as_method():
    """diffrax's own solvers run in simulate: Euler on the step grid (plain explicit Euler,
    the projected scheme on R^d), an adaptive one with the PID controller as "tsit5"."""
    A = -0.5 * np.eye(2)
    model = jaxdyn.EuclideanAttention(A, 0.2 * np.eye(2), 0.3 * np.eye(2), np.array([1.0, 0.0]))
    x0 = jnp.asarray(np.random.default_rng(0).standard_normal((5, 2)))
    ours = jaxdyn.simulate(model, x0, t1=1.0, dt=0.1, method="euler")
    theirs = jaxdyn.simulate(model, x0, t1=1.0, dt=0.1, method=diffrax.Euler())
    # the same steps; diffrax's linear dense output saves y0 + 1·(y1 − y0) (one rounding)
    np.testing.assert_allclose(np.asarray(ours.xs), np.asarray(theirs.xs), rtol=0, atol=1e-15)
    tsit = jaxdyn.simulate(model, x0, t1=1.0, dt=0.1, method=diffrax.Tsit5())
    named = jaxdyn.simulate(model, x0, t1=1.0, dt=0.1, method="tsit5")
    np.testing.assert_array_equal(np.asarray(tsit.xs), np.asarray(named.xs))
    # the scheme classes: a geometry given explicitly wins over the model's
    eye = np.eye(3)
    sph = jaxdyn.SphereAttention(eye, eye, eye, 1.0)
    free = jaxdyn.simulate(sph, _x0(), t1=1.0, dt=0.1, method=ProjectedRK4(jaxdyn.integrators.Euclidean()))
    assert float(jnp.max(jnp.abs(jnp.linalg.norm(free.xs[-1], axis=-1) - 1))) > 1e-10
    with pytest.raises(ValueError, match="method must be one of"):
        jaxdyn.simulate(sph, _x0(), t1=1.0, dt=0.1, method="leapfrog")


@pytest.mark.slow  # a plumbing identity (simulate calls diffeqsolve with its scheme); a jaxdyn scheme as a diffrax solver: test_geodesic_em_step_by_hand
def test_the_schemes_run_in_diffeqsolve():
    """A scheme of jaxdyn.integrators is a diffrax solver: diffeqsolve on the step grid gives
    simulate's states."""
    eye = np.eye(3)
    model = jaxdyn.SphereAttention(eye, eye, 0.5 * eye, 2.0)
    x0 = _x0()
    grid = np.arange(11) * 0.1
    sol = diffrax.diffeqsolve(GridODETerm(model, jnp.asarray(0.1)), ProjectedEuler(Sphere()), 0.0,
                              float(grid[-1]), None, x0, saveat=diffrax.SaveAt(t1=True),
                              stepsize_controller=diffrax.StepTo(grid), max_steps=10)
    ref = jaxdyn.simulate(model, x0, **FIXED)
    np.testing.assert_array_equal(np.asarray(sol.ys[-1]), np.asarray(ref.xs[-1]))


# ------------------------------------------------------------------ simulate_sde


def test_grid_brownian_path_draws_fold_in_of_the_step():
    key = jax.random.PRNGKey(7)
    grid = jnp.asarray(np.arange(6) * 0.25)
    struct = jax.ShapeDtypeStruct((4, 3), jnp.float64)
    path = GridBrownianPath(struct, key, grid, jnp.asarray(0.25))
    for k in range(5):
        want = 0.5 * jax.random.normal(jax.random.fold_in(key, k), (4, 3), jnp.float64)
        np.testing.assert_array_equal(np.asarray(path.evaluate(grid[k], grid[k + 1])),
                                      np.asarray(want))
    with pytest.raises(ValueError, match="increments"):
        path.evaluate(grid[1])


def test_geodesic_em_step_by_hand():
    """simulate_sde's first step is exp_x(dt f + σ P⊥(x) ΔW) with ΔW from fold_in(key, 0)."""
    Q, K, V = _weights()
    model = jaxdyn.SphereAttention(Q, K, V, 2.0)
    x0 = _x0()
    key = jax.random.PRNGKey(3)
    # three steps, every one saved: the program of the unbatched run of the vmap test below
    tr = jaxdyn.simulate_sde(model, x0, key, sigma=0.3, t1=0.3, dt=0.1)
    np.testing.assert_allclose(np.asarray(tr.ts), [0.0, 0.1, 0.2, 0.3], rtol=0, atol=1e-15)

    @jax.jit  # the step by hand, one program
    def by_hand(x0):
        dw = jnp.sqrt(0.1) * jax.random.normal(jax.random.fold_in(key, 0), x0.shape, x0.dtype)
        return exp_map(x0, 0.1 * model(0.0, x0) + 0.3 * tangent_project(x0, dw))

    np.testing.assert_allclose(np.asarray(tr.xs[1]), np.asarray(by_hand(x0)), rtol=0, atol=1e-15)
    assert isinstance(GeodesicEulerMaruyama(), diffrax.AbstractStratonovichSolver)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["geodesic_em", "heun"])
def test_grad_of_simulate_sde_against_central_differences(method):
    Q, K, V = _weights()
    x0 = _x0()
    key = jax.random.PRNGKey(2)

    def loss(beta, sigma=0.2):
        tr = jaxdyn.simulate_sde(jaxdyn.SphereAttention(Q, K, V, beta), x0, key, sigma=sigma,
                                 t1=0.4, dt=0.05, method=method)
        return jnp.sum(tr.xs[-1, :, 1] * jnp.arange(1.0, 11.0))

    _assert_grad_matches(loss, 1.5)
    _assert_grad_matches(lambda s: loss(1.5, s), 0.2)


def test_simulate_sde_under_vmap_over_keys_and_sigma():
    eye = np.eye(3)
    model = jaxdyn.SphereAttention(eye, eye, eye, 1.0)
    x0 = _x0()
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    sigmas = jnp.asarray([0.1, 0.2, -0.1])

    def run(key, sigma):
        return jaxdyn.simulate_sde(model, x0, key, sigma=sigma, t1=0.3, dt=0.1)

    out = jax.jit(jax.vmap(run))(keys, sigmas)
    assert list(out.names) == ["successful", "successful", "invalid_input"]
    np.testing.assert_array_equal(np.asarray(out.xs[1]), np.asarray(run(keys[1], 0.2).xs))


# ------------------------------------------------------------------ simulate_ensemble


def _stack(Q, K, V, betas):
    return jaxdyn.stack_models([jaxdyn.SphereAttention(Q, K, V, b) for b in betas])


@pytest.mark.slow
def test_simulate_ensemble_under_jit_vmap_and_grad():
    Q, K, V = _weights()
    x0 = jnp.stack([_x0(n=7, seed=s) for s in range(4)])
    kw = dict(t1=0.4, dt=0.05, save_every=4, method="rk4")
    betas = [0.5, 1.0, 2.0, 3.0]
    ref = jaxdyn.simulate_ensemble(_stack(Q, K, V, betas), x0, **kw)
    jitted = jax.jit(lambda b, x: jaxdyn.simulate_ensemble(_stack(Q, K, V, [b[i] for i in range(4)]),
                                                           x, **kw))(jnp.asarray(betas), x0)
    np.testing.assert_allclose(np.asarray(jitted.xs), np.asarray(ref.xs), rtol=0, atol=1e-14)
    assert list(jitted.names) == ["successful"] * 4
    # vmap over a leading axis of stacks (two ensembles at once)
    models = _stack(Q, K, V, betas)
    two = jax.vmap(lambda m, x: jaxdyn.simulate_ensemble(m, x, **kw).xs)(
        jax.tree.map(lambda a: jnp.stack([a, a]), models), jnp.stack([x0, x0[:, ::-1]]))
    np.testing.assert_allclose(np.asarray(two[0]), np.asarray(ref.xs), rtol=0, atol=1e-14)
    # a traced cloud off the sphere: flagged per system
    bad = x0.at[1, 0].multiply(1.5)
    status = jax.jit(lambda x: jaxdyn.simulate_ensemble(models, x, **kw).status)(bad)
    assert np.asarray(status).tolist() == [0, jaxdyn.status_code("invalid_input"), 0, 0]

    def loss(beta, ensemble=True):
        m = _stack(Q, K, V, [beta, 2 * beta, 0.5, 1.0])
        if ensemble:
            xs = jaxdyn.simulate_ensemble(m, x0, **kw).xs
        else:
            xs = jax.vmap(lambda mm, x: jaxdyn.simulate(mm, x, **kw))(m, x0).xs
        return jnp.sum(xs[:, -1, :, 0] * jnp.arange(1.0, 8.0))

    g = _assert_grad_matches(loss, 1.3)
    np.testing.assert_allclose(g, float(jax.grad(lambda b: loss(b, False))(1.3)), rtol=1e-10)


# ------------------------------------------------------------------ sharding


@pytest.mark.slow
def test_sharded_vmap_under_jit_vmap_and_grad():
    eye = np.eye(3)
    x0s = jnp.stack([_x0(n=6, seed=s) for s in range(3)])

    def loss(beta, adjoint=None):
        models = _stack(eye, eye, 0.5 * eye + 0.1, [beta, 1.5 * beta, 2.0])
        kw = {} if adjoint is None else {"adjoint": adjoint}
        run = sharded_vmap(lambda m, x: jaxdyn.simulate(m, x, t1=0.3, dt=0.1, method="rk4",
                                                        **kw).xs[-1])
        return jnp.sum(run(models, x0s)[..., 0] * jnp.arange(1.0, 7.0))

    ref = float(loss(1.0))
    np.testing.assert_allclose(float(jax.jit(loss)(1.0)), ref, rtol=1e-13)
    np.testing.assert_allclose(np.asarray(jax.vmap(loss)(jnp.asarray([1.0, 2.0])))[0], ref,
                               rtol=1e-13)
    _assert_grad_matches(lambda b: loss(b, diffrax.DirectAdjoint()), 1.0)


@pytest.mark.slow
def test_query_sharding_under_jit_vmap_and_grad():
    Q, K, V = _weights()
    B = jnp.asarray(Q.T @ K)
    x = _x0(n=9)

    def inter(beta):
        return jnp.sum(query_sharded_interaction(x, x, B, beta, kernel="dense")[:, 0])

    ref = jaxdyn.kernels.interaction(x, x, B, 2.0, kernel="dense")
    np.testing.assert_allclose(float(jax.jit(inter)(2.0)), float(jnp.sum(ref[:, 0])), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.vmap(inter)(jnp.asarray([2.0, 3.0])))[0],
                               float(jnp.sum(ref[:, 0])), rtol=1e-12)
    _assert_grad_matches(inter, 2.0)

    def flow(beta):
        field = query_sharded_field(jaxdyn.SphereAttention(Q, K, V, beta))
        return jnp.sum(jaxdyn.simulate(field, x, t1=0.3, dt=0.1, method="euler").xs[-1, :, 2])

    _assert_grad_matches(flow, 2.0)
    padded = jax.jit(lambda a: shard_batch({"a": a, "s": "static"})["a"])(jnp.arange(5.0))
    np.testing.assert_array_equal(np.asarray(padded)[:5], np.arange(5.0))


# ------------------------------------------------------------------ traced invalid parameters

I3 = np.eye(3)
# name -> (a model with the traced scalar v in the parameter's place, a value in its domain)
TRACED_PARAMETERS = {
    "sphere beta": (lambda v: jaxdyn.SphereAttention(I3, I3, I3, v), 1.0),
    "multi-head beta": (lambda v: jaxdyn.MultiHeadAttention(np.stack([I3, 0.5 * I3]),
                                                            np.stack([I3, I3]),
                                                            np.stack([I3, I3]), v), 1.0),
    "depth beta": (lambda v: jaxdyn.models.DepthAttention(I3[None], I3[None], I3[None], v), 1.0),
    "depth period": (lambda v: jaxdyn.models.DepthAttention(I3[None], I3[None], I3[None], 1.0, v),
                     0.5),
    "ngpt alpha": (lambda v: jaxdyn.models.layer_norm(jaxdyn.SphereAttention(I3, I3, I3, 1.0),
                                                      "ngpt", alpha=v), 0.2),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRACED_PARAMETERS))
def test_simulate_flags_a_traced_parameter_outside_its_domain(name):
    """A traced parameter outside its domain makes simulate's result invalid_input.

    model.invalid() (under vmap one flag a member; under jit) is OR-ed into the result; the
    members in the domain run as without the flag.
    """
    build, good = TRACED_PARAMETERS[name]
    x0 = _x0(n=6)

    def run(v, method="rk4"):
        return jaxdyn.simulate(build(v), x0, t1=0.2, dt=0.1, method=method)

    out = jax.vmap(run)(jnp.asarray([good, -1.0, good]))
    assert list(out.names) == ["successful", "invalid_input", "successful"]
    np.testing.assert_array_equal(np.asarray(out.xs[0]), np.asarray(run(good).xs))
    for v in (-1.0, np.nan):
        assert jax.jit(run)(v).names == "invalid_input", v
    assert jax.jit(run)(good).names == "successful"
    if name == "sphere beta":  # an adaptive method too
        assert jax.jit(lambda v: run(v, "dopri5"))(-1.0).names == "invalid_input"
        with pytest.raises(Exception, match="Invalid input"):  # throw=True: eqx.error_if
            jax.block_until_ready(jax.jit(lambda v: jaxdyn.simulate(
                build(v), x0, t1=0.2, dt=0.1, throw=True))(-1.0).xs)


@pytest.mark.slow
def test_simulate_sde_flags_a_traced_parameter_outside_its_domain():
    """A traced β or period outside its domain makes simulate_sde's result invalid_input."""
    x0 = _x0(n=6)
    key = jax.random.PRNGKey(0)
    for name in ("sphere beta", "depth period"):
        build, good = TRACED_PARAMETERS[name]

        def run(v, method="geodesic_em", build=build):
            return jaxdyn.simulate_sde(build(v), x0, key, sigma=0.1, t1=0.2, dt=0.1,
                                       method=method)

        out = jax.vmap(run)(jnp.asarray([good, -1.0]))
        assert list(out.names) == ["successful", "invalid_input"], name
        assert jax.jit(lambda v, run=run: run(v, "heun"))(-1.0).names == "invalid_input", name


@pytest.mark.slow
def test_simulate_ensemble_flags_a_traced_beta_per_system():
    """A traced β outside its domain flags its own system of the ensemble (jit and vmap)."""
    x0 = jnp.stack([_x0(n=5, seed=s) for s in range(3)])
    kw = dict(t1=0.2, dt=0.1, method="euler")

    def run(betas):
        return jaxdyn.simulate_ensemble(_stack(I3, I3, I3, [betas[i] for i in range(3)]), x0,
                                        **kw)

    betas = jnp.asarray([1.0, -1.0, 2.0])
    assert list(jax.jit(run)(betas).names) == ["successful", "invalid_input", "successful"]
    ref = run(jnp.asarray([1.0, 1.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(jax.jit(run)(betas).xs[0]), np.asarray(ref.xs[0]))
    # under vmap over stacks: one flag per system of each stack
    two = jax.vmap(run)(jnp.stack([betas, jnp.asarray([np.nan, 1.0, 1.0])]))
    assert [list(r) for r in two.names] == [["successful", "invalid_input", "successful"],
                                            ["invalid_input", "successful", "successful"]]


@pytest.mark.slow
def test_sharded_paths_flag_a_traced_parameter():
    """sharded_vmap(simulate) and a query-sharded field flag a traced β outside its domain."""
    x0s = jnp.stack([_x0(n=6, seed=s) for s in range(3)])
    run = sharded_vmap(lambda m, x: jaxdyn.simulate(m, x, t1=0.2, dt=0.1, method="rk4"))
    out = jax.jit(lambda b: run(_stack(I3, I3, I3, [b[0], b[1], b[2]]), x0s))(
        jnp.asarray([1.0, 2.0, -1.0]))
    assert list(out.names) == ["successful", "successful", "invalid_input"]
    x = _x0(n=6)

    def flow(beta):
        field = query_sharded_field(jaxdyn.SphereAttention(I3, I3, I3, beta))
        return jaxdyn.simulate(field, x, t1=0.2, dt=0.1, method="euler")

    assert list(jax.vmap(flow)(jnp.asarray([1.0, -1.0])).names) == ["successful", "invalid_input"]


def test_concrete_parameters_set_outside_their_domain_are_refused_on_the_host():
    """A concrete parameter set outside its domain after construction is a ValueError.

    The constructors refuse such a value, so it can only come from editing a built model; the
    drivers refuse it as they refuse any concrete bad input. A field without invalid() (a
    user's) is not flagged.
    """
    import equinox as eqx

    x0 = _x0(n=6)
    bad = eqx.tree_at(lambda m: m.beta, jaxdyn.SphereAttention(I3, I3, I3, 1.0), jnp.asarray(-1.0))
    with pytest.raises(ValueError, match="outside its domain"):
        jaxdyn.simulate(bad, x0, t1=0.2, dt=0.1)
    with pytest.raises(ValueError, match="outside its domain"):
        jaxdyn.simulate_sde(bad, x0, jax.random.PRNGKey(0), sigma=0.1, t1=0.2, dt=0.1)
    stack = eqx.tree_at(lambda m: m.beta, _stack(I3, I3, I3, [1.0, 2.0]), jnp.asarray([1.0, 0.0]))
    with pytest.raises(ValueError, match=r"members \[1\]"):
        jaxdyn.simulate_ensemble(stack, jnp.stack([x0, x0]), t1=0.2, dt=0.1)

    class Drift(eqx.Module):  # a user's field: no invalid()
        rate: jax.Array
        dim = 3

        def __call__(self, t, x, args=None):
            return -self.rate * x

    out = jax.vmap(lambda r: jaxdyn.simulate(Drift(r), x0, t1=0.2, dt=0.1))(jnp.asarray([1.0, -1.0]))
    assert list(out.names) == ["successful", "successful"]


@pytest.mark.parametrize("max_steps", [0, 2.5, True])
def test_max_steps_not_a_positive_integer_is_refused(max_steps):
    """simulate refuses a step budget that is not an integer >= 1, naming max_steps."""
    model = jaxdyn.SphereAttention(I3, I3, I3, 1.0)
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1"):
        jaxdyn.simulate(model, _x0(n=4), t1=0.1, dt=0.05, method="dopri5", max_steps=max_steps)
