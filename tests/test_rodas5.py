"""Rodas5 as a diffrax solver: order 5 on a non-autonomous linear ODE (the ∂f/∂t terms), its
dense output, L-stability on a stiff system, reverse-mode gradients, and the one-step helper
on the same stage code."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sla

from jaxdyn.integrators.rodas5 import RODAS5, Rodas5, rodas5_step

J = np.array([[-1.0, 2.0, 0.0], [-2.0, -1.0, 0.0], [0.0, 0.0, -0.5]])
Y0 = np.array([1.0, 0.5, -1.0])
FORCE = np.array([1.0, 0.0, 2.0])


def _field(t, y, args):
    return jnp.asarray(J) @ y + jnp.sin(3 * t) * jnp.asarray(FORCE)


def _exact(ts):
    """y(t) = e^{Jt} y0 + ∫₀ᵗ e^{J(t−s)} sin(3s) F ds, by Van Loan's block exponential."""
    out = []
    for t in ts:
        # augmented linear system: z = (y, sin 3s, cos 3s)
        M = np.zeros((5, 5))
        M[:3, :3] = J
        M[:3, 3] = FORCE
        M[3, 4] = 3.0
        M[4, 3] = -3.0
        z = sla.expm(t * M) @ np.concatenate([Y0, [0.0, 1.0]])
        out.append(z[:3])
    return np.array(out)


@pytest.mark.slow
def test_order_five_and_dense_output_on_a_nonautonomous_ode():
    ts = np.linspace(0.0, 2.0, 41)
    ref = _exact(ts)
    errs, dense = [], []
    for n in (8, 16, 32):
        sol = diffrax.diffeqsolve(diffrax.ODETerm(_field), Rodas5(), 0.0, 2.0, 2.0 / n,
                                  jnp.asarray(Y0), saveat=diffrax.SaveAt(ts=jnp.asarray(ts)))
        e = np.abs(np.asarray(sol.ys) - ref)
        errs.append(e[-1].max())
        dense.append(e.max())
    slopes = np.diff(np.log(errs)) / np.log(0.5)
    assert np.all((slopes > 4.6) & (slopes < 5.6)), (errs, slopes)
    dslopes = np.diff(np.log(dense)) / np.log(0.5)
    assert np.all(dslopes > 4.5), (dense, dslopes)  # order 4 locally: 5 at the save times


@pytest.mark.slow
def test_adaptive_stiff_solve_and_gradient():
    Js = np.array([[-1e6, 0.0], [1.0, -1.0]])
    sol = diffrax.diffeqsolve(diffrax.ODETerm(lambda t, y, a: jnp.asarray(Js) @ y), Rodas5(), 0.0,
                              10.0, None, jnp.array([1.0, 1.0]),
                              stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10))
    ref = sla.expm(10 * Js) @ np.array([1.0, 1.0])
    assert int(sol.stats["num_steps"]) < 400
    np.testing.assert_allclose(np.asarray(sol.ys[-1]), ref, rtol=1e-6, atol=1e-12)

    def loss(k):  # a pytree state
        f = lambda t, y, a: (-a * y[0], a * y[0] - y[1])  # noqa: E731
        s = diffrax.diffeqsolve(diffrax.ODETerm(f), Rodas5(), 0.0, 1.0, None,
                                (jnp.array(1.0), jnp.array(0.0)), args=k,
                                stepsize_controller=diffrax.PIDController(rtol=1e-11, atol=1e-13))
        return s.ys[1][-1]

    k = 2.0
    exact = lambda k: k / (k - 1) * (np.exp(-1.0) - np.exp(-k))  # noqa: E731
    np.testing.assert_allclose(float(loss(k)), exact(k), rtol=1e-9)
    fd = (exact(k + 1e-6) - exact(k - 1e-6)) / 2e-6
    np.testing.assert_allclose(float(jax.grad(loss)(k)), fd, rtol=1e-6)


def test_one_step_helper_is_l_stable():
    # jitted: one program instead of the step's many small ops compiled one by one
    step = jax.jit(lambda y, h: rodas5_step(lambda y: -1e12 * y, y, h))
    y1, err, _ = step(jnp.asarray([1.0, -2.0]), jnp.asarray(1.0))
    assert np.max(np.abs(np.asarray(y1))) < 1e-9
    assert RODAS5.h.shape == (3, 8) and RODAS5.alpha[-1] == 1.0


def test_a_float32_state_stays_float32_with_x64_on():
    """The tableau's NumPy float64 weights must not promote a float32 state (diffrax's save
    buffer then refused the step); the answer against the matrix exponential in float32."""
    M = np.array([[-50.0, 1.0], [0.0, -0.5]])
    y0 = np.array([1.0, 1.0], np.float32)
    term = diffrax.ODETerm(lambda t, y, args: jnp.asarray(M, y.dtype) @ y)
    t0, t1, dt0 = (jnp.float32(v) for v in (0.0, 2.0, 0.05))  # float32 times keep y float32
    sol = diffrax.diffeqsolve(term, Rodas5(), t0, t1, dt0, jnp.asarray(y0),
                              stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-7))
    assert sol.ys.dtype == jnp.float32
    np.testing.assert_allclose(sol.ys[-1], sla.expm(2.0 * M) @ y0, rtol=1e-4, atol=1e-6)
