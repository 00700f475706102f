"""The models compose with jax.jit, jax.vmap and jax.grad, and are built inside a traced function
from NumPy or traced weights: concrete values are checked on the host without device work, traced
parameters outside their domain are flagged by ``invalid()`` (which the drivers report as
``RESULTS.invalid_input``). The samplers jit and vmap over their keys and parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn import models as M

D, N = 3, 7
T = 0.3  # the time the fields are evaluated at (DepthAttention's layer 0 with period 0.5)


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return [0.6 * rng.standard_normal((D, D)) for _ in range(3)]


def _cloud(seed=1):
    x = np.random.default_rng(seed).standard_normal((N, D))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _stack(*a):
    return np.stack(a)


# name -> model built from float64 NumPy weights W and a scalar s that enters the field
BUILD = {
    "sphere": lambda W, s: M.SphereAttention(*W, s),
    "sphere_blocked": lambda W, s: M.SphereAttention(*W, s, kernel="blocked", k_block=4, q_block=4),
    "zero_temperature": lambda W, s: M.ZeroTemperature(s * W[0], W[1], W[2]),
    "euclidean": lambda W, s: M.EuclideanAttention(W[0], s * W[1], W[2], np.ones(D)),
    "euclidean_control": lambda W, s: M.EuclideanAttention(
        M.Control(_stack(W[0], -W[0]), 1.0), s * W[1], M.Control(_stack(W[2], W[1]), 1.0, "linear")),
    "multi_head": lambda W, s: M.MultiHeadAttention(
        _stack(W[0], W[1]), _stack(W[1], W[2]), _stack(W[2], W[0]) / 2, s, mask="causal",
        alibi=[0.1, 0.3], rope=np.array([0.7])),
    "multi_head_l2": lambda W, s: M.MultiHeadAttention(W[0], W[1], W[2], s, attention="l2"),
    "depth": lambda W, s: M.DepthAttention(_stack(W[0], W[1]), _stack(W[1], W[2]), _stack(W[2], W[0]),
                                           s, 0.5, c=0.1 * _stack(W[0][0], W[1][0])),
    "postln": lambda W, s: M.layer_norm(M.SphereAttention(*W, s), "postln"),
    "preln": lambda W, s: M.layer_norm(M.SphereAttention(*W, s), "preln"),
    "periln": lambda W, s: M.layer_norm(M.SphereAttention(*W, s), "periln"),
    "ngpt": lambda W, s: M.layer_norm(M.SphereAttention(*W, 2.0), "ngpt", alpha=s),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILD))
def test_built_inside_jit_from_numpy_equals_outside_and_vmaps(name):
    W, x, build = _weights(), _cloud(), BUILD[name]
    ref = np.asarray(build(W, 1.5)(T, jnp.asarray(x)))
    inside = jax.jit(lambda x: build(W, 1.5)(T, x))(x)
    np.testing.assert_allclose(np.asarray(inside), ref, rtol=1e-12, atol=1e-13)
    # the scalar traced and vmapped through the constructor: one evaluation per value
    ss = np.array([0.7, 1.5, 2.5])
    batched = jax.jit(jax.vmap(lambda s: build(W, s)(T, x)))(ss)
    np.testing.assert_allclose(np.asarray(batched[1]), ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(np.asarray(batched[2]), np.asarray(build(W, 2.5)(T, jnp.asarray(x))),
                               rtol=1e-12, atol=1e-13)
    # a stack of models vmapped, and the clouds vmapped
    stacked = M.stack_models([build(W, s) for s in ss])
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda m: m(T, x))(stacked)), np.asarray(batched),
                               rtol=1e-12, atol=1e-13)
    xs = np.stack([x, _cloud(2)])
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda y: build(W, 1.5)(T, y))(xs)[0]), ref,
                               rtol=1e-12, atol=1e-13)


# Under -m slow, with a default-suite sibling through the same constructor: the plain Euclidean
# model (euclidean_control), the l2 heads (multi_head), the pre- and peri-LN wrappers (postln,
# ngpt), the blocked kernel (tests/test_blocked_vjp.py: its gradient in every argument, β too).
_GRAD_SLOW = {"euclidean", "multi_head_l2", "preln", "periln", "sphere_blocked"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _GRAD_SLOW else n
                                  for n in sorted(BUILD)])
def test_grad_through_the_constructor_matches_finite_differences(name):
    W, x, build = _weights(), _cloud(), BUILD[name]
    r = np.random.default_rng(3).standard_normal((N, D))

    def f(s):
        return jnp.sum(build(W, s)(T, x) * r)

    g = float(jax.jit(jax.grad(f))(1.5))
    h = 1e-5
    fd = (float(f(1.5 + h)) - float(f(1.5 - h))) / (2 * h)
    assert abs(g - fd) <= 1e-6 * max(1.0, abs(fd)), (g, fd)


def test_no_device_work_at_construction():
    """Building a model from NumPy weights (or from JAX arrays of its dtype) compiles no
    program; neither does invalid() on a concrete model (it answers on the host)."""
    rng = np.random.default_rng(5)
    d = 5  # a size no other test compiles for
    W = [rng.standard_normal((d, d)).astype(np.float32) for _ in range(3)]
    before = jaxdyn.compile_stats()["compiles"]
    models = [
        M.SphereAttention(*W, 2.0),
        M.SphereAttention(*(jax.device_put(w) for w in W), np.float32(2.0)),
        M.ZeroTemperature(*W),
        M.EuclideanAttention(W[0], W[1], W[2]),
        M.EuclideanAttention(M.Control(np.stack([W[0], W[1]]), 2.0), W[1], W[2], np.zeros(d)),
        M.MultiHeadAttention(np.stack([W[0], W[1]]), np.stack([W[1], W[2]]), np.stack([W[2], W[0]]),
                             1.0, alibi=0.5, rope=True),
        M.DepthAttention(np.stack([W[0], W[1]]), np.stack([W[1], W[2]]), np.stack([W[2], W[0]]), 1.0),
        M.layer_norm(M.SphereAttention(*W, 1.0), "ngpt", alpha=0.3),
        M.stack_models([M.SphereAttention(*W, b) for b in (1.0, 2.0)]),
    ]
    M.redrawn_weights({"ensemble": "gaussian"}, d, 2, 2)
    flags = [m.invalid() for m in models]
    assert jaxdyn.compile_stats()["compiles"] == before
    assert all(isinstance(f, (np.bool_, np.ndarray)) and not np.any(f) for f in flags)
    assert flags[-1].shape == (2,)  # one flag per member of the stack
    assert models[0].Q.dtype == np.float32 and models[0].beta.dtype == np.float32


# name -> (builder of a model from a traced scalar v in the parameter's place, good value)
DOMAINS = {
    "sphere beta": (lambda v: M.SphereAttention(np.eye(D), np.eye(D), np.eye(D), v), 1.0),
    "multi-head beta": (lambda v: M.MultiHeadAttention(np.eye(D), np.eye(D), np.eye(D), v), 1.0),
    "alibi slope": (lambda v: M.MultiHeadAttention(
        np.stack([np.eye(D)] * 2), np.stack([np.eye(D)] * 2), np.stack([np.eye(D)] * 2), 1.0,
        alibi=jnp.stack([0.2, v])), 0.0),
    "depth beta": (lambda v: M.DepthAttention(np.eye(D)[None], np.eye(D)[None], np.eye(D)[None], v),
                   1.0),
    "depth period": (lambda v: M.DepthAttention(np.eye(D)[None], np.eye(D)[None], np.eye(D)[None],
                                                1.0, v), 0.5),
    "ngpt alpha": (lambda v: M.layer_norm(M.SphereAttention(np.eye(D), np.eye(D), np.eye(D), 1.0),
                                          "ngpt", alpha=v), 0.2),
    "wrapped beta": (lambda v: M.layer_norm(M.SphereAttention(np.eye(D), np.eye(D), np.eye(D), v),
                                            "preln"), 1.0),
    "control t1": (lambda v: M.EuclideanAttention(M.Control(np.stack([np.eye(D)] * 2), v), np.eye(D),
                                                  np.eye(D)), 1.0),
}


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_traced_parameters_out_of_domain_are_flagged(name):
    build, good = DOMAINS[name]
    flag = jax.jit(lambda v: build(v).invalid())
    assert not bool(flag(good))
    bad = [-1.0, np.nan, np.inf] + ([] if name == "alibi slope" else [0.0])
    for v in bad:
        assert bool(flag(v)), v
    # under vmap: one flag a member, as for a stack of models
    flags = jax.vmap(lambda v: build(v).invalid())(jnp.array([good, -1.0, good]))
    assert np.asarray(flags).tolist() == [False, True, False]
    # the same value given concretely is refused on the host
    with pytest.raises(ValueError, match="must be"):
        build(-1.0)


def test_host_errors_name_the_field():
    I3 = np.eye(D)
    with pytest.raises(ValueError, match=r"beta \(inverse temperature\) must be > 0 and finite"):
        M.SphereAttention(I3, I3, I3, np.inf)
    with pytest.raises(ValueError, match="beta .* must be a scalar"):
        M.SphereAttention(I3, I3, I3, np.ones(2))
    with pytest.raises(ValueError, match="at least one head"):
        M.MultiHeadAttention(np.zeros((0, D, D)), np.zeros((0, D, D)), np.zeros((0, D, D)), 1.0)
    with pytest.raises(ValueError, match="at least one head"):
        M.MultiHeadAttention(np.zeros((1, 0, D)), np.zeros((1, 0, D)), np.ones((1, D, D)), 1.0)
    with pytest.raises(ValueError, match="sinkhorn_iters must be an integer"):
        M.MultiHeadAttention(I3, I3, I3, 1.0, attention="sinkhorn", sinkhorn_iters=2.7)
    with pytest.raises(ValueError, match="mask must be one of"):
        M.MultiHeadAttention(I3, I3, I3, 1.0, mask=np.ones((4, 4), bool))
    with pytest.raises(ValueError, match="rope_base"):
        M.MultiHeadAttention(I3, I3, I3, 1.0, rope=True, rope_base=np.nan)
    with pytest.raises(ValueError, match="alibi must be a scalar or hold one slope a head"):
        M.MultiHeadAttention(I3, I3, I3, 1.0, alibi=[0.1, 0.2])
    with pytest.raises(ValueError, match="at least one layer"):
        M.DepthAttention(np.zeros((0, D, D)), np.zeros((0, D, D)), np.zeros((0, D, D)), 1.0)
    with pytest.raises(ValueError, match="period .* must be > 0"):
        M.DepthAttention(I3[None], I3[None], I3[None], 1.0, 0.0)
    with pytest.raises(ValueError, match="k_block must be an integer >= 1"):
        M.SphereAttention(I3, I3, I3, 1.0, k_block=0)
    with pytest.raises(ValueError, match="t1 .* must be > 0"):
        M.Control(np.ones((2, D)), 0.0)
    with pytest.raises(ValueError, match="alpha .* must be > 0"):
        M.layer_norm(M.SphereAttention(I3, I3, I3, 1.0), "ngpt", alpha=np.nan)
    with pytest.raises(ValueError, match="field must be a jaxdyn particle model"):
        M.layer_norm("not a model", "periln")
    one = M.MultiHeadAttention(I3, I3, I3, 1.0)
    two = M.MultiHeadAttention(np.stack([I3] * 2), np.stack([I3] * 2), np.stack([I3] * 2), 1.0)
    with pytest.raises(ValueError, match=r"stack_models: model 1's Q has shape \(2, 3, 3\)"):
        M.stack_models([one, two])
    # a weights section without scale or seed takes their defaults (1, 0)
    Q, K, V = M.redrawn_weights({"ensemble": "gaussian"}, D, 1)
    Q1, _, _ = M.redrawn_weights({"ensemble": "gaussian", "scale": 1.0, "seed": 0}, D, 1)
    np.testing.assert_array_equal(np.asarray(Q), np.asarray(Q1))


def test_one_dtype_for_mixed_inputs():
    """Weights of mixed dtypes (and Python lists) promote to one floating dtype; integer arrays
    become floating (a gradient needs it)."""
    m = M.SphereAttention(np.eye(D, dtype=np.float32), jnp.eye(D, dtype=jnp.float64),
                          np.eye(D).tolist(), 1)
    assert {m.Q.dtype, m.K.dtype, m.V.dtype, m.beta.dtype} == {np.dtype(np.float64)}
    e = M.EuclideanAttention(np.eye(D, dtype=int), np.eye(D, dtype=np.float32), np.eye(D, dtype=np.float32))
    assert e.A.dtype == np.float32 and e.b.dtype == np.float32


# ------------------------------------------------------------------------------- sampling


@pytest.mark.slow
def test_samplers_jit_and_vmap_over_keys_and_parameters():
    """The samplers under jit and vmap over keys equal their eager draws; κ, μ and the mixture
    weight may be traced (vmapped) too. A traced value out of range gives NaN samples (the
    rejection loop still ends) where a concrete one raises. (One sample size for every draw:
    the vMF rejection loop compiles once.)"""
    n, key = 6, jax.random.PRNGKey(7)
    keys = jax.random.split(key, 3)
    mu = np.array([0.0, 1.0, 1.0])
    cases = {
        "sphere": lambda k: jaxdyn.sample_sphere(k, n, D, jnp.float64),
        "mixture": lambda k: jaxdyn.sample_mixture(k, n, D, mu=mu, kappa=5.0, weight=0.3,
                                                   dtype=jnp.float64),
    }
    for name, f in cases.items():
        batched = np.asarray(jax.jit(jax.vmap(f))(keys))
        for i, k in enumerate(keys):
            np.testing.assert_allclose(batched[i], np.asarray(f(k)), rtol=0, atol=1e-15, err_msg=name)
        np.testing.assert_allclose(np.linalg.norm(batched, axis=-1), 1.0, atol=1e-14)
    # vMF: keys, κ and μ traced together
    kappas = jnp.array([1.0, 10.0, -1.0, jnp.nan])
    mus = jnp.array([[1.0, 0, 0], [0, 0, 2.0], [1.0, 0, 0], [1.0, 0, 0]])
    ks = jax.random.split(key, 4)
    xs = np.asarray(jax.jit(jax.vmap(lambda k, kap, m: jaxdyn.sample_vmf(k, n, m, kap, jnp.float64)))(
        ks, kappas, mus))
    for i in (0, 1):
        np.testing.assert_allclose(xs[i], np.asarray(jaxdyn.sample_vmf(
            ks[i], n, np.asarray(mus[i]), float(kappas[i]), jnp.float64)), atol=1e-15)
    assert np.all(np.isnan(xs[2:]))
    ws = jnp.array([0.3, 0.5, 1.0])
    xw = np.asarray(jax.jit(jax.vmap(lambda w: jaxdyn.sample_mixture(key, n, D, mu=mu, kappa=5.0,
                                                                     weight=w, dtype=jnp.float64)))(ws))
    np.testing.assert_allclose(xw[0], np.asarray(cases["mixture"](key)), atol=1e-15)
    assert np.all(np.isfinite(xw[:2])) and np.all(np.isnan(xw[2]))
    with pytest.raises(ValueError, match="kappa must be a finite number > 0"):
        jaxdyn.sample_vmf(key, n, np.array([1.0, 0, 0]), -1.0)
    with pytest.raises(ValueError, match="mu must be a nonzero"):
        jaxdyn.sample_vmf(key, n, np.zeros(3), 1.0)
    with pytest.raises(ValueError, match="weight must lie in"):
        jaxdyn.sample_mixture(key, n, D, weight=1.0)
