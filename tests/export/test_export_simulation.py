"""The particle drivers lower for ``cuda`` and ``tpu`` with no host callback or CPU-only call.

``simulate`` with every method (the model given, and built inside the exported
function from NumPy weights), ``simulate_sde``, ``simulate_ensemble`` and
``sharded_vmap(simulate)``; the flag of traced parameters outside their domain
(``model.invalid()`` in the result) included.
"""

import diffrax
import jax
import numpy as np
import pytest

import jaxdyn
from jaxdyn.simulation import sharded_vmap

from ._export import export_check

RNG = np.random.default_rng(0)
D = 3
Q, K, V = (np.eye(D, dtype=np.float32) + 0.3 * RNG.standard_normal((D, D)).astype(np.float32)
           for _ in range(3))
X0 = np.asarray(jaxdyn.sample_sphere(jax.random.PRNGKey(0), 6, D, np.float32))
METHODS = ["euler", "rk4", "exp_euler", "euler_renormalise", "tsit5", "dopri5", "dopri8"]


def _model(kind):
    """A model built from the NumPy weights (inside the exported function when called there)."""
    if kind == "sphere":
        return jaxdyn.SphereAttention(Q, K, V, 2.0)
    if kind == "zero":
        return jaxdyn.ZeroTemperature(Q + 2 * np.eye(D, dtype=np.float32), K, V)
    return jaxdyn.EuclideanAttention(-0.5 * np.eye(D, dtype=np.float32), 0.3 * K, 0.5 * V,
                                     np.ones(D, np.float32))


@pytest.mark.parametrize("method", METHODS)
def test_simulate_model_given(method):
    model = _model("sphere")
    assert export_check(lambda x0: jaxdyn.simulate(model, x0, t1=0.3, dt=0.1, method=method), X0)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ["sphere", "euclidean", "zero"])
def test_simulate_model_built_inside_from_numpy_weights(kind, method):
    if kind == "euclidean" and method == "euler_renormalise":
        method = "euler"  # in R^d the same step
    assert export_check(lambda x0: jaxdyn.simulate(_model(kind), x0, t1=0.3, dt=0.1, method=method), X0)


def test_simulate_with_a_diffrax_solver_and_traced_beta():
    def run(x0, beta):
        return jaxdyn.simulate(jaxdyn.SphereAttention(Q, K, V, beta), x0, t1=0.3, dt=0.1,
                               method=diffrax.Heun())

    assert export_check(run, X0, np.float32(1.5))


@pytest.mark.parametrize("method", ["geodesic_em", "heun"])
@pytest.mark.parametrize("kind", ["sphere", "euclidean"])
def test_simulate_sde(kind, method):
    def run(x0, sigma):
        return jaxdyn.simulate_sde(_model(kind), x0, jax.random.PRNGKey(1), sigma=sigma,
                                   t1=0.3, dt=0.1, method=method)

    assert export_check(run, X0, np.float32(0.2))


def test_simulate_ensemble_models_built_and_stacked_inside():
    x0 = np.stack([X0, X0[::-1]])

    def run(x0, betas):
        models = jaxdyn.stack_models([jaxdyn.SphereAttention(Q, K, V, betas[i]) for i in range(2)])
        return jaxdyn.simulate_ensemble(models, x0, t1=0.3, dt=0.1, method="euler_renormalise")

    assert export_check(run, x0, np.asarray([1.0, 3.0], np.float32))


def test_simulate_ensemble_of_multihead_models_built_inside():
    x0 = np.stack([X0, X0[::-1]])

    def run(x0, betas):
        models = jaxdyn.stack_models([jaxdyn.MultiHeadAttention(
            np.stack([Q, K]), np.stack([K, V]), np.stack([V, Q]), betas[i], mask="causal",
            alibi=0.1) for i in range(2)])
        return jaxdyn.simulate_ensemble(models, x0, t1=0.3, dt=0.1, method="rk4")

    assert export_check(run, x0, np.asarray([1.0, 3.0], np.float32))


def test_query_sharded_field_of_multihead():
    from jaxdyn.simulation import query_sharded_field

    def run(x0, beta):
        model = jaxdyn.MultiHeadAttention(np.stack([Q, K]), np.stack([K, V]), np.stack([V, Q]),
                                          beta, mask="causal", rope=True, kernel="blocked",
                                          k_block=4, q_block=4)
        return jaxdyn.simulate(query_sharded_field(model), x0, t1=0.3, dt=0.1, method="rk4")

    assert export_check(run, X0, np.float32(2.0))


def test_sharded_vmap_of_simulate():
    x0 = np.stack([X0, X0[::-1], X0])

    def run(x0, betas):
        models = jaxdyn.stack_models([jaxdyn.SphereAttention(Q, K, V, betas[i]) for i in range(3)])
        return sharded_vmap(lambda m, x: jaxdyn.simulate(m, x, t1=0.3, dt=0.1, method="rk4"))(
            models, x0)

    assert export_check(run, x0, np.asarray([1.0, 2.0, 3.0], np.float32))


I = np.eye(D, dtype=np.float32)
# a model with the traced scalar v in a value-constrained parameter's place
TRACED = {
    "multi-head beta": lambda v: jaxdyn.MultiHeadAttention(np.stack([Q, K]), np.stack([K, V]),
                                                           np.stack([V, Q]), v),
    "depth period": lambda v: jaxdyn.DepthAttention(np.stack([Q, K]), np.stack([K, V]),
                                                    np.stack([V, Q]), 1.0, v),
    "ngpt alpha": lambda v: jaxdyn.layer_norm(jaxdyn.SphereAttention(Q, K, V, 1.0), "ngpt",
                                              alpha=v),
}


def _with_status(tr):
    """The trajectory and its status as a float (the summed output then depends on the flag)."""
    return tr, tr.status.astype(np.float32)


@pytest.mark.parametrize("name", sorted(TRACED))
def test_simulate_and_sde_flag_traced_parameters(name):
    """The flag of a traced β, period or α in simulate's and simulate_sde's program."""
    def run(x0, v):
        return _with_status(jaxdyn.simulate(TRACED[name](v), x0, t1=0.3, dt=0.1, method="rk4"))

    assert export_check(run, X0, np.float32(0.5))

    def noisy(x0, v):
        return _with_status(jaxdyn.simulate_sde(TRACED[name](v), x0, jax.random.PRNGKey(1),
                                                sigma=0.1, t1=0.3, dt=0.1))

    assert export_check(noisy, X0, np.float32(0.5))


def test_simulate_ensemble_and_sharded_vmap_flag_traced_betas():
    """The flags of traced βs in simulate_ensemble's and sharded_vmap(simulate)'s programs."""
    x0 = np.stack([X0, X0[::-1]])

    def stack(betas):
        return jaxdyn.stack_models([jaxdyn.SphereAttention(Q, K, V, betas[i]) for i in range(2)])

    def ensemble(x0, betas):
        return _with_status(jaxdyn.simulate_ensemble(stack(betas), x0, t1=0.3, dt=0.1,
                                                     method="euler"))

    def sharded(x0, betas):
        return _with_status(sharded_vmap(lambda m, x: jaxdyn.simulate(m, x, t1=0.3, dt=0.1))(
            stack(betas), x0))

    betas = np.asarray([1.0, 3.0], np.float32)
    assert export_check(ensemble, x0, betas)
    assert export_check(sharded, x0, betas)
