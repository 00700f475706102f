"""The gaussian guide's renderers and the per-seed readings they show.

Each renderer of :data:`jaxdyn.experiments.gaussian.summary.GUIDE_RENDERERS` is checked on a
small synthetic result dict; the per-seed error readings on a synthetic Dataset.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from jaxdyn.experiments import guide_numbers as gn
from jaxdyn.experiments.gaussian import summary as S

META = {"wall_seconds": 103.4, "machine": {"cores": 2, "cpu": "Test CPU"}}


def _trajectory():
    per_seed = [[0.2, 0.25, 0.3], [0.1, 0.12, 0.15]]  # per N, per seed
    return {"kind": "gaussian", "meta": META, "results": {
        "closure": {"blowup_time": 0.7682323744759669, "trace_vs_closed_form_max_relative_error": 5.14e-10},
        "error_vs_n": {
            "time": 3.0, "seeds": 3,
            "per_activation": {
                "identity": {"n": [250, 1000], "fitted_loglog_slope": -0.5712,
                             "fitted_loglog_slope_jackknife_se": 0.043,
                             "fitted_loglog_slope_per_seed": [-0.4, -0.5, -0.6],
                             "bures_to_closure_per_seed": per_seed},
                "relu": {"n": [250, 1000], "fitted_loglog_slope": 0.01,
                         "fitted_loglog_slope_per_seed": [-0.02, 0.0, 0.05],
                         "bures_to_closure_per_seed": [[0.9, 0.8, 1.0], [0.85, 0.9, 0.95]]}},
            "identity_slope_over_time": [
                {"t": 0.12, "tilt_index": 0.66, "predicted_exponent": -0.5, "fitted_slope": -0.4526,
                 "fitted_slope_jackknife_se": 0.0396, "fitted_slope_per_seed": [-0.3, -0.5, None]},
                {"t": 0.62, "tilt_index": 3.28, "predicted_exponent": -0.0852, "fitted_slope": -0.102,
                 "fitted_slope_per_seed": [-0.1, -0.2, 0.0]},
                {"t": 0.88, "tilt_index": None, "predicted_exponent": None, "fitted_slope": None,
                 "fitted_slope_jackknife_se": None, "fitted_slope_per_seed": [None, None, None]}]},
        "tilt_index": {"first_time_at_least_1": 0.32},
        "parting": {"threshold": 0.25, "per_n": {
            "500": {"parting_time_per_seed": [0.56, 0.66, 0.6]},
            "250": {"parting_time_per_seed": [0.44, 0.02, 0.58]}}},
    }}


def _phase():
    return {"kind": "gaussian", "meta": META, "results": {
        "grid": {"a": [-2.0, 2.0, 81], "c": [-2.0, 2.0, 81], "points": 6561, "v": 1.0},
        "blowup_classification_agreement": 1.0, "status_counts": {"blowup": 2361, "large": 1},
        "large_theory_blowup_time_minus_t1": [0.0]}}


def test_gaussian_renderers_are_registered():
    """The kind's renderers are those the generator finds, next to the shared ones."""
    table = gn.renderers("gaussian")
    for name, fn in S.GUIDE_RENDERERS.items():
        assert table[name] is fn
    assert "phase_blowup" in table and "blowup" in table  # the shared ones are kept


def test_slope_shows_the_pooled_slope_and_the_seeds_spread():
    """The pooled slope, then the per-seed slopes as mean (range)."""
    text = S.guide_slope(_trajectory())
    assert "**−0.57 ± 0.04**" in text
    assert "−0.50 (−0.60 to −0.40) over 3 seeds" in text
    assert "t = 3.0" in text and "N = 250–1000" in text


def test_closed_form_blowup_time_and_seeds():
    """Single readings: closed-form agreement, T*, counts, the tilt crossing."""
    res = _trajectory()
    assert S.guide_closed_form(res) == "5e−10"
    assert S.guide_blowup_time(res) == "0.768232"
    assert S.guide_seeds_ns(res) == "N = 250–1000, 3 seeds"
    assert S.guide_tilt_crossing(res) == "t = 0.32"
    res["results"]["tilt_index"]["first_time_at_least_1"] = None
    assert S.guide_tilt_crossing(res) == "never"


def test_relu_distance_at_smallest_and_largest_n():
    """The ReLU distance per seed at both ends of N, and its slope."""
    text = S.guide_relu(_trajectory())
    assert text.startswith("0.90 (0.80–1.0) at N = 250 and 0.90 (0.85–0.95) at N = 1000")
    assert "over 3 seeds" in text and "0.010 (−0.020 to 0.050)" in text


def test_parting_table_is_sorted_by_n_with_its_spread():
    """Parting times per N in numeric order, mean (range) over seeds."""
    res = _trajectory()
    table = S.guide_parting(res).splitlines()
    assert table[0] == "| N | 250 | 500 |"
    assert table[2].endswith("| 0.35 (0.020–0.58) | 0.61 (0.56–0.66) |")
    assert "over 3 seeds" in table[2]
    assert S.guide_parting_threshold(res) == "0.25"


def test_slopes_max_z_over_the_times_with_a_standard_error():
    """Only the times with a fit and a standard error count; |−0.4526 + 0.5| / 0.0396 = 1.2."""
    assert S.guide_slopes_max_z(_trajectory()) == "1.2"


def test_slopes_over_time_table_marks_missing_seeds():
    """A seed without a slope is counted out ([k of n]); a time with no slope is left out."""
    table = S.guide_slopes_over_time(_trajectory()).splitlines()
    assert len(table) == 4
    assert table[2] == "| 0.12 | 0.66 | −0.50 | −0.45 ± 0.04 | 1.2 | −0.40 (−0.50 to −0.30) [2 of 3] |"
    assert table[3] == "| 0.62 | 3.3 | −0.085 | −0.10 | — | −0.10 (−0.20 to 0.0) |"  # no SE: no z


def test_phase_grid_large_and_wall():
    """The grid's agreement count, the large points, the wall time."""
    res = _phase()
    assert S.guide_phase_grid(res) == ("a 81 × 81 grid in one batched solve; blow-up or not agrees "
                                       "with the closed form at 6561 of its 6561 points")
    assert S.guide_phase_large(res) == "1 point ends `large` (closed-form T* − t1 = 0.0)"
    res["results"]["status_counts"] = {"blowup": 2361}
    assert S.guide_phase_large(res) == "no point ends `large`"
    assert S.guide_wall(res) == "103 s"
    assert S.guide_machine(res) == "2 CPU cores (Test CPU)"


def test_seed_errors_and_slopes_read_each_seed():
    """Each seed's error against N gives its own slope."""
    ns, seeds, ts = [100, 400, 1600], [0, 1, 2], np.array([0.0, 1.0])
    scale = np.array([1.0, 2.0, 0.5])
    # the error of seed k at N: scale_k N^(-1/2) (t = 1), 0 at t = 0
    b = np.zeros((len(ns), len(seeds), 1, ts.size))
    for i, n in enumerate(ns):
        b[i, :, 0, 1] = scale / np.sqrt(n)
    ds = xr.Dataset({"bures": (("n", "seed", "activation", "t"), b)},
                    coords={"n": ns, "seed": seeds, "activation": ["identity"], "t": ts})
    cfg = {"n": 100, "seed": 0, "activation": "identity"}
    got_ns, errs = S.seed_errors(cfg, ds, "identity")
    assert list(got_ns) == ns and errs.shape == (3, 3, 2)
    np.testing.assert_allclose(errs[:, 1, 1], 2.0 / np.sqrt(ns))
    assert S.seed_slopes(got_ns, errs[:, :, 1]) == pytest.approx([-0.5] * 3)
    assert S.seed_slopes(got_ns, errs[:, :, 0]) == [None] * 3  # no usable point


def test_relu_first_order_skips_covariances_that_are_not_psd():
    """Σ + tΔΣ̇ leaves the PSD cone inside the first quarter of [0, t1]: NaN there, no refusal."""
    from pathlib import Path

    import yaml

    from jaxdyn.experiments import resolve_config
    from jaxdyn.experiments.gaussian.schema import parameters

    cfg = resolve_config(yaml.safe_load(
        (Path(__file__).parents[1] / "configs" / "gaussian_stable.yaml").read_text()))
    p = parameters(cfg)
    ts = np.linspace(0.0, 12.0, 121)
    ds = xr.Dataset({"mean_closure": (("t", "i"), np.tile(p["m0"], (ts.size, 1))),
                     "cov_closure": (("t", "i", "j"), np.tile(p["S0"], (ts.size, 1, 1)))},
                    coords={"t": ts})
    w, (_, dS) = S.relu_first_order(cfg, ds)
    S1 = p["S0"] + ts[:, None, None] * dS
    psd = np.linalg.eigvalsh(S1)[:, 0] >= 0
    early = ts <= 3.0
    assert (early & ~psd).any()  # the case that used to be refused
    assert np.all(np.isfinite(w[early & psd])) and w[0] == pytest.approx(0.0, abs=1e-12)
    assert np.all(np.isnan(w[~(early & psd)]))


def test_jackknife_standard_error_of_the_pooled_slope():
    """Leave-one-seed-out fits: zero spread for seeds on one power law, None below 3 seeds."""
    ns = np.array([100.0, 400.0, 1600.0])
    same = np.outer(ns ** -0.5, [1.0, 2.0, 0.5, 1.5])
    assert S.jackknife_slope_se(ns, same) == pytest.approx(0.0, abs=1e-12)
    assert S.jackknife_slope_se(ns, same[:, :2]) is None
    rng = np.random.default_rng(0)
    noisy = same * np.exp(0.3 * rng.standard_normal(same.shape))
    loo = [S.fit_slope(ns, np.sqrt(np.mean(np.delete(noisy, j, axis=1) ** 2, axis=1))) for j in range(4)]
    want = np.sqrt(3 / 4 * np.sum((np.array(loo) - np.mean(loo)) ** 2))
    assert S.jackknife_slope_se(ns, noisy) == pytest.approx(want)
