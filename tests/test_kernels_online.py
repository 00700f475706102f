"""The online-softmax core under the variants kernel: its bound shift and running maximum
each against the dense weights (masks, positions, biases, L2, Sinkhorn), the guard, edge
inputs, gradients, and every public kernel function under jit, vmap and grad with traced
inputs (central finite differences in float64)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn.kernels._online as O
from jaxdyn.kernels import (attention_weights, blocked_lse, heads_interaction, interaction,
                            lse_tile, rope)
from conftest import tol

BLOCKS = dict(k_block=8, q_block=16)  # several key and query blocks, ragged last blocks


def _qkv(dtype, H=2, n=37, m=None, p=3, e=3, seed=0):
    rng = np.random.default_rng(seed)
    m = n if m is None else m
    q = jnp.asarray(rng.normal(size=(H, n, p)), dtype)
    k = jnp.asarray(rng.normal(size=(H, m, p)), dtype)
    v = jnp.asarray(rng.normal(size=(m, e)), dtype)
    return q, k, v


def _both(q, k, v, beta, **kw):
    """(blocked, dense) of heads_interaction."""
    return (heads_interaction(q, k, v, beta, kernel="blocked", **BLOCKS, **kw),
            heads_interaction(q, k, v, beta, kernel="dense", **kw))


def _close(got, want, dtype, f32=1e-5, f64=1e-12):
    scale = float(np.max(np.abs(np.asarray(want))))
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                               atol=tol(dtype, f32, f64) * scale)


CASES = {
    "one-head": dict(H=1),
    "causal-alibi": dict(causal=True, alibi=True),
    "bias-l2": dict(key_bias=True, logits="l2"),
    "cross": dict(m=45),
    "sinkhorn-alibi": dict(sinkhorn_iters=3, alibi=True),
}


def _case(dtype, name, seed=0):
    c = dict(CASES[name])
    q, k, v = _qkv(dtype, H=c.pop("H", 2), m=c.pop("m", None), seed=seed)
    H, m = k.shape[0], k.shape[1]
    rng = np.random.default_rng(seed + 1)
    if c.pop("alibi", False):
        c["alibi"] = jnp.asarray(rng.uniform(0.05, 0.4, size=H), dtype)
    if c.pop("key_bias", False):
        c["key_bias"] = jnp.asarray(rng.normal(size=(H, m)), dtype)
    return q, k, v, c


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("branch,safe", [("maximum", -1.0), ("bound", 1e30)])
def test_variant_bound_shift_and_running_maximum_each_equal_dense(monkeypatch, case, branch,
                                                                  safe):
    # the CPU pass shifts the weights by a bound of the row's logits where that is exact and
    # safe, and by the running maximum otherwise; forcing either everywhere (SAFE_SHIFT -1 /
    # 1e30, read at each call) gives the dense weights' averages, for masks, positions,
    # biases, L2 logits, Sinkhorn sweeps and n != m, with ragged query and key blocks
    monkeypatch.setitem(O.SAFE_SHIFT, "float64", safe)
    q, k, v, kw = _case(np.float64, case)
    got, want = _both(q, k, v, 2.5, **kw)
    _close(got, want, np.float64)


@pytest.mark.slow
def test_variant_default_guard_float32(dtype=np.float32):
    # the default guard in float32, every case: blocked equals dense
    for case in CASES:
        q, k, v, kw = _case(dtype, case, seed=3)
        got, want = _both(q, k, v, 2.5, **kw)
        _close(got, want, dtype)


@pytest.mark.slow  # the shared guard (O.SAFE_SHIFT) is shown live by default: tests/test_blocked_extra.py::test_bound_shift_guard_is_live_and_batch_wide
def test_variant_guard_is_live(monkeypatch):
    # β = 200 with random queries and keys: the Cauchy–Schwarz bound lies far above the
    # rows' logits, so only the running maximum keeps the weights in float32's range. The
    # default guard takes it (finite, equal to dense); forcing the bound loses rows.
    q, k, v = _qkv(np.float32, H=1, n=60, seed=4)
    got, want = _both(q, k, v, 200.0)
    _close(got, want, np.float32, f32=1e-4)
    with monkeypatch.context() as mp:
        mp.setitem(O.SAFE_SHIFT, "float32", 1e30)
        forced = heads_interaction(q, k, v, 200.0, kernel="blocked", **BLOCKS)
        assert not np.all(np.isfinite(np.asarray(forced)))


@pytest.mark.slow  # 3.3 CPU-s; not in the default suite: the bound with negative ALiBi slopes (positive slopes blocked = dense: tests/test_variants_attention.py::test_blocked_equals_dense_masked)
def test_negative_alibi_slopes_are_bounded(monkeypatch):
    # the kernel takes any slope; with α < 0 the term −α|i − j| raises logits by up to
    # |α|(n − 1) = 99, which the bound includes: forced everywhere, the bound shift still
    # equals dense in float32 (without the term e^99 overflows)
    q, k, v = _qkv(np.float32, H=2, n=100, p=2, seed=5)
    alibi = jnp.asarray([-1.0, 0.5], jnp.float32)
    monkeypatch.setitem(O.SAFE_SHIFT, "float32", 1e30)
    for causal in (False, True):
        got, want = _both(0.1 * q, 0.1 * k, v, 1.0, alibi=alibi, causal=causal)
        _close(got, want, np.float32, f32=1e-4)


@pytest.mark.slow
def test_masked_keys_by_minus_infinity_bias(dtype):
    # key 0, the diagonal of rows 3 and 20 and a whole key block masked by a −∞ bias: the
    # guard sees a −∞ known logit and the first block's maximum, and falls back where needed
    q, k, v = _qkv(dtype, H=2, n=37, seed=6)
    bias = np.zeros((2, 37))
    bias[:, [0, 3, 20]] = -np.inf
    bias[1, 8:16] = -np.inf
    got, want = _both(q, k, v, 1.5, key_bias=jnp.asarray(bias, dtype))
    _close(got, want, dtype)
    one, dense_one = _both(q[:1], k[:1], v, 1.5, key_bias=jnp.asarray(bias[:1], dtype))
    _close(one, dense_one, dtype)


@pytest.mark.slow  # default-suite counterpart: tests/test_variants_attention.py's
# test_identical_heads_equal_single_head[blocked] (the heads kernel, blocked, against the
# sphere kernel, 1e-12)
def test_one_head_is_the_sphere_kernel():
    # one head, no bias, no mask: the same online pass as interaction with B = QᵀK
    rng = np.random.default_rng(7)
    Q, K = (jnp.asarray(rng.normal(size=(3, 3))) for _ in range(2))
    x = jnp.asarray(rng.normal(size=(53, 3)))
    x = x / jnp.linalg.norm(x, axis=1, keepdims=True)
    m1 = heads_interaction((x @ Q.T)[None], (x @ K.T)[None], x, 1.7, kernel="blocked", **BLOCKS)
    m2 = interaction(x, x, Q.T @ K, 1.7, kernel="blocked", **BLOCKS)
    np.testing.assert_allclose(np.asarray(m1[0]), np.asarray(m2), rtol=0, atol=1e-13)


@pytest.mark.slow  # the same quotient's derivative, float32 and float64, by default: tests/test_blocked_extra.py::test_gradient_where_the_largest_weight_is_tiny_equals_dense
@pytest.mark.parametrize("dt,beta", [(np.float32, 55.0), (np.float64, 590.0)],
                         ids=["f32", "f64"])
def test_variant_gradient_where_the_largest_weight_is_tiny_equals_dense(dt, beta):
    # one query e1 against keys orthogonal to it: every logit is 0 and the bound is β, so
    # the normaliser is e^-β; the bound shift is taken up to SAFE_SHIFT. The quotient's
    # derivative must not square it (e^-110 underflows in float32).
    th = np.linspace(0, 2 * np.pi, 7, endpoint=False)
    y0 = np.stack([np.zeros_like(th), np.cos(th), np.sin(th) + 0.3], 1)
    y0 /= np.linalg.norm(y0, axis=1, keepdims=True)
    k = jnp.asarray(y0, dt)[None]

    def loss(q, kernel):
        m = heads_interaction(q, k, k[0], beta, kernel=kernel, k_block=4, q_block=4)
        return jnp.sum(m ** 2)

    q = jnp.asarray([[[1.0, 0.0, 0.0]]], dt)
    g_d, g_b = (np.asarray(jax.jit(jax.grad(loss), static_argnums=1)(q, kern))
                for kern in ("dense", "blocked"))
    assert np.all(np.isfinite(g_b)), (dt, g_b)
    np.testing.assert_allclose(g_b, g_d, rtol=tol(dt, 1e-4, 1e-10), atol=0)


@pytest.mark.slow
def test_variant_gradients_blocked_equal_dense():
    # reverse mode through the causal pass (skipped, masked and full key blocks, a repeated
    # last query row) and through the Sinkhorn sweeps, in float64
    q, k, v = _qkv(np.float64, H=2, n=37, seed=8)
    alibi = jnp.asarray([0.1, 0.3])

    def loss(q, beta, kernel, **kw):
        m = heads_interaction(q, k, v, beta, kernel=kernel, **BLOCKS, **kw)
        return jnp.sum(m * jnp.sin(m))

    for kw in (dict(causal=True, alibi=alibi), dict(logits="l2", sinkhorn_iters=2)):
        gd = jax.grad(loss, argnums=(0, 1))(q, 2.0, "dense", **kw)
        gb = jax.grad(loss, argnums=(0, 1))(q, 2.0, "blocked", **kw)
        for a, b in zip(gb, gd):
            assert np.all(np.isfinite(np.asarray(a)))
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10,
                                       atol=1e-11 * float(jnp.max(jnp.abs(b))))



@pytest.mark.slow  # 8.3 CPU-s (a program per layout); not in the default suite: the ragged and unaligned causal block layouts (causal blocked = dense by default: test_causal_gradient_under_vmap_over_query_offsets, tests/test_variants_attention.py::test_blocked_equals_dense_masked)
@pytest.mark.parametrize("p", [3, 10],
                         ids=["fused", "matmul"])  # the CPU tiles' two logits
def test_causal_key_blocks_visited_equal_dense(dtype, p):
    # the causal pass visits the key blocks wholly before a query block unmasked, then per
    # sub-block of as many rows as a key block those across its diagonal, masked: query
    # blocks wider, narrower and not multiples of the key block, ragged last blocks, a block
    # of rows at an unaligned offset and one running past the last particle (which attends
    # to every particle), ALiBi on the second head: all equal dense
    _causal_visits(dtype, p, [(dict(k_block=8, q_block=20), None, 37),
                              (dict(k_block=16, q_block=8), None, 37),
                              (dict(k_block=8, q_block=16), 13, 20),
                              (dict(k_block=8, q_block=8), 30, 12)])


@pytest.mark.slow  # 1.3 s of compiles a case; the fold's ragged sub-blocks by default: the test above
@pytest.mark.parametrize("p", [3, 10], ids=["fused", "matmul"])
def test_causal_one_query_block_of_many_sub_blocks_equals_dense(dtype, p):
    """One query block over every row, in sub-blocks of a key block (5) dividing neither."""
    _causal_visits(dtype, p, [(dict(k_block=5, q_block=37), None, 37)])


def _causal_visits(dtype, p, cases):
    """Each case (blocks, q_offset, rows): the causal blocked pass equals dense."""
    q, k, v = _qkv(dtype, H=2, n=37, p=p, seed=15)
    alibi = jnp.asarray([0.0, 0.3], dtype)
    for blocks, off, rows in cases:
        qr = q if off is None else jnp.pad(q, ((0, 0), (0, 8), (0, 0)))[:, off:off + rows]
        kw = dict(alibi=alibi, causal=True, q_offset=off)
        got = heads_interaction(qr, k, v, 2.0, kernel="blocked", **blocks, **kw)
        want = heads_interaction(qr, k, v, 2.0, kernel="dense", **kw)
        _close(got, want, dtype)



def test_causal_gradient_under_vmap_over_query_offsets():
    # blocks of query rows at traced offsets, vmapped (the skip of a key block is then one
    # branch for every member, the mask serving the others): values and reverse mode equal
    # dense in float64
    q, k, v = _qkv(np.float64, H=1, n=40, seed=16)
    offs = jnp.asarray([0, 7, 13, 30])

    def f(q, kernel):
        def rows(off):
            qr = jax.lax.dynamic_slice_in_dim(jnp.pad(q, ((0, 0), (0, 16), (0, 0))), off, 16, 1)
            return heads_interaction(qr, k, v, 2.0, causal=True, q_offset=off, kernel=kernel,
                                     k_block=8, q_block=12)

        return jax.vmap(rows)(offs)

    @functools.partial(jax.jit, static_argnums=1)
    def values_and_grad(q, kernel):  # one program a kernel
        return f(q, kernel), jax.grad(lambda q: jnp.sum(jnp.sin(f(q, kernel))))(q)

    (vb, gb), (vd, gd) = (values_and_grad(q, kern) for kern in ("blocked", "dense"))
    np.testing.assert_allclose(np.asarray(vb), np.asarray(vd), rtol=0, atol=1e-12)
    gb, gd = np.asarray(gb), np.asarray(gd)
    np.testing.assert_allclose(gb, gd, rtol=0, atol=1e-11 * np.max(np.abs(gd)))


# --------------------------------------------------------- composability with traced inputs


def _fd(f, x, h=1e-6):
    """Central finite difference of a scalar f along a fixed random direction of x.

    f is jitted: one program for both evaluations.

    Returns:
        (the difference quotient, the direction).
    """
    u = jnp.asarray(np.random.default_rng(0).normal(size=np.shape(x)), jnp.float64)
    fj = jax.jit(f)
    return (fj(x + h * u) - fj(x - h * u)) / (2 * h), u


def _check_grad(f, x, rel=1e-6):
    fd, u = _fd(f, x)
    g = jax.jit(jax.grad(f))(x)
    np.testing.assert_allclose(float(jnp.sum(g * u)), float(fd), rtol=rel)


@pytest.mark.slow
def test_interaction_under_jit_vmap_grad():
    rng = np.random.default_rng(9)
    x = jnp.asarray(rng.normal(size=(40, 3)))
    x = x / jnp.linalg.norm(x, axis=1, keepdims=True)
    B = jnp.asarray(rng.normal(size=(3, 3)) + np.eye(3))
    for norm in ("softmax", "unnormalized", "hardmax"):
        def f(x, B, beta, kernel):
            return interaction(x, x, B, beta, normalization=norm, kernel=kernel, **BLOCKS)

        xs = jnp.stack([x, -x, x[::-1]])
        Bs = jnp.stack([B, B.T, 0.5 * B])
        betas = jnp.asarray([0.5, 2.0, 3.0])
        got = jax.jit(jax.vmap(lambda *a: f(*a, "blocked")))(xs, Bs, betas)
        want = jax.vmap(lambda *a: f(*a, "dense"))(xs, Bs, betas)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-12)
        if norm == "hardmax":
            continue  # piecewise constant weights: the derivative is the values' alone
        for arg in range(3):
            def loss(a, arg=arg):
                args = [x, B, jnp.asarray(2.0)]
                args[arg] = a
                return jnp.sum(jnp.sin(f(*args, "blocked")))

            _check_grad(loss, [x, B, jnp.asarray(2.0)][arg])


@pytest.mark.slow
def test_heads_interaction_under_jit_vmap_grad():
    q, k, v = _qkv(np.float64, H=2, n=37, seed=10)
    bias = jnp.asarray(np.random.default_rng(11).normal(size=(2, 37)))
    alibi = jnp.asarray([0.2, 0.1])

    @jax.jit
    def f(q, k, bias, alibi, beta):
        return heads_interaction(q, k, v, beta, key_bias=bias, alibi=alibi, causal=True,
                                 kernel="blocked", **BLOCKS)

    # vmap over traced slopes and β: one program, each member equal to dense
    betas = jnp.asarray([0.5, 2.0])
    alibis = jnp.stack([alibi, 2 * alibi])
    got = jax.vmap(lambda a, b: f(q, k, bias, a, b))(alibis, betas)
    for i in range(2):
        want = heads_interaction(q, k, v, betas[i], key_bias=bias, alibi=alibis[i], causal=True,
                                 kernel="dense")
        np.testing.assert_allclose(np.asarray(got[i]), np.asarray(want), rtol=0, atol=1e-12)
    args = [q, k, bias, alibi, jnp.asarray(1.5)]
    for arg in range(5):
        def loss(a, arg=arg):
            b = list(args)
            b[arg] = a
            return jnp.sum(jnp.sin(f(*b)))

        _check_grad(loss, args[arg])

    def sink(q):
        return jnp.sum(jnp.sin(heads_interaction(q, k, v, 1.0, logits="l2", sinkhorn_iters=3,
                                                 kernel="blocked", **BLOCKS)))

    _check_grad(sink, q)


@pytest.mark.slow
def test_blocked_lse_and_tile_under_jit_vmap_grad():
    rng = np.random.default_rng(12)
    x = jnp.asarray(rng.normal(size=(45, 3)))
    y = jnp.asarray(rng.normal(size=(30, 3)))
    pot = jnp.asarray(rng.normal(size=(30,)))

    def dense(x, pot, eps):
        c = jnp.sum((x[:, None] - y[None]) ** 2, -1)
        return eps * jax.nn.logsumexp((pot[None] - c) / eps, axis=1)

    f = jax.jit(lambda x, pot, eps: blocked_lse(x, y, pot, eps, q_block=16, k_block=8))
    for eps in (1.0, 0.05):
        np.testing.assert_allclose(np.asarray(f(x, pot, eps)), np.asarray(dense(x, pot, eps)),
                                   rtol=1e-12, atol=1e-12)
    eps_s = jnp.asarray([0.3, 1.0, 3.0])
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda e: f(x, pot, e))(eps_s)),
                               np.asarray(jax.vmap(lambda e: dense(x, pot, e))(eps_s)),
                               rtol=1e-12, atol=1e-12)
    _check_grad(lambda a: jnp.sum(f(a, pot, 0.5)), x)
    _check_grad(lambda a: jnp.sum(f(x, a, 0.5)), pot)
    _check_grad(lambda a: jnp.sum(f(x, pot, a)), jnp.asarray(0.5))
    # a pot = −inf term contributes nothing; a row of −inf terms gives −inf
    carry = (jnp.full((2,), -jnp.inf), jnp.zeros(2))
    mx, s = lse_tile(x[:2], y[:3], jnp.asarray([-jnp.inf, -jnp.inf, -jnp.inf]), 1.0, carry)
    assert np.all(np.asarray(mx + jnp.log(s)) == -np.inf)


def test_rope_and_weights_under_jit_vmap_grad():
    q, k, _ = _qkv(np.float64, H=2, n=11, p=4, seed=13)
    freqs = jnp.asarray([0.3, 1.1])

    def loss(freqs):
        w = attention_weights(rope(q, freqs), rope(k, freqs), 1.5, causal=True)
        return jnp.sum(jnp.sin(w))

    _check_grad(loss, freqs)
    ws = jax.jit(jax.vmap(lambda b: attention_weights(q, k, b, sinkhorn_iters=2)))(
        jnp.asarray([0.5, 1.0]))
    np.testing.assert_allclose(np.asarray(jnp.sum(ws, -1)), 1.0, rtol=0, atol=1e-13)


def test_guarded_shift():
    # the bound where every r − low <= safe, else the maximum (NaN: the maximum); one
    # decision for a vmapped batch; no derivative
    r, low = jnp.asarray([3.0, 4.0]), jnp.asarray([1.0, 2.0])
    mx = jnp.asarray([2.5, 3.5])

    @jax.jit  # every case in one program (not op by op)
    def cases(r, low, mx):
        return (O.guarded_shift(r, low, lambda: mx, 2.0),
                O.guarded_shift(r, low, lambda: mx, 1.9),
                O.guarded_shift(r, low.at[0].set(jnp.nan), lambda: mx, 1e9),
                jax.vmap(lambda r: O.guarded_shift(r, low, lambda: r - 1, 2.0))(
                    jnp.stack([r, r + 1])),
                jax.grad(lambda r: jnp.sum(O.guarded_shift(r, low, lambda: r, 2.0)))(r))

    safe, unsafe, nan, many, grad = cases(r, low, mx)
    np.testing.assert_array_equal(safe, r)
    np.testing.assert_array_equal(unsafe, mx)
    np.testing.assert_array_equal(nan, mx)
    np.testing.assert_array_equal(many, np.stack([r - 1, r]))
    assert float(grad[0]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("dtype_", [np.float32, np.float64], ids=["f32", "f64"])
def test_causal_rows_depend_on_their_prefix_only(dtype_):
    # under a causal mask row i sees rows and keys <= i only, bitwise: a later query far from
    # its keys (its query block then needs the running maximum), a later key of large norm
    # and a large later bias leave rows 0..11 unchanged to the last bit
    q, k, v = _qkv(dtype_, H=1, n=20, seed=14)
    bias = jnp.zeros((1, 20), dtype_)
    alibi = jnp.asarray([0.2], dtype_)
    kw = dict(causal=True, alibi=alibi, kernel="blocked", k_block=4, q_block=8)
    a = heads_interaction(q, k, v, 2.0, key_bias=bias, **kw)
    q1 = q.at[0, 12].multiply(1000.0)
    k1 = k.at[0, 15].multiply(100.0)
    b = heads_interaction(q1, k1, v, 2.0, key_bias=bias.at[0, 17].set(50.0), **kw)
    assert np.array_equal(np.asarray(a[0, :12]), np.asarray(b[0, :12]))
    assert not np.allclose(np.asarray(a[0, 12:]), np.asarray(b[0, 12:]))
    dense = heads_interaction(q1, k1, v, 2.0, key_bias=bias.at[0, 17].set(50.0), causal=True,
                              alibi=alibi, kernel="dense")
    _close(b, dense, dtype_, f32=1e-4)
