"""What the papers predict, said exactly (issue 20): the concentration summary and the config
checker know their regime (too few β for a fit, no metastable phase, phases that cannot
separate), and Conjecture 1's two readings of "the top eigenspace of V" are told apart.
Config-only checks and summaries of constructed arrays: no dynamics run here."""

import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from jaxdyn.cli import main
from jaxdyn.config import load_yaml
from jaxdyn.experiments import resolve_config
from jaxdyn.experiments import concentration as conc
from jaxdyn.experiments.concentration.schema import SEPARATION, magnitude_basis, regime_warnings
from jaxdyn.experiments.concentration.summary import analyse, fit, fit_report
from jaxdyn.spectral import subspace_angle, top_eigenspace

ROOT = Path(__file__).resolve().parents[1]
SPEC = {"ensemble": "spectral", "mu": [1.0, 0.4, -0.2], "eigenspace_angle_deg": 8.0, "plane": [0, 1]}
BASE = {"kind": "concentration", "name": "p", "d": 3, "n": 1024, "t1": 8.0, "dt": 0.05,
        "weights": SPEC, "w2_methods": ["coupling"], "near_angle_deg": 3.0}


def _cfg(path):
    return resolve_config(load_yaml(ROOT / path))


# ---------------------------------------------------------------- the config checker


def test_two_betas_warn_that_the_fits_mean_nothing():
    warns = conc.check(resolve_config({**BASE, "sweep": {"beta": [300.0, 1000.0]}}))
    assert any("only 2 β values" in w and "R² = 1 by construction" in w for w in warns), warns
    warns = conc.check(resolve_config({**BASE, "sweep": {"beta": [300.0, 500.0, 700.0, 1000.0]}}))
    assert not any("β values" in w for w in warns), warns


def test_phase_separation_and_near_angle_thresholds():
    # E(V) 8° from E: β^(-1/2) < 4° (= 8°/SEPARATION) needs β > (2/0.1396)² = 205.2.
    ang = math.radians(8.0)
    need = (SEPARATION / ang) ** 2
    assert need == pytest.approx(205.2, abs=0.1)
    w = regime_warnings([200.0, 210.0, 1000.0, 2000.0], 3, ang, 1.0)
    sep = [x for x in w if "cannot separate" in x]
    assert len(sep) == 1 and "β ∈ {200}" in sep[0], w
    # near_angle 3°: β^(-1/2) ≤ 3° needs β ≥ 364.8 (flagged: 200, 210).
    w = regime_warnings([200.0, 210.0, 365.0, 1000.0], 3, ang, 3.0)
    near = [x for x in w if "near_angle_deg" in x]
    assert len(near) == 1 and "β ∈ {200, 210}" in near[0], w
    assert regime_warnings([365.0, 500.0, 700.0, 1000.0], 3, ang, 3.0) == []
    # E(V) inside E (angle 0, e.g. the d = 4 plane config): nothing to separate.
    assert not any("separate" in x for x in regime_warnings([10.0] * 4, 4, 0.0, 3.0))


def test_no_metastability_config_is_predicted_by_the_checker(capsys):
    path = "configs/concentration_no_metastability.yaml"
    warns = conc.check(_cfg(path))
    assert any("cannot separate" in w and "{1, 2, 4, 8}" in w for w in warns), warns
    assert any("undercounts" in w for w in warns), warns
    assert main(["config", str(ROOT / path)]) == 0
    err = capsys.readouterr().err
    assert "cannot separate" in err and "undercounts" in err


def test_conjecture_readings_config_separates_the_readings():
    cfg = _cfg("configs/terminal_phase_readings.yaml")
    pi, bV = conc.spectral_info(cfg)
    bM = magnitude_basis(cfg)
    # E(V) by real part is 8° from E; the magnitude-dominant eigenvector (eigenvalue −3) is ⟂ E.
    assert math.degrees(subspace_angle(np.asarray(pi.basis), bV)) == pytest.approx(8.0, abs=1e-9)
    assert math.degrees(subspace_angle(np.asarray(pi.basis), bM)) == pytest.approx(90.0, abs=1e-9)


# ---------------------------------------------------------------- Conjecture 1's readings


def test_top_eigenspace_by_real_part_and_by_magnitude():
    V = np.diag([1.0, 0.4, -3.0])
    real = top_eigenspace(V, symmetric=False)
    mag = top_eigenspace(V, symmetric=False, by="magnitude")
    np.testing.assert_allclose(np.abs(real.basis[:, 0]), [1, 0, 0], atol=1e-15)
    np.testing.assert_allclose(np.abs(mag.basis[:, 0]), [0, 0, 1], atol=1e-15)
    assert real.value == 1.0 and mag.value == 3.0
    # A complex pair of the largest modulus: the real invariant plane, in both readings' terms.
    R = np.array([[0.0, -2.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # eigenvalues ±2i, 1
    assert top_eigenspace(R, symmetric=False, by="magnitude").dim == 2
    assert top_eigenspace(R, symmetric=False).dim == 1
    with pytest.raises(ValueError, match="magnitude"):
        top_eigenspace(V, by="magnitude")
    with pytest.raises(ValueError, match="by must be"):
        top_eigenspace(V, symmetric=False, by="modulus")


# ---------------------------------------------------------------- the summary


def _dataset(betas, mass_E, mass_V, w2, mass_mag=None):
    t = np.arange(mass_E.shape[1], dtype=float)
    v = {"mass_E": (("beta", "t"), mass_E), "mass_V": (("beta", "t"), mass_V),
         "w2_exact": (("beta", "t_w2"), w2)}
    if mass_mag is not None:
        v["mass_V_magnitude"] = (("beta", "t"), mass_mag)
    return xr.Dataset(v, coords={"beta": betas, "t": t, "t_w2": t})


def test_fits_on_two_points_report_no_r2():
    s, r2 = fit([0.0, 1.0], [1.0, 3.0])
    assert s == pytest.approx(2.0, rel=1e-14) and r2 is None
    warns = []
    r = fit_report("f", [0.0, 1.0, 2.0], [0.0, 1.0, 2.0], warns)
    assert r["n_points"] == 3 and r["r2"] == pytest.approx(1.0) and "indicative" in r["warning"]
    r = fit_report("g", np.log([10, 30, 100, 300]), [1.0, 2.0, 2.9, 4.1], warns)
    assert "warning" not in r and len(warns) == 1


def test_summary_flags_two_betas_and_an_overtake_without_metastable_phase():
    # β = 10: the mass near E peaks at 1.6 % and is overtaken at t = 2 (no metastable phase);
    # β = 1000: it peaks at 0.9 and is overtaken at t = 4.
    mE = np.array([[0, .016, .01, 0, 0, 0], [0, .5, .9, .8, .3, 0]])
    mV = np.array([[0, .01, .2, .6, .9, 1], [0, 0, .1, .2, .6, 1]])
    w2 = np.array([[.5, .3, .2, .25, .3, .4], [.5, .2, .1, .05, .1, .2]])
    res = analyse({"metastable_mass": 0.1}, _dataset([10.0, 1000.0], mE, mV, w2), math.radians(8.0))
    tp = res["terminal_phase"]
    assert tp["beta=10"]["overtake_time"] == 2.0 and tp["beta=10"]["metastable"] is False
    assert tp["beta=1000"]["overtake_time"] == 4.0 and tp["beta=1000"]["metastable"] is True
    # β = 10: β^(-1/2) = 18° is not below 8°/2; β = 1000: 1.8° is.
    assert tp["beta=10"]["phases_separate"] is False and tp["beta=1000"]["phases_separate"] is True
    assert res["fit_argmin_t_vs_log_beta"]["r2"] is None
    assert res["fit_min_w2_vs_beta"]["r2"] is None and "upper bound" in res["fit_min_w2_vs_beta"]["note"]
    # The overtake fit keeps only β = 1000 (metastable, separable): one point, no fit.
    assert res["fit_overtake_t_vs_log_beta"]["n_points"] == 1
    assert res["fit_overtake_t_vs_log_beta"]["slope"] is None
    w = " | ".join(res["warnings"])
    assert "β = 10: an overtake time 2 is reported but the mass near E never exceeded" in w
    assert "β = 1000: an overtake" not in w
    assert "fit_argmin_t_vs_log_beta: 2 points" in w and "R² is not reported" in w


def test_summary_reports_which_reading_holds_the_mass():
    mE = np.array([[0, .6, .9, .3, 0, 0]] * 4)
    mV = np.array([[0, 0, .1, .6, .9, .95]] * 4)
    mM = np.zeros((4, 6))
    w2 = np.array([[.5, .2, .1, .2, .3, .3]] * 4)
    res = analyse({"metastable_mass": 0.1}, _dataset([300.0, 1000.0, 3000.0, 1e4], mE, mV, w2, mM))
    r = res["conjecture_1_readings"]["beta=1000"]
    assert r["chosen"] == "real part" and r["final_mass_V_real_part"] == 0.95
    assert r["final_mass_V_magnitude"] == 0.0
    f = res["fit_overtake_t_vs_log_beta"]
    assert f["n_points"] == 4 and f["slope"] == pytest.approx(0.0) and "warning" not in f
