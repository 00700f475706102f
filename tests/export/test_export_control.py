"""Export cases of jaxdyn.control: the loss reach minimises (its constant-step moment solve) for
each control family, the adaptive controlled solve, the particle transfer and the layers, the
Bures part of the cloud distance, and reach itself (its whole optimisation loop)."""

import jax.numpy as jnp
import numpy as np

from jaxdyn.control import (
    ControlledEuclideanAttention,
    cloud_w2_to_gaussian,
    controlled_moments,
    random_target,
    reach,
    reach_loss,
    transfer_particles,
    transformer_layers,
)
from jaxdyn.gaussian import Control

from ._export import export_check

D, N = 2, 4
_RNG = np.random.default_rng(0)
M1, S1 = random_target(1, D)


def _values(kind):
    n = N + (kind == "linear")
    vals = {k: 0.3 * _RNG.standard_normal((n, D, D)) for k in "ABV"}
    vals["b"] = 0.3 * _RNG.standard_normal((n, D))
    return vals


def test_reach_loss_exports_for_each_control_family():
    for kind in ("piecewise", "linear"):
        vals = _values(kind)

        def f(A, kind=kind, vals=vals):
            ctr = {k: Control(A if k == "A" else vals[k], 1.0, kind) for k in "ABVb"}
            return reach_loss(ctr, np.zeros(D), np.eye(D), M1, S1, energy_weight=0.1)

        assert export_check(f, jnp.asarray(vals["A"]))


def test_controlled_moments_exports():
    vals = _values("piecewise")
    assert export_check(lambda A: controlled_moments({k: Control(A if k == "A" else vals[k], 1.0)
                                               for k in "ABVb"}, None, np.eye(D), t1=1.0),
                 jnp.asarray(vals["A"]))


def test_transfer_particles_and_layers_export_with_the_model_built_inside():
    """The controlled field is built inside the function from NumPy control values."""
    vals = _values("piecewise")
    x0 = _RNG.standard_normal((16, D))

    def model():
        return ControlledEuclideanAttention.from_controls(
            {k: Control(v, 1.0) for k, v in vals.items()}, kernel="dense")

    assert export_check(lambda x: transfer_particles(model(), x, t1=1.0, steps_per_piece=2),
                 jnp.asarray(x0))
    assert export_check(lambda x: transformer_layers(model(), x, t1=1.0, n_layers=8), jnp.asarray(x0))


def test_cloud_w2_bures_exports():
    assert export_check(lambda x: cloud_w2_to_gaussian(x, M1, S1, exact=False),
                 jnp.asarray(_RNG.standard_normal((32, D))))


def test_reach_exports_with_traced_targets():
    """The whole optimisation (L-BFGS loop, verification solve) as one program."""
    assert export_check(lambda m1, S1: reach(np.zeros(D), np.eye(D), m1, S1, n_pieces=N, init="zero",
                                      lbfgs_steps=20, with_certificate=False),
                 jnp.asarray(M1), jnp.asarray(S1))
