"""Export cases of measure-to-measure control.

The layer flow and the objective's gradient for each model (also with the weights built inside
the function from NumPy), and the whole optimiser.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxdyn.control import default_controls, measure_control, measure_flow, measure_loss

from ._export import export_check

_RNG = np.random.default_rng(0)
N = 8


def _clouds(model):
    d = 3 if model == "sphere" else 2
    x0, y = _RNG.standard_normal((N, d)), _RNG.standard_normal((N, d))
    if model == "sphere":
        x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
        y /= np.linalg.norm(y, axis=1, keepdims=True)
    return x0.astype(np.float32), y.astype(np.float32)


def test_flow_and_loss_gradient_export_for_each_model():
    """The flow and the objective's gradient lower for cuda and tpu, both models."""
    for model in ("sphere", "euclidean"):
        x0, y = _clouds(model)
        c = {k: np.asarray(v) + 0.1 for k, v in
             default_controls(model, x0.shape[1], 2, jnp.float32).items()}
        assert export_check(lambda V, c=c, x0=x0, model=model: measure_flow(
            dict(c, V=V), x0, model=model, steps_per_layer=2), c["V"])
        assert export_check(lambda V, c=c, x0=x0, y=y, model=model: jax.grad(
            lambda v: measure_loss(dict(c, V=v), x0, y, model=model, epsilon=0.1))(V), c["V"])


def test_flow_exports_with_weights_built_inside_from_numpy():
    """The flow lowers with its weights built from NumPy inside the function."""
    x0, _ = _clouds("sphere")
    q = np.eye(3, dtype=np.float32)

    def f(x):
        c = {"Q": np.stack([q, q]), "K": np.stack([q, q]), "V": np.stack([q, 2 * q]),
             "beta": np.ones((2,), np.float32)}
        return measure_flow(c, x, model="sphere", steps_per_layer=1)

    assert export_check(f, x0)


def test_measure_control_exports():
    """The whole optimiser (Adam, L-BFGS, Sinkhorn) lowers for cuda and tpu."""
    x0, y = _clouds("euclidean")
    assert export_check(lambda x: measure_control(x, y, n_layers=2, adam_steps=2, lbfgs_steps=2,
                                           steps_per_layer=1), x0)
