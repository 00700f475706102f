"""Export cases of the Gaussian moment drivers: solve_moments (Paper B's field and an attention
variant's), solve_moments_batch (its composable path under jit) and the stationary points."""

import jax.numpy as jnp
import numpy as np

import jaxdyn
from jaxdyn.gaussian import solve_moments, solve_moments_batch

from ._export import export_check

D = 3
_RNG = np.random.default_rng(0)
A, B, V = (0.3 * _RNG.standard_normal((D, D)) for _ in range(3))
b = 0.3 * _RNG.standard_normal(D)


def test_solve_moments_exports():
    assert export_check(lambda S0: solve_moments(None, S0, A=A, B=B, V=V, b=b, t1=1.0, saveat=4),
                 jnp.eye(D))


def test_solve_moments_with_fields_built_inside_from_numpy():
    """The field's parameters are NumPy arrays captured by the function (constants of the
    program), and so is the initial state."""
    def f(scale):
        return solve_moments(np.zeros(D), 2 * np.eye(D), A=A, B=scale * B, V=V, b=b, t1=1.0)

    assert export_check(f, jnp.asarray(1.0))


def test_solve_moments_batch_exports():
    n = 4
    As = 0.3 * _RNG.standard_normal((n, D, D))
    assert export_check(lambda As: solve_moments_batch(None, 2 * np.eye(D), A=As, B=B, V=V, b=b, t1=1.0),
                 jnp.asarray(As))


def test_variant_moment_solve_exports():
    Q, K = (_RNG.standard_normal((2, 2, D)) for _ in range(2))
    Vh = 0.3 * _RNG.standard_normal((2, D, D))
    for attention in ("softmax", "l2", "sinkhorn"):
        assert export_check(lambda S0: solve_moments(None, S0, A=None, V=Vh, Q=Q, K=K, beta=0.5, t1=0.5,
                                              attention=attention), jnp.eye(D))


def test_stationary_covariance_exports():
    Am = np.eye(D) + 0.1 * A
    assert export_check(lambda Vm: jaxdyn.gaussian.stationary_covariance(Am, np.eye(D), Vm).cov,
                 jnp.asarray(-np.eye(D)))
