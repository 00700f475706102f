"""The multiscale W2 compiles nothing on a second call with the same clouds."""

import numpy as np
import pytest

import jaxdyn
from jaxdyn.distances import w2_sinkhorn


@pytest.mark.slow  # about 30 CPU-s: two multiscale solves at N = 5000
def test_second_multiscale_call_compiles_nothing_and_gives_the_same_value():
    """Every program of the multiscale solver is cached: a second call compiles none (about 30 CPU-s)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2000, 3)) * np.array([1.0, 0.6, 0.3])).astype(np.float32)
    a = np.diag([1.3, 0.9, 0.7])
    y = (x @ a + np.array([0.3, -0.2, 0.1])).astype(np.float32)
    first = w2_sinkhorn(x, y, multiscale=True)
    before = jaxdyn.compile_stats()["compiles"]
    second = w2_sinkhorn(x, y, multiscale=True)
    assert jaxdyn.compile_stats()["compiles"] == before
    assert float(second.value) == float(first.value)
    # y = A x + b with A symmetric positive definite: the identity pairing is optimal
    exact = float(np.sqrt(np.mean(np.sum((y.astype(np.float64) - x) ** 2, axis=1))))
    assert abs(float(second.value) / exact - 1.0) < 1e-3
    assert bool(second.converged)
