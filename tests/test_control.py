"""Reachability (Paper B, docs/math.md §B.9–B.10): certificate, optimiser, modes, rank, transfer.

Independent checks: the certificate's algebra (``T Σ0 T = Σ1``, ``expm(A t1) = G``) against
scipy; every optimised W2 is recomputed by a scipy DOP853 solve of the moment ODE, piece by
piece, written here from docs/math.md §B.2 (not through jaxdyn); the particle transfer of an affine
flow against its exact map. Optimisation tests run in float64 (``W2 < 1e-4`` is
``W2² < 1e-8``). All optimisations in d = 2 share one grid (8 pieces) and so one compiled
loss.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sla
from scipy.integrate import solve_ivp

import jaxdyn
from _references import energy_np, moment_rhs_np
from conftest import tol
from jaxdyn.control import (
    Certificate,
    ControlledEuclideanAttention,
    certificate,
    cloud_w2_to_gaussian,
    control_energy,
    gaussian_cloud,
    mode_options,
    numerical_rank,
    random_target,
    reach,
    reach_loss,
    transfer_particles,
    transformer_layers,
)
from jaxdyn.gaussian import Control
from jaxdyn.models._fields import EuclideanAttention

N_PIECES = 8


# ---------------------------------------------------------------------------------------
# Independent reference: the moment ODE in numpy/scipy, piece by piece
# ---------------------------------------------------------------------------------------


def scipy_moments(controls, m0, S0, t1):
    """m(t1), S(t1) of the moment ODE of docs/math.md §B.2 for piecewise-constant Controls (DOP853)."""
    vals = {k: np.asarray(controls[k].values, np.float64) for k in ("A", "B", "V", "b")}
    n = vals["A"].shape[0]
    y = np.concatenate([np.asarray(m0, np.float64), np.asarray(S0, np.float64).ravel()])
    d = len(m0)
    for k in range(n):
        f = moment_rhs_np(vals["A"][k], vals["B"][k], vals["V"][k], vals["b"][k])
        sol = solve_ivp(f, (k * t1 / n, (k + 1) * t1 / n), y, method="DOP853", rtol=1e-12,
                        atol=1e-14)
        assert sol.success
        y = sol.y[:, -1]
    return y[:d], y[d:].reshape(d, d)


def bures_np(m0, S0, m1, S1):
    """Bures W2 with scipy square roots (independent of jaxdyn's eigh-based ones)."""
    r1 = sla.sqrtm(S1).real
    cross = sla.sqrtm(r1 @ S0 @ r1).real
    val = np.sum((m0 - m1) ** 2) + np.trace(S0 + S1 - 2 * cross)
    return math.sqrt(max(val, 0.0))


def _start(d, mean=0.0):
    m0 = np.zeros(d)
    m0[0] = mean
    return m0, np.eye(d)


# ---------------------------------------------------------------------------------------
# Certificate
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [2, 4])
@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
@pytest.mark.slow
def test_certificate_full_rank_monge(d, dtype):
    m1, S1 = random_target(10 + d, d, dtype=dtype)
    m0, S0 = (a.astype(dtype) for a in _start(d, 0.5))
    # jaxdyn's own verification solve only where its compiled solve is shared with reach's
    c = certificate(m0, S0, m1, S1, t1=1.0, n_pieces=N_PIECES,
                    verify=(d == 2 and dtype == np.float64))
    assert isinstance(c, Certificate) and c.construction == "monge" and c.rank == d
    S0h, S1h = S0.astype(np.float64), S1.astype(np.float64)
    # The Monge map T: SPD, T Σ0 T = Σ1, and exp(A t1) = T with A = log(T)/t1 symmetric.
    T = c.G
    np.testing.assert_allclose(T, T.T, atol=tol(dtype, 1e-5, 1e-12))
    assert np.linalg.eigvalsh(T).min() > 0
    np.testing.assert_allclose(T @ S0h @ T, S1h, atol=tol(dtype, 1e-4, 1e-11))
    A = np.asarray(c.A.values[0], np.float64)
    np.testing.assert_allclose(A, A.T, atol=tol(dtype, 1e-5, 1e-12))
    np.testing.assert_allclose(sla.expm(A), T, atol=tol(dtype, 1e-4, 1e-11))
    # The constant A and b on all pieces.
    assert np.ptp(np.asarray(c.A.values), axis=0).max() == 0
    # Independent solve of the moment ODE (scipy) with the certificate's controls.
    m, S = scipy_moments(c.controls(), m0, S0, 1.0)
    assert bures_np(m, S, m1.astype(np.float64), S1h) < tol(dtype, 2e-3, 1e-6)
    if c.w2 is not None:
        assert c.w2 < tol(dtype, 2e-3, 1e-6)
    # Energy: ∫ ‖A‖² + |b|² dt = t1 (‖A‖_F² + |b|²).
    b = np.asarray(c.b.values[0], np.float64)
    assert c.energy == pytest.approx(np.sum(A ** 2) + np.sum(b ** 2), rel=1e-6)


def test_certificate_rank_deficient_polar():
    """Same rank r = 2 < d = 3 with different ranges: G = R P, two phases, exact."""
    d = 3
    m1, S1 = random_target(3, d, rank=2)
    _, S0 = random_target(4, d, rank=2)
    m0 = np.array([0.3, -0.2, 0.1])
    c = certificate(m0, S0, m1, S1, t1=1.0, verify=False)
    assert c.construction == "polar" and c.rank == 2 and c.A.n == 2
    A1, A2 = (np.asarray(c.A.values[k]) for k in range(2))
    np.testing.assert_allclose(A1, A1.T, atol=1e-12)     # log P / h: symmetric
    np.testing.assert_allclose(A2, -A2.T, atol=1e-12)    # log R / h: skew
    G = sla.expm(0.5 * A2) @ sla.expm(0.5 * A1)
    np.testing.assert_allclose(G, c.G, atol=1e-11)
    assert np.linalg.det(G) > 0
    np.testing.assert_allclose(G @ S0 @ G.T, S1, atol=1e-11)
    assert c.residual < 1e-12 and c.mean_residual < 1e-12
    m, S = scipy_moments(c.controls(), m0, S0, 1.0)
    np.testing.assert_allclose(m, m1, atol=1e-9)
    np.testing.assert_allclose(S, S1, atol=1e-9)
    assert numerical_rank(S)[0] == 2  # rank is kept along the way
    with pytest.raises(ValueError, match="even"):
        certificate(m0, S0, m1, S1, t1=1.0, n_pieces=3, verify=False)


def test_rank_mismatch_refused():
    d = 3
    m1, S1 = random_target(5, d, rank=2)
    for fn in (certificate, reach):
        with pytest.raises(ValueError, match="rank 2 but S0 has rank 3.*preserve rank"):
            fn(None, np.eye(d), m1, S1, t1=1.0)


def test_nearly_singular_rank_reported():
    """λ = 1e-12 relative is below the default cut sqrt(eps): rank 1, reported as dropped."""
    S0 = np.diag([1.0, 1e-12])
    v = np.array([0.8, 0.6])
    S1 = 1.5 * np.outer(v, v)  # rank 1, another range
    c = certificate(None, S0, None, S1, t1=1.0, verify=False)
    assert c.rank == 1 and c.construction == "polar"
    assert 0 < c.dropped < 1e-10
    assert c.rank_rtol == pytest.approx(math.sqrt(np.finfo(np.float64).eps))
    # The regularised certificate still lands within sqrt(dropped) of the target.
    m, S = scipy_moments(c.controls(), np.zeros(2), S0, 1.0)
    assert bures_np(m, S, np.zeros(2), S1) < 1e-5
    # A full-rank target from the (numerically) rank-1 S0 is refused; a smaller cut accepts it.
    with pytest.raises(ValueError, match="numerical rank 2 but S0 has rank 1"):
        certificate(None, S0, None, np.eye(2), verify=False)
    assert certificate(None, S0, None, np.eye(2), rank_rtol=1e-14, verify=False).rank == 2


# ---------------------------------------------------------------------------------------
# Optimiser
# ---------------------------------------------------------------------------------------


def _check_reached(res, m0, S0, m1, S1, bound=1e-4):
    """The result's own W2 and an independent scipy solve of the moment ODE."""
    assert bool(res.ok) and res.names == "successful", res.message
    assert res.w2 < bound
    m, S = scipy_moments(res.controls, m0, S0, 1.0)
    w2_ref = bures_np(m, S, m1, S1)
    assert w2_ref < bound, (w2_ref, res.message)
    return w2_ref


@pytest.mark.slow  # 12 s; reach by default: tests/test_control_compose.py::test_results_are_pytrees_of_arrays
@pytest.mark.parametrize("d,seed", [(2, 1), (2, 2),
                                    pytest.param(4, 3, marks=pytest.mark.slow)])
def test_reach_all_free_from_zero(d, seed):
    """All controls free, optimiser from zero controls (no certificate start). d = 4 is
    marked slow only for its compilation (about 30 s on a loaded 2-core machine)."""
    m1, S1 = random_target(seed, d)
    m0, S0 = _start(d)
    # d = 4: no jaxdyn verification solve (one compilation less); scipy checks the result.
    res = reach(m0, S0, m1, S1, t1=1.0, n_pieces=N_PIECES, init="zero", verify=(d == 2))
    w2_ref = _check_reached(res, m0, S0, m1, S1)
    print(f"\nd={d} seed={seed}: W2 {res.w2:.2e} (scipy {w2_ref:.2e}), {res.iterations} iterations, "
          f"energy {res.energy:.3f} vs certificate {res.certificate.energy:.3f}")
    cert = res.certificate
    assert cert is not None and cert.residual < 1e-12
    if d == 2:
        assert cert.w2 < 1e-6
    assert res.w2_history[0] > 1e-2 > res.w2_history[-1]
    assert set(res.controls) == {"A", "B", "V", "b"}
    assert all(c.values.shape[0] == N_PIECES for c in res.controls.values())


@pytest.mark.slow  # ~12 s (two reach solves); reach by default: tests/test_control_compose.py::test_results_are_pytrees_of_arrays
def test_attention_only():
    """A = b = 0. From m0 = 0 the mean cannot move (m' = V(I + ΣB) m keeps m = 0): the
    covariance is reached, W2 stays |m1|. From m0 = e1 the target is reached."""
    d = 2
    m1, S1 = random_target(2, d)
    m0, S0 = _start(d, 0.0)
    r0 = reach(m0, S0, m1, S1, n_pieces=N_PIECES, **mode_options("attention"))
    assert r0.free == ("V", "B")
    assert np.all(np.asarray(r0.controls["A"].values) == 0)
    assert np.all(np.asarray(r0.controls["b"].values) == 0)
    assert r0.w2_mean == pytest.approx(np.linalg.norm(m1), rel=1e-9)
    assert not r0.ok and r0.w2 >= np.linalg.norm(m1) - 1e-9
    # the verification solve succeeded, the target was not met: not_converged, with a message
    assert r0.names == "not_converged" and "tolerance" in r0.messages
    with pytest.raises(RuntimeError, match="not_converged"):
        reach(m0, S0, m1, S1, n_pieces=N_PIECES, throw=True, **mode_options("attention"))
    assert r0.w2_cov < 1e-4
    # the same by scipy's solve of the moment ODE with r0's controls: the mean stays 0, the
    # covariance lands on S1, W2 is |m1|
    m, S = scipy_moments(r0.controls, m0, S0, 1.0)
    np.testing.assert_array_equal(m, 0.0)
    assert bures_np(m, S, m, S1) < 1e-4
    assert bures_np(m, S, m1, S1) == pytest.approx(np.linalg.norm(m1), abs=1e-4)
    m0e, _ = _start(d, 1.0)
    r1 = reach(m0e, S0, m1, S1, n_pieces=N_PIECES, **mode_options("attention"))
    w2_ref = _check_reached(r1, m0e, S0, m1, S1)
    print(f"\nattention only: m0 = 0 -> W2 {r0.w2:.4f} = |m1| (covariance part {r0.w2_cov:.1e}); "
          f"m0 = e1 -> W2 {r1.w2:.2e} (scipy {w2_ref:.2e}) in {r1.iterations} iterations")


@pytest.mark.slow
def test_bounded_controls_respect_bound():
    d = 2
    m1, S1 = random_target(1, d)
    m0, S0 = _start(d, 1.0)
    c = 0.5
    res = reach(m0, S0, m1, S1, n_pieces=N_PIECES, **mode_options("bounded", bound=c))
    for k in ("A", "B", "V", "b"):
        v = np.asarray(res.controls[k].values)
        norms = np.sqrt(np.sum(v.reshape(v.shape[0], -1) ** 2, axis=1))
        assert norms.max() <= c * (1 + 1e-12), (k, norms)
    assert res.bound == {k: c for k in ("A", "b", "V", "B")}
    m, S = scipy_moments(res.controls, m0, S0, 1.0)
    assert bures_np(m, S, m1, S1) == pytest.approx(float(res.w2), abs=1e-6)
    print(f"\nbounded |u|_F <= {c}: W2 {res.w2:.3e} (reached: {bool(res.ok)}); "
          f"{res.message}")


@pytest.mark.slow
def test_energy_mode_lowers_energy_and_reaches():
    d = 2
    m1, S1 = random_target(1, d)
    m0, S0 = _start(d, 1.0)
    res = reach(m0, S0, m1, S1, n_pieces=N_PIECES, **mode_options("energy", energy_weight=1e-3))
    _check_reached(res, m0, S0, m1, S1)
    cert = res.certificate
    assert res.energy < cert.energy
    # the reported energy is the exact integral of the free controls (NumPy, not jaxdyn's)
    assert float(res.energy) == pytest.approx(energy_np(res.controls, res.free), rel=1e-9)
    print(f"\nenergy mode: W2 {res.w2:.2e}, energy {res.energy:.4f} vs certificate "
          f"{cert.energy:.4f}; lambda {res.energy_weight} -> {res.energy_weight_final}")


def test_control_energy_quadrature():
    """control_energy's closed forms against a fine trapezoid rule of ‖u(t)‖²."""
    rng = np.random.default_rng(0)
    for kind, n in (("piecewise", 5), ("linear", 6)):
        c = Control(jnp.asarray(rng.standard_normal((n, 2, 2))), 2.0, kind)
        ts = np.linspace(0, 2.0, 20001)
        f = np.sum(np.asarray(jax.jit(jax.vmap(c))(jnp.asarray(ts))) ** 2, axis=(1, 2))
        quad = np.trapezoid(f, ts)
        assert control_energy({"A": c}, names=("A",)) == pytest.approx(quad, rel=1e-3)
    with pytest.raises(ValueError, match="pass t1"):
        control_energy({"A": np.eye(2)}, names=("A",))
    assert control_energy({"A": np.eye(2)}, names=("A",), t1=3.0) == pytest.approx(6.0)


def test_reach_input_errors():
    S = np.eye(2)
    with pytest.raises(ValueError, match="free must be"):
        reach(None, S, None, S, free=("A", "Q"))
    with pytest.raises(ValueError, match="n_pieces"):
        reach(None, S, None, S, n_pieces=0)
    with pytest.raises(ValueError, match="S1 must have shape"):
        reach(None, S, None, np.eye(3))
    with pytest.raises(ValueError, match="bound must be > 0"):
        reach(None, S, None, S, bound=0.0)
    with pytest.raises(ValueError, match="mode must be one of"):
        mode_options("teleport")


# ---------------------------------------------------------------------------------------
# Transfer to particles and layers
# ---------------------------------------------------------------------------------------


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_controlled_field_matches_euclidean(dtype):
    rng = np.random.default_rng(1)
    d, n = 3, 4
    vals = {k: rng.standard_normal((n, d, d)).astype(dtype) * 0.5 for k in "ABV"}
    vals["b"] = rng.standard_normal((n, d)).astype(dtype)
    ctr = {k: Control(jnp.asarray(v), 1.0) for k, v in vals.items()}
    model = ControlledEuclideanAttention.from_controls(ctr, kernel="dense")
    x = jnp.asarray(rng.standard_normal((17, d)), dtype)
    # the fields jitted (one program a model structure, t traced) instead of op by op
    field = eqx.filter_jit(lambda m, t, x: m(t, x))
    for t, k in ((0.1, 0), (0.3, 1), (0.99, 3)):
        tj = jnp.asarray(t, dtype)
        ref = field(EuclideanAttention(vals["A"][k], vals["B"][k], vals["V"][k], vals["b"][k],
                                       kernel="dense"), tj, x)
        got = field(model, tj, x)
        np.testing.assert_allclose(got, ref, rtol=tol(dtype, 1e-5, 1e-12), atol=tol(dtype, 1e-5, 1e-12))
        np.testing.assert_allclose(field(model.at(t), tj, x), ref, rtol=tol(dtype, 1e-5, 1e-12),
                                   atol=tol(dtype, 1e-5, 1e-12))
    assert model.dim == d
    with pytest.raises(ValueError, match="B must have shape"):
        ControlledEuclideanAttention(np.eye(2), np.eye(3), np.eye(2))


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
@pytest.mark.slow
def test_transfer_affine_flow_is_exact(dtype):
    """With V = B = 0 the particle flow is the affine map x ↦ G x + c of the certificate:
    RK4 (A constant per piece) reproduces it; L Euler layers converge to it at order 1."""
    d = 2
    m1, S1 = random_target(7, d, dtype=dtype)
    m0, S0 = (a.astype(dtype) for a in _start(d, 1.0))
    c = certificate(m0, S0, m1, S1, t1=1.0, n_pieces=4, verify=False)
    ctr = c.controls()
    x0 = np.random.default_rng(0).standard_normal((50, d)).astype(dtype) + m0
    xs = transfer_particles(ctr, x0, t1=1.0, steps_per_piece=16)
    assert xs.shape == (5, 50, d)
    # exact: every particle follows the mean's map with the same G
    shift = m1.astype(np.float64) - c.G @ m0.astype(np.float64)
    exact = x0.astype(np.float64) @ c.G.T + shift
    np.testing.assert_allclose(np.asarray(xs[-1], np.float64), exact, atol=tol(dtype, 1e-4, 1e-9))
    errs = [np.sqrt(np.mean(np.sum((np.asarray(transformer_layers(ctr, x0, t1=1.0, n_layers=L),
                                                np.float64) - exact) ** 2, axis=1)))
            for L in (16, 64)]
    assert 2.5 < errs[0] / errs[1] < 6.0  # first order: 4 expected


@pytest.mark.slow
def test_particle_w2_falls_with_n():
    """Attention-only controls on the particle system: the W2 between the cloud's empirical
    moments at t1 and the target falls as N grows. Initial clouds with exact moments (so the
    error measured is the one the finite-N attention adds, not the initial sample's)."""
    d = 2
    m1, S1 = random_target(2, d)
    m0, S0 = _start(d, 1.0)
    res = reach(m0, S0, m1, S1, n_pieces=N_PIECES, **mode_options("attention"))
    assert bool(res.ok), res.message
    model = ControlledEuclideanAttention.from_controls(res.controls)
    out = {}
    for N in (64, 256, 1024):
        w = []
        for r in range(4):
            x0 = gaussian_cloud([N, r], N, m0, S0, exact_moments=True)
            assert cloud_w2_to_gaussian(x0, m0, S0, exact=False)["bures"] < 1e-6
            xs = transfer_particles(model, x0, t1=1.0, steps_per_piece=8)
            w.append(cloud_w2_to_gaussian(np.asarray(xs[-1]), m1, S1, exact=False)["bures"])
        out[N] = float(np.mean(w))
    print(f"\nparticle W2 (Bures of empirical moments) to the target: {out}; moment ODE {res.w2:.1e}")
    assert out[1024] < out[256] < out[64]
    assert out[1024] < 0.6 * out[64]


def test_cloud_w2_to_gaussian():
    rng = np.random.default_rng(3)
    m1, S1 = random_target(3, 2)
    R = sla.sqrtm(S1).real
    x = m1 + rng.standard_normal((400, 2)) @ R
    w = cloud_w2_to_gaussian(x, m1, S1, seed=1)
    assert w["n"] == 400
    assert w["bures"] < 0.3
    # a sample of the target is as close as another sample: exact ≈ floor
    assert 0.5 < w["exact"] / w["floor"] < 2.0
    far = cloud_w2_to_gaussian(x + 3.0, m1, S1, seed=1)
    assert far["bures"] == pytest.approx(3.0 * math.sqrt(2), abs=0.3)
    assert far["exact"] > 3.0
    assert math.isnan(cloud_w2_to_gaussian(x, m1, S1, exact_max=100)["exact"])
    with pytest.raises(ValueError, match="x must have shape"):
        cloud_w2_to_gaussian(x[:, :1], m1, S1)


def test_random_target():
    m, S = random_target(0, 5, eig_range=(0.5, 2.0))
    w = np.linalg.eigvalsh(S)
    assert w.min() >= 0.5 - 1e-12 and w.max() <= 2.0 + 1e-12
    np.testing.assert_allclose(S, S.T)
    _, S2 = random_target(0, 5, rank=3)
    assert numerical_rank(S2)[0] == 3


@pytest.mark.slow
def test_reachability_experiment_tiny(tmp_path):
    """The experiment kind end to end (engine, summary, figures) on a tiny grid."""
    from jaxdyn.experiments import run_experiment

    raw = {"kind": "reachability", "name": "reach_tiny", "d": 2, "n_save": 5,
           "transfer": {"modes": ["attention"], "seeds": [0], "n_particles": [32, 64],
                        "repeats": 1, "layers": [8], "layer_n": 64, "exact_max": 64},
           "sweep": {"mode": ["all", "attention"], "seed": [0]}}
    res = run_experiment(raw, tmp_path / "run", progress=False, log=lambda *a: None)
    assert res.status == "ok"
    table = {r["mode"]: r for r in res.summary["results"]["modes"]}
    assert table["all"]["reached_fraction"] == 1.0 and table["all"]["w2_max"] < 1e-4
    assert table["attention"]["targets"] == 1
    tr = res.summary["results"]["transfer"]
    assert len(tr) == 1 and tr[0]["mode"] == "attention"
    assert all(np.isfinite(x) for x in tr[0]["particle_w2_bures_moments"])
    names = {p.split("/")[-1] for p in res.figures}
    assert names == {"covariance.png", "loss.png", "controls.png", "transfer.png"}
    from jaxdyn.config import ConfigError
    with pytest.raises(ConfigError, match="transfer.modes"):
        run_experiment({**raw, "transfer": {"modes": ["teleport"]}}, tmp_path / "bad",
                       progress=False, log=lambda *a: None)
    with pytest.raises(ConfigError, match="'m0'"):
        run_experiment({**raw, "m0": [1.0, 2.0, 3.0]}, tmp_path / "bad2", progress=False,
                       log=lambda *a: None)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rk4", "euler"])
def test_transfer_is_simulate_on_the_frozen_field_per_piece(method):
    """transfer_particles runs simulate's fixed-step loop: piece by piece, it equals simulate
    on the field frozen at the piece's midpoint (EuclideanAttention.at), and
    transformer_layers equals one projected-Euler step a layer."""
    rng = np.random.default_rng(4)
    d, n, S = 3, 3, 4
    ctr = {k: Control(jnp.asarray(0.4 * rng.standard_normal((n, d, d))), 1.5) for k in "ABV"}
    ctr["b"] = Control(jnp.asarray(rng.standard_normal((n, d))), 1.5)
    model = EuclideanAttention.from_controls(ctr, kernel="dense")
    assert ControlledEuclideanAttention is EuclideanAttention
    x0 = jnp.asarray(rng.standard_normal((11, d)))
    xs = transfer_particles(model, x0, t1=1.5, steps_per_piece=S, method=method)
    h = 1.5 / n
    x = x0
    for k in range(n):
        tr = jaxdyn.simulate(model.at((k + 0.5) * h), x, t0=k * h, t1=(k + 1) * h, dt=h / S,
                             save_every=S, method=method)
        x = tr.xs[-1]
        np.testing.assert_allclose(np.asarray(xs[k + 1]), np.asarray(x), rtol=0, atol=1e-13)
    L = 6
    y = x0
    for layer in range(L):
        f = model.at((layer + 0.5) * 1.5 / L)
        y = y + (1.5 / L) * f(0.0, y)
    np.testing.assert_allclose(np.asarray(transformer_layers(model, x0, t1=1.5, n_layers=L)),
                               np.asarray(y), rtol=0, atol=1e-13)


@pytest.mark.slow
def test_reach_loss_solve_matches_adaptive():
    """reach's own solve (reach_loss: constant diffrax Dopri8 steps, each inside one piece)
    against scipy's DOP853 at rtol 1e-12 on random piecewise-constant and piecewise-linear
    controls (to the optimiser's tolerances 1e-9/1e-11); a blow-up and too-long steps are
    flagged (not successful), too-long steps alone by ``max_steps_reached`` (reach's cue to
    halve them)."""
    d, n = 3, N_PIECES
    rng = np.random.default_rng(5)
    m0, S0 = rng.standard_normal(d), np.eye(d) + 0.2 * np.ones((d, d))

    def run(vals, kind, steps):
        ctr = {k: Control(jnp.asarray(v), 1.0, kind) for k, v in zip("ABVb", vals)}
        return reach_loss(ctr, m0, S0, np.zeros(d), np.eye(d), t1=1.0, steps_per_piece=steps,
                          rtol=1e-9, atol=1e-11)

    def reference(vals, kind):
        def f(t, y):
            k = min(int(t * n), n - 1)
            w = t * n - k
            A, B, V, b = ((v[k] + w * (v[k + 1] - v[k])) if kind == "linear" else v[k] for v in vals)
            m, S = y[:d], y[d:].reshape(d, d)
            G = (A + V @ S @ B) @ S
            return np.concatenate([(A + V) @ m + V @ S @ B @ m + b, (G + G.T).ravel()])
        y = np.concatenate([m0, S0.ravel()])
        for k in range(n):
            y = solve_ivp(f, (k / n, (k + 1) / n), y, method="DOP853", rtol=1e-12, atol=1e-14).y[:, -1]
        return y[:d], y[d:].reshape(d, d)

    for kind, nv in (("piecewise", n), ("linear", n + 1)):
        vals = [0.4 * rng.standard_normal((nv, d, d)) for _ in range(3)] + [0.4 * rng.standard_normal((nv, d))]
        sol = run(vals, kind, 8)
        m_ref, S_ref = reference(vals, kind)
        assert sol.names == "successful" and float(sol.error_ratio) <= 1.0
        np.testing.assert_allclose(np.asarray(sol.cov), S_ref, rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(np.asarray(sol.mean), m_ref, rtol=1e-9, atol=1e-11)
        assert np.array_equal(np.asarray(sol.cov), np.asarray(sol.cov).T)
        assert int(sol.stats["num_steps"]) == 8 * n
    # V = 2I, B = I, A = b = 0: blow-up before t1 = 1 (T* = 1/(4 λmax(S0)) < 1)
    z, eye = np.zeros((n, d, d)), np.broadcast_to(np.eye(d), (n, d, d))
    blow = run([z, eye, 2 * eye, np.zeros((n, d))], "piecewise", 8)
    assert blow.names in ("large", "nonfinite") and np.isnan(float(blow.loss))
    # fast linear dynamics (A = -5 I, Σ decays at rate 10): one step a piece is outside the
    # tolerance, eight are within it
    fine = run([-5 * eye, z, z, np.zeros((n, d))], "piecewise", 8)
    assert fine.names == "successful"
    coarse = run([-5 * eye, z, z, np.zeros((n, d))], "piecewise", 1)
    assert coarse.names == "max_steps_reached" and float(coarse.error_ratio) > 1.0


@pytest.mark.slow
def test_reach_rejects_too_long_trials_and_refines_a_too_long_start():
    """One fixed Dopri8 step a piece: a too-long trial of the L-BFGS line search is a rejected
    trial like any other (the target is reached at one step a piece, no refinement); a start
    whose own solve fails only the step-error check (A = -3 I: Σ decays at rate 6; its error
    ratio is 23 at one step a piece, 0.07 at two) makes reach double ``steps_per_piece`` until
    it passes, then optimise at that count (history of the step counts, message) to the
    target (adaptive verification solve and scipy). Only steps 1 and 2 are compiled (2 is
    shared with the other d = 2 reach tests)."""
    m1, S1 = random_target(3, 2, mean_scale=2.0, eig_range=(0.1, 10.0))
    m0, S0 = _start(2)
    kw = dict(t1=1.0, n_pieces=N_PIECES, tol=1e-4, steps_per_piece=1, with_certificate=False)
    r = reach(m0, S0, m1, S1, init="zero", **kw)
    assert r.step_refinements == 0 and r.steps_per_piece == 1 and "halved" not in r.message
    _check_reached(r, m0, S0, m1, S1)
    eye = np.broadcast_to(np.eye(2), (N_PIECES, 2, 2))
    r = reach(m0, S0, m1, S1, init={"A": Control(jnp.asarray(-3 * eye), 1.0)}, **kw)
    k = int(r.step_refinements)
    assert k >= 1 and r.steps_per_piece == 2 ** k and f"halved {k} time" in r.message
    steps = np.asarray(r.stats["steps_history"])
    assert len(steps) == len(r.loss_history) == int(r.iterations) + 1
    assert np.all(steps == 2 ** k)  # refined before the start was accepted
    start = {"A": Control(jnp.asarray(-3 * eye), 1.0), "B": Control(jnp.zeros((N_PIECES, 2, 2)), 1.0),
             "V": Control(jnp.zeros((N_PIECES, 2, 2)), 1.0), "b": Control(jnp.zeros((N_PIECES, 2)), 1.0)}
    assert reach_loss(start, m0, S0, m1, S1, steps_per_piece=2 ** (k - 1)).names == "max_steps_reached"
    assert reach_loss(start, m0, S0, m1, S1, steps_per_piece=2 ** k).names == "successful"
    _check_reached(r, m0, S0, m1, S1)


@pytest.mark.slow  # ~15 CPU-s (three step counts compiled); default counterpart:
# test_reach_rejects_too_long_trials_and_refines_a_too_long_start
def test_reach_halves_fixed_steps_when_only_the_step_error_check_fails():
    """Large controls (Adam at lr 0.3 towards a stretched target) make 16 Dopri8 steps a piece
    too long for rtol/atol: reach doubles steps_per_piece (16 → 64) instead of rejecting every
    such trial, and the target is reached: W2 < tol by its verification solve and by scipy's
    DOP853 solve of the moment ODE with the optimised controls."""
    m0, S0 = np.zeros(2), np.eye(2)
    m1, S1 = np.array([5.0, 5.0]), np.array([[30.0, 20.0], [20.0, 15.0]])
    r = reach(m0, S0, m1, S1, t1=1.0, n_pieces=4, init="zero", tol=1e-4, steps_per_piece=16,
              adam_steps=20, adam_lr=0.3)
    assert r.step_refinements >= 1
    assert r.steps_per_piece == 16 * 2 ** r.step_refinements <= 64
    assert "halved" in r.message
    _check_reached(r, m0, S0, m1, S1)  # its own W2 and scipy's DOP853 solve of the controls


@pytest.mark.slow  # ~10 CPU-s (steps 1, 2 and 4 compiled); default counterpart:
# test_reach_rejects_too_long_trials_and_refines_a_too_long_start
def test_reach_step_refinement_in_the_adam_phase_compares_at_one_step_count():
    """Refinements (1 → 2 → … steps a piece) during 20 Adam steps: L-BFGS starts from the best
    Adam iterate *at the final step count* (the best so far is evaluated again after each
    refinement), so its first accepted loss is at most the least Adam loss recorded at that
    count; the target is reached (adaptive verification solve and scipy)."""
    m1, S1 = random_target(4, 2, mean_scale=2.0, eig_range=(0.1, 10.0))
    m0, S0 = _start(2)
    r = reach(m0, S0, m1, S1, t1=1.0, n_pieces=N_PIECES, init="zero", tol=1e-4, steps_per_piece=1,
              adam_steps=20, adam_lr=0.05, with_certificate=False)
    steps = np.asarray(r.stats["steps_history"])
    hist = np.asarray(r.loss_history)
    assert steps[0] == 1 < steps[20] == r.steps_per_piece
    final = [hist[i] for i in range(1, 21) if steps[i] == steps[20] and np.isfinite(hist[i])]
    assert final and hist[21] <= min(final) * (1 + 1e-6)
    _check_reached(r, m0, S0, m1, S1)


@pytest.mark.slow  # ~30 CPU-s (steps 2, 4 and 8 compiled at 4 pieces); default counterpart:
# test_reach_rejects_too_long_trials_and_refines_a_too_long_start
def test_reach_refines_the_steps_when_the_line_search_fails_near_the_step_error_limit():
    """Attention controls with a fixed A = -0.1 I: the L-BFGS line search finds no decrease at
    an iterate whose step-error ratio is above 1e-2 (its trials fail the check); reach doubles
    steps_per_piece and resumes the loop from that iterate (an empty L-BFGS memory), and the
    target is reached (adaptive verification solve and scipy). The step counts of the
    iterations double at the recorded refinements and never decrease."""
    m1, S1 = random_target(1, 2)
    m0, S0 = _start(2, 1.0)
    r = reach(m0, S0, m1, S1, t1=1.0, n_pieces=4, free=("V", "B"),
              fixed={"A": -0.1 * np.eye(2)}, with_certificate=False)
    k = int(r.step_refinements)
    assert k >= 1 and r.steps_per_piece == 2 * 2 ** k and f"halved {k} time" in r.message
    steps = np.asarray(r.stats["steps_history"])
    assert len(steps) == int(r.iterations) + 1 and steps[0] == 2 and steps[-1] == r.steps_per_piece
    assert np.all(np.diff(steps) >= 0) and set(np.unique(np.diff(steps))) <= {0} | {2 ** j for j in range(1, 7)}
    np.testing.assert_array_equal(np.asarray(r.controls["A"].values), np.broadcast_to(-0.1 * np.eye(2), (4, 2, 2)))
    m, S = scipy_moments(r.controls, m0, S0, 1.0)
    assert bool(r.ok) and bures_np(m, S, m1, S1) < 1e-4
