"""One rule for traced invalid input: a bare-array function gives NaN, never a number.

A public function that returns arrays (losses, fields, observables, statistics) has no status
channel: where a traced scalar parameter lies outside its documented domain the function
returns NaN (−1 in integer outputs), while a concrete value outside it is a ValueError naming
the parameter before compute. Each entry of ``CASES`` is run under ``jax.vmap`` over
``[valid, invalid, NaN]``: the valid lane is finite and equals the unbatched call, the others
are all NaN (or −1). ``test_every_public_function_with_a_scalar_parameter_is_listed`` walks
``__all__`` of the package and its subpackages so that a new public function with a scalar
parameter needs an entry here or a stated reason in ``EXCLUDED``.

Cost rule: tiny sizes (5 points in R³), one compiled program per entry: the batch and the
unbatched call (its parameter a concrete number, as in an eager call) run together as
``jax.jit(lambda lanes: (jax.vmap(fn)(lanes), fn(good)))`` (an eager ``jax.vmap`` of a function
that is not jitted inside compiles each of its batched operations on its own; two programs
compile in more time than one holding both), except the entries of ``EAGER_VMAP`` (both
eager) and ``EAGER_REFERENCE`` (the unbatched call eager).
"""

from __future__ import annotations

import inspect
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from _public_api import public_functions
from jaxdyn import clusters, control, encoder, gaussian, kernels, pde, simulation, spectral, sphere

X = np.stack([np.cos(np.arange(5.0)), np.sin(np.arange(5.0)), 0.3 * np.ones(5)], 1)
X = X / np.linalg.norm(X, axis=1, keepdims=True)
Q3 = X[None]
I2, I3 = np.eye(2), np.eye(3)
S2 = np.array([[0.6, 0.1], [0.1, 0.4]])
X2 = np.random.default_rng(0).normal(size=(6, 2))
KEY = jax.random.PRNGKey(0)
RHO16 = np.full(16, 1 / (2 * math.pi)) * (1 + 0.5 * np.cos(2 * np.arange(16) * 2 * math.pi / 16))
CTL = control.default_controls("euclidean", 2, 2, dtype=np.float64)
CIRCLE = pde.CircleDensity(I2, I2, I2, 1.0, 16)
SPHERE2 = pde.SphereDensity(I3, I3, I3, 1.0, 8, 16) if hasattr(pde, "SphereDensity") else None
BERT_CFG = encoder.BertConfig(vocab_size=10, hidden_size=4, num_hidden_layers=1,
                              num_attention_heads=1, intermediate_size=4,
                              max_position_embeddings=4)

def _local(out):
    """The averages and the certified bounds of local_interaction (its counters stay counts)."""
    m, stats = out
    return m, stats.bound, stats.mass



# "function parameter": (the call as a function of the parameter, a valid value, an invalid
# value, xfail reason or None). The invalid value lies outside the domain the docstring states.
CASES = {
    "interaction beta": (lambda v: jaxdyn.interaction(X, X, I3, v), 2.0, -1.0, None),
    "local_interaction beta": (lambda v: _local(jaxdyn.local_interaction(X, X, I3, v)), 2.0,
                               -1.0, None),
    "attention_weights beta": (lambda v: kernels.attention_weights(Q3, Q3, v), 2.0, -1.0, None),
    "heads_interaction beta": (lambda v: kernels.heads_interaction(Q3, Q3, X, v), 2.0, -1.0,
                               None),
    "sinkhorn_key_bias beta": (lambda v: kernels.sinkhorn_key_bias(Q3, Q3, v), 2.0, -1.0, None),
    "blocked_lse eps": (lambda v: kernels.blocked_lse(X, X, np.zeros(5), v), 0.5, -1.0, None),
    "default_rope_freqs base": (lambda v: kernels.default_rope_freqs(4, v), 100.0, 0.0, None),
    "weight_statistics beta": (lambda v: kernels.weight_statistics(X, beta=v).max_weight, 2.0,
                               -1.0, None),
    "query_sharded_interaction beta": (
        lambda v: simulation.query_sharded_interaction(X, X, I3, v), 2.0, -1.0, None),
    "interaction_energy beta": (lambda v: clusters.interaction_energy(X, v), 2.0, -1.0, None),
    "log_partition_energy beta": (lambda v: clusters.log_partition_energy(X, v), 2.0, 0.0,
                                  None),
    "pair_fraction threshold": (lambda v: clusters.pair_fraction(X, v), 0.9, np.inf, None),
    "cluster_count delta": (lambda v: clusters.cluster_count(X, v), 1e-3, -1.0, None),
    "cluster_labels delta": (lambda v: clusters.cluster_labels(X, v), 1e-3, -1.0, None),
    "cluster_masses delta": (lambda v: clusters.cluster_masses(X, v), 1e-3, -1.0, None),
    "cluster_centres delta": (lambda v: clusters.cluster_centres(X, v), 1e-3, -1.0, None),
    "gram_rank rtol": (lambda v: clusters.gram_rank(X, rtol=v), 1e-3, np.inf, None),
    "span_dimension rtol": (lambda v: clusters.span_dimension(X, v), 1e-3, -1.0, None),
    "mass_near angle": (lambda v: spectral.mass_near(X, I3[:, :1], v), 0.5, -0.1, None),
    "sample_vmf kappa": (lambda v: sphere.sample_vmf(KEY, 4, np.ones(3), v), 2.0, -1.0, None),
    "sample_mixture kappa": (lambda v: sphere.sample_mixture(KEY, 4, 3, kappa=v), 2.0, 0.0,
                             None),
    "sample_mixture weight": (lambda v: sphere.sample_mixture(KEY, 4, 3, weight=v), 0.5, 1.0,
                              None),
    "scalar_variance sigma0": (lambda v: gaussian.scalar_variance(0.1, v, 0.1, 0.2), 1.0, -1.0,
                               None),
    "scalar_blowup_time sigma0": (lambda v: gaussian.scalar_blowup_time(v, 0.1, 0.2), 1.0, -1.0,
                                  None),
    "vi_covariance v": (lambda v: gaussian.vi_covariance(0.1, S2, I2, v), 1.0, np.inf, None),
    "vi_precision v": (lambda v: gaussian.vi_precision(0.1, S2, I2, I2, v), 1.0, np.inf, None),
    "vi_blowup_time v": (lambda v: gaussian.vi_blowup_time(S2, I2, v), 1.0, np.inf, None),
    "conditional_mean_map beta": (lambda v: gaussian.conditional_mean_map(S2, I2, I2, v), 1.0,
                                  -1.0, None),
    "conditional_mean_affine beta": (
        lambda v: gaussian.conditional_mean_affine(np.ones(2), S2, I2, I2, v), 1.0, -1.0, None),
    "covariance_rhs beta": (lambda v: gaussian.covariance_rhs(S2, I2, I2, I2, v), 1.0, -1.0,
                            None),
    "variant_moment_rhs beta": (
        lambda v: gaussian.variant_moment_rhs(np.ones(2), S2, I2, np.zeros(2), I2, I2, I2, v),
        1.0, -1.0, None),
    "bessel_ive r": (lambda v: pde.bessel_ive(v, 3), 1.5, -1.0, None),
    "cos_mode phase": (lambda v: pde.cos_mode(8, 2, phase=v), 0.3, np.inf, None),
    "perturbed_uniform eps": (lambda v: pde.perturbed_uniform(16, v, KEY), 0.1, np.inf, None),
    "cfl_dt cfl": (lambda v: pde.cfl_dt(CIRCLE, v), 0.9, -1.0, None),
    "sphere_cfl_dt cfl": (lambda v: pde.sphere_cfl_dt(SPHERE2, v), 0.9, -1.0, None),
    "gaussian_tokens scale": (lambda v: encoder.gaussian_tokens(KEY, 1, 2, 3, scale=v), 1.0,
                              -1.0, None),
    "random_like std": (lambda v: encoder.random_like(
        encoder.init_bert(BERT_CFG, KEY, dtype=jnp.float64), KEY, std=v), 0.02, -1.0, None),
    "control_energy t1": (lambda v: control.control_energy({"A": I2}, names=("A",), t1=v), 1.0,
                          -1.0, None),
    "transfer_particles t1": (lambda v: control.transfer_particles(
        control.moment_controls(CTL), X2, t1=v, steps_per_piece=1), 1.0, -1.0, None),
    "transformer_layers t1": (lambda v: control.transformer_layers(
        control.moment_controls(CTL), X2, t1=v, n_layers=2), 1.0, -1.0, None),
    "measure_flow t1": (lambda v: control.measure_flow(CTL, X2, t1=v, steps_per_layer=1), 1.0,
                        -1.0, None),
    "measure_loss epsilon": (lambda v: control.measure_loss(CTL, X2, X2 + 1.0, epsilon=v), 0.1,
                             -1.0, None),
    "measure_loss cost_weight": (lambda v: control.measure_loss(
        CTL, X2, X2 + 1.0, cost="energy", cost_weight=v), 0.1, -1.0, None),
    "measure_loss t1": (lambda v: control.measure_loss(CTL, X2, X2 + 1.0, t1=v), 1.0, -1.0,
                        None),
    "control_cost t1": (lambda v: control.control_cost(CTL, t1=v, kind="energy"), 1.0, -1.0,
                        None),
}

# Public functions with a parameter the coverage walk counts as scalar, and why each has no
# entry above.
_DRIVER = "a driver: a traced parameter out of its domain is its result code (invalid_input)"
_HOST = "runs on the host on concrete values only (NumPy); a traced value is refused by name"
_ARRAY = "the flagged name is an array argument (a vector or a matrix), not a scalar parameter"
_FREE = "its scalar argument is a time or a coordinate with no domain beyond the array's own"
_STATIC = "the parameter is a static option (a Python number fixing the program), refused by " \
          "name when traced"
_OBJECT = ("returns a model or Controls, whose invalid() flags a traced parameter out of its "
           "domain (the drivers' invalid_input)")
EXCLUDED = {
    "certificate": _DRIVER, "reach": _DRIVER, "simulate": _DRIVER, "simulate_ensemble": _DRIVER,
    "simulate_sde": _DRIVER, "solve_moments": _DRIVER, "solve_moments_batch": _DRIVER,
    "w2_sinkhorn": _DRIVER, "solve_density": _DRIVER, "controlled_moments": _DRIVER,
    "measure_control": _DRIVER, "covariance_curves": _DRIVER, "moment_grid": _DRIVER,
    "scalar_grid": _DRIVER, "vi_grid": _DRIVER, "reach_loss": _DRIVER,
    "stationary_covariance": _DRIVER,
    "check_assumptions": _HOST, "projection": _HOST, "spectral_weights": _HOST,
    "top_eigenspace": _HOST, "rotation_matrix": _HOST, "vi_blowup_time_general": _HOST,
    "lyapunov_equilibrium": _HOST, "vi_closed_form": _HOST, "phase_theory": _HOST,
    "parting_time": _HOST, "clusters": _HOST, "kde_circle": _HOST, "kde_sphere": _HOST,
    "linear_rates": _HOST, "most_unstable_mode": _HOST, "sphere_rates": _HOST,
    "fourier_modes": _HOST, "mode_options": _HOST, "random_target": _HOST, "classify": _HOST,
    "plan_steps": _HOST, "save_indices": _HOST,
    "cluster_counts": ("its level, min_mass, max_cover and min_total are static thresholds of "
                       "a host-side count (concrete values, refused by name when traced)"),
    "exp_map": _ARRAY, "tangent_project": _ARRAY, "attend": _ARRAY, "pad_rows": _ARRAY,
    "trace_sqrtm_psd": _ARRAY,
    "attention_output": _FREE, "scheme_step": _FREE, "fixed_steps": _FREE,
    "scalar_variance": "its sigma0 has an entry; t, a and c are any finite numbers (NaN when "
                       "not finite, as the entry's lanes check for sigma0)",
    "vi_covariance": "its v has an entry; t is a time below the blow-up time",
    "vi_precision": "its v has an entry; t is a time",
    "moment_controls": _OBJECT,
    "replay": ("a host driver (one simulate a layer): a traced t1 is refused by name "
               "(test_replay_refuses_a_traced_t1)"),
}
# The names the coverage walk treats as scalar parameters (besides any float default).
SCALAR_NAMES = {"beta", "epsilon", "eps", "kappa", "weight", "sigma", "sigma0", "t", "t1",
                "threshold", "delta", "rtol", "angle", "bandwidth", "cfl", "scale", "tol", "base",
                "r", "phase", "level", "min_mass", "cost_weight", "v", "a", "c", "alpha",
                "energy_weight", "std", "dt", "t0", "bound", "mean_scale"}
# parameters of a listed function that are static options (not traceable), with the reason
STATIC_PARAMS = {("interaction", "tol"), ("local_interaction", "tol")}


def _public_functions():
    return public_functions()


def _scalar_params(fn):
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    return [p for p, v in params.items()
            if p in SCALAR_NAMES or (isinstance(v.default, float) and not isinstance(v.default, bool))]


def test_every_public_function_with_a_scalar_parameter_is_listed():
    """Each public function with a scalar parameter has an entry in CASES or a reason."""
    listed = {k.split()[0] for k in CASES} | set(EXCLUDED)
    missing = sorted(name for name, fn in _public_functions().items()
                     if _scalar_params(fn) and name not in listed)
    assert not missing, f"public functions with scalar parameters and no entry: {missing}"
    stale = sorted(n for n in listed if n not in _public_functions())
    assert not stale, f"entries for names that are not public: {stale}"


def test_every_listed_parameter_is_a_parameter():
    """The entries name real parameters of their functions."""
    fns = _public_functions()
    for key in CASES:
        name, param = key.split()
        assert param in inspect.signature(fns[name]).parameters, key
    assert SLOW_CASES <= set(CASES) and EAGER_VMAP <= set(CASES)
    assert EAGER_REFERENCE <= set(CASES)


# Entries under -m slow (measure_loss: each compiles a measure-control program of several
# CPU-seconds); the default counterpart of the measure_loss entries is
# tests/test_measure_params.py::test_traced_option_out_of_domain_gives_nan, which runs the
# same domain checks and NaN propagation through measure_loss (ε, λ and T in one vmapped
# program, value and gradient).
SLOW_CASES = {"measure_loss epsilon", "measure_loss cost_weight", "measure_loss t1",
              # its vmapped program and the unbatched call compile the local kernel's key
              # lists and certified bounds (13 CPU-s, against under 6 for any other entry):
              # not in the default suite: local_interaction's traced β < 0 or NaN gives NaN
              # and its concrete β < 0 is refused by name
              "local_interaction beta"}


# Entries whose batch runs as an eager jax.vmap: the samplers' float32 draws, which a jitted
# batch rounds differently (by an ulp) from the eager unbatched call they are compared with.
EAGER_VMAP = {"sample_vmf kappa", "sample_mixture kappa", "sample_mixture weight"}
# Entries whose unbatched call runs eagerly, beside the jitted batch (the others: both in one
# compiled program): it reads its own draws on the host (NumPy), which a trace cannot.
EAGER_REFERENCE = {"perturbed_uniform eps"}


def _params():
    for key, (_, _, _, xfail) in CASES.items():
        marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
        if key in SLOW_CASES:
            marks.append(pytest.mark.slow)
        yield pytest.param(key, marks=marks, id=key.replace(" ", "-"))


def _bad_lane(a):
    a = np.asarray(a)
    return np.all(np.isnan(a)) if np.issubdtype(a.dtype, np.inexact) else np.all(a == -1)


@pytest.mark.parametrize("key", list(_params()))
def test_traced_parameter_outside_its_domain_gives_nan(key):
    """vmap over [valid, invalid, NaN]: the valid lane is the unbatched call, the rest NaN/−1;
    the invalid value given concretely is a ValueError naming the parameter."""
    fn, good, bad, _ = CASES[key]
    param = key.split()[1]
    with pytest.raises(ValueError, match=param):
        fn(bad)
    lanes = jnp.array([good, bad, np.nan], jnp.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if key in EAGER_VMAP:
            out, ref = jax.vmap(fn)(lanes), fn(good)
        elif key in EAGER_REFERENCE:
            out, ref = jax.jit(jax.vmap(fn))(lanes), fn(good)
        else:  # the batch and the unbatched call (its value concrete) as one compiled program
            out, ref = jax.jit(lambda lanes: (jax.vmap(fn)(lanes), fn(good)))(lanes)
    for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        o, r = np.asarray(o), np.asarray(r)
        if np.issubdtype(o.dtype, np.inexact):
            assert np.all(np.isfinite(o[0])), key
        np.testing.assert_allclose(o[0], r, rtol=1e-9, atol=1e-12, err_msg=key)
        assert _bad_lane(o[1]) and _bad_lane(o[2]), (key, o[1], o[2])


def test_replay_refuses_a_traced_t1():
    with pytest.raises(TypeError, match="t1 must be a concrete number"):
        jax.jit(lambda v: control.replay(CTL, X2, t1=v, steps_per_layer=1))(1.0)
    with pytest.raises(ValueError, match="t1"):
        control.replay(CTL, X2, t1=-1.0, steps_per_layer=1)
