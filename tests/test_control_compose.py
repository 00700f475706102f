"""jax.jit / jax.vmap / jax.grad on the drivers of jaxdyn.control.

The loss (reach_loss: the moment solve with the controls) under jit and vmap, its gradient
against central finite differences in float64; reach itself under jax.jit with traced targets
(the same optimisation as a concrete call); the results (ReachResult, Certificate, CloudW2)
as pytrees of arrays.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _references import energy_np
from jaxdyn.control import (
    CloudW2,
    Certificate,
    ReachOptions,
    ReachResult,
    certificate,
    cloud_w2_to_gaussian,
    control_energy,
    random_target,
    reach,
    reach_loss,
    transfer_particles,
    transformer_layers,
)
from jaxdyn.gaussian import Control

D, N = 2, 4


def _controls(seed, kind="piecewise", scale=0.3):
    rng = np.random.default_rng(seed)
    n = N + (kind == "linear")
    vals = {k: scale * rng.standard_normal((n, D, D)) for k in "ABV"}
    vals["b"] = scale * rng.standard_normal((n, D))
    return {k: Control(jnp.asarray(v), 1.0, kind) for k, v in vals.items()}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["piecewise", "linear"])
def test_reach_loss_jit_and_vmap(kind):
    """jit gives the eager value; vmap over targets gives each target's value."""
    ctr = _controls(0, kind)
    m0, S0 = np.zeros(D), np.eye(D)
    targets = [random_target(s, D) for s in range(3)]
    kw = dict(energy_weight=0.1, steps_per_piece=8)
    direct = [reach_loss(ctr, m0, S0, m1, S1, **kw) for m1, S1 in targets]
    f = jax.jit(lambda m1, S1: reach_loss(ctr, m0, S0, m1, S1, **kw))
    m1s = jnp.asarray(np.stack([t[0] for t in targets]))
    S1s = jnp.asarray(np.stack([t[1] for t in targets]))
    batched = jax.vmap(f)(m1s, S1s)
    for i, r in enumerate(direct):
        assert r.names == "successful"
        np.testing.assert_allclose(float(f(m1s[i], S1s[i]).loss), float(r.loss), rtol=1e-12)
        np.testing.assert_allclose(float(batched.loss[i]), float(r.loss), rtol=1e-12)
    assert batched.status.shape == (3,)
    # the energy term: ∫ Σ‖u‖_F² dt in NumPy (exact for both kinds; tests/_references.py)
    np.testing.assert_allclose(float(direct[0].energy), energy_np(ctr, tuple(ctr)), rtol=1e-12)
    np.testing.assert_allclose(float(control_energy(ctr)), energy_np(ctr, tuple(ctr)), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["piecewise", "linear"])
def test_reach_loss_gradient_matches_finite_differences(kind):
    """∂L/∂(control values) and ∂L/∂m1 against central differences (float64, h = 1e-6)."""
    ctr = _controls(1, kind)
    m0, S0 = np.zeros(D), np.eye(D)
    m1, S1 = (jnp.asarray(a) for a in random_target(2, D))

    def loss(vals, m1):
        c = {k: Control(v, 1.0, kind) for k, v in vals.items()}
        return reach_loss(c, m0, S0, m1, S1, energy_weight=0.05, steps_per_piece=4).loss

    vals = {k: c.values for k, c in ctr.items()}
    gv, gm = jax.jit(jax.grad(loss, argnums=(0, 1)))(vals, m1)
    f = jax.jit(loss)
    h = 1e-6
    rng = np.random.default_rng(3)
    for k in "ABVb":  # two random entries of each control
        for _ in range(2):
            idx = tuple(int(rng.integers(s)) for s in vals[k].shape)
            up = {**vals, k: vals[k].at[idx].add(h)}
            dn = {**vals, k: vals[k].at[idx].add(-h)}
            fd = (float(f(up, m1)) - float(f(dn, m1))) / (2 * h)
            assert float(gv[k][idx]) == pytest.approx(fd, rel=1e-6, abs=1e-9), (k, idx)
    for i in range(D):
        e = jnp.zeros(D).at[i].set(h)
        fd = (float(f(vals, m1 + e)) - float(f(vals, m1 - e))) / (2 * h)
        assert float(gm[i]) == pytest.approx(fd, rel=1e-6, abs=1e-9)


@pytest.mark.slow
def test_reach_under_jit_with_traced_targets():
    """reach inside jax.jit (traced m1, S1): the same optimisation as the concrete call (same
    iterations and optimiser W2), the histories padded with NaN to the iteration budget; the
    verification solve and the result code run inside the program too."""
    m0, S0 = np.zeros(D), np.eye(D)
    m1, S1 = random_target(1, D)
    # the grid and budgets of tests/test_control.py's reach calls: the concrete call's program
    # is theirs
    opts = ReachOptions(init="zero", with_certificate=False, stop_factor=1.0)
    r = reach(m0, S0, m1, S1, n_pieces=8, options=opts)
    rj = jax.jit(lambda m1, S1: reach(m0, S0, m1, S1, n_pieces=8, options=opts))(
        jnp.asarray(m1), jnp.asarray(S1))
    assert isinstance(rj, ReachResult)
    assert int(rj.iterations) == int(r.iterations)
    np.testing.assert_allclose(float(rj.w2_optimizer), float(r.w2_optimizer), rtol=1e-9)
    np.testing.assert_allclose(float(rj.w2), float(r.w2), rtol=1e-9)
    assert bool(rj.ok) == bool(r.ok) and rj.names == r.names
    n = int(r.iterations) + 1
    np.testing.assert_allclose(np.asarray(rj.loss_history[:n]), np.asarray(r.loss_history), rtol=1e-9)
    assert np.all(np.isnan(np.asarray(rj.loss_history[n:])))
    for k in "ABVb":
        np.testing.assert_allclose(np.asarray(rj.controls[k].values),
                                   np.asarray(r.controls[k].values), rtol=1e-9, atol=1e-12)
    assert rj.rank is None and r.rank == D


def test_results_are_pytrees_of_arrays():
    """ReachResult, Certificate and CloudW2: every leaf an array (flatten/unflatten round trip),
    static metadata in the tree structure."""
    m0, S0 = np.zeros(D), np.eye(D)
    m1, S1 = random_target(1, D)
    r = reach(m0, S0, m1, S1, n_pieces=8, init="zero")
    c = certificate(m0, S0, m1, S1, t1=1.0, n_pieces=8)
    w = cloud_w2_to_gaussian(np.random.default_rng(0).standard_normal((50, D)), m1, S1)
    for res, cls in ((r, ReachResult), (c, Certificate), (w, CloudW2)):
        assert isinstance(res, cls)
        leaves, tree = jax.tree.flatten(res)
        assert leaves and all(isinstance(x, jax.Array) for x in leaves), cls
        assert isinstance(jax.tree.unflatten(tree, leaves), cls)
    assert isinstance(r.certificate, Certificate) and r.free == ("A", "b", "V", "B")


@pytest.mark.slow
def test_cloud_w2_bures_under_jit_vmap_grad():
    """The Bures part of cloud_w2_to_gaussian under jit, vmap and grad (exact=False); the
    exact part refuses traced inputs."""
    rng = np.random.default_rng(4)
    m1, S1 = random_target(5, D)
    xs = jnp.asarray(rng.standard_normal((3, 40, D)))
    f = jax.jit(lambda x: cloud_w2_to_gaussian(x, m1, S1, exact=False).bures)
    direct = [float(cloud_w2_to_gaussian(x, m1, S1, exact=False).bures) for x in xs]
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(xs)), direct, rtol=1e-12)
    g = jax.grad(f)(xs[0])
    h = 1e-6
    e = jnp.zeros_like(xs[0]).at[3, 1].set(h)
    fd = (float(f(xs[0] + e)) - float(f(xs[0] - e))) / (2 * h)
    assert float(g[3, 1]) == pytest.approx(fd, rel=1e-6)
    with pytest.raises(ValueError, match="exact=False"):
        jax.jit(lambda x: cloud_w2_to_gaussian(x, m1, S1).bures)(xs[0])


@pytest.mark.slow  # ~19 CPU-s: the batched optimisation loop compiles once more
def test_reach_under_vmap_over_targets():
    """reach vmapped over three targets: each member's optimisation as its own call (the same
    iterations, W2 to rounding)."""
    m0, S0 = np.zeros(D), np.eye(D)
    targets = [random_target(s, D) for s in range(3)]
    opts = ReachOptions(init="zero", with_certificate=False, stop_factor=1.0)
    rv = jax.vmap(lambda m1, S1: reach(m0, S0, m1, S1, n_pieces=8, options=opts))(
        jnp.asarray(np.stack([t[0] for t in targets])), jnp.asarray(np.stack([t[1] for t in targets])))
    assert rv.status.shape == (3,)
    for i, (m1, S1) in enumerate(targets):
        r = reach(m0, S0, m1, S1, n_pieces=8, options=opts)
        assert int(rv.iterations[i]) == int(r.iterations)
        assert int(rv.status[i]) == int(r.status)
        np.testing.assert_allclose(float(rv.w2[i]), float(r.w2), rtol=1e-6)


@pytest.mark.slow
def test_transfer_particles_and_layers_under_jit_vmap_grad():
    """transfer_particles and transformer_layers: jit with a traced t1 gives the eager cloud,
    vmap over initial clouds gives each cloud's, and the gradient of a scalar of the final
    cloud with respect to a control value matches central differences (float64)."""
    ctr = _controls(6)
    rng = np.random.default_rng(7)
    x0s = jnp.asarray(rng.standard_normal((2, 9, D)))
    eager = transfer_particles(ctr, x0s[0], t1=1.0, steps_per_piece=4)
    jitted = jax.jit(lambda x, t1: transfer_particles(ctr, x, t1=t1, steps_per_piece=4))
    np.testing.assert_allclose(np.asarray(jitted(x0s[0], jnp.asarray(1.0))), np.asarray(eager),
                               rtol=1e-12, atol=1e-13)
    batched = jax.vmap(lambda x: transformer_layers(ctr, x, t1=1.0, n_layers=8))(x0s)
    for i in range(2):
        np.testing.assert_allclose(np.asarray(batched[i]),
                                   np.asarray(transformer_layers(ctr, x0s[i], t1=1.0, n_layers=8)),
                                   rtol=1e-12, atol=1e-13)

    def scalar(vals, layers):
        c = {k: Control(v, 1.0) for k, v in vals.items()}
        if layers:
            return jnp.sum(transformer_layers(c, x0s[0], t1=1.0, n_layers=8) ** 2)
        return jnp.sum(transfer_particles(c, x0s[0], t1=1.0, steps_per_piece=4)[-1] ** 2)

    vals = {k: c.values for k, c in ctr.items()}
    h = 1e-6
    for layers in (False, True):
        g = jax.grad(scalar)(vals, layers)
        for k, idx in (("B", (1, 0, 1)), ("b", (2, 1))):
            up = {**vals, k: vals[k].at[idx].add(h)}
            dn = {**vals, k: vals[k].at[idx].add(-h)}
            fd = (float(scalar(up, layers)) - float(scalar(dn, layers))) / (2 * h)
            assert float(g[k][idx]) == pytest.approx(fd, rel=1e-6, abs=1e-9), (layers, k)
