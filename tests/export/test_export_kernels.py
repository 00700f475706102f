"""Export cases of the attention kernels and the online log-sum-exp: each lowers for ``cuda``
and ``tpu`` (the accelerators' branch of the blocked kernels) with no host callback."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn.kernels as K

from ._export import export_check


def _cloud(n=40, d=3, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, d))
    return jnp.asarray(x / np.linalg.norm(x, axis=1, keepdims=True), jnp.float32)


@pytest.mark.parametrize("kernel", ["dense", "blocked"])
@pytest.mark.parametrize("normalization", ["softmax", "unnormalized", "hardmax"])
def test_interaction_exports(kernel, normalization):
    x = _cloud()
    B = jnp.eye(3, dtype=jnp.float32)
    assert export_check(lambda x, B, beta: K.interaction(x, x, B, beta, normalization=normalization,
                                                  kernel=kernel, k_block=16, q_block=32),
                 x, B, jnp.float32(2.0))


@pytest.mark.parametrize("n", [40, 5000], ids=["one-leaf", "clusters"])
def test_local_interaction_and_its_gradient_export(n):
    # the local kernel with its certificate, and reverse mode through it (the second pass)
    import jax

    x = _cloud(n)
    B = jnp.eye(3, dtype=jnp.float32)

    def value_and_grad(x, beta):
        def loss(x, beta):
            m, stats = K.local_interaction(x, x, B, beta, tol=1e-6)
            return jnp.sum(m * m), stats
        (v, stats), g = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, beta)
        return v, g, stats.bound, stats.visited

    assert export_check(value_and_grad, x, jnp.float32(300.0))
    assert export_check(lambda x: K.interaction(x, x, B, 50.0, kernel="auto"), _cloud(20000))


def test_interaction_with_weights_built_inside_exports():
    # B from NumPy weights inside the exported function
    rng = np.random.default_rng(1)
    Q, Kw = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    assert export_check(lambda x: K.interaction(x, x, jnp.asarray(Q.T @ Kw, jnp.float32), 1.5,
                                         kernel="blocked"), _cloud(1100))


def test_blocked_exports():
    x = _cloud()
    assert export_check(lambda x: K.blocked(2.0 * x, x, k_block=16, q_block=32, self_keys=True), x)


@pytest.mark.parametrize("opts", [
    dict(causal=True, alibi=True),
    dict(rope=True),
    dict(logits="l2", key_bias=True),
    dict(sinkhorn_iters=3, alibi=True),
], ids=["causal-alibi", "rope", "l2-bias", "sinkhorn"])
@pytest.mark.parametrize("kernel", ["dense", "blocked"])
def test_heads_interaction_exports(kernel, opts):
    opts = dict(opts)
    x = _cloud(37)
    rng = np.random.default_rng(2)
    Q = jnp.asarray(rng.normal(size=(2, 4, 3)), jnp.float32)
    Kw = jnp.asarray(rng.normal(size=(2, 4, 3)), jnp.float32)
    freqs = K.default_rope_freqs(4) if opts.pop("rope", False) else None
    alibi = jnp.asarray([0.1, 0.3], jnp.float32) if opts.pop("alibi", False) else None
    bias = jnp.asarray(rng.normal(size=(2, 37)), jnp.float32) if opts.pop("key_bias", False) \
        else None

    def f(x, beta, alibi, bias):
        q = jnp.einsum("hpd,nd->hnp", Q, x)
        k = jnp.einsum("hpd,nd->hnp", Kw, x)
        if freqs is not None:
            q, k = K.rope(q, freqs), K.rope(k, freqs)
        return K.heads_interaction(q, k, x, beta, alibi=alibi, key_bias=bias, kernel=kernel,
                                   k_block=8, q_block=16, **opts)

    assert export_check(f, x, jnp.float32(2.0), alibi, bias)


def test_attention_weights_exports():
    q = _cloud(9)[None]
    assert export_check(lambda q, b: K.attention_weights(q, q, b, causal=True), q, jnp.float32(1.0))


def test_blocked_lse_exports():
    x, y = _cloud(50), _cloud(30, seed=1)
    pot = jnp.zeros((30,), jnp.float32)
    assert export_check(lambda x, pot, eps: K.blocked_lse(x, y, pot, eps, q_block=16, k_block=8),
                 x, pot, jnp.float32(0.1))


@pytest.mark.parametrize("which", ["interaction", "heads-causal", "attend"])
def test_blocked_gradients_export(which):
    # the core's derivative (a rematerialised second blocked pass) lowers for the accelerators
    import jax

    x = _cloud(70)
    B = jnp.eye(3, dtype=jnp.float32)
    if which == "interaction":
        def f(x, beta):
            return jnp.sum(jnp.sin(K.interaction(x, x, B, beta, kernel="blocked", k_block=16,
                                                 q_block=32)))
    elif which == "heads-causal":
        def f(x, beta):
            return jnp.sum(jnp.sin(K.heads_interaction(
                x[None], x[None], x, beta, causal=True, alibi=jnp.asarray([0.1], jnp.float32),
                kernel="blocked", k_block=16, q_block=32)))
    else:
        def f(x, beta):
            return jnp.sum(jnp.sin(K.attend(beta * x, x, x, jnp.zeros((70,), jnp.float32),
                                            32, 16)))

    assert export_check(jax.grad(f, argnums=(0, 1)), x, jnp.float32(2.0))


def test_sinkhorn_key_bias_exports():
    q = _cloud(37)[None]
    assert export_check(lambda q, beta: K.sinkhorn_key_bias(q, q, beta, sinkhorn_iters=2,
                                                     kernel="blocked", k_block=8, q_block=16),
                 q, jnp.float32(2.0))
