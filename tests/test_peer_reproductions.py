"""The peers' experiments in jaxdyn's conventions: tfdy's split step and castin's
covariance ODE, each against an independent NumPy transcription of the published equations.

Default tests (a few CPU-seconds): the step and the right-hand side, exactly (float64).
The whole reproductions (``reproductions/tfdy_split_reference.py`` and
``reproductions/castin_covariance_reference.py``) run in ``tests/test_reproductions.py``.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn

jax.config.update("jax_enable_x64", True)



# --------------------------------------------------------------------------------------
# tfdy (TimRoith/TransformerDynamics): usa_flow with sgn = -1, sigma = 0
# --------------------------------------------------------------------------------------


def _tfdy_loop(x, D, beta, tau, steps):
    """NumPy transcription of the published update: x += (τ/n) exp(β x D xᵀ) x Dᵀ, then
    every row renormalised (float64)."""
    x = np.array(x, np.float64)
    n = x.shape[0]
    for _ in range(steps):
        x = x + (tau / n) * np.exp(beta * (x @ (D @ x.T))) @ x @ D.T
        x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    return x


@pytest.mark.slow
def test_tfdy_split_step_is_euler_renormalise_with_usa_and_V_equal_D():
    """tfdy's split experiment is SphereAttention(I, D, D, β, unnormalized) with the published
    step (method="euler_renormalise"), dt = τ: two dd values (one each side of the split),
    n = 12, 40 steps, against the NumPy loop to 1e-12."""
    n, steps, tau, beta = 12, 40, 0.1, 1.0
    dds = (0.3, 1.3)
    x0 = jax.vmap(lambda k: jaxdyn.sample_sphere(k, n, 2, dtype=jnp.float64))(
        jax.vmap(jax.random.PRNGKey)(jnp.arange(len(dds))))
    Ds = [np.diag([dd, 1.0]) for dd in dds]
    models = jaxdyn.stack_models([jaxdyn.SphereAttention(np.eye(2), D, D, beta,
                                                         normalization="unnormalized")
                                  for D in Ds])
    traj = jaxdyn.simulate_ensemble(models, x0, t1=steps * tau, dt=tau,
                                    method="euler_renormalise", save_every=steps)
    assert bool(np.all(np.asarray(traj.ok)))
    got = np.asarray(traj.xs[:, -1])
    for i, D in enumerate(Ds):
        ref = _tfdy_loop(np.asarray(x0[i]), D, beta, tau, steps)
        np.testing.assert_allclose(got[i], ref, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------
# castin (vcastin/2025-transformers-PDEs): rhs_trad
# --------------------------------------------------------------------------------------


def _castin_rhs(S, Q, K, V, d):
    """NumPy transcription of the published right-hand side: A = KᵀQ/√d,
    S' = V S A S + (V S A S)ᵀ."""
    A = K.T @ Q / np.sqrt(d)
    r = V @ S @ A @ S
    return r + r.T


@pytest.mark.parametrize("rank_one_qk", [False, True], ids=["square", "rank_one"])
def test_castin_covariance_rhs_is_the_moment_ode_with_A0_B_KtQ_over_sqrt_d(rank_one_qk):
    """castin's covariance ODE = jaxdyn's moment ODE with A = 0, B = KᵀQ/√d, the same V
    (docs/math.md §F.5), at random covariances and parameters, to 1e-12; the zero mean stays
    zero. ``rank_one`` is the "convergence to a line" set-up (Q, K of shape (1, d))."""
    rng = np.random.default_rng(7)
    d = 2
    for _ in range(5):
        W = rng.normal(size=(d, d))
        S = W @ W.T
        if rank_one_qk:
            q = rng.normal(size=(1, d))
            Q, K = q, -q
        else:
            Q, K = rng.normal(size=(d, d)), rng.normal(size=(d, d))
        V = rng.normal(size=(d, d))
        field = jaxdyn.gaussian.MomentField(np.zeros((d, d)), K.T @ Q / np.sqrt(d), V)
        dm, dS = field(0.0, (jnp.zeros(d), jnp.asarray(S)), None)
        ref = _castin_rhs(S, Q, K, V, d)
        np.testing.assert_allclose(np.asarray(dS), ref, rtol=0, atol=1e-12 * max(1.0, np.abs(ref).max()))
        np.testing.assert_array_equal(np.asarray(dm), 0.0)
