"""Export cases of the infrastructure itself: the checker catches what it is for."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ._export import custom_call_targets, export_check


def test_checker_refuses_a_host_callback():
    def f(x):
        return jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct((3,), x.dtype), x)

    with pytest.raises(Exception):
        export_check(f, jnp.ones(3, jnp.float32))


def test_checker_reads_custom_call_targets():
    text = 'stablehlo.custom_call @lapack_sgesdd(%0) ... call_target_name = "cu_threefry2x32"'
    assert custom_call_targets(text) == {"lapack_sgesdd", "cu_threefry2x32"}


def test_plain_program_exports():
    seen = export_check(lambda x: jnp.tanh(x) @ x.T, jnp.ones((4, 3), jnp.float32))
    assert set(seen) == {"cuda", "tpu"}
