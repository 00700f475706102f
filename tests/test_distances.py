"""W2 distances: exact assignment, coupling bound, Sinkhorn (ott-jax), Bures closed form.

Each test compares two independent computations of one quantity (brute force over
permutations, scipy's Hungarian solver, closed forms, scipy.linalg.sqrtm)."""

import functools
import itertools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.special
from hypothesis import given, settings, strategies as st

import equinox as eqx

import jaxdyn
from conftest import tol
from jaxdyn.distances import (
    W2Solution,
    bures_w2,
    bures_w2_squared,
    sqrtm_psd,
    trace_sqrtm_psd,
    w2,
    w2_coupling,
    w2_exact,
    w2_sinkhorn,
)


def _unit(a):
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


# ------------------------------------------------------------------------- exact, coupling


def _brute_force_w2(x, y):
    n = x.shape[0]
    cost = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    best = min(cost[np.arange(n), list(p)].mean() for p in itertools.permutations(range(n)))
    return math.sqrt(best)


@pytest.mark.parametrize("seed", range(5))
def test_exact_matches_brute_force_over_permutations(seed):
    rng = np.random.default_rng(seed)
    n = 6
    x = rng.standard_normal((n, 3))
    y = rng.standard_normal((n, 3)) + 0.5
    assert float(w2_exact(x, y).value) == pytest.approx(_brute_force_w2(x, y), rel=1e-12)


def test_exact_of_permuted_copy_is_zero_and_symmetric():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 4))
    y = x[rng.permutation(50)]
    assert float(w2_exact(x, y).value) == pytest.approx(0.0, abs=1e-12)
    z = rng.standard_normal((50, 4))
    assert float(w2_exact(x, z).value) == pytest.approx(float(w2_exact(z, x).value), rel=1e-12)


def test_exact_of_translation_is_shift_length():
    # for a translation the identity pairing is optimal: W2 = |τ|
    rng = np.random.default_rng(2)
    x = rng.standard_normal((40, 3))
    tau = np.array([0.3, -1.2, 0.5])
    assert float(w2_exact(x, x + tau).value) == pytest.approx(np.linalg.norm(tau), rel=1e-12)


@pytest.mark.slow  # 2 CPU-s (a coupling program for each random shape); by default: the exact value
# against brute force (test_exact_matches_brute_force_over_permutations), the coupling above it
# (test_coupling_bounds_exact_on_sphere_clouds)
@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 6),
    d=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    scale=st.floats(1e-3, 1e3),
)
def test_coupling_bounds_exact_from_above(n, d, seed, scale):
    rng = np.random.default_rng(seed)
    x = scale * rng.standard_normal((n, d))
    y = scale * rng.standard_normal((n, d))
    ex = float(w2_exact(x, y).value)
    cp = float(w2_coupling(jnp.asarray(x, jnp.float64), jnp.asarray(y, jnp.float64)).value)
    assert cp >= ex * (1 - 1e-12)
    assert ex == pytest.approx(_brute_force_w2(x, y), rel=1e-10, abs=1e-300)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_coupling_bounds_exact_on_sphere_clouds(seed, dtype):
    rng = np.random.default_rng(seed)
    x = _unit(rng.standard_normal((300, 3))).astype(dtype)
    y = _unit(x + 0.3 * rng.standard_normal((300, 3))).astype(dtype)
    cp = w2_coupling(jnp.asarray(x), jnp.asarray(y)).value
    assert cp.dtype == dtype
    # closed form of the coupling cost
    direct = math.sqrt(np.mean(np.sum((x.astype(np.float64) - y) ** 2, axis=1)))
    assert float(cp) == pytest.approx(direct, rel=tol(dtype, 1e-5, 1e-12))
    assert float(cp) >= float(w2_exact(x, y).value) * (1 - tol(dtype, 1e-5, 1e-12))


def test_coupling_broadcasts_over_a_trajectory():
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((5, 20, 3))
    y = rng.standard_normal((20, 3))
    out = w2_coupling(jnp.asarray(xs), jnp.asarray(y))
    assert out.value.shape == (5,) and out.status.shape == (5,) and bool(np.all(out.ok))
    for k in range(5):
        assert float(out.value[k]) == pytest.approx(float(w2_coupling(xs[k], y).value), rel=1e-12)


def test_structural_errors_name_the_argument():
    x = np.zeros((10, 3))
    with pytest.raises(ValueError, match="same number of points"):
        w2_exact(x, np.zeros((9, 3)))
    with pytest.raises(ValueError, match="same dimension"):
        w2_exact(x, np.zeros((10, 2)))
    with pytest.raises(ValueError, match=r"x must be a point cloud of shape \(N, d\)"):
        w2_exact(np.zeros(10), x)
    with pytest.raises(ValueError, match="paired clouds"):
        w2_coupling(x, np.zeros((9, 3)))
    with pytest.raises(ValueError, match="method must be"):
        w2(x, x, method="emd")
    with pytest.raises(ValueError, match="batch_size"):
        w2_sinkhorn(x, x + 1, batch_size=0)


def test_exact_returns_nan_on_nonfinite_input():
    x = np.zeros((4, 2))
    y = np.ones((4, 2))
    y[0, 0] = np.nan
    res = w2_exact(x, y)
    assert math.isnan(float(res.value)) and res.names == "nonfinite"


# ------------------------------------------------------------------------------ Sinkhorn


def _case(name, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if name == "spread":  # two independent uniform samples on S^2
        x = _unit(rng.standard_normal((n, 3)))
        y = _unit(rng.standard_normal((n, 3)))
    elif name == "separated":  # two clouds far apart
        x = _unit(rng.standard_normal((n, 3)))
        y = _unit(rng.standard_normal((n, 3))) + np.array([3.0, 0.0, 0.0])
    elif name == "near_limit":  # atoms ±e1 against the same atoms + 0.05 noise, renormalised
        x = np.zeros((n, 3))
        x[:, 0] = np.where(rng.random(n) < 0.5, 1.0, -1.0)
        y = _unit(x + 0.05 * rng.standard_normal((n, 3)))
    elif name == "near_limit_raw":  # the same, not renormalised
        x = np.zeros((n, 3))
        x[:, 0] = np.where(rng.random(n) < 0.5, 1.0, -1.0)
        y = x + 0.05 * rng.standard_normal((n, 3))
    else:
        raise AssertionError(name)
    return x.astype(dtype), y.astype(dtype)


@pytest.mark.parametrize("name", [
    # spread at N = 1000 (~2 000 iterations, 7 CPU-s) under -m slow; spread clouds by default:
    # test_w2_dispatch_returns_the_methods_results (the default ε rule within 2 %, N = 200)
    pytest.param("spread", marks=pytest.mark.slow), "separated", "near_limit"])
@pytest.mark.slow_dtype("f64")  # f64 (~14 s, spread the most): the ε rule is the same in f32
def test_sinkhorn_default_epsilon_within_2_percent_of_exact(name, dtype):
    # the instances under -m slow at 1000 points (the size w2_sinkhorn's documentation quotes);
    # the default suite's (float32, separated and near_limit) at 200, the size and dtype of the
    # dispatch test's clouds (one compiled program): the rule is relative to W2², so its error
    # does not depend on N (measured 0.03-0.08 % separated, 0.4-0.5 % near the limit at 200,
    # 500 and 1000 points), while the solve's cost grows as N²
    n = 200 if dtype == np.float32 and name != "spread" else 1000
    x, y = _case(name, n, dtype)
    exact = float(w2_exact(x, y).value)
    res = w2_sinkhorn(x, y)  # the DEFAULT ε rule: no ε given
    assert res.converged, res
    assert not res.stats["epsilon_floored"]
    assert abs(res.value / exact - 1) < 0.02, (res.value, exact, res.epsilon)
    # the final ε follows the distance: ε <= rel_epsilon · W2^2 (rule: ε = 0.005 · S_ε <= 0.005 · W2^2)
    assert res.epsilon <= 0.005 * exact**2 * 1.05
    if name == "near_limit":
        assert exact == pytest.approx(0.07, abs=0.01)  # atoms ±e1 against a 0.05-noisy copy: W2 ≈ 0.07


@pytest.mark.slow  # 1.6 CPU-s; the default rule on nearly concentrated clouds by default: the near_limit
# case of test_sinkhorn_default_epsilon_within_2_percent_of_exact (the same program)
def test_sinkhorn_near_limit_unnormalised_copy():
    x, y = _case("near_limit_raw", 1000, np.float32, seed=1)
    exact = float(w2_exact(x, y).value)
    res = w2_sinkhorn(x, y)
    assert res.converged
    assert abs(res.value / exact - 1) < 0.02


@pytest.mark.slow  # 1000 points in f64 (3.6 CPU-s); a fixed ε by default: the translation test, and
# the bias bound |S_ε - W2²| <= ε log N against the exact value: test_w2_dispatch_returns_the_methods_results
def test_sinkhorn_fixed_large_epsilon_is_biased_as_documented():
    # at ε = 1e-3 (≈ 0.2 W2^2) the near-limit case is off by > 5 %: the reason ε must follow W2^2
    x, y = _case("near_limit", 1000, np.float64)
    exact = float(w2_exact(x, y).value)
    res = w2_sinkhorn(x, y, epsilon=1e-3)
    assert res.epsilon == pytest.approx(1e-3)
    assert res.value < exact * 0.95


# the translated clouds and options of the translation test (test_bad_options_and_list_inputs_*
# solves them again from nested lists: one compiled program for both)
TRANSLATION = dict(epsilon=0.05, threshold=1e-5)


def _translated(dtype):
    rng = np.random.default_rng(4)
    x = _unit(rng.standard_normal((200, 3))).astype(dtype)
    tau = np.array([0.4, 0.0, -0.3], dtype=dtype)
    return x, x + tau, tau


@pytest.mark.slow_dtype("f32")  # f64 (tighter) by default; Sinkhorn in f32: the default-ε tests
def test_sinkhorn_translation_is_exact_at_any_epsilon(dtype):
    # debiased divergence of a translated copy: S_ε(μ, μ + τ) = |τ|^2 for every ε
    # (the cross terms of |x - y - τ|^2 integrate to constants under the marginals)
    x, y, tau = _translated(dtype)
    res = w2_sinkhorn(x, y, **TRANSLATION)
    assert res.converged
    assert res.divergence == pytest.approx(float(tau @ tau), rel=tol(dtype, 1e-4, 1e-7))


@pytest.mark.parametrize("shape", [(37, 53, 8, 16), (64, 64, 64, 64), (5, 300, 1024, 7)])
def test_blocked_lse_equals_dense_logsumexp(dtype, shape):
    # The tile-by-tile kernel of the online geometry against one dense logsumexp, with
    # sizes that are not multiples of the blocks, -inf potentials, and a small eps at which
    # the naive exp underflows (the running maximum must rescale).
    from jaxdyn.kernels import blocked_lse

    n, m, qb, kb = shape
    # jitted, ε traced: one program a shape and dtype for both ε and the masked call (op by op,
    # each ε's scans and small ops compile on their own)
    lse = jax.jit(lambda p, o, pot, eps: blocked_lse(p, o, pot, eps, q_block=qb, k_block=kb))
    rng = np.random.default_rng(n + m)
    p = rng.standard_normal((n, 3)).astype(dtype)
    o = rng.standard_normal((m, 3)).astype(dtype)
    pot = rng.standard_normal(m).astype(dtype) * 0.3
    pot[rng.random(m) < 0.2] = -np.inf
    for eps in (1.0, 1e-3):
        got = np.asarray(lse(jnp.asarray(p), jnp.asarray(o), jnp.asarray(pot), jnp.asarray(eps, dtype)))
        cost = ((p[:, None, :].astype(np.float64) - o[None, :, :]) ** 2).sum(-1)
        want = eps * scipy.special.logsumexp((pot[None, :].astype(np.float64) - cost) / eps, axis=1)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=tol(dtype, 2e-5, 1e-12), atol=tol(dtype, 1e-5, 1e-12))
    all_masked = np.full(m, -np.inf, dtype)
    out = np.asarray(lse(jnp.asarray(p), jnp.asarray(o), jnp.asarray(all_masked), jnp.asarray(1.0, dtype)))
    assert np.all(out == -np.inf)


def test_blocked_lse_program_does_not_grow_with_n():
    # The compiled program is the same loop at any N (only trip counts change): the HLO of
    # the kernel at N = 2 000 and N = 200 000 has the same number of instructions.
    from jaxdyn.kernels import blocked_lse

    def size(n):
        x = jax.ShapeDtypeStruct((n, 3), jnp.float32)
        pot = jax.ShapeDtypeStruct((n,), jnp.float32)
        txt = jax.jit(lambda a, b, f: blocked_lse(a, b, f, 1e-3)).lower(x, x, pot).as_text()
        return sum(1 for line in txt.splitlines() if "=" in line)

    assert size(2_000) == size(200_000)


def test_sinkhorn_online_geometry_equals_dense():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((120, 3))
    y = rng.standard_normal((100, 3)) + 0.3  # unequal sizes are fine for Sinkhorn
    dense = w2_sinkhorn(x, y, batch_size=None)
    online = w2_sinkhorn(x, y, batch_size=32)  # 120 and 100 are not multiples of 32
    assert dense.converged and online.converged
    assert dense.geometry == "dense" and online.geometry == "online"
    assert int(online.stats["num_rounds"]) == int(dense.stats["num_rounds"])
    k = int(dense.stats["num_rounds"])
    assert np.asarray(online.stats["epsilons"])[:k] == pytest.approx(
        np.asarray(dense.stats["epsilons"])[:k], rel=1e-10)
    assert float(online.divergence) == pytest.approx(float(dense.divergence), rel=1e-10)


def test_w2_dispatch_returns_the_methods_results():
    # (float32: the program of the default-ε test's default-suite instances)
    x, y = _case("spread", 200, np.float32, seed=6)
    exact = float(w2_exact(x, y).value)
    res = w2(x, y)
    assert isinstance(res, W2Solution) and res.method == "exact"
    assert float(res.value) == pytest.approx(exact) and float(res) == float(res.value)
    assert float(res.divergence) == pytest.approx(exact ** 2) and float(res.bias_bound) == 0.0
    cp = w2(x, y, method="coupling")
    assert cp.method == "coupling"
    assert float(cp.value) == pytest.approx(float(w2_coupling(x, y).value))
    # the coupling is an upper bound: its bias bound is its own square, W2^2 in [0, C^2]
    assert float(cp.bias_bound) == pytest.approx(float(cp.value) ** 2)
    # a converged solve warns nothing; import ott first, so that a third-party import-time
    # DeprecationWarning (jaxopt) does not depend on which test ran first in this process
    import ott.solvers.linear.sinkhorn  # noqa: F401

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v = w2(x, y, method="sinkhorn")
    assert v.method == "sinkhorn" and bool(v.ok)
    assert float(v.value) == pytest.approx(exact, rel=0.02)
    # the bound holds: |S_ε - W2^2| <= ε log N
    assert abs(float(v.divergence) - exact ** 2) <= float(v.bias_bound)
    res = w2_sinkhorn(x, y, max_iterations=20, max_rounds=2)
    assert not bool(res.converged) and res.names == "not_converged"
    # the status travels on the result (no warning): the same solve through w2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = w2(x, y, method="sinkhorn", max_iterations=20, max_rounds=2)
    assert again.names == "not_converged" and float(again.value) == float(res.value)


# -------------------------------------------------------------------------------- Bures


def _bures_scipy(m0, S0, m1, S1):
    r1 = scipy.linalg.sqrtm(S1)
    cross = scipy.linalg.sqrtm(r1 @ S0 @ r1)
    val = np.sum((m0 - m1) ** 2) + np.trace(S0) + np.trace(S1) - 2 * np.trace(cross).real
    return math.sqrt(max(val, 0.0))


def _random_spd(rng, d, cond=10.0):
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    ev = np.geomspace(1.0, 1.0 / cond, d)
    return (q * ev) @ q.T


@pytest.mark.parametrize("seed", range(3))
def test_bures_matches_scipy_sqrtm(seed):
    rng = np.random.default_rng(seed)
    d = 5
    m0, m1 = rng.standard_normal(d), rng.standard_normal(d)
    S0, S1 = _random_spd(rng, d, 30.0), _random_spd(rng, d, 5.0)
    got = float(bures_w2(m0, S0, m1, S1).value)
    assert got == pytest.approx(_bures_scipy(m0, S0, m1, S1), rel=1e-12)


def _bures_sq_mpmath(S0, S1, dps=50):
    """W2² between N(0, S0) and N(0, S1) in 50-digit arithmetic (the float64 matrices taken
    exactly): an independent reference whose own error is far below float64's."""
    import mpmath

    with mpmath.workdps(dps):
        A, B = mpmath.matrix(S0.tolist()), mpmath.matrix(S1.tolist())
        w, U = mpmath.eigsy(B)
        r1 = U * mpmath.diag([mpmath.sqrt(max(x, 0)) for x in w]) * U.T
        c = mpmath.eigsy(r1 * A * r1, eigvals_only=True)
        tr = sum(A[i, i] + B[i, i] for i in range(A.rows)) - 2 * sum(mpmath.sqrt(max(x, 0)) for x in c)
        return float(tr)


def test_bures_ill_conditioned_matches_scipy():
    # cond 1e8 and 1e6: ott-jax 0.6's Newton-Schulz Bures is off by ~1e-3 here
    rng = np.random.default_rng(7)
    d = 6
    S0, S1 = _random_spd(rng, d, 1e8), _random_spd(rng, d, 1e6)
    m = np.zeros(d)
    ref = _bures_scipy(m, S0, m, S1)
    got = float(bures_w2(m, S0, m, S1).value)
    assert got == pytest.approx(ref, rel=1e-9)
    # and W2^2 itself, absolutely, against the scale tr S0 + tr S1, with a 50-digit reference
    # (scipy's sqrtm is itself off by 1.6e-12 here: the eigenvalues of S1^½ S0 S1^½ near 1e-14
    # lose their digits under the square root; so did jaxdyn's before it took singular values)
    sq = float(bures_w2_squared(m, S0, m, S1))
    exact = _bures_sq_mpmath(S0, S1)
    assert abs(sq - exact) <= 1e-12 * (np.trace(S0) + np.trace(S1))


def test_bures_singular_covariances():
    # rank-deficient S: the eigh square root handles PSD; scipy's sqrtm on the PSD matrix agrees
    rng = np.random.default_rng(8)
    d = 4
    a = rng.standard_normal((d, 2))
    S0 = a @ a.T  # rank 2
    S1 = _random_spd(rng, d, 10.0)
    m = np.zeros(d)
    assert float(bures_w2(m, S0, m, S1).value) == pytest.approx(_bures_scipy(m, S0, m, S1), rel=1e-7)
    # same rank-2 Gaussian against itself: distance 0
    assert float(bures_w2(m, S0, m, S0).value) == pytest.approx(0.0, abs=1e-7)


def test_bures_traced_covariance_out_of_domain_is_nan_and_invalid_input(dtype):
    """A traced covariance that is not symmetric PSD (beyond the concrete check's allowance):
    NaN from bures_w2_squared and status invalid_input from bures_w2, lane by lane under vmap;
    a rank-deficient PSD one (eigenvalues at rounding below 0) keeps the concrete answer."""
    rng = np.random.default_rng(12)
    d = 3
    a = rng.standard_normal((d, 2))
    singular = (a @ a.T).astype(dtype)                   # rank 2: a rounding-level eigenvalue
    spd = _random_spd(rng, d, 10.0).astype(dtype)
    not_psd = (spd - 2.0 * np.linalg.eigvalsh(spd.astype(float))[-1] * np.eye(d)).astype(dtype)
    asym = spd.copy()
    asym[1, 0] += 1e-3 * np.abs(spd).max()               # far beyond 100 d eps max|S|
    S0 = jnp.asarray(np.stack([singular, spd, not_psd, asym]))
    S1 = jnp.asarray(np.stack([spd, singular, spd, spd]))
    m = jnp.zeros((4, d), dtype)
    # both vmapped functions as one compiled program (op by op, the small operations of the
    # first each compiled on their own)
    sq, sol = jax.jit(lambda *a: (jax.vmap(bures_w2_squared)(*a), jax.vmap(bures_w2)(*a)))(
        m, S0, m, S1)
    for i in range(2):  # the valid lanes: the concrete results
        assert float(sq[i]) == pytest.approx(float(bures_w2_squared(m[i], S0[i], m[i], S1[i])),
                                             rel=tol(dtype, 1e-5, 1e-12), abs=tol(dtype, 1e-5, 1e-12))
        assert sol.names[i] == "successful" and np.isfinite(float(sol.value[i]))
    assert np.isnan(np.asarray(sq[2:])).all()
    assert list(sol.names[2:]) == ["invalid_input"] * 2
    assert np.isnan(np.asarray(sol.value[2:])).all() and np.isnan(np.asarray(sol.divergence[2:])).all()
    for i in (2, 3):  # concrete, the same inputs are refused by name
        with pytest.raises(ValueError, match="S0 must be"):
            bures_w2(m[i], S0[i], m[i], S1[i])


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_bures_commuting_closed_form(dtype):
    # diagonal (commuting) covariances: W2^2 = |Δm|^2 + Σ (sqrt a_i - sqrt b_i)^2
    a = np.array([0.5, 2.0, 3.0, 1e-3], dtype=dtype)
    b = np.array([1.0, 1.0, 0.25, 4.0], dtype=dtype)
    m0 = np.array([0.0, 1.0, 0.0, 0.0], dtype=dtype)
    m1 = np.array([1.0, 1.0, -1.0, 0.5], dtype=dtype)
    q, _ = np.linalg.qr(np.random.default_rng(9).standard_normal((4, 4)))
    q = q.astype(dtype)
    S0, S1 = (q * a) @ q.T, (q * b) @ q.T  # rotate both: still commuting
    ref = math.sqrt(np.sum((m0.astype(float) - m1) ** 2) + np.sum((np.sqrt(a.astype(float)) - np.sqrt(b)) ** 2))
    got = bures_w2(jnp.asarray(m0), jnp.asarray(S0), jnp.asarray(m1), jnp.asarray(S1)).value
    assert got.dtype == dtype
    assert float(got) == pytest.approx(ref, rel=tol(dtype, 1e-4, 1e-12))


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_bures_is_symmetric_and_jit_vmap(dtype):
    rng = np.random.default_rng(10)
    d, k = 3, 4
    ms0 = rng.standard_normal((k, d)).astype(dtype)
    ms1 = rng.standard_normal((k, d)).astype(dtype)
    S0 = np.stack([_random_spd(rng, d, 20.0) for _ in range(k)]).astype(dtype)
    S1 = np.stack([_random_spd(rng, d, 20.0) for _ in range(k)]).astype(dtype)
    res = jax.jit(jax.vmap(bures_w2))(ms0, S0, ms1, S1)
    assert res.value.shape == (k,) and list(res.names) == ["successful"] * k
    batched = res.value
    for i in range(k):
        ref = _bures_scipy(ms0[i].astype(float), S0[i].astype(float), ms1[i].astype(float), S1[i].astype(float))
        assert float(batched[i]) == pytest.approx(ref, rel=tol(dtype, 1e-4, 1e-12))
        swapped = float(bures_w2(ms1[i], S1[i], ms0[i], S0[i]).value)
        assert swapped == pytest.approx(float(batched[i]), rel=tol(dtype, 1e-4, 1e-12))


def test_sqrtm_psd_squares_back_and_matches_scipy():
    rng = np.random.default_rng(11)
    S = _random_spd(rng, 5, 1e6)
    R = np.asarray(jax.jit(sqrtm_psd)(jnp.asarray(S)))  # one program, not op by op
    assert np.allclose(R, R.T, atol=0)
    assert np.allclose(R @ R, S, atol=1e-14, rtol=0)
    assert np.allclose(R, scipy.linalg.sqrtm(S).real, atol=1e-12)
    assert float(jax.jit(trace_sqrtm_psd)(jnp.asarray(S))) == pytest.approx(np.trace(R), rel=1e-13)


def _fd_grad(f, S, h=1e-6):
    """Central finite differences of f along symmetric unit perturbations E_ij + E_ji."""
    d = S.shape[0]
    g = np.zeros((d, d))
    for i in range(d):
        for j in range(i, d):
            E = np.zeros((d, d))
            E[i, j] = E[j, i] = 1.0
            g[i, j] = g[j, i] = (f(S + h * E) - f(S - h * E)) / (2 * h)
    return g


def _sym_directional(G):
    """Directional derivatives of a gradient G along E_ij + E_ji (matches _fd_grad)."""
    d = G.shape[0]
    out = np.zeros((d, d))
    for i in range(d):
        for j in range(i, d):
            out[i, j] = out[j, i] = G[i, j] + G[j, i] if i != j else G[i, i]
    return out


# W2² between N(m, A) and N(m1, B) with its gradients in m, A and B: one program (d = 3) for
# the gradient tests below, the second mean an argument (not a constant of each test's closure)
_bures_sq_value_and_grad = jax.jit(jax.value_and_grad(
    lambda m, A, m1, B: bures_w2_squared(m, A, m1, B), argnums=(0, 1, 3)))


def _bures_vg_at(m1, m, A, B):
    """(W2², (∂/∂m, ∂/∂A, ∂/∂B)) between N(m, A) and N(m1, B), float64."""
    return _bures_sq_value_and_grad(*(jnp.asarray(a, jnp.float64) for a in (m, A, m1, B)))


@pytest.mark.parametrize("where", ["generic", "repeated_eigenvalues"])
def test_bures_gradient_matches_finite_differences(where):
    rng = np.random.default_rng(12)
    d = 3
    S0 = _random_spd(rng, d, 10.0)
    S1 = np.eye(d) if where == "repeated_eigenvalues" else _random_spd(rng, d, 10.0)
    m0, m1 = rng.standard_normal(d), rng.standard_normal(d)
    # the value and the three gradients from one program (the differences read its value)
    vg = functools.partial(_bures_vg_at, m1)
    f1 = lambda S: float(vg(m0, S0, S)[0])  # noqa: E731
    gm, G0, G = (np.asarray(a) for a in vg(m0, S0, S1)[1])
    assert np.all(np.isfinite(G))
    assert np.allclose(_sym_directional(G), _fd_grad(f1, S1), atol=1e-7)
    f0 = lambda S: float(vg(m0, S, S1)[0])  # noqa: E731
    assert np.allclose(_sym_directional(G0), _fd_grad(f0, S0), atol=1e-7)
    assert np.allclose(gm, 2 * (m0 - m1), atol=1e-12)


def test_bures_gradient_is_finite_at_coincidence_and_rank_deficiency():
    d = 3
    S = np.diag([1.0, 0.5, 0.0])  # singular
    m = np.zeros(d)
    g = jax.grad(lambda S1: bures_w2(m, jnp.asarray(S), m, S1).value)(jnp.asarray(S))
    assert np.all(np.isfinite(np.asarray(g)))
    # ∂/∂S1 of W2² (the finite-difference tests' program)
    g2 = _bures_vg_at(m, m, jnp.asarray(S), jnp.asarray(np.diag([1.0, 0.5, 0.2])))[1][2]
    assert np.all(np.isfinite(np.asarray(g2)))


def test_bures_structural_errors():
    with pytest.raises(ValueError, match="S0"):
        bures_w2(np.zeros(3), np.eye(2), np.zeros(3), np.eye(3))
    with pytest.raises(ValueError, match="same d"):
        bures_w2(np.zeros(3), np.eye(3), np.zeros(2), np.eye(2))


def test_sinkhorn_result_is_a_pytree_for_jit_and_vmap():
    """W2Solution holds arrays: it passes through jax.jit (in and out), stacks and vmaps;
    float(res.value) still works; throw=True raises with the status message."""
    # the clouds of test_w2_dispatch_returns_the_methods_results: its two programs (the default
    # rule, the cut budget) serve here too
    x, y = _case("spread", 200, np.float32, seed=6)
    res = w2_sinkhorn(x, y)
    assert isinstance(res, jaxdyn.Solution) and bool(res.ok) and res.names == "successful"
    assert isinstance(float(res.value), float) and int(res.num_steps) > 0
    out = jax.jit(lambda r: r)(res)
    assert isinstance(out, W2Solution) and float(out.value) == float(res.value)
    assert out.geometry == res.geometry
    doubled = jax.jit(lambda r: 2.0 * r.value)(res)
    assert float(doubled) == 2.0 * float(res.value)
    # built inside jit: a W2Solution returned from a jitted function
    made = jax.jit(lambda v: eqx.tree_at(lambda r: r.value, res, v))(jnp.asarray(0.5))
    assert float(made.value) == 0.5
    # a batch of results: status per member
    bad = w2_sinkhorn(x, y, max_iterations=20, max_rounds=2)
    assert bad.names == "not_converged" and "tolerance" in bad.messages
    # (results of equal ladder length stack; here res and a copy flagged not_converged)
    other = eqx.tree_at(lambda r: r.result, res, jaxdyn.RESULTS.not_converged)
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), res, other)
    assert list(stacked.names) == ["successful", "not_converged"]
    vals = jax.vmap(lambda r: jnp.where(r.ok, r.value, jnp.nan))(stacked)
    assert float(vals[0]) == float(res.value) and np.isnan(float(vals[1]))
    with pytest.raises(RuntimeError, match="not_converged"):
        w2_sinkhorn(x, y, max_iterations=20, max_rounds=2, throw=True)
    xn = np.array(x)
    xn[0, 0] = np.nan
    assert w2_sinkhorn(xn, y).names == "nonfinite"


def test_bad_options_and_list_inputs_and_nan_gaussians():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((30, 2))
    y = x + 0.1
    for kw, msg in (({"max_iterations": 0}, "max_iterations must be a positive integer"),
                    ({"max_rounds": 0}, "max_rounds must be a positive integer"),
                    ({"threshold": -1e-3}, "threshold .* must be positive")):
        with pytest.raises(ValueError, match=msg):  # (ran to an IndexError, a NaN, a long wait)
            w2_sinkhorn(x, y, **kw)
    # nested lists are point clouds as arrays are (the checks read .shape before converting)
    assert float(w2_exact(x.tolist(), y.tolist()).value) == pytest.approx(
        float(w2_exact(x, y).value), rel=1e-12)
    assert float(w2_exact(x.tolist(), y.tolist()).value) == pytest.approx(0.1 * np.sqrt(2), rel=1e-9)
    # (the clouds and options of the translation test: its compiled program)
    xt, yt, _ = _translated(np.float64)
    assert float(w2_sinkhorn(xt.tolist(), yt.tolist(), **TRANSLATION).value) == pytest.approx(
        float(w2_sinkhorn(xt, yt, **TRANSLATION).value), rel=1e-9)
    # a NaN in a Gaussian's parameters gives W2 = NaN (it read 0, "identical Gaussians")
    from jaxdyn.distances import bures_w2, bures_w2_squared
    S = np.eye(2)
    for m0, S0 in ((np.array([np.nan, 0.0]), S), (np.zeros(2), np.array([[np.nan, 0.0], [0.0, 1.0]]))):
        assert np.isnan(float(bures_w2_squared(m0, S0, np.zeros(2), S)))
        res = bures_w2(m0, S0, np.zeros(2), S)
        assert np.isnan(float(res.value)) and res.names == "nonfinite"
    assert float(bures_w2(np.zeros(2), S, np.zeros(2), S).value) == 0.0
