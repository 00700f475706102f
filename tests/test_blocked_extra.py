"""The blocked kernel's two block-step formulations, default blocks, and its use under
vmap and grad, each against the dense kernel (an independent computation)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdyn.kernels._attention import (
    AUTO_BLOCKED_MIN_KEYS,
    DEFAULT_BLOCKS,
    blocked,
    interaction,
    resolve_kernel,
)
from conftest import tol


def _sphere(seed, n, d, dtype):
    """Points uniform on the unit sphere of R^d, n of them (NumPy: no program to compile)."""
    x = np.random.default_rng(seed).normal(size=(n, d))
    return jnp.asarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype)


def _setup(dtype, n, d=3, seed=0, beta=4.0):
    rng = np.random.default_rng(seed)
    B = jnp.asarray(rng.normal(size=(d, d)) + np.eye(d), dtype)  # non-symmetric
    x = _sphere(seed + 100, n, d, dtype)
    qx = jnp.asarray(beta, dtype) * jnp.matmul(x, B, precision=jax.lax.Precision.HIGHEST)
    return x, B, qx


@pytest.mark.slow
@pytest.mark.parametrize("formulation", ["dot", "fused"])
@pytest.mark.parametrize("normalization", ["softmax", "unnormalized", "hardmax"])
def test_formulations_equal_dense(dtype, formulation, normalization):
    beta = 1.0 if normalization == "hardmax" else 4.0
    x, B, qx = _setup(dtype, 201, beta=beta)
    dense = interaction(x, x, B, beta, kernel="dense", normalization=normalization)
    scale = float(np.max(np.abs(np.asarray(dense))))
    for kb, qb in [(64, 128), (37, 1000)]:  # padded keys and queries; one query block
        got = blocked(qx, x, normalization, k_block=kb, q_block=qb, formulation=formulation)
        assert got.dtype == dense.dtype and got.shape == dense.shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(dense), rtol=0,
                                   atol=tol(dtype, 1e-5, 1e-12) * scale)


@pytest.mark.slow_dtype("f64")
def test_default_blocks_and_auto_switch(dtype):
    n = AUTO_BLOCKED_MIN_KEYS + 37
    x, B, _ = _setup(dtype, n, beta=9.0)
    assert resolve_kernel("auto", n) == "blocked"
    assert resolve_kernel("auto", AUTO_BLOCKED_MIN_KEYS - 1) == "dense"
    auto = interaction(x, x, B, 9.0)  # blocked, default (platform) blocks
    dense = interaction(x, x, B, 9.0, kernel="dense")
    scale = float(np.max(np.abs(np.asarray(dense))))
    np.testing.assert_allclose(np.asarray(auto), np.asarray(dense), rtol=0,
                               atol=tol(dtype, 1e-5, 1e-12) * scale)
    assert set(DEFAULT_BLOCKS) >= {"cpu", "gpu"}


def test_large_beta_float32_hits_are_exact():
    # β = 10⁴: logits of order 10⁴ must not overflow in either formulation.
    x, B, _ = _setup(np.float32, 200, beta=1.0)
    B = jnp.eye(3, dtype=jnp.float32)
    qx = 1e4 * x
    for form in ("dot", "fused"):
        m = blocked(qx, x, k_block=64, q_block=64, formulation=form)
        assert bool(jnp.all(jnp.isfinite(m)))
        np.testing.assert_allclose(np.asarray(m), np.asarray(interaction(x, x, B, 1e4, kernel="dense")),
                                   atol=1e-5)


@pytest.mark.slow  # 5-6 s a dtype; grad through the blocked kernel by default: test_bound_shift_gradient_equals_dense_gradient
def test_vmap_over_beta_and_grad_match_dense(dtype):
    x, B, _ = _setup(dtype, 80)
    betas = jnp.asarray([0.5, 3.0, 8.0], dtype)
    f_b = jax.vmap(lambda b: interaction(x, x, B, b, kernel="blocked", k_block=16, q_block=32))
    f_d = jax.vmap(lambda b: interaction(x, x, B, b, kernel="dense"))
    np.testing.assert_allclose(np.asarray(f_b(betas)), np.asarray(f_d(betas)), rtol=0,
                               atol=tol(dtype, 1e-5, 1e-12) * 2)

    def loss(b, kernel):
        return jnp.sum(interaction(x, x, B, b, kernel=kernel, k_block=16, q_block=32) ** 2)

    g_b = jax.grad(loss)(jnp.asarray(2.0, dtype), "blocked")
    g_d = jax.grad(loss)(jnp.asarray(2.0, dtype), "dense")
    np.testing.assert_allclose(float(g_b), float(g_d), rtol=tol(dtype, 1e-4, 1e-10))


@pytest.mark.slow_dtype("f32")
def test_mixed_query_key_sets(dtype):
    # n ≠ m, keys not the queries: both formulations still agree with dense.
    x, B, _ = _setup(dtype, 70, seed=1)
    y = _sphere(9, 45, 3, dtype)
    dense = interaction(x, y, B, 3.0, kernel="dense")
    got = interaction(x, y, B, 3.0, kernel="blocked", k_block=16, q_block=32)
    np.testing.assert_allclose(np.asarray(got), np.asarray(dense), rtol=0,
                               atol=tol(dtype, 1e-5, 1e-12))


def test_bad_blocks_and_formulation():
    x = jnp.ones((4, 3))
    with pytest.raises(ValueError, match="k_block"):
        interaction(x, x, jnp.eye(3), 1.0, k_block=0)
    with pytest.raises(ValueError, match="q_block"):
        interaction(x, x, jnp.eye(3), 1.0, q_block=2.5)
    with pytest.raises(ValueError, match="formulation"):
        blocked(x, x, formulation="magic")


@pytest.mark.parametrize("self_keys", [True, False])
@pytest.mark.parametrize("branch,safe", [("maximum", -1.0), ("bound", 1e30)])
@pytest.mark.slow_dtype("f64")  # a code-path identity: f32 (the runs' default dtype) in the default suite, f64 under -m slow
def test_bound_shift_and_running_maximum_each_equal_dense(monkeypatch, dtype, self_keys, branch,
                                                          safe):
    # the CPU block step shifts softmax weights by the Cauchy–Schwarz bound where that is
    # exact and by the running maximum otherwise; forcing either everywhere (SAFE_SHIFT
    # -1 / 1e30) gives the dense kernel's result, for self-attention (l_ii known) and for
    # other keys (first-block maximum), with padded query and key blocks
    import jaxdyn.kernels._attention as K

    monkeypatch.setitem(K.SAFE_SHIFT, "float32", safe)
    monkeypatch.setitem(K.SAFE_SHIFT, "float64", safe)
    x, B, qx = _setup(dtype, 203, beta=6.0)
    dense = interaction(x, x, B, 6.0, kernel="dense")
    # the guard is read at each call and keys the program: no trace of another case serves
    got = blocked(qx, x, k_block=64, q_block=96, formulation="dot", self_keys=self_keys)
    np.testing.assert_allclose(np.asarray(got), np.asarray(dense), rtol=0,
                               atol=tol(dtype, 1e-5, 1e-12) * float(np.max(np.abs(np.asarray(dense)))))


def test_bound_shift_guard_is_live_and_batch_wide(monkeypatch):
    # β = 3000 with a random B: only the running maximum keeps weights in float32 range.
    # The default guard picks it (finite, equal to dense); forcing the bound loses rows.
    import jaxdyn.kernels._attention as K

    x, B, qx = _setup(np.float32, 150, beta=3000.0, seed=3)
    dense = interaction(x, x, B, 3000.0, kernel="dense")
    got = blocked(qx, x, k_block=64, q_block=64, formulation="dot", self_keys=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(dense), rtol=0, atol=1e-4)
    with monkeypatch.context() as mp:
        mp.setitem(K.SAFE_SHIFT, "float32", 1e30)  # read at each call: it keys the program
        forced = blocked(qx, x, k_block=64, q_block=64, formulation="dot", self_keys=True)
        assert not np.all(np.isfinite(np.asarray(forced)))
    # under vmap one decision covers the batch: a safe β next to an unsafe one still
    # matches dense for both (the unsafe one forces the maximum for the pair)
    betas = jnp.asarray([2.0, 3000.0], jnp.float32)
    f = jax.vmap(lambda b: interaction(x, x, B, b, kernel="blocked", k_block=64, q_block=64))
    many = f(betas)
    for i, b in enumerate([2.0, 3000.0]):
        ref = interaction(x, x, B, b, kernel="dense")
        np.testing.assert_allclose(np.asarray(many[i]), np.asarray(ref), rtol=0, atol=1e-4)


@pytest.mark.slow  # default-suite counterpart (∂/∂Q, ∂/∂K of the same bound-shifted pass, with ∂/∂(V, β, x)): tests/test_blocked_vjp.py::test_sphere_attention_gradient_equals_dense
def test_bound_shift_gradient_equals_dense_gradient():
    x, B, _ = _setup(np.float64, 90, beta=3.0, seed=5)

    def loss(B, kernel):
        m = interaction(x, x, B, 3.0, kernel=kernel, k_block=32, q_block=40)
        return jnp.sum(m * jnp.sin(m))

    g_dense = jax.grad(loss)(B, "dense")
    g_blocked = jax.grad(loss)(B, "blocked")
    np.testing.assert_allclose(np.asarray(g_blocked), np.asarray(g_dense), rtol=1e-10, atol=1e-12)


@pytest.mark.slow_dtype("f32")  # f64 (1e-12) here; both float32 logits in the default suite: test_fused_logits_large_beta_float32
def test_cpu_logits_by_matmul_and_in_the_exp_loop_equal_dense(dtype):
    # The CPU step with a fixed shift (bound-shifted softmax; unnormalised: no shift) forms
    # a tile's logits either by a matrix product or inside the exponential's loop on a
    # (keys × queries) tile; both give the dense kernel's result, padded blocks included.
    x, B, qx = _setup(dtype, 203, beta=6.0)
    for normalization in ("softmax", "unnormalized"):
        dense = interaction(x, x, B, 6.0, kernel="dense", normalization=normalization)
        scale = float(np.max(np.abs(np.asarray(dense))))
        for logits in ("matmul", "fused"):
            got = blocked(qx, x, normalization, k_block=64, q_block=96, formulation="dot",
                          self_keys=True, logits=logits)
            np.testing.assert_allclose(np.asarray(got), np.asarray(dense), rtol=0,
                                       atol=tol(dtype, 1e-5, 1e-12) * scale)
    with pytest.raises(ValueError, match="logits"):
        blocked(qx, x, logits="einsum")


def test_fused_logits_large_beta_float32():
    # β = 10⁴ (logits of order 10⁴, the bound shift taken: r_i − l_ii = 0): the logits
    # formed inside the exponential's loop match the dense kernel as the product's do.
    x, _, _ = _setup(np.float32, 200, beta=1.0)
    dense = np.asarray(interaction(x, x, jnp.eye(3, dtype=jnp.float32), 1e4, kernel="dense"))
    for logits in ("matmul", "fused"):
        m = blocked(1e4 * x, x, k_block=64, q_block=64, formulation="dot", self_keys=True,
                    logits=logits)
        assert bool(jnp.all(jnp.isfinite(m)))
        np.testing.assert_allclose(np.asarray(m), dense, atol=1e-5)


# ------------------------------------------------------- gradients and inputs at the edges


def _grad_pair(loss, arg):
    # each gradient one jitted program (not op by op)
    return [np.asarray(jax.jit(jax.grad(lambda a, k=k: loss(a, k)))(arg))
            for k in ("dense", "blocked")]


@pytest.mark.slow_dtype("f32")  # dtype-independent (sqrt's derivative at 0): f64 here, f32 under -m slow
@pytest.mark.slow
def test_gradient_with_a_zero_query_row_equals_dense(dtype):
    # β = 0 or a rank-deficient B gives a query row β Bᵀx_i = 0, where the bound shift's
    # sqrt has no derivative: the shift cancels in the weights, so it carries none (it gave
    # NaN gradients, e.g. controls optimised from B = 0)
    x, _, _ = _setup(dtype, 50, seed=2)
    x = x.at[0].set(jnp.asarray([0.0, 0.0, 1.0], dtype))  # in the kernel of B below
    Bd = jnp.diag(jnp.asarray([1.0, 1.0, 0.0], dtype))

    def at_beta(beta, kernel):
        m = interaction(x, x, Bd, beta, kernel=kernel, k_block=16, q_block=16)
        return jnp.sum(m * jnp.sin(3 * m))

    def at_B(B, kernel):
        return jnp.sum(jnp.sin(3 * interaction(x, x, B, 1.0, kernel=kernel, k_block=16,
                                               q_block=16)))

    for f, arg in ((at_beta, jnp.asarray(0.0, dtype)), (at_B, Bd)):
        dense, blocked_ = _grad_pair(f, arg)
        assert np.all(np.isfinite(blocked_)), blocked_
        np.testing.assert_allclose(blocked_, dense, rtol=tol(dtype, 1e-4, 1e-10),
                                   atol=tol(dtype, 1e-5, 1e-12))


def test_gradient_where_the_largest_weight_is_tiny_equals_dense():
    # one query e1 against keys orthogonal to it: every logit is 0 and the bound is β, so
    # the row's normaliser is e^-β; the bound shift is taken up to SAFE_SHIFT (60 / 600).
    # The quotient's derivative must not square it (e^-110 underflows in float32).
    th = np.linspace(0, 2 * np.pi, 7, endpoint=False)
    y0 = np.stack([np.zeros_like(th), np.cos(th), np.sin(th) + 0.3], 1)
    y0 /= np.linalg.norm(y0, axis=1, keepdims=True)
    for dt, beta in ((np.float32, 55.0), (np.float64, 590.0)):
        y = jnp.asarray(y0, dt)
        B = jnp.eye(3, dtype=dt)

        def loss(x, kernel):
            return jnp.sum(interaction(x, y, B, beta, kernel=kernel, k_block=4, q_block=4) ** 2)

        dense, blocked_ = _grad_pair(loss, jnp.asarray([[1.0, 0.0, 0.0]], dt))
        assert np.all(np.isfinite(blocked_)), (dt, blocked_)
        np.testing.assert_allclose(blocked_, dense, rtol=tol(dt, 1e-4, 1e-10), atol=0)


def test_inputs_at_the_edges():
    # dense hardmax keeps a NaN row NaN under jit (XLA folded its 0/0 to 0), as blocked does
    xn = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    xn[2, 0] = np.nan
    x = jnp.asarray(xn)
    B = jnp.eye(3, dtype=jnp.float32)
    for kernel in ("dense", "blocked"):
        m = np.asarray(interaction(x, jnp.asarray(xn[[0, 1, 3, 4]]), B, 1.0, kernel=kernel,
                                   normalization="hardmax"))
        assert np.all(np.isnan(m[2])) and np.all(np.isfinite(m[[0, 1, 3, 4]])), (kernel, m)
    # integer points are computed in floating point (β = 0.7 was truncated to 0)
    xi = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]])
    ref = np.asarray(interaction(jnp.asarray(xi, jnp.float64), jnp.asarray(xi, jnp.float64),
                                 jnp.eye(3), 0.7, kernel="dense"))
    w = np.exp(0.7 * xi @ xi.T)
    np.testing.assert_allclose(ref, (w / w.sum(1, keepdims=True)) @ xi, rtol=1e-12)
    for kernel in ("dense", "blocked"):
        got = np.asarray(interaction(jnp.asarray(xi), jnp.asarray(xi), jnp.eye(3), 0.7,
                                     kernel=kernel))
        np.testing.assert_allclose(got, ref, rtol=1e-6)
    # float16: the bound shift keeps the row's largest weight a normal float16 number
    x16 = jnp.asarray([[1.0, 0.0, 0.0]], jnp.float16)
    y16 = jnp.asarray([[0.0, 1.0, 0.0], [-0.5, -0.8660254, 0.0], [-0.5, 0.0, 0.8660254]],
                      jnp.float16)
    dense16 = np.asarray(interaction(x16, y16, jnp.eye(3, dtype=jnp.float16), 30.0,
                                     kernel="dense"), np.float32)
    blocked16 = np.asarray(interaction(x16, y16, jnp.eye(3, dtype=jnp.float16), 30.0,
                                       kernel="blocked"), np.float32)
    assert np.all(np.isfinite(blocked16)), blocked16
    np.testing.assert_allclose(blocked16, dense16, atol=2e-3)
    with pytest.raises(ValueError, match="at least one key"):
        interaction(x, x[:0], B, 1.0)
    with pytest.raises(ValueError, match="beta must be a scalar"):
        interaction(x, x, B, jnp.ones(3))
