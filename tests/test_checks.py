"""The shared dtype rule of the entry points (jaxdyn._checks): check_dtype, float_dtype,
real_arrays, check_host, any_nonfinite, in float32 and float64, concrete and traced."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdyn import _checks
from jaxdyn._checks import (DtypeError, HostOnlyError, any_nonfinite, check_dtype, check_host,
                            float_dtype, nan_where, real_arrays)

REAL = [np.float32, np.float64]


@pytest.mark.parametrize("dtype", REAL)
def test_check_dtype_takes_float32_and_float64_concrete_and_traced(dtype):
    a = jnp.ones((2, 3), dtype)
    assert check_dtype("x", a) == np.dtype(dtype)
    assert check_dtype("x", np.ones(3, dtype)) == np.dtype(dtype)
    # the dtype is known when tracing: a tracer is checked like a concrete array
    assert jax.jit(lambda x: jnp.asarray(check_dtype("x", x) == np.dtype(dtype)))(a)
    assert check_dtype("x", None) is None


@pytest.mark.parametrize("bad", [jnp.complex64, jnp.complex128])
def test_check_dtype_refuses_complex_by_name_concrete_and_traced(bad):
    a = jnp.ones(3, bad)
    with pytest.raises(TypeError, match=r"^x must hold float32 or float64.*imaginary part.*"
                                        rf"got dtype {np.dtype(bad).name}$"):
        check_dtype("x", a)
    with pytest.raises(TypeError, match=r"^f: x must hold"):
        jax.jit(lambda x: check_dtype("x", x, fn="f") and x)(a)


@pytest.mark.parametrize("half", [jnp.float16, jnp.bfloat16])
def test_check_dtype_half_precision_only_where_allowed(half):
    a = jnp.ones(3, half)
    with pytest.raises(TypeError, match=r"^s must hold float32 or float64 .*no half-precision "
                                        rf"path.*got dtype {np.dtype(half).name}"):
        check_dtype("s", a)
    assert check_dtype("s", a, half=True) == np.dtype(half)
    with pytest.raises(TypeError, match="s must hold"):
        check_dtype("s", jnp.ones(3, jnp.complex64), half=True)


def test_check_dtype_integers_taken_or_refused_by_name():
    for a in (np.arange(3), np.arange(3, dtype=np.int32), np.array([True, False])):
        check_dtype("n", a)
        with pytest.raises(TypeError, match=r"^n must hold float32 or float64 numbers, got"):
            check_dtype("n", a, integers=False)
    with pytest.raises(TypeError, match="must hold"):
        check_dtype("n", np.array(["a", "b"]))


def test_dtype_error_is_a_type_error_and_a_value_error():
    with pytest.raises(ValueError):
        check_dtype("x", np.ones(2, np.complex64))
    assert issubclass(DtypeError, TypeError) and issubclass(DtypeError, ValueError)
    assert issubclass(HostOnlyError, TypeError) and issubclass(HostOnlyError, ValueError)
    assert "float32 or float64" in _checks.DTYPES_RULE


@pytest.mark.parametrize("dtype", REAL)
def test_float_dtype_converts_integers_to_the_other_inputs_float(dtype):
    i = np.arange(3, dtype=np.int32)
    assert float_dtype(i, np.ones(2, dtype)) == np.dtype(dtype)
    assert float_dtype(np.ones(2, dtype), None) == np.dtype(dtype)
    # integers alone: JAX's default float (float64 under the suite's x64)
    assert float_dtype(i) == jnp.result_type(float)


@pytest.mark.parametrize("dtype", REAL)
def test_real_arrays_converts_integers_only(dtype):
    f = jnp.ones((2, 2), dtype)
    i = np.arange(4, dtype=np.int32).reshape(2, 2)
    a, b, c = real_arrays(a=f, b=i, c=None)
    assert a is f and c is None
    assert b.dtype == dtype
    np.testing.assert_array_equal(np.asarray(b), i)
    with pytest.raises(TypeError, match=r"^g: b must hold float32 or float64"):
        real_arrays(fn="g", a=f, b=i.astype(np.complex64))
    h = jnp.ones(2, jnp.float16)
    assert real_arrays(half=True, a=h)[0] is h


@pytest.mark.parametrize("dtype", REAL)
def test_check_host_names_the_function_under_jit_and_vmap(dtype):
    x = jnp.ones((2, 2), dtype)
    check_host("fn", x=x, y=None)  # concrete: nothing to say

    def host(a):
        check_host("host_fn", a=a)
        return np.asarray(a).sum()

    for transform in (jax.jit, jax.vmap):
        with pytest.raises(TypeError, match=r"^host_fn is host-only: a must be a concrete array"):
            transform(host)(x)


@pytest.mark.parametrize("dtype", REAL)
def test_any_nonfinite_flags_nan_and_inf_concrete_and_traced(dtype):
    ok = jnp.ones(3, dtype)
    assert not bool(any_nonfinite(ok, None, np.arange(2)))
    assert any_nonfinite(None, np.arange(2)) is None
    for v in (np.nan, np.inf, -np.inf):
        bad = ok.at[1].set(v)
        assert bool(any_nonfinite(ok, bad))
        out = jax.jit(lambda a: nan_where(any_nonfinite(a), 2 * a))(bad)
        assert np.all(np.isnan(np.asarray(out)))
    # one flag a lane under vmap
    lanes = jnp.stack([ok, ok.at[0].set(np.nan)])
    got = np.asarray(jax.vmap(lambda a: nan_where(any_nonfinite(a), a))(lanes))
    np.testing.assert_array_equal(got[0], np.ones(3))
    assert np.all(np.isnan(got[1]))


@pytest.mark.parametrize("dtype", REAL)
def test_entry_points_apply_the_rule(dtype):
    from jaxdyn import kernels, pde, sphere

    x = jnp.asarray([[3.0, 4.0], [1.0, 0.0]], dtype)
    # normalize rescales rows whose squared norm leaves the dtype's range
    big = float(np.finfo(dtype).max) ** 0.75
    np.testing.assert_allclose(np.asarray(sphere.normalize(x * big)),
                               [[0.6, 0.8], [1.0, 0.0]], rtol=4 * np.finfo(dtype).eps)
    np.testing.assert_array_equal(np.asarray(sphere.normalize(x)), np.asarray(x / jnp.linalg.norm(
        x, axis=-1, keepdims=True)))  # unchanged for rows of ordinary size
    with pytest.raises(TypeError, match=r"^x must hold"):
        sphere.normalize(x.astype(jnp.complex64))
    # integers are converted (here: to the other input's dtype)
    q = x[None]
    w = kernels.attention_weights(q, jnp.asarray(np.array([[[1, 0], [0, 1]]], np.int32)), 1.0)
    assert w.dtype == dtype
    # a host function under jit
    with pytest.raises(TypeError, match=r"^angles is host-only"):
        jax.jit(pde.angles)(x)
