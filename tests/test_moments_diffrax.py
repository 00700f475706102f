"""The moment solvers' field objects and their diffrax pass-through (controller, adjoint).

``solve_moments`` and ``solve_moments_batch`` take the system as ``field=`` (a
:class:`jaxdyn.gaussian.MomentField` or, for ``solve_moments``, a ``VariantMomentField``) or
as keywords, with the same results; a user's ``stepsize_controller`` and ``adjoint`` reach
diffrax (the step counts follow the controller, the gradients agree with the default
adjoint's), in float32 and float64; the batch solver's fast host path refuses them by name.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdyn.gaussian import MomentField, VariantMomentField, solve_moments, solve_moments_batch

# a stable system (no blow-up on [0, 1]): the steps are the controller's alone
A = np.array([[-0.3, 0.2], [-0.1, -0.2]])
B = np.array([[0.2, 0.1], [0.0, 0.1]])
V = -0.5 * np.eye(2)
b = np.array([0.1, -0.2])
S0 = np.array([[1.0, 0.3], [0.3, 0.8]])
m0 = np.array([0.3, -0.1])
DTYPES = [np.float32, np.float64]
# Every solve check here runs under -m slow, both dtypes: each dtype compiles its own diffrax
# programs (8 to 28 CPU-s a test), for properties of forwarding (a field object is its
# keywords; a controller or adjoint given reaches diffrax). The solvers themselves run by
# default elsewhere: solve_moments' closed forms and vmap in tests/test_gaussian.py, its jit and
# the batch in tests/test_properties.py's fault cases. The refusals by name stay default.
# The options of the solves that share one compiled program a dtype (the field form's, the
# default controller's and the primal of the default adjoint's gradient): each distinct
# solve_moments program costs seconds to trace and compile.
KW = dict(t1=1.0, saveat=3, rtol=1e-5, atol=1e-7)


def _cast(dtype, *xs):
    return tuple(np.asarray(x, dtype) for x in xs)


def _same(r1, r2):
    for k in ("cov", "mean", "t_final", "cov_final", "mean_final", "blowup_time"):
        np.testing.assert_array_equal(np.asarray(getattr(r1, k)), np.asarray(getattr(r2, k)))
    np.testing.assert_array_equal(np.asarray(r1.num_steps), np.asarray(r2.num_steps))
    np.testing.assert_array_equal(np.asarray(r1.status), np.asarray(r2.status))


@pytest.mark.slow  # a keyword form equal to a field form (forwarding): solve_moments itself by default in tests/test_gaussian.py::test_vi_blowup_time_matches_closed_form
@pytest.mark.parametrize("dtype", DTYPES)
def test_field_form_is_the_keyword_form(dtype):
    """``field=MomentField(A, B, V, b)`` and the keywords give the same solve, bit for bit.

    A dtype-independent identity of two forms, in both dtypes."""
    a, bb, v, c, s0, mm = _cast(dtype, A, B, V, b, S0, m0)
    kw = KW
    _same(solve_moments(mm, s0, field=MomentField(a, bb, v, c), **kw),
          solve_moments(mm, s0, A=a, B=bb, V=v, b=c, **kw))
    Q, K = np.eye(2, dtype=dtype)[None], np.eye(2, dtype=dtype)[None]
    field = VariantMomentField(a, Q, K, v[None], c, beta=0.5, attention="l2")
    _same(solve_moments(mm, s0, field=field, **kw),
          solve_moments(mm, s0, A=a, Q=Q, K=K, V=v[None], b=c, beta=0.5, attention="l2", **kw))


@pytest.mark.slow  # a keyword form equal to a field form (forwarding): solve_moments_batch by default in tests/test_properties.py::test_fault_default[solve_moments_batch]
@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_field_form_is_the_keyword_form(dtype):
    """A stacked field (``jax.vmap(MomentField)``) or a shared one: as the keywords, both paths."""
    a, bb, v, c, s0 = _cast(dtype, A, B, V, b, S0)
    As = np.stack([a, 0.5 * a, 2 * a])
    stacked = jax.vmap(MomentField, in_axes=(0, None, None, None))(As, bb, v, c)
    _same(solve_moments_batch(None, s0, field=stacked, t1=1.0),
          solve_moments_batch(None, s0, A=As, B=bb, V=v, b=c, t1=1.0))
    _same(solve_moments_batch(None, s0, field=MomentField(a, bb, v, c), t1=1.0, saveat=2,
                              stiff=False),
          solve_moments_batch(None, s0, A=a, B=bb, V=v, b=c, t1=1.0, saveat=2, stiff=False))


def test_field_and_keywords_both_given_is_a_named_error():
    """A field together with a keyword for its parameters is a TypeError naming the keyword."""
    f = MomentField(A, B, V, b)
    with pytest.raises(TypeError, match=r"given twice.*\['A'\]"):
        solve_moments(m0, S0, field=f, A=A, t1=1.0)
    with pytest.raises(TypeError, match=r"given twice.*\['beta'\]"):
        solve_moments(m0, S0, field=f, beta=2.0, t1=1.0)
    with pytest.raises(TypeError, match=r"given twice.*\['V', 'b'\]"):
        solve_moments_batch(None, S0, field=f, V=V, b=b, t1=1.0)
    with pytest.raises(TypeError, match="MomentField"):
        solve_moments(m0, S0, field=(A, B, V, b), t1=1.0)
    with pytest.raises(TypeError, match="MomentField of constant arrays"):
        solve_moments_batch(None, S0, field=VariantMomentField(A, np.eye(2), np.eye(2), V),
                            t1=1.0)
    with pytest.raises(ValueError, match="V is required"):
        solve_moments(m0, S0, A=A, B=B, t1=1.0)
    with pytest.raises(ValueError, match="A, B required"):
        solve_moments_batch(None, S0, V=V, t1=1.0)
    with pytest.raises(TypeError, match="stepsize_controller"):
        solve_moments(m0, S0, field=f, t1=1.0, stepsize_controller="pid")


@pytest.mark.slow  # an option reaching diffrax; not in the default suite: a user's stepsize_controller in solve_moments (its refusal by name stays default)
@pytest.mark.parametrize("dtype", DTYPES)
def test_stepsize_controller_reaches_diffrax(dtype):
    """ConstantStepSize takes t1/dt0 steps, StepTo its grid's; a PID controller at (rtol, atol)
    is the default one (bit for bit; the default's solve is test_field_form_is_the_keyword_form's
    compiled program)."""
    a, bb, v, c, s0, mm = _cast(dtype, A, B, V, b, S0, m0)
    f = MomentField(a, bb, v, c)
    const = solve_moments(mm, s0, field=f, t1=1.0, dt0=0.1,
                          stepsize_controller=diffrax.ConstantStepSize())
    assert const.names == "successful" and int(const.num_steps) == 10
    assert int(const.num_accepted_steps) == 10
    step_to = solve_moments(mm, s0, field=f, t1=1.0, stepsize_controller=diffrax.StepTo(
        ts=jnp.linspace(0.0, 1.0, 5, dtype=dtype)))
    assert int(step_to.num_steps) == 4
    tight = solve_moments(mm, s0, field=f, **KW)
    given = solve_moments(mm, s0, field=f, t1=1.0, saveat=3,
                          stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-7))
    _same(tight, given)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_controller_tolerances_set_the_steps_and_the_error(dtype):
    """A looser PID takes fewer steps than a strict one; the constant steps agree with the
    strict adaptive solve to their order (Dopri8, h = 0.1)."""
    a, bb, v, c, s0, mm = _cast(dtype, A, B, V, b, S0, m0)
    f = MomentField(a, bb, v, c)
    const = solve_moments(mm, s0, field=f, t1=1.0, dt0=0.1,
                          stepsize_controller=diffrax.ConstantStepSize())
    strict = 2e-6 if dtype == np.float32 else 1e-11  # near what the dtype resolves
    strict = solve_moments(mm, s0, field=f, t1=1.0, stepsize_controller=diffrax.PIDController(
        rtol=strict, atol=strict / 100))
    loose = solve_moments(mm, s0, field=f, t1=1.0,
                          stepsize_controller=diffrax.PIDController(rtol=1e-2, atol=1e-4))
    assert int(loose.num_steps) < int(strict.num_steps), (loose.num_steps, strict.num_steps)
    tol = 1e-5 if dtype == np.float32 else 1e-9
    np.testing.assert_allclose(np.asarray(const.cov_final), np.asarray(strict.cov_final),
                               rtol=tol, atol=tol)


class _SpyAdjoint(diffrax.RecursiveCheckpointAdjoint):
    """diffrax's checkpointed adjoint that records each solve it runs (diffrax calls an
    adjoint's ``loop`` for every solve, differentiated or not)."""

    def loop(self, **kwargs):
        ADJOINT_CALLS.append(self.checkpoints)
        return super().loop(**kwargs)


ADJOINT_CALLS: list = []


def _gradients(loss, a, adjoints):
    return [np.asarray(jax.grad(loss)(a, adj)) for adj in adjoints]


@pytest.mark.slow  # 28 CPU-s, the file's costliest; not in the default suite: jax.grad through solve_moments' diffrax solve (reach's default run differentiates the fixed-step moment solve: tests/test_control_compose.py)
@pytest.mark.parametrize("dtype", DTYPES)
def test_custom_adjoint_gives_the_default_gradient(dtype):
    """A checkpointed adjoint (3 checkpoints) gives the default adjoint's gradient: both
    differentiate the same discretisation, equal to rounding (float64 1e-10, float32 1e-4
    relative). The solve's options are KW (its primal is the field form's traced program).
    Forward mode: under -m slow."""
    a, bb, v, c, s0, mm = _cast(dtype, A, B, V, b, S0, m0)

    def loss(a, adjoint):
        sol = solve_moments(mm, s0, A=a, B=bb, V=v, b=c, adjoint=adjoint, **KW)
        return jnp.sum(sol.cov_final) + jnp.sum(sol.mean_final)

    g0, g_ck = _gradients(loss, a, [None, diffrax.RecursiveCheckpointAdjoint(checkpoints=3)])
    tol = 1e-4 if dtype == np.float32 else 1e-10
    assert np.all(np.isfinite(g0)) and np.max(np.abs(g0)) > 0.1
    np.testing.assert_allclose(g_ck, g0, rtol=tol, atol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_mode_adjoint_gives_the_default_gradient(dtype):
    """diffrax.ForwardMode under jax.jacfwd: the default adjoint's gradient, to rounding."""
    a, bb, v, c, s0, mm = _cast(dtype, A, B, V, b, S0, m0)

    def loss(a, adjoint):
        sol = solve_moments(mm, s0, A=a, B=bb, V=v, b=c, t1=1.0, adjoint=adjoint)
        return jnp.sum(sol.cov_final) + jnp.sum(sol.mean_final)

    (g0,) = _gradients(loss, a, [None])
    g_fwd = np.asarray(jax.jacfwd(loss)(a, diffrax.ForwardMode()))
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(g_fwd, g0, rtol=tol, atol=tol)


@pytest.mark.slow  # options reaching diffrax; not in the default suite: controller and adjoint in solve_moments_batch's jitted path (the fast path's refusal stays default)
@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_composable_path_takes_controller_and_adjoint(dtype):
    """Under jax.jit the batch takes the controller (StepTo: 4 steps a member) and runs its
    solve with the adjoint given (a recording adjoint sees the solve), both in one call (one
    compiled program). The adjoint's gradient: under -m slow."""
    a, bb, v, c, s0 = _cast(dtype, A, B, V, b, S0)
    As = np.stack([a, 0.5 * a])
    step_to = diffrax.StepTo(ts=jnp.linspace(0.0, 1.0, 5, dtype=dtype))
    ADJOINT_CALLS.clear()
    sol = jax.jit(lambda As: solve_moments_batch(None, s0, A=As, B=bb, V=v, b=c, t1=1.0,
                                                 stiff=False, stepsize_controller=step_to,
                                                 adjoint=_SpyAdjoint(5)))(As)
    assert list(sol.names) == ["successful"] * 2
    np.testing.assert_array_equal(np.asarray(sol.num_steps), [4, 4])
    assert ADJOINT_CALLS == [5]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_adjoint_gives_the_default_gradient(dtype):
    """The batch's gradient through a checkpointed adjoint (2 checkpoints): the default's."""
    a, bb, v, c, s0 = _cast(dtype, A, B, V, b, S0)
    As = np.stack([a, 0.5 * a])

    def loss(As, adjoint):
        s = solve_moments_batch(None, s0, A=As, B=bb, V=v, b=c, t1=1.0, stiff=False,
                                adjoint=adjoint)
        return jnp.sum(s.cov_final)

    g0, g_ck = _gradients(loss, As, [None, diffrax.RecursiveCheckpointAdjoint(checkpoints=2)])
    tol = 1e-4 if dtype == np.float32 else 1e-10
    assert np.all(np.isfinite(g0))
    np.testing.assert_allclose(g_ck, g0, rtol=tol, atol=tol)


def test_batch_fast_path_refuses_controller_and_adjoint():
    """Concrete inputs at t1 alone run the host path: a controller or adjoint is refused by name."""
    with pytest.raises(ValueError, match="stepsize_controller.*jax.jit"):
        solve_moments_batch(None, S0, A=A, B=B, V=V, t1=1.0,
                            stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8))
    with pytest.raises(ValueError, match="adjoint apply to the composable"):
        solve_moments_batch(None, S0, A=A, B=B, V=V, t1=1.0,
                            adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=2))
