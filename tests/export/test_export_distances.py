"""Export cases of the W2 family: every function that can run under ``jit`` lowers for ``cuda``
and ``tpu`` with no host callback and no CPU-only custom call. (``w2_exact`` is SciPy's
assignment on the host: it has no program to export.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdyn.distances import bures_w2, bures_w2_squared, w2, w2_coupling, w2_sinkhorn

from ._export import export_check


def _clouds(n=24, m=20, d=3, dtype=np.float32):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d)).astype(dtype)
    y = (0.7 * rng.standard_normal((m, d)) + 0.3).astype(dtype)
    return jnp.asarray(x), jnp.asarray(y)


@pytest.mark.parametrize("batch_size", [None, 8], ids=["dense", "online"])
def test_w2_sinkhorn_exports(batch_size):
    x, y = _clouds()
    assert export_check(lambda a, b: w2_sinkhorn(a, b, batch_size=batch_size), x, y)


def test_w2_sinkhorn_fixed_epsilon_and_throw_export():
    # a traced ε (an argument of the program), and throw=True (eqx.error_if: under
    # EQX_ON_ERROR=nan a NaN select, no callback)
    x, y = _clouds()
    assert export_check(lambda a, b, e: w2_sinkhorn(a, b, epsilon=e), x, y, jnp.float32(0.1))
    assert export_check(lambda a, b: w2_sinkhorn(a, b, throw=True), x, y)


def test_w2_sinkhorn_gradient_exports():
    x, y = _clouds()
    assert export_check(lambda a, b: jax.grad(lambda p: w2_sinkhorn(p, b).divergence)(a), x, y)


def test_w2_coupling_exports():
    x, y = _clouds(m=24)
    assert export_check(w2_coupling, x, y)
    assert export_check(w2_coupling, jnp.stack([x, 2 * x]), y)  # a batch of clouds


@pytest.mark.parametrize("method", ["sinkhorn", "coupling"])
def test_w2_methods_export(method):
    x, y = _clouds(m=24)
    assert export_check(lambda a, b: w2(a, b, method=method), x, y)


def test_bures_w2_exports():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 3, 3))
    S0 = jnp.asarray(a @ np.swapaxes(a, -1, -2) + np.eye(3), jnp.float32)
    S1 = jnp.asarray(np.eye(3) * 2.0, jnp.float32)
    m0 = jnp.asarray(rng.standard_normal((4, 3)), jnp.float32)
    m1 = jnp.zeros(3, jnp.float32)
    assert export_check(bures_w2, m0, S0, m1, S1)
    assert export_check(bures_w2_squared, m0, S0, m1, S1)


def test_distances_built_inside_from_numpy_inputs_export():
    # clouds and Gaussians made inside the exported function from NumPy constants
    rng = np.random.default_rng(2)
    xn = rng.standard_normal((16, 2)).astype(np.float32)
    yn = (xn + 0.2).astype(np.float32)

    def f(scale):
        x = scale * jnp.asarray(xn)
        r = w2_sinkhorn(x, yn)
        b = bures_w2(np.zeros(2, np.float32), np.eye(2, dtype=np.float32),
                     np.ones(2, np.float32), scale * np.eye(2, dtype=np.float32))
        return r.value + b.value + w2_coupling(x, yn).value

    assert export_check(f, jnp.float32(1.5))
