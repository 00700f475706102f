"""The concentration experiment kind: W2 to Π#ρ0, assumption refusal, fits, mass fractions."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

from jaxdyn import sample_sphere
from jaxdyn.distances import w2_exact
from jaxdyn.spectral import projection
from jaxdyn.config import ConfigError
from jaxdyn.experiments.sphere_common import WEIGHTS_SCHEMA, build_weights
from jaxdyn.config import validate_section
from jaxdyn.experiments import resolve_config, run_experiment
from jaxdyn.experiments import concentration as conc
from jaxdyn.experiments.concentration.summary import crossing, fit

SPEC = {"ensemble": "spectral", "mu": [1.0, 0.4, -0.2], "eigenspace_angle_deg": 8.0, "plane": [0, 1]}
TINY = {"kind": "concentration", "name": "tiny", "d": 3, "n": 200, "t1": 8.0, "dt": 0.05,
        "save_every": 8, "weights": SPEC, "w2_methods": ["exact", "coupling", "sinkhorn"],
        "w2_every": 5, "near_angle_deg": 3.0, "sweep": {"beta": [10.0, 100.0]}}


def test_spectral_ensemble_builds_assumption_1():
    w = validate_section("weights", SPEC, WEIGHTS_SCHEMA)
    Q, K, V = build_weights(w, 3)
    M = V @ (Q.T @ K).T
    np.testing.assert_allclose(M, M.T, atol=1e-14)
    np.testing.assert_allclose(np.linalg.eigvalsh(M), [-0.2, 0.4, 1.0], atol=1e-12)
    with pytest.raises(ConfigError, match="expected 3 eigenvalues"):
        build_weights(validate_section("weights", {**SPEC, "mu": [1.0, 0.5]}, WEIGHTS_SCHEMA), 3)


@pytest.mark.slow  # a whole experiment; tests/test_readme.py runs the default concentration config from the CLI by default
def test_concentration_run(tmp_path):
    out = tmp_path / "run"
    res = run_experiment(TINY, out, progress=False, log=lambda *_: None)
    assert res.status == "ok"
    ds = xr.open_dataset(out / "data.nc", engine="h5netcdf").load()
    # At t = 0 the exact W2 is W2(x0, Π(x0)) computed independently here.
    x0 = np.asarray(sample_sphere(jax.random.PRNGKey(0), 200, 3))
    Q, K, V = build_weights(validate_section("weights", SPEC, WEIGHTS_SCHEMA), 3)
    pi = projection(Q, K, V)
    w0 = float(w2_exact(x0, np.asarray(pi(jnp.asarray(x0, jnp.float64)))).value)
    np.testing.assert_allclose(ds["w2_exact"].isel(t_w2=0).values, w0, rtol=1e-4)
    # The coupling bound is never below the exact W2 at the same times.
    coup = ds["w2_coupling"].sel(t=ds["t_w2"].values).values
    assert np.all(coup >= ds["w2_exact"].values - 1e-6)
    # Sinkhorn (ε following the distance) agrees with exact assignment.
    rel = np.abs(ds["w2_sinkhorn"].values - ds["w2_exact"].values) / ds["w2_exact"].values
    assert rel.max() < 0.05, rel
    assert bool(ds["sinkhorn_converged"].all())
    # Concentration happens: W2 falls well below its start, and mass gathers near E.
    assert float(ds["w2_exact"].min()) < 0.5 * w0
    assert float(ds["mass_E"].max()) > 0.1
    s = json.loads((out / "summary.json").read_text())["results"]
    assert s["assumption_1"]["ok"] and s["assumption_1"]["dim_E"] == 1
    assert abs(s["angle_E_EV_deg"] - 8.0) < 1e-6
    assert set(s) >= {"fit_min_w2_vs_beta", "fit_argmin_t_vs_log_beta", "terminal_phase"}
    assert s["sinkhorn_vs_exact_max_rel_error"] == pytest.approx(rel.max(), rel=1e-6)
    for f in ["w2_vs_t.png", "min_w2_vs_beta.png", "argmin_t_vs_log_beta.png", "mass_fractions.png"]:
        assert (out / f).exists()


def test_assumption_failure_is_refused_unless_forced():
    rot = {"ensemble": "explicit", "Q": [[1, 0, 0], [0, 1, 0], [0, 0, 1]],
           "K": [[1, 0, 0], [0, 1, 0], [0, 0, 1]], "V": [[1, 0.5, 0], [0, 0.3, 0], [0, 0, -0.2]]}
    cfg = resolve_config({**TINY, "weights": rot})
    with pytest.raises(ConfigError, match="not symmetric|symmetric"):
        conc.check(cfg)
    warns = conc.check(resolve_config({**TINY, "weights": rot, "force": True}))
    assert any("running anyway" in w for w in warns)


def test_exact_refused_for_large_n():
    with pytest.raises(ConfigError, match="exact_max_n"):
        conc.check(resolve_config({**TINY, "n": 5000}))


def test_sweeps_over_d_or_n_are_refused():
    # the summary averaged W2 and the masses over the swept d (or N) under one β label and
    # reported the base d's spectrum
    for axis, values in (("d", [3]), ("n", [100, 200])):
        with pytest.raises(ConfigError, match=f"sweep.{axis}': a concentration run compares β"):
            conc.check(resolve_config({**TINY, "sweep": {"beta": [10.0], axis: values}}))


def test_crossing_and_fits():
    t = np.linspace(0, 10, 11)
    mE = np.array([0, .2, .5, .8, .9, .7, .4, .2, .1, 0, 0])
    mV = np.array([0, .1, .2, .2, .3, .5, .6, .8, .9, 1, 1])
    assert crossing(t, mE, mV) == 6.0  # first t with mass_V > mass_E
    assert crossing(t, mV * 0, mV) is None
    s, r2 = fit(np.log([10, 100, 1000]), np.log([1.0, 0.1, 0.01]))
    assert s == pytest.approx(-1.0) and r2 == pytest.approx(1.0)


@pytest.mark.slow
def test_concentration_over_several_segments(tmp_path):
    """A run of 300 steps (two segments of the chunk integrator), in both integrators: every
    frame's outputs are arrays (the W2 results reduced to their values), the coupling bound at
    t = 0 is |x0 − Π(x0)| (RMS) and the two integrators agree."""
    x0 = np.asarray(sample_sphere(jax.random.PRNGKey(0), 24, 3), np.float64)
    target = np.asarray(conc.spectral_info({"weights": SPEC, "d": 3})[0](x0), np.float64)
    want = np.sqrt(np.mean(np.sum((x0 - target) ** 2, axis=-1)))
    got = {}
    for ensemble in (True, False):
        cfg = {**TINY, "n": 24, "t1": 6.0, "dt": 0.02, "save_every": 25, "w2_methods": ["coupling"],
               "ensemble": ensemble}
        out = tmp_path / f"run{ensemble}"
        assert run_experiment(cfg, out, progress=False, log=lambda *_: None).status == "ok"
        with xr.open_dataset(out / "data.nc", engine="h5netcdf") as ds:
            got[ensemble] = ds["w2_coupling"].values
        assert got[ensemble].shape == (2, 13) and np.all(np.isfinite(got[ensemble]))
        np.testing.assert_allclose(got[ensemble][:, 0], want, rtol=1e-5)
    np.testing.assert_allclose(got[False], got[True], atol=2e-5)
