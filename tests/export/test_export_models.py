"""Export cases of the models, the spectral tools, the samplers and the encoders: each model's field
built inside the exported function from NumPy weights (and a stack of them), simulate on a model
built there, Π and the Lyapunov functional, the samplers, and the encoders' forward passes on
random weights."""

import jax
import numpy as np
import pytest

import jaxdyn
from jaxdyn import encoder as E
from jaxdyn import models as M

from ._export import export_check

D, N = 3, 8
_rng = np.random.default_rng(0)
W = [(0.6 * _rng.standard_normal((D, D))).astype(np.float32) for _ in range(3)]
_x = _rng.standard_normal((N, D)).astype(np.float32)
X0 = _x / np.linalg.norm(_x, axis=1, keepdims=True)


def _stack(*a):
    return np.stack(a)


BUILD = {
    "sphere": lambda: M.SphereAttention(*W, 1.5),
    "sphere_blocked": lambda: M.SphereAttention(*W, 1.5, kernel="blocked", k_block=4, q_block=4),
    "zero_temperature": lambda: M.ZeroTemperature(*W),
    "euclidean_control": lambda: M.EuclideanAttention(
        M.Control(_stack(W[0], -W[0]), 1.0), W[1], M.Control(_stack(W[2], W[1]), 1.0, "linear"),
        np.ones(D, np.float32), activation="relu"),
    "multi_head": lambda: M.MultiHeadAttention(
        _stack(W[0], W[1]), _stack(W[1], W[2]), _stack(W[2], W[0]), 1.5, mask="causal",
        alibi=0.2, rope=True),
    "multi_head_sinkhorn": lambda: M.MultiHeadAttention(W[0], W[1], W[2], 1.5, attention="sinkhorn",
                                                        sinkhorn_iters=3),
    "depth": lambda: M.DepthAttention(_stack(W[0], W[1]), _stack(W[1], W[2]), _stack(W[2], W[0]),
                                      1.5, 0.5),
    "preln": lambda: M.layer_norm(M.SphereAttention(*W, 1.5), "preln"),
    "ngpt": lambda: M.layer_norm(M.SphereAttention(*W, 1.5), "ngpt", alpha=0.3),
}


@pytest.mark.parametrize("name", sorted(BUILD))
def test_field_built_inside_from_numpy(name):
    build = BUILD[name]
    assert export_check(lambda x: (build()(0.7, x), build().invalid()), X0)


def test_stacked_models_built_inside_vmapped():
    def f(x, betas):
        models = M.stack_models([M.SphereAttention(*W, b) for b in (0.5, 1.0, 2.0)])
        traced = jax.vmap(lambda b: M.MultiHeadAttention(*W, b, alibi=0.1))(betas)
        return (jax.vmap(lambda m: m(0.0, x))(models), jax.vmap(lambda m: m(0.0, x))(traced),
                traced.invalid())

    assert export_check(f, X0, np.array([0.5, 1.0], np.float32))


def test_simulate_on_a_model_built_inside():
    assert export_check(lambda x: jaxdyn.simulate(M.SphereAttention(*W, 1.5), x, t1=0.2, dt=0.05,
                                           method="rk4"), X0)


def test_spectral_projection_and_lyapunov():
    sw = jaxdyn.spectral_weights([1.0, 0.4, -0.2], rotation=0.5, plane=(0, 2))
    Q, K, V = (np.asarray(a, np.float32) for a in (sw.Q, sw.K, sw.V))

    def f(x):
        P = jaxdyn.projection(Q, K, V)  # host eigen-decomposition: a constant of the program
        return (P(x), jaxdyn.lyapunov(x, P), jaxdyn.mass_near(x, P, 0.3),
                jaxdyn.spectral.angle_to_subspace(x, P))

    assert export_check(f, X0)


def test_samplers():
    key = jax.random.PRNGKey(0)
    assert export_check(lambda k: jaxdyn.sample_sphere(k, 16, D), key)
    assert export_check(lambda k, kappa: jaxdyn.sample_vmf(k, 16, np.array([0.0, 1.0, 0.0]), kappa), key,
                 np.float32(4.0))
    assert export_check(lambda k, w: jaxdyn.sample_mixture(k, 16, D, kappa=3.0, weight=w), key,
                 np.float32(0.4))
    assert export_check(lambda keys: jax.vmap(lambda k: jaxdyn.sphere.sample_initial(
        k, 16, D, "vmf", kappa=2.0))(keys), jax.random.split(key, 3))


TINY = E.BertConfig(hidden_size=8, num_attention_heads=2, intermediate_size=12, num_hidden_layers=2,
                    vocab_size=11, max_position_embeddings=6)


def test_encoder_forward_on_random_weights():
    params = E.init_bert(TINY, jax.random.PRNGKey(1))
    h0 = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (2, 5, 8)), np.float32)
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    assert export_check(lambda h: E.encode(params, TINY, h, mask), h0)
    # weights drawn inside the exported function, and the heads as a particle field
    assert export_check(lambda k, h: E.encode(E.init_bert(TINY, k), TINY, h), jax.random.PRNGKey(3), h0)
    assert export_check(lambda x: M.DepthAttention.from_heads(E.attention_heads(params, TINY))(0.5, x),
                 np.ones((4, 8), np.float32) / np.sqrt(8))
    ids = np.array([[1, 2, 3, 4]], np.int32)
    assert export_check(lambda i: E.encode(params, TINY, E.embed(params, TINY, i)), ids)


def test_paper_b_architectures_forward():
    mb = E.ModernBertConfig(hidden_size=8, num_attention_heads=2, intermediate_size=6,
                            num_hidden_layers=2, local_attention=4)
    deit = E.DeitConfig(hidden_size=6, num_attention_heads=3, intermediate_size=12,
                        num_hidden_layers=2, image_size=8, patch_size=4)
    pm = E.init_modernbert(mb, jax.random.PRNGKey(0))
    pd = E.init_deit(deit, jax.random.PRNGKey(1))
    assert export_check(lambda h: E.encode_modernbert(pm, mb, h), np.ones((1, 7, 8), np.float32))
    assert export_check(lambda img: E.encode_deit(pd, deit, E.embed_deit(pd, deit, img)),
                 np.ones((1, 8, 8, 3), np.float32))
