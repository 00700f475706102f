"""Measure control: S_ε against an independent Sinkhorn, options out of their domain.

Concrete options out of their domain raise a ValueError naming the option before anything is
computed; traced ones give a NaN loss (``measure_loss``) or the status ``invalid_input``
(``measure_control``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn.control import (MeasureControlOptions, default_controls, measure_control, measure_flow,
                            measure_loss)
from jaxdyn.control._measure import (
    INVALID,
    _divergence,
    _reached,
    _sinkhorn_settings,
    _start_epsilon,
    _zero_potentials,
)


def _logsumexp(a, axis):
    """log Σ exp(a) along ``axis`` (scipy.special.logsumexp's shift by the maximum, without its
    per-call overhead: the reference below makes some 20 000 such calls)."""
    top = np.max(a, axis=axis, keepdims=True)
    return np.squeeze(top, axis) + np.log(np.sum(np.exp(a - top), axis=axis))


def _reference_ot(x, y, eps, iterations=1500):
    """OT_ε(x, y) with uniform weights: log-domain Sinkhorn in NumPy, ε halved from 0.05 mean C.

    Returns:
        ⟨f, a⟩ + ⟨g, b⟩ at convergence (ott's regularised cost of a balanced problem).
    """
    c = np.sum((x[:, None] - y[None]) ** 2, -1)
    n, m = c.shape
    la, lb = np.full(n, -np.log(n)), np.full(m, -np.log(m))
    f, g = np.zeros(n), np.zeros(m)
    e = max(eps, 0.05 * c.mean())
    while True:
        for _ in range(iterations if e == eps else 50):
            f = -e * _logsumexp((g[None] - c) / e + lb[None], axis=1)
            g = -e * _logsumexp((f[:, None] - c) / e + la[:, None], axis=0)
        if e == eps:
            return f.mean() + g.mean()
        e = max(eps, 0.5 * e)


def _reference_divergence(x, y, eps):
    return _reference_ot(x, y, eps) - 0.5 * (_reference_ot(x, x, eps) + _reference_ot(y, y, eps))


def _clouds(dtype=np.float64, n=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 2)).astype(dtype), rng.standard_normal((n, 2)).astype(dtype)


def test_loss_is_the_sinkhorn_divergence_and_finite_at_small_epsilon():
    """S_ε of 16 points in R² is finite, >= 0 and equals a NumPy Sinkhorn (float64, 1e-6;
    float32: test_loss_is_finite_at_small_epsilon_in_float32, under -m slow).

    Before, the cold solve was annealed from 0.05 · mean cost of x0 rather than of the final
    cloud (five times too small here): ott's over-relaxation was measured on a transient,
    the (x, y) iteration diverged and S_ε came out −inf at ε = 0.02 and 0.005.
    """
    x0, y = _clouds()
    c = default_controls("euclidean", 2, 1, jnp.float64)
    x_t = np.asarray(measure_flow(c, x0)[-1])
    for eps in (0.02, 0.005):
        value = float(measure_loss(c, x0, y, epsilon=eps))
        ref = _reference_divergence(x_t, y, eps)
        assert abs(value - ref) <= 1e-6, (eps, value, ref)


@pytest.mark.slow  # the float32 programs of the loss (a second dtype); float64 by default: test_loss_is_the_sinkhorn_divergence_and_finite_at_small_epsilon (S_ε finite at the same ε)
def test_loss_is_finite_at_small_epsilon_in_float32():
    """float32: S_ε finite at every ε that gave −inf, the float64 reference to 1e-3 relative
    (the rounding of a value ~10)."""
    x0, y = _clouds()
    c = default_controls("euclidean", 2, 1, jnp.float64)
    x_t = np.asarray(measure_flow(c, x0)[-1])
    ref = _reference_divergence(x_t, y, 0.005)
    c32 = default_controls("euclidean", 2, 1, jnp.float32)
    x32, y32 = _clouds(np.float32)
    for eps in (0.02, 0.005):
        value = float(measure_loss(c32, x32, y32, epsilon=eps))
        assert np.isfinite(value) and abs(value - ref) <= 1e-3 * ref, (eps, value)


@pytest.mark.slow  # the same clouds and ε = 0.02 through measure_loss, finite and equal to NumPy's Sinkhorn, by default: test_loss_is_the_sinkhorn_divergence_and_finite_at_small_epsilon
def test_diverged_over_relaxation_is_solved_again_without_it():
    """A solve whose over-relaxed (x, y) iteration diverges is redone plainly: S_ε finite.

    The old start (0.05 · mean cost of x0 for the flowed cloud) made ott's adaptive
    over-relaxation diverge (S_ε = −inf) at ε = 0.02 on these clouds.
    """
    x0, y = _clouds()
    c = default_controls("euclidean", 2, 1, jnp.float64)
    x_t = measure_flow(c, x0)[-1]
    y = jnp.asarray(y)
    sk = _sinkhorn_settings(16, 16, 1e-6, 20000)
    pots = _zero_potentials(16, 16, jnp.float64)
    div = jax.jit(lambda xt, yy, e0: _divergence(xt, yy, 0.02, e0, pots, sk, 16, 16)[0])(
        x_t, y, _start_epsilon(jnp.asarray(x0), y))
    ref = _reference_divergence(np.asarray(x_t), np.asarray(y), 0.02)
    assert abs(float(div) - ref) <= 1e-5, (float(div), ref)


_X = np.random.default_rng(1).standard_normal((6, 2))
_U = np.c_[_X / np.linalg.norm(_X, axis=1, keepdims=True), np.zeros(6)]
_C = default_controls("euclidean", 2, 1, jnp.float32)
def _fast(**fields):
    """Options of a one-step run (Adam, then L-BFGS), with ``fields`` set."""
    return MeasureControlOptions(**dict(dict(adam_steps=1, lbfgs_steps=1), **fields))


@pytest.mark.parametrize("name,call", [
    ("epsilon", lambda: measure_loss(_C, _X, _X, epsilon=0.0)),
    ("epsilon", lambda: measure_loss(_C, _X, _X, epsilon=-0.01)),
    ("cost_weight", lambda: measure_loss(_C, _X, _X, cost_weight=-1.0)),
    ("sinkhorn_threshold", lambda: measure_loss(_C, _X, _X, sinkhorn_threshold=-1e-6)),
    ("steps_per_layer", lambda: measure_loss(_C, _X, _X, steps_per_layer=0)),
    ("steps_per_layer", lambda: measure_loss(_C, _X, _X, steps_per_layer=2.5)),
    ("sinkhorn_max_iterations", lambda: measure_loss(_C, _X, _X, sinkhorn_max_iterations=0)),
    ("free", lambda: measure_loss(_C, _X, _X, free=("Z",))),
    ("t1", lambda: measure_loss(_C, _X, _X, t1=-1.0)),
    ("steps_per_layer", lambda: measure_flow(_C, _X, steps_per_layer=2.5)),
    ("t1", lambda: measure_flow(_C, _X, t1=0.0)),
    ("q_block", lambda: measure_flow(_C, _X, q_block=0)),
    ("cost_weight", lambda: measure_control(_X, _X, n_layers=1, options=_fast(cost_weight=-5))),
    ("gtol", lambda: measure_control(_X, _X, n_layers=1, options=_fast(gtol=-1))),
    ("init_scale", lambda: measure_control(_X, _X, n_layers=1, options=_fast(init_scale=-1))),
    ("k_block", lambda: measure_control(_X, _X, n_layers=1, options=_fast(k_block=-4))),
    ("t1", lambda: measure_control(_X, _X, n_layers=1, t1=-1.0, options=_fast())),
    ("free", lambda: measure_control(_U, _U, n_layers=1, model="sphere",
                                     options=_fast(free="Z"))),
    ("x0", lambda: measure_control(_U * (1 + 1e-3), _U, n_layers=1, model="sphere",
                                   options=_fast())),
    # a keyword override is checked as the field it replaces
    ("gtol", lambda: measure_control(_X, _X, n_layers=1, options=_fast(), gtol=-1)),
])
def test_concrete_option_out_of_domain_is_named(name, call):
    """A concrete option out of its domain raises a ValueError naming it, before compute."""
    with pytest.raises(ValueError, match=name) as err:
        call()
    if name == "x0":  # the largest deviation from the unit norm is given
        assert "1e-03" in str(err.value) or "0.001" in str(err.value)


@pytest.mark.slow  # a keyword form equal to an options form (forwarding); measure_control's run and a refusal of its options by default: test_traced_option_out_of_domain_gives_invalid_input, test_concrete_option_out_of_domain_is_named
def test_keywords_override_the_options_fields():
    """``options=`` is the settings; a keyword replaces that one field (the same run, bit for bit).

    Keywords alone start from the defaults of :class:`MeasureControlOptions` (an unknown
    keyword or options of another type: test_unknown_keyword_or_options_of_another_type_is_a_type_error).
    """
    x, y = _clouds(np.float32, n=6)
    # no iteration: the seed alone sets the run (its start, loss and controls); the
    # optimiser's programs are not compiled for a test of how options are merged. The clouds
    # and static options of test_traced_option_out_of_domain_gives_invalid_input: its jitted
    # run traces the same start segments (the seed and ε are arrays, not static options)
    base = dict(adam_steps=0, lbfgs_steps=0, sinkhorn_max_iterations=200)
    ref = measure_control(x, y, n_layers=1, options=MeasureControlOptions(seed=3, **base))
    over = measure_control(x, y, n_layers=1, options=MeasureControlOptions(seed=0, **base),
                           seed=3)
    kw = measure_control(x, y, n_layers=1, seed=3, **base)
    other = measure_control(x, y, n_layers=1, options=MeasureControlOptions(seed=0, **base))
    for r in (over, kw):
        np.testing.assert_array_equal(np.asarray(r.loss_history), np.asarray(ref.loss_history))
        for k in ref.controls:
            np.testing.assert_array_equal(np.asarray(r.controls[k]), np.asarray(ref.controls[k]))
    assert not np.array_equal(np.asarray(other.controls["V"]), np.asarray(ref.controls["V"]))


def test_unknown_keyword_or_options_of_another_type_is_a_type_error():
    """An unknown keyword, or options that are not :class:`MeasureControlOptions`: a TypeError
    naming it, before anything is computed."""
    x, y = _clouds(np.float32, n=6)
    with pytest.raises(TypeError, match="stepz"):
        measure_control(x, y, n_layers=1, stepz=3)
    with pytest.raises(TypeError, match="MeasureControlOptions"):
        measure_control(x, y, n_layers=1, options=dict(seed=3))


def test_w2_tol_zero_never_counts_as_reached():
    """``w2_tol = 0`` (the default, "never"): a divergence that rounds to 0 or below it does not
    stop the optimiser as reached; a positive tolerance does at W2 <= w2_tol."""
    w2 = jnp.array([0.0, 1e-9, 0.5])
    assert not np.any(np.asarray(_reached(w2, 0.0)))
    np.testing.assert_array_equal(np.asarray(_reached(w2, 1e-6)), [True, True, False])


def test_single_free_name_is_one_weight():
    """``free="beta"`` is the one weight β, not its characters."""
    from jaxdyn.control._measure import _free_names

    assert _free_names("beta", "sphere", ()) == ("beta",)
    assert _free_names(["Q", "V"], "euclidean", ()) == ("Q", "V")
    with pytest.raises(ValueError, match="free"):
        _free_names(("Q", "Q"), "euclidean", ())


def test_traced_option_out_of_domain_gives_nan():
    """measure_loss: NaN (value and gradient) where a traced ε, λ or T is out of its domain."""
    x, y = _clouds(np.float32, n=6)

    # one RK4 step a layer (the domain checks do not depend on it): a smaller program to
    # compile than at the default four
    def loss(c, e, lam, t):
        return measure_loss(c, x, y, epsilon=e, cost="jump", cost_weight=lam, t1=t,
                            steps_per_layer=1)

    # one program: a valid row, then ε <= 0, λ < 0, T < 0 (a backward grid used to run as the
    # forward flow over |T|: the loss at T = -1 was that at T = +1)
    args = (jnp.array([0.05, -1.0, 0.05, 0.05]), jnp.array([0.5, 0.5, -0.5, 0.5]),
            jnp.array([1.0, 1.0, 1.0, -1.0]))
    vals, grads = jax.jit(jax.vmap(jax.value_and_grad(loss), in_axes=(None, 0, 0, 0)))(_C, *args)
    assert np.isfinite(vals[0]) and np.all(np.isfinite(grads["V"][0]))
    assert np.all(np.isnan(vals[1:])) and np.all(np.isnan(grads["V"][1:]))


@pytest.mark.slow  # by default: tests/test_traced_domains.py's "measure_flow t1" entry (jit, vmap)
def test_traced_negative_t1_gives_a_nan_flow():
    """measure_flow: a traced T < 0 gives a NaN flow (not the forward flow over |T|)."""
    x, _ = _clouds(np.float32, n=6)
    assert np.all(np.isnan(jax.jit(lambda t: measure_flow(_C, x, t1=t))(-1.0)))


def test_traced_option_out_of_domain_gives_invalid_input():
    """measure_control under jit: a traced ε or T out of its domain is invalid_input, unrun."""
    x, y = _clouds(np.float32, n=6)
    # one RK4 step a layer (the domain checks do not depend on it): a smaller program to
    # compile than at the default four
    run = jax.jit(lambda e, t: measure_control(
        x, y, t1=t, n_layers=1,
        options=MeasureControlOptions(epsilon=e, adam_steps=0, lbfgs_steps=0, steps_per_layer=1,
                                      sinkhorn_max_iterations=200)))
    invalid = jaxdyn.status_code("invalid_input")
    for e, t in ((-1.0, 1.0), (0.05, -1.0)):
        res = run(e, t)
        assert int(res.status) == invalid and int(res.stats["stop"]) == INVALID, (e, t)
        assert int(res.num_steps) == 0 and np.isnan(res.loss) and np.all(np.isnan(res.xs))
    res = run(0.05, 1.0)
    assert int(res.status) != invalid and np.isfinite(res.loss)


@pytest.mark.slow
def test_traced_invalid_member_of_a_vmapped_measure_control():
    """Under vmap only the member with ε < 0 is invalid_input; its Adam steps are not taken."""
    x, y = _clouds(np.float32, n=6)
    res = jax.vmap(lambda e: measure_control(x, y, n_layers=1, options=_fast(epsilon=e)))(
        jnp.array([0.05, -1.0]))
    invalid = jaxdyn.status_code("invalid_input")
    assert int(res.status[0]) != invalid and int(res.status[1]) == invalid
    assert int(res.num_steps[1]) == 0 and np.isfinite(res.loss[0]) and np.isnan(res.loss[1])
