"""Attention variants: multi-head, causal masks, ALiBi, RoPE,
L2 and Sinkhorn attention: exact identities in float64, dense against blocked kernels."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn as jd
from jaxdyn.experiments.variants.covariance_check import AffineAttentionField
from jaxdyn.kernels import attention_weights, heads_interaction, rope

_weights = jax.jit(attention_weights, static_argnames=("causal", "logits", "sinkhorn_iters"))

D, N, H = 3, 37, 4
BLOCKS = dict(k_block=8, q_block=16)  # several key and query blocks, ragged last blocks


def _cloud(n=N, d=D, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, d))
    return jnp.asarray(x / np.linalg.norm(x, axis=1, keepdims=True))


def _mats(k=3, shape=(D, D), seed=1):
    r = np.random.default_rng(seed)
    return [jnp.asarray(r.normal(size=shape)) for _ in range(k)]


@eqx.filter_jit
def _field(model, x):
    return model(0.0, x)


@eqx.filter_jit
def _ambient(model, x):
    return model.ambient(0.0, x)


@pytest.fixture(scope="module")
def qkv():
    return _mats()


# ---------------------------------------------------------------- 1. multi-head


@pytest.mark.parametrize("kernel", ["dense", "blocked"])
def test_identical_heads_equal_single_head(qkv, kernel):
    Q, K, V = qkv
    x = _cloud()
    one = _field(jd.SphereAttention(Q, K, V, 2.0, kernel="dense"), x)
    multi = jd.MultiHeadAttention(jnp.stack([Q] * H), jnp.stack([K] * H), jnp.stack([V / H] * H),
                                  2.0, kernel=kernel, **BLOCKS)
    np.testing.assert_allclose(_field(multi, x), one, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_heads_with_disjoint_supports_add(qkv):
    """castin's split: Q_h, K_h the rows of block h (head dimension p = d/H), V_h = E_hᵀ V_h
    writes only block h. The H-head ambient field is the sum of the H one-head ones (so is
    the field, P⊥(x) times it), and its block h is head h's alone."""
    d, Hh = 6, 3
    p = d // Hh
    Q, K, V = _mats(shape=(d, d), seed=2)
    x = _cloud(d=d)
    Qh = Q.reshape(Hh, p, d)
    Kh = K.reshape(Hh, p, d)
    E = jnp.eye(d).reshape(Hh, p, d)
    Vh = jnp.einsum("hpd,hpe->hde", E, V.reshape(Hh, p, d))  # (H, d, d), rows in block h only
    multi = jd.MultiHeadAttention(Qh, Kh, Vh, 0.7, kernel="dense")
    singles = [jd.MultiHeadAttention(Qh[h], Kh[h], Vh[h], 0.7, kernel="dense") for h in range(Hh)]
    amb = _ambient(multi, x)
    np.testing.assert_allclose(amb, sum(_ambient(s, x) for s in singles), rtol=0, atol=1e-12)
    for h in range(Hh):
        np.testing.assert_allclose(amb[:, h * p:(h + 1) * p],
                                   _ambient(singles[h], x)[:, h * p:(h + 1) * p],
                                   rtol=0, atol=1e-12)


@pytest.mark.slow  # default-suite counterpart: test_identical_heads_equal_single_head
def test_one_head_equals_sphere_attention_in_simulate(qkv):
    Q, K, V = qkv
    x0 = _cloud(n=12)
    a = jd.simulate(jd.SphereAttention(Q, K, V, 1.5), x0, t1=0.5, dt=0.05)
    b = jd.simulate(jd.MultiHeadAttention(Q, K, V, 1.5), x0, t1=0.5, dt=0.05)
    np.testing.assert_allclose(b.xs, a.xs, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- 2. masks and positions


@pytest.mark.parametrize("kernel", ["dense", pytest.param("blocked", marks=pytest.mark.slow)])
def test_causal_prefix_invariance_exact(qkv, kernel):
    """Particles 0..k−1 never see k..N−1: their trajectory is bitwise unchanged when the
    later particles are perturbed (the particle index is the position through simulate)."""
    Q, K, V = qkv
    m = jd.MultiHeadAttention(jnp.stack([Q, K]), jnp.stack([K, Q]), jnp.stack([V, V.T]) / 2, 3.0,
                              mask="causal", alibi=0.2, rope=True, kernel=kernel, k_block=4,
                              q_block=8)
    x0 = _cloud(n=20)
    k = 9
    x1 = x0.at[k:].set(_cloud(n=20 - k, seed=5))
    a = jd.simulate(m, x0, t1=0.4, dt=0.05)
    b = jd.simulate(m, x1, t1=0.4, dt=0.05)
    assert np.array_equal(np.asarray(a.xs[:, :k]), np.asarray(b.xs[:, :k]))
    assert not np.allclose(a.xs[-1, k:], b.xs[-1, k:])


def test_causal_first_particle_does_not_move():
    """V = I: particle 0 attends only to itself, ẋ_0 = P⊥(x_0) x_0 = 0."""
    x = _cloud()
    Q, K, _ = _mats(seed=3)
    v = _field(jd.MultiHeadAttention(Q, K, jnp.eye(D), 4.0, mask="causal", kernel="dense"), x)
    assert float(jnp.max(jnp.abs(v[0]))) < 1e-15 < float(jnp.min(jnp.abs(v[1:, 0])))


@pytest.mark.slow  # default-suite counterpart: test_causal_first_particle_does_not_move
def test_causal_first_particle_stays_put():
    x0 = _cloud(n=10)
    Q, K, _ = _mats(seed=3)
    m = jd.MultiHeadAttention(Q, K, jnp.eye(D), 4.0, mask="causal")
    traj = jd.simulate(m, x0, t1=2.0, dt=0.05)
    np.testing.assert_allclose(traj.xs[:, 0], jnp.broadcast_to(x0[0], traj.xs[:, 0].shape),
                               rtol=0, atol=1e-14)
    assert float(jnp.max(jnp.abs(traj.xs[-1, 1:] - x0[1:]))) > 1e-2


@pytest.mark.parametrize("opts", [dict(mask="causal", alibi=[0.1, 0.5], rope=True),
                                  pytest.param(dict(alibi=[0.3, 0.0]), marks=pytest.mark.slow)],
                         ids=["causal-alibi-rope", "alibi"])  # counterpart: causal-alibi-rope
def test_blocked_equals_dense_masked(qkv, opts):
    Q, K, V = qkv
    x = _cloud()
    args = (jnp.stack([Q, K]), jnp.stack([K, Q]), jnp.stack([V, jnp.eye(D)]), 2.5)
    a = _field(jd.MultiHeadAttention(*args, kernel="dense", **opts), x)
    b = _field(jd.MultiHeadAttention(*args, kernel="blocked", **BLOCKS, **opts), x)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)


def test_alibi_zero_and_rope_zero_are_unmasked(qkv):
    Q, K, V = qkv
    x = _cloud()
    plain = _field(jd.SphereAttention(Q, K, V, 2.0, kernel="dense"), x)
    a = _field(jd.MultiHeadAttention(Q, K, V, 2.0, alibi=0.0, kernel="dense"), x)
    r = _field(jd.MultiHeadAttention(Q, K, V, 2.0, rope=jnp.zeros(1), kernel="dense"), x)
    b = _field(jd.MultiHeadAttention(Q, K, V, 2.0, alibi=0.0, rope=jnp.zeros(1), kernel="blocked",
                                     **BLOCKS), x)
    for got in (a, r, b):
        np.testing.assert_allclose(got, plain, rtol=0, atol=1e-12)


def test_rope_logits_depend_on_offset_only():
    """One query vector and one key vector at every position: ⟨R_i q, R_j k⟩ is Toeplitz."""
    p, n = 6, 11
    q, k = _mats(2, shape=(p,), seed=4)
    freqs = jnp.asarray([0.3, 1.1, 2.9])
    rq, rk = (np.asarray(jax.jit(rope)(jnp.broadcast_to(a, (n, p)), freqs)) for a in (q, k))
    G = rq @ rk.T  # the checks in NumPy (float64): no program a check
    np.testing.assert_allclose(G[1:, 1:], G[:-1, :-1], rtol=0, atol=1e-12)
    assert float(np.std(np.diag(G, 3) - G[0, 0])) < 1e-12 < float(np.abs(G[3, 0] - G[0, 3]))
    np.testing.assert_allclose(np.linalg.norm(rq, axis=1), np.linalg.norm(q), rtol=1e-14)


def test_alibi_bias_and_causal_weights():
    """The dense weights: causal rows vanish above the diagonal, and ALiBi's factor
    exp(−α|i − j|) is exactly the ratio of biased to unbiased weights (up to row sums)."""
    q = _cloud(n=9)[None]
    # the checks in NumPy (float64): no program a check
    w = np.asarray(_weights(q, q, 2.0, causal=True)[0])
    assert float(np.max(np.abs(np.triu(w, 1)))) == 0.0
    np.testing.assert_allclose(np.sum(w, axis=1), 1.0, rtol=0, atol=1e-14)
    wa = np.asarray(_weights(q, q, 2.0, alibi=jnp.asarray([0.4]))[0])
    w0 = np.asarray(_weights(q, q, 2.0)[0])
    i = np.arange(9)
    ratio = wa / w0 / np.exp(-0.4 * np.abs(i[:, None] - i[None, :]))
    np.testing.assert_allclose(ratio, np.broadcast_to(ratio[:, :1], ratio.shape), rtol=1e-12)


# ---------------------------------------------------------------- 6. L2 and Sinkhorn attention


def test_l2_is_softmax_at_2beta_with_key_shift(qkv):
    Q, K, _ = qkv
    x = _cloud()
    q, k = (x @ Q.T)[None], (x @ K.T)[None]
    beta = 1.3
    l2 = _weights(q, k, beta, logits="l2")
    shifted = _weights(q, k, 2 * beta, key_bias=-beta * jnp.sum(k * k, axis=-1))
    np.testing.assert_allclose(l2, shifted, rtol=0, atol=1e-12)


def test_l2_with_orthogonal_keys_on_sphere_is_softmax_at_2beta(qkv):
    Q, _, V = qkv
    K = jnp.linalg.qr(_mats(1, seed=6)[0])[0]
    x = _cloud()
    want = _field(jd.SphereAttention(Q, K, V, 2 * 1.3, kernel="dense"), x)
    got = _field(jd.MultiHeadAttention(Q, K, V, 1.3, attention="l2", kernel="blocked", **BLOCKS), x)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_sinkhorn_weights_doubly_stochastic(qkv):
    Q, K, V = qkv
    x = _cloud()
    q, k = (x @ Q.T)[None], (x @ K.T)[None]
    w = _weights(q, k, 1.0, sinkhorn_iters=300)[0]
    np.testing.assert_allclose(jnp.sum(w, axis=1), 1.0, rtol=0, atol=1e-14)
    np.testing.assert_allclose(jnp.sum(w, axis=0), 1.0, rtol=0, atol=1e-10)
    w1 = _weights(q, k, 1.0, sinkhorn_iters=1)[0]  # one sweep: columns off
    assert float(jnp.max(jnp.abs(jnp.sum(w1, axis=0) - 1))) > 1e-3


@pytest.mark.slow  # default-suite counterparts: test_sinkhorn_weights_doubly_stochastic (dense
# Sinkhorn) and test_blocked_equals_dense_masked (the blocked pass that the bias g feeds)
def test_sinkhorn_blocked_equals_dense(qkv):
    Q, K, V = qkv
    x = _cloud()
    args = (jnp.stack([Q, K]), jnp.stack([K, Q]), jnp.stack([V, V]), 1.0)
    a = _field(jd.MultiHeadAttention(*args, attention="sinkhorn", sinkhorn_iters=4, alibi=0.1,
                                     kernel="dense"), x)
    b = _field(jd.MultiHeadAttention(*args, attention="sinkhorn", sinkhorn_iters=4, alibi=0.1,
                                     kernel="blocked", **BLOCKS), x)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)


def test_variant_errors(qkv):
    Q, K, V = qkv
    with pytest.raises(ValueError, match="sinkhorn.*causal"):
        jd.MultiHeadAttention(Q, K, V, 1.0, attention="sinkhorn", mask="causal")
    with pytest.raises(ValueError, match="mask must be one of"):
        jd.MultiHeadAttention(Q, K, V, 1.0, mask="future")
    with pytest.raises(ValueError, match="V must have shape"):
        jd.MultiHeadAttention(jnp.stack([Q, Q]), jnp.stack([K, K]), V[None], 1.0)
    with pytest.raises(ValueError, match="alibi.*must be >= 0"):
        jd.MultiHeadAttention(Q, K, V, 1.0, alibi=-1.0)
    with pytest.raises(ValueError, match="rope must hold"):
        jd.MultiHeadAttention(Q, K, V, 1.0, rope=jnp.zeros(3))
    with pytest.raises(ValueError, match="causal mask needs as many queries"):
        heads_interaction(Q[None], K[None, :2], V[:2], 1.0, causal=True)


def test_sphere_kind_variant_fields():
    """The sphere kind's variant fields: defaults keep SphereAttention (and the ensemble
    driver); any variant builds MultiHeadAttention; bad combinations are config errors."""
    from jaxdyn.config import ConfigError
    from jaxdyn.experiments import sphere_common as sc

    base = {"heads": 1, "heads_spread": 0.0, "mask": "none", "positions": "none",
            "attention": "softmax", "normalization": "softmax", "sweep": {}}
    assert not sc.is_variant(base)
    assert sc.is_variant(dict(base, heads=4)) and sc.is_variant(dict(base, heads_spread=0.5))
    with pytest.raises(ConfigError, match="normalization: softmax"):
        sc.check_variants(dict(base, normalization="hardmax", sweep={"mask": ["none", "causal"]}))
    with pytest.raises(ConfigError, match="no causal"):
        sc.check_variants(dict(base, attention="sinkhorn", mask="causal"))
    pc = dict(base, heads=3, d=D, beta=2.0, positions="alibi", alibi_slope=0.4, rope_base=1e4,
              sinkhorn_iters=5, kernel="dense", k_block=None, q_block=None, tol=1e-6,
              weights={"seed": 0})
    Q, K, V = _mats()
    m = sc.variant_model(pc, Q, K, V)
    assert m.heads == 3 and m.alibi.shape == (3,) and float(m.alibi[0]) == 0.4
    np.testing.assert_allclose(jnp.sum(m.V, axis=0), V, rtol=1e-15)


# ---------------------------------------------------------------- 6. covariance right-hand sides

_S = np.array([[1.0, 0.3], [0.3, 0.6]])


def test_conditional_means_against_quadrature():
    """E_w[y | x] on N(0, S) by an 80 × 80 Gauss–Hermite rule against the closed maps T x
    (softmax and L2, two β, two x): 1e−12."""
    from jaxdyn.gaussian import conditional_mean_map

    r = np.random.default_rng(0)
    Q, K = r.normal(size=(2, 2, 2)) * 0.7
    R = np.linalg.cholesky(_S)
    z, wz = np.polynomial.hermite_e.hermegauss(80)
    Y = np.stack(np.meshgrid(z, z, indexing="ij"), -1).reshape(-1, 2) @ R.T
    W = np.outer(wz, wz).reshape(-1)
    for attention in ("softmax", "l2"):
        for beta in (0.3, 0.8):
            T = np.asarray(conditional_mean_map(jnp.asarray(_S), jnp.asarray(Q), jnp.asarray(K),
                                                beta, attention=attention))
            for x in (np.array([0.5, -1.0]), np.array([2.0, 1.0])):
                if attention == "softmax":
                    logit = beta * (Y @ (K.T @ Q @ x))
                else:
                    logit = -beta * np.sum((Q @ x - Y @ K.T) ** 2, axis=1)
                w = W * np.exp(logit - logit.max())
                np.testing.assert_allclose(T @ x, (w[:, None] * Y).sum(0) / w.sum(), rtol=0,
                                           atol=1e-12)


@pytest.fixture(scope="module")
def particle_dS():
    from jaxdyn.gaussian import gaussian_cloud

    @jax.jit
    def dS(x, Q, K, V, beta, iters_l2):
        q = jnp.einsum("hpd,nd->hnp", Q, x, precision="highest")
        k = jnp.einsum("hpd,nd->hnp", K, x, precision="highest")
        out = []
        for logits, iters in (("dot", 0), ("l2", 0), ("dot", 40)):
            m = heads_interaction(q, k, x, beta, kernel="dense", logits=logits,
                                  sinkhorn_iters=iters)
            u = jnp.einsum("hne,hde->nd", m, V, precision="highest")
            out.append((u.T @ x + x.T @ u) / x.shape[0])
        return out

    r = np.random.default_rng(0)
    Q, K = (jnp.asarray(a) for a in r.normal(size=(2, 2, 2, 2)) * 0.7)
    V = jnp.asarray(r.normal(size=(2, 2, 2)))
    x = jnp.asarray(gaussian_cloud(jax.random.PRNGKey(1), 1000, jnp.zeros(2), jnp.asarray(_S),
                                   exact_moments=True))
    return Q, K, V, dict(zip(("softmax", "l2", "sinkhorn"), dS(x, Q, K, V, 0.3, 0)))


@pytest.mark.parametrize("attention,tol", [("softmax", 0.03), ("l2", 0.03), ("sinkhorn", 2e-3)])
def test_covariance_rhs_against_particles(particle_dS, attention, tol):
    """Ṡ of two heads from 1000 particles (exact sample moments, β = 0.3) against the closed
    right-hand side, for this one cloud (key 1): relative errors 1.4 % (softmax), 1.1 % (L2;
    both Monte Carlo, decreasing with N, and exact against quadrature above), 5e−4 (Sinkhorn,
    40 sweeps). Over 20 clouds the L2 error reaches 8.8 % (the spread:
    docs/results/variants/covariance_particles.json); the bounds hold for this cloud."""
    from jaxdyn.gaussian import covariance_rhs

    Q, K, V, got = particle_dS
    want = covariance_rhs(jnp.asarray(_S), Q, K, V, 0.3, attention=attention)
    assert float(jnp.linalg.norm(got[attention] - want) / jnp.linalg.norm(want)) < tol


def test_sinkhorn_covariance_is_softmax_to_second_order():
    """Z = 2(I + (I + 4N)^{1/2})^{-1} = I − N + O(β⁴): the Sinkhorn right-hand side differs
    from softmax's by O(β³) (halving β divides the difference by 8)."""
    from jaxdyn.gaussian import covariance_rhs

    Q, K, V = _mats(seed=7, shape=(2, 2))
    S = jnp.asarray(_S)

    def diff(b):
        return float(jnp.linalg.norm(covariance_rhs(S, Q, K, V, b, attention="sinkhorn")
                                     - covariance_rhs(S, Q, K, V, b, attention="softmax")))

    assert abs(diff(0.02) / diff(0.01) - 8.0) < 0.01


@pytest.mark.slow  # default-suite counterpart: test_blocked_equals_dense_masked (forward values)
def test_gradients_blocked_equal_dense_causal(qkv):
    """Reverse mode through the masked kernels (−∞ logits, skipped key blocks): d/dβ and
    d/dQ of a loss agree between dense and blocked (1e−10, float64) and are finite."""
    Q, K, V = qkv
    x = _cloud()
    Qh = jnp.stack([Q, K])

    def grads(kernel):
        def loss(beta, Qh):
            m = jd.MultiHeadAttention(Qh, jnp.stack([K, Q]), jnp.stack([V, V]), beta,
                                      mask="causal", alibi=[0.1, 0.3], rope=True, kernel=kernel,
                                      **BLOCKS)
            return jnp.sum(m(0.0, x) ** 2)

        return jax.grad(loss, argnums=(0, 1))(jnp.asarray(5.0), Qh)

    (ga, gqa), (gb, gqb) = grads("dense"), grads("blocked")
    assert bool(jnp.isfinite(gb)) and bool(jnp.all(jnp.isfinite(gqb)))
    np.testing.assert_allclose(gb, ga, rtol=1e-10)
    np.testing.assert_allclose(gqb, gqa, rtol=0, atol=1e-10 * float(jnp.max(jnp.abs(gqa))))


# ------------------------------------- 6. the closed right-hand sides in solve_moments(attention=)


def _moment_problem(seed=0, H=2):
    r = np.random.default_rng(seed)
    Q, K = (jnp.asarray(a) for a in r.normal(size=(2, H, 2, 2)) * 0.7)
    V = jnp.asarray(r.normal(size=(H, 2, 2))) * 0.5
    A = jnp.asarray(r.normal(size=(2, 2))) * 0.2
    return Q, K, V, A, jnp.array([0.3, -0.2]), jnp.array([0.1, 0.0])


def test_variant_moment_rhs_identities():
    """One softmax head is Paper B's moment ODE with B = βKᵀQ (1e−14), and so are two
    identical heads with V/2 (so the softmax mean c = m is right); L2's affine conditional
    mean c + T x on N(m, S), m ≠ 0, against a 120 × 120 Gauss–Hermite rule (1e−12)."""
    from jaxdyn.gaussian import conditional_mean_affine, moment_rhs, variant_moment_rhs

    # each right-hand side one jitted program (not op by op)
    variant_moment_rhs = jax.jit(variant_moment_rhs)
    moment_rhs = jax.jit(moment_rhs)
    conditional_mean_affine = jax.jit(conditional_mean_affine, static_argnames="attention")
    Q, K, V, A, m, b = _moment_problem()
    S = jnp.asarray(_S)
    got = variant_moment_rhs(m, S, A, b, Q[:1], K[:1], V[:1], 0.3)
    want = moment_rhs(m, S, A, 0.3 * K[0].T @ Q[0], V[0], b)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-14)
    rep = variant_moment_rhs(m, S, A, b, jnp.stack([Q[0]] * 2), jnp.stack([K[0]] * 2),
                             jnp.stack([V[0] / 2] * 2), 0.3)
    for g, w in zip(rep, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-14)
    R = np.linalg.cholesky(_S)
    z, wz = np.polynomial.hermite_e.hermegauss(120)  # L2 at β = 0.8 narrows the tilted law
    Y = np.stack(np.meshgrid(z, z, indexing="ij"), -1).reshape(-1, 2) @ R.T + np.asarray(m)
    W = np.outer(wz, wz).reshape(-1)
    Qn, Kn = np.asarray(Q[1]), np.asarray(K[1])
    c, T = conditional_mean_affine(m, S, Q[1], K[1], 0.8, attention="l2")
    for x in (np.array([0.5, -1.0]), np.array([2.0, 1.0])):
        logit = -0.8 * np.sum((Qn @ x - Y @ Kn.T) ** 2, axis=1)
        w = W * np.exp(logit - logit.max())
        np.testing.assert_allclose(c + T @ x, (w[:, None] * Y).sum(0) / w.sum(), rtol=0,
                                   atol=1e-12)


def _moments_vs_particles(attention, n, iters, kernel, dt):
    from jaxdyn.gaussian import gaussian_cloud, solve_moments

    Q, K, V, A, m0, b = _moment_problem()
    S0 = jnp.asarray(_S)
    x0 = jnp.asarray(gaussian_cloud(1, n, m0, S0, exact_moments=True))  # NumPy stream: cheap
    mh = jd.MultiHeadAttention(Q, K, V, 0.3, attention=attention, sinkhorn_iters=iters,
                               kernel=kernel)
    x = jd.simulate(AffineAttentionField(mh, A, b), x0, t1=1.0, dt=dt, method="rk4", save_every=10**6).xs[-1]
    mp = jnp.mean(x, 0)
    Sp = (x - mp).T @ (x - mp) / n
    sol = solve_moments(m0, S0, A=A, V=V, b=b, t1=1.0, attention=attention, Q=Q, K=K, beta=0.3)
    assert bool(sol.ok)
    err_S = float(jnp.linalg.norm(Sp - sol.cov_final) / jnp.linalg.norm(sol.cov_final - S0))
    err_m = float(jnp.linalg.norm(mp - sol.mean_final) / jnp.linalg.norm(sol.mean_final - m0))
    return err_S, err_m


@pytest.mark.slow
def test_solve_moments_attention_against_particles():
    """solve_moments(attention="l2") with two heads, A, b and m ≠ 0 against 1000 particles
    (exact initial moments, NumPy seed 1) through simulate with the Euclidean field (RK4,
    h = 0.25), t = 1: errors relative to the change of Σ and of m, 0.8 % and 8.6 % measured
    (Monte Carlo: 0.2–0.9 % and 0.6–8.6 % over seeds 1–5; -m slow: all three attentions at
    larger N). Bad input: B with attention=, Q without it, an unknown attention."""
    from jaxdyn.gaussian import solve_moments

    err_S, err_m = _moments_vs_particles("l2", 1000, 0, "dense", 0.25)
    assert err_S < 0.02 and err_m < 0.15  # measured 0.8 % and 8.6 %
    Q, K, V, A, m0, b = _moment_problem()
    with pytest.raises(ValueError, match="instead of B"):
        solve_moments(m0, jnp.asarray(_S), A=A, B=A, V=V, t1=1.0, attention="l2", Q=Q, K=K)
    with pytest.raises(ValueError, match="unless attention"):
        solve_moments(m0, jnp.asarray(_S), A=A, B=A, V=V[0], t1=1.0, Q=Q, K=K)
    with pytest.raises(ValueError, match="attention must be one of"):
        solve_moments(m0, jnp.asarray(_S), V=V, t1=1.0, attention="cosine", Q=Q, K=K)


@pytest.mark.slow  # default-suite counterpart: test_solve_moments_attention_against_particles
@pytest.mark.parametrize("attention,n,iters,dt,tol_S,tol_m", [
    ("softmax", 8000, 0, 0.05, 0.005, 0.01),
    ("l2", 8000, 0, 0.05, 0.01, 0.1),
    ("sinkhorn", 1000, 20, 0.1, 1e-3, 1e-7)])
def test_solve_moments_attention_against_particles_large(attention, n, iters, dt, tol_S, tol_m):
    """The moment ODE of each closed right-hand side against N particles (blocked kernel,
    RK4, t = 1, two heads, A, b ≠ 0, m ≠ 0). Errors (Σ, m) of this one cloud (NumPy seed 1),
    relative to their changes: softmax (N = 8000, h = 0.05) 0.12 %, 0.19 %; L2 (8000) 0.23 %,
    4.3 %; Sinkhorn (N = 1000, 20 sweeps, h = 0.1) 1.8e−4, 6e−9. Over seeds 1–5 the Σ errors
    spread (docs/results/variants/covariance_ode.json): Sinkhorn's reaches 1.3e−3 at seed 3,
    above this test's bound, which holds for seed 1. L2's mean
    has a large Monte Carlo error (its instantaneous rate: 3.9 % at N = 4000, 0.19 % at
    16000; c itself is exact against quadrature above); Sinkhorn's mean moves by A m + b +
    Σ_h V_h m exactly (doubly stochastic weights), up to the Sinkhorn error."""
    err_S, err_m = _moments_vs_particles(attention, n, max(iters, 1), "blocked", dt)
    assert err_S < tol_S and err_m < tol_m


def test_sphere_energy_statistic_is_per_head():
    """The sphere kind's ``energy`` of a variant point is (1/H) Σ_h E_β(Q_hᵀK_h) with each
    head's own weights (an independent NumPy sum, 1e−12); H identical heads report the one
    head's E_β (the plain point's QᵀK)."""
    from jaxdyn.experiments import sphere_common as sc
    from jaxdyn.experiments.sphere.run import cluster_stats_of

    pc = {"heads": 3, "heads_spread": 0.7, "mask": "none", "positions": "none",
          "attention": "softmax", "normalization": "softmax", "sweep": {}, "d": D, "beta": 2.0,
          "rope_base": 1e4, "sinkhorn_iters": 5, "kernel": "dense", "k_block": None,
          "q_block": None, "tol": 1e-6, "dtype": "float64", "pair_threshold": 0.99, "cluster_delta": 0.1,
          "gram_threshold": 0.9999, "weights": {"ensemble": "gaussian", "scale": 1.0, "seed": 0}}
    xs = np.stack([_cloud(12, seed=s) for s in range(2)])[None]  # (P=1, S=2, N, d)
    en = cluster_stats_of(xs, [pc])[3]
    Q, K, V = sc.weights_for(pc)
    m = sc.variant_model(pc, Q, K, V)
    want = np.zeros(2)
    for s in range(2):
        x = np.asarray(xs[0, s])
        for h in range(3):
            Bh = np.asarray(m.Q[h]).T @ np.asarray(m.K[h])
            want[s] += np.exp(2.0 * x @ Bh @ x.T).sum() / (2 * 2.0 * 12 ** 2) / 3
    np.testing.assert_allclose(en[0], want, rtol=1e-12)
    same = [cluster_stats_of(xs, [dict(pc, heads=h, heads_spread=0.0)])[3] for h in (1, 3)]
    np.testing.assert_allclose(same[1], same[0], rtol=1e-12)
    assert not np.allclose(same[0], en)


def _sinkhorn_knopp(l, col):
    """The unique scaling diag(u) e^l diag(v) with rows summing to 1 and columns to ``col``:
    multiplicative Sinkhorn–Knopp in float64 NumPy, iterated until both marginals hold to
    1e-15 (the limit itself, not a fixed number of sweeps)."""
    K = np.exp(l - l.max())
    v = np.ones(K.shape[1])
    for _ in range(10_000):
        u = 1.0 / (K @ v)
        v = col / (K.T @ u)
        w = u[:, None] * K * v[None, :]
        if max(np.abs(w.sum(1) - 1).max(), np.abs(w.sum(0) - col).max()) < 1e-15:
            return w
    raise AssertionError("the NumPy Sinkhorn–Knopp reference did not converge")


def test_sinkhorn_cross_attention_potential_stays_bounded():
    # n != m: the column potential's target was m/n while the rows total n, so g drifted by
    # 2 log(m/n) a sweep; the row normalisation cancelled it, but float32 lost the digits of
    # l + g (weights off by 3e-3 after 5000 sweeps). Columns now sum to n/m. Both dtypes
    # against the doubly stochastic limit computed independently (NumPy Sinkhorn–Knopp).
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 8, 3))
    k = rng.normal(size=(1, 64, 3))
    ref = _sinkhorn_knopp(1.0 * q[0] @ k[0].T, 8 / 64)[None]
    w64 = np.asarray(_weights(jnp.asarray(q), jnp.asarray(k), 1.0, sinkhorn_iters=2000))
    w32 = np.asarray(_weights(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32), 1.0,
                              sinkhorn_iters=2000))
    np.testing.assert_allclose(w64.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(w64.sum(-2), 8 / 64, atol=1e-9)  # columns to n/m
    assert np.max(np.abs(w64 - ref) / ref) < 1e-12
    assert np.max(np.abs(w32 - ref) / ref) < 2e-5
