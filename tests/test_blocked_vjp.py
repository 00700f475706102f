"""The blocked kernels' derivative: the online core's second blocked pass.

Reverse mode (and forward mode) through ``SphereAttention(kernel="blocked")``,
``MultiHeadAttention`` and ``attend`` against the dense kernels in float64 and float32, and
the program of a gradient holds no array of N × N elements (the weights are recomputed a tile
at a time, never stored).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from _jaxpr import largest_array as _largest_array
import pytest

import jaxdyn
from jaxdyn.kernels import attend, heads_interaction, interaction
from conftest import tol

BLOCKS = dict(k_block=32, q_block=64)  # several key and query blocks, ragged last blocks


def _cloud(n, d, dtype, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, d))
    return jnp.asarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype)


def _close_trees(got, want, dtype, f32=2e-4, f64=1e-10):
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        assert np.all(np.isfinite(a))
        scale = float(np.max(np.abs(b)))
        np.testing.assert_allclose(a, b, rtol=tol(dtype, f32, f64),
                                   atol=tol(dtype, f32, f64) * scale)


def _sphere_loss(kernel, w):
    def loss(Q, K, V, beta, x):
        model = jaxdyn.SphereAttention(Q, K, V, beta, kernel=kernel, **BLOCKS)
        return jnp.sum(model(0.0, x) * w)

    return loss


def test_sphere_attention_gradient_equals_dense(dtype):
    """∂/∂(Q, K, V, β, x) of the blocked field equal the dense kernel's."""
    n, d = 150, 3
    rng = np.random.default_rng(1)
    Q, K, V = (jnp.asarray(rng.normal(size=(d, d)) + np.eye(d), dtype) for _ in range(3))
    beta = jnp.asarray(2.5, dtype)
    x = _cloud(n, d, dtype)
    w = jnp.asarray(rng.normal(size=(n, d)), dtype)
    args = (Q, K, V, beta, x)
    gb = jax.jit(jax.grad(_sphere_loss("blocked", w), argnums=range(5)))(*args)
    gd = jax.jit(jax.grad(_sphere_loss("dense", w), argnums=range(5)))(*args)
    _close_trees(gb, gd, dtype)


def test_sphere_attention_forward_mode_equals_dense():
    """jax.jvp through the blocked field (its tangent pass) equals the dense kernel's."""
    n, d, dtype = 70, 3, np.float64
    rng = np.random.default_rng(2)
    Q, K, V = (jnp.asarray(rng.normal(size=(d, d)) + np.eye(d), dtype) for _ in range(3))
    x = _cloud(n, d, dtype, seed=3)
    t = jnp.asarray(rng.normal(size=(n, d)), dtype)

    @functools.partial(jax.jit, static_argnums=0)  # one program a kernel (not op by op)
    def f(kernel):
        model = jaxdyn.SphereAttention(Q, K, V, 3.0, kernel=kernel, k_block=16, q_block=32)
        return jax.jvp(lambda y: model(0.0, y), (x,), (t,))

    (pb, tb), (pd, td) = f("blocked"), f("dense")
    _close_trees((pb, tb), (pd, td), dtype)


@pytest.mark.slow  # another normalization of the blocked VJP (softmax, float32 and float64, by default: test_sphere_attention_gradient_equals_dense); not in the default suite: the unnormalised weights' VJP
def test_unnormalized_gradient_equals_dense(dtype):
    """The unnormalised weights (no shift) take the same blocked derivative."""
    n, d = 90, 3
    rng = np.random.default_rng(4)
    B = jnp.asarray(rng.normal(size=(d, d)), dtype)
    x = _cloud(n, d, dtype, seed=5)

    def loss(B, beta, x, kernel):
        m = interaction(x, x, B, beta, normalization="unnormalized", kernel=kernel, **BLOCKS)
        return jnp.sum(jnp.sin(m))

    args = (B, jnp.asarray(1.5, dtype), x)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)  # one program a kernel
    gb = grad(*args, "blocked")
    gd = grad(*args, "dense")
    _close_trees(gb, gd, dtype)


@pytest.mark.slow  # 7.1 CPU-s in float64; the blocked heads VJP (causal) equals dense by default: tests/test_kernels_online.py::test_causal_gradient_under_vmap_over_query_offsets
def test_multihead_gradient_equals_dense(dtype):
    """MultiHeadAttention (2 heads, causal, ALiBi, RoPE): ∂/∂(Q, K, V, β, α, x) blocked = dense."""
    n, d, H = 100, 4, 2
    rng = np.random.default_rng(6)
    Q, K = (jnp.asarray(rng.normal(size=(H, d, d)), dtype) for _ in range(2))
    V = jnp.asarray(rng.normal(size=(H, d, d)), dtype)
    alibi = jnp.asarray([0.05, 0.2], dtype)
    x = _cloud(n, d, dtype, seed=7)
    w = jnp.asarray(rng.normal(size=(n, d)), dtype)

    def loss(kernel):
        def f(Q, K, V, beta, alibi, x):
            model = jaxdyn.MultiHeadAttention(Q, K, V, beta, mask="causal", alibi=alibi,
                                              rope=True, kernel=kernel, **BLOCKS)
            return jnp.sum(model(0.0, x) * w)

        return f

    args = (Q, K, V, jnp.asarray(1.5, dtype), alibi, x)
    gb = jax.jit(jax.grad(loss("blocked"), argnums=range(6)))(*args)
    gd = jax.jit(jax.grad(loss("dense"), argnums=range(6)))(*args)
    _close_trees(gb, gd, dtype)


@pytest.mark.slow  # default-suite counterparts: tests/test_control_measure.py::test_kernel_matches_dense_forward_and_reverse
# (float64) and test_sphere_attention_gradient_equals_dense[f32] here (float32)
def test_attend_gradient_with_bias_equals_dense(dtype):
    """``attend`` (the same core, bound shift on CPU) against dense softmax, all cotangents."""
    rng = np.random.default_rng(8)
    n, m, p, e = 75, 61, 3, 2
    q, k, v, c = (jnp.asarray(rng.normal(size=s), dtype)
                  for s in [(n, p), (m, p), (m, e), (m,)])
    g = jnp.asarray(rng.normal(size=(n, e)), dtype)

    def dense(q, k, v, c):
        return jax.nn.softmax(q @ k.T + c[None], axis=1) @ v

    gb = jax.grad(lambda *a: jnp.sum(attend(*a, 16, 8) * g), argnums=range(4))(q, k, v, c)
    gd = jax.grad(lambda *a: jnp.sum(dense(*a) * g), argnums=range(4))(q, k, v, c)
    _close_trees(gb, gd, dtype)


# ------------------------------------------------------------ no N × N array in the gradient


N = 512


def test_sphere_gradient_program_holds_no_n_by_n_array():
    """jax.grad of the blocked field: every value is at most a tile or a row stack."""
    # (both platforms' branches are in the program; explicit blocks for both: the
    # accelerators' default tile is as large as N here)
    x = _cloud(N, 3, np.float32)
    B = jnp.eye(3, dtype=jnp.float32)
    for norm in ("softmax", "unnormalized"):
        def loss(x, B, beta, norm=norm):
            return jnp.sum(jnp.sin(interaction(x, x, B, beta, normalization=norm,
                                               kernel="blocked", k_block=64, q_block=128)))

        jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, B, jnp.float32(2.0))
        assert _largest_array(jaxpr) <= N * N / 4, norm


@pytest.mark.parametrize("kw", [dict(), dict(mask="causal", alibi=0.1, rope=True)],
                         ids=["full", "causal-alibi-rope"])
def test_multihead_gradient_program_holds_no_n_by_n_array(kw):
    """jax.grad of MultiHeadAttention's blocked field: no value of N × N / 4 elements."""
    x = _cloud(N, 4, np.float32)
    Q = jnp.broadcast_to(jnp.eye(4, dtype=jnp.float32), (2, 4, 4))

    def loss(Q, x):
        model = jaxdyn.MultiHeadAttention(Q, Q, Q, 2.0, kernel="blocked", k_block=64,
                                          q_block=128, **kw)
        return jnp.sum(jnp.sin(model(0.0, x)))

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(Q, x)
    assert _largest_array(jaxpr) <= N * N / 4


def test_heads_gradient_program_holds_no_n_by_n_array_sinkhorn():
    """The Sinkhorn sweeps' log-sum-exps run on the same core: no N × N value either."""
    q = _cloud(N, 3, np.float32)[None]

    def loss(q):
        return jnp.sum(jnp.sin(heads_interaction(q, q, q[0], 2.0, sinkhorn_iters=2,
                                                 kernel="blocked", k_block=64, q_block=128)))

    assert _largest_array(jax.make_jaxpr(jax.grad(loss))(q)) <= N * N / 4
