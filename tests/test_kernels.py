"""The interaction kernel against a plain NumPy double loop, and dense against blocked."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn.kernels._attention import interaction
from conftest import tol


def _loop_reference(x, V, B, beta, normalization):
    """Σ_j w_ij V x_j with a Python double loop in float64 (the definition, nothing clever)."""
    x = np.asarray(x, np.float64)
    n, d = x.shape
    out = np.zeros((n, d))
    for i in range(n):
        logits = np.array([beta * x[i] @ B @ x[j] for j in range(n)])
        if normalization == "softmax":
            w = np.exp(logits - logits.max())
            w /= w.sum()
        elif normalization == "unnormalized":
            w = np.exp(logits) / n
        else:
            w = (logits == logits.max()).astype(float)
            w /= w.sum()
        for j in range(n):
            out[i] += w[j] * (V @ x[j])
    return out


def _sphere(seed, n, d, dtype):
    """Points uniform on the unit sphere of R^d, n of them (NumPy: no program to compile)."""
    x = np.random.default_rng(seed).normal(size=(n, d))
    return jnp.asarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype)


def _random_qkv(seed, d, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(d, d)).astype(dtype) for _ in range(3)]


@pytest.mark.parametrize("normalization", ["softmax", "unnormalized", "hardmax"])
@pytest.mark.parametrize("kernel", ["dense", "blocked"])
def test_kernel_matches_double_loop(dtype, normalization, kernel):
    d, n, beta = 4, 37, 1.7
    Q, K, V = _random_qkv(1, d)  # non-symmetric
    x = np.asarray(_sphere(3, n, d, np.float64))
    ref = _loop_reference(x, V, Q.T @ K, beta, normalization)
    model = jaxdyn.SphereAttention(Q.astype(dtype), K.astype(dtype), V.astype(dtype), beta,
                                   kernel=kernel, normalization=normalization, k_block=8, q_block=16)
    xj = jnp.asarray(x, dtype)
    got = np.asarray(jaxdyn.kernels.interaction(xj, xj, model.B, model.beta, normalization=normalization,
                                        kernel=kernel, k_block=8, q_block=16) @ model.V.T)
    np.testing.assert_allclose(got, ref, rtol=tol(dtype, 2e-5, 1e-12), atol=tol(dtype, 2e-5, 1e-12))
    # The field is the tangent projection of that.
    field = np.asarray(model(0.0, xj))
    proj = ref - np.sum(ref * x, axis=1, keepdims=True) * x
    np.testing.assert_allclose(field, proj, rtol=tol(dtype, 2e-5, 1e-12), atol=tol(dtype, 2e-5, 1e-12))


def _sizes():
    """The (dtype, n, normalization) cases of test_blocked_equals_dense, the slow ones marked.

    511, 513 and 1030 (many blocks, ragged last ones, of the three layouts) under -m slow
    (tens of seconds of compiles); by default 1 and 5 points here (one ragged block) and, with several
    ragged key and query blocks in float32 and float64 for every normalization,
    test_kernel_matches_double_loop. float64 (the tighter tolerance) by default, float32
    under -m slow (the float32 blocked kernel against a double loop by default:
    test_kernel_matches_double_loop).

    Returns:
        The ``pytest.param`` list.
    """
    out = []
    for normalization in ("softmax", "unnormalized", "hardmax"):
        for dt, name in ((np.float32, "f32"), (np.float64, "f64")):
            for n in (1, 5, 511, 513, 1030):
                slow = n in (511, 513, 1030) or name == "f32"
                out.append(pytest.param(dt, n, normalization, id=f"{normalization}-{name}-{n}",
                                        marks=[pytest.mark.slow] if slow else []))
    return out


@pytest.mark.parametrize("dtype,n,normalization", _sizes())
def test_blocked_equals_dense(dtype, n, normalization):
    d = 3
    Q, K, V = _random_qkv(7, d)
    B = jnp.asarray(Q.T @ K, dtype)
    x = _sphere(n, n, d, dtype)
    dense = interaction(x, x, B, 3.0, kernel="dense", normalization=normalization)
    for kb, qb in [(128, 256), (500, 100), (7, 33)]:
        blocked = interaction(x, x, B, 3.0, kernel="blocked", normalization=normalization,
                              k_block=kb, q_block=qb)
        scale = float(np.max(np.abs(np.asarray(dense))))
        np.testing.assert_allclose(np.asarray(blocked), np.asarray(dense),
                                   atol=tol(dtype, 1e-5, 1e-12) * scale, rtol=0)


@contextlib.contextmanager
def _traces_of(name):
    """The traces JAX records (``jax.monitoring``'s trace-duration events) of the jitted
    function ``name`` while the block runs: one per program built."""
    seen = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/jaxpr_trace_duration" and kwargs.get("fun_name") == name:
            seen.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_block_sizes_meaning_the_same_blocks_share_one_program():
    # at 6 points, blocks of 128 and of 500 keys are both one block of 6: one program, the
    # same numbers (a shape no other test uses: both would otherwise be cached already);
    # blocks of 2 are another program
    x = _sphere(3, 6, 5, np.float64)
    B = jnp.eye(5, dtype=jnp.float64)
    with _traces_of("_interaction_jit") as traces:
        a = interaction(x, x, B, 2.0, kernel="blocked", k_block=128, q_block=256)
        b = interaction(x, x, B, 2.0, kernel="blocked", k_block=500, q_block=100)
        assert len(traces) == 1
        c = interaction(x, x, B, 2.0, kernel="blocked", k_block=2, q_block=256)
        assert len(traces) == 2
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(np.asarray(c), np.asarray(a), rtol=1e-13, atol=1e-13)


@pytest.mark.slow  # float32 at large β by default: tests/test_blocked_extra.py::test_large_beta_float32_hits_are_exact and ::test_fused_logits_large_beta_float32
def test_large_beta_float32_no_overflow():
    d = 3
    x = _sphere(0, 600, d, np.float32)
    B = jnp.eye(d, dtype=jnp.float32)
    for kernel in ["dense", "blocked"]:
        m = np.asarray(interaction(x, x, B, 1e4, kernel=kernel, k_block=128))
        assert np.all(np.isfinite(m))
        # At β = 10⁴ each particle mostly attends to itself and its nearest neighbours.
        assert float(np.min(np.sum(m * np.asarray(x), axis=1))) > 0.9


def test_kernel_rejects_bad_shapes():
    x = jnp.ones((4, 3))
    with pytest.raises(ValueError, match="B must have shape"):
        interaction(x, x, jnp.eye(2), 1.0)
    with pytest.raises(ValueError, match="kernel must be one of"):
        interaction(x, x, jnp.eye(3), 1.0, kernel="fast")
    with pytest.raises(ValueError, match="normalization"):
        interaction(x, x, jnp.eye(3), 1.0, normalization="sparsemax")
