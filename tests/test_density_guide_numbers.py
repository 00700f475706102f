"""The density guide's renderers (``GUIDE_RENDERERS`` of the pde kind) on small synthetic results.

Each renderer reads a result file of ``jaxdyn.experiments.guide_numbers`` (``{"kind": "pde",
"meta", "results"}``); these tests build the smallest such dicts by hand and check the text.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from jaxdyn.experiments import guide_numbers as gn
from jaxdyn.experiments.pde import summary as S

MACHINE = {"cpu": "Test CPU", "cores": 2, "platform": "x", "python": "3"}


def _meta(config, cpu=12.4, wall=30.6):
    return {"config": config, "machine": MACHINE, "cpu_seconds": cpu, "wall_seconds": wall}


def _point(beta, seed, k_star, count, t, mode=None, mode_t=None, merge=None, final=None, **extra):
    return {"beta": beta, "seed": seed, "k_star": k_star, "first_cluster_count": count,
            "first_cluster_time": t, "first_mode": k_star if mode is None else mode,
            "first_mode_time": t - 6 if mode_t is None else mode_t, "first_merge_time": merge,
            "final_cluster_count": count if final is None else final,
            "growth_rate_max_rel_error": 1e-13 if beta >= 10 else 1e-9,
            "growth_rate_max_abs_error": 1e-14 * beta, "mass_error": 1e-15, "min_rho": 0.0, **extra}


CLUSTERS_CFG = "t1: 300.0\ngrowth_k: 16\nm: 512\nparticles:\n  cluster_n: 10000\n"


def _clusters():
    pts = [_point(5.0, s, 3, 3, 35.0 + s) for s in (0.0, 1.0)]
    pts += [_point(50.0, 0.0, 10, 10, 34.0, merge=37.0, final=9, before_merge_masses=[0.03, 0.09, 0.12]),
            _point(50.0, 1.0, 10, 9, 36.0, mode=9)]
    return {"kind": "pde", "meta": _meta(CLUSTERS_CFG),
            "results": {"points": pts, "max_mass_error": 1.5e-14, "min_rho": 2.5e-70}}


def _particles_entry(count, t, mode, seconds=1.0):
    return {"first_cluster_count": count, "first_cluster_time": t, "first_mode": mode,
            "first_mode_time": t - 5, "count_at_solver_time": count, "seconds": seconds}


def _cluster_particles():
    pts = []
    for s, iid in ((0.0, (3, 11.0, 3)), (1.0, (4, 12.0, 3))):
        p = _point(5.0, s, 3, 3, 35.0)
        p["particles"] = {"quantile": _particles_entry(3, 35.0, 3), "iid": _particles_entry(*iid)}
        pts.append(p)
    p = _point(20.0, 0.0, 6, 6, 34.0)
    p["particles"] = {"quantile": _particles_entry(6, 33.0, 6), "iid": _particles_entry(6, 11.0, 7)}
    pts.append(p)
    return {"kind": "pde", "meta": _meta(CLUSTERS_CFG), "results": {"points": pts}}


def test_run_and_scalars():
    """The run's cost, mass, positivity and growth-rate errors."""
    res = _clusters()
    assert S.guide_run(res) == "12 CPU-s, 31 s wall on 2 CPU cores (Test CPU)"
    res["meta"]["cpu_seconds"] = None
    assert S.guide_run(res) == "31 s wall on 2 CPU cores (Test CPU)"
    assert S.guide_mass(res) == "1.5e−14"
    assert S.guide_min_rho(res) == "2.5e−70"
    assert S.guide_growth_abs(res) == "5.0e−13"   # the largest, at β = 50
    assert S.guide_growth_rel_beta10(res) == "1.0e−13"  # β ≥ 10 only
    assert S.guide_growth_k(res) == "k = 1..16"


def test_first_clusters_readings():
    """First counts against k*, their exceptions, times and the per-β table."""
    res = _clusters()
    assert S.guide_first_count(res) == "3 of 4 runs"
    assert S.guide_first_exceptions(res) == "β = 50, seed 1: 9 instead of 10"
    assert S.guide_solver_mode(res) == "3 of 4"
    assert S.guide_sweep(res) == "β ∈ {5, 50} × 2 seeds; k* = 3, 10"
    assert S.guide_first_time_range(res) == "34–36"
    table = S.guide_clusters_table(res).splitlines()
    assert len(table) == 4
    assert table[2] == "| 5 | 3 | 2 | 3 | 35.5 (35.0–36.0) | 3 | 29.5 (29.0–30.0) |"
    assert table[3].startswith("| 50 | 10 | 2 | 9 (×1), 10 (×1) | 35.0 (34.0–36.0) | 9 (×1), 10 (×1) |")
    pts = res["results"]["points"]
    for p in pts:
        p["first_cluster_count"] = p["k_star"]
    assert S.guide_first_exceptions(res) == "no exception"


def test_merges():
    """The σ = 0 merges in words and the merges table."""
    res = _clusters()
    assert S.guide_merges(res) == ("1 of its 4 runs drop a cluster by t = 300 (β = 50 seed 0 at t = 37, 3.0 "
                                   "time units after the first clusters; just before it the smallest cluster "
                                   "held 0.030 of the mass and the others 0.090–0.12)")
    del res["results"]["points"][2]["before_merge_masses"]
    assert S.guide_merges(res) == "1 of its 4 runs drop a cluster by t = 300 (β = 50 seed 0 at t = 37)"
    for p in res["results"]["points"]:
        p["first_merge_time"] = None
    assert S.guide_merges(res) == "no merge happens by t = 300 in any of its 4 runs"
    res = _clusters()
    table = S.guide_merges_table(res).splitlines()
    assert "merge by t = 300" in table[0] and "count at t = 300" in table[0]
    assert table[2] == "| 5 | 3 | 2 | 3 | 35.5 (35.0–36.0) | 0 of 2 | — | 3 |"
    assert table[3] == "| 50 | 10 | 2 | 9 (×1), 10 (×1) | 35.0 (34.0–36.0) | 1 of 2 | 37.0 | 9 |"


def test_cluster_particles():
    """The particles' first clusters against the solver's and k*, per start."""
    res = _cluster_particles()
    table = S.guide_particles_table(res).splitlines()
    assert len(table) == 4
    assert table[2] == "| 5 | 3 | 2 | 3 | 35.0 (35.0–35.0) | 2 of 2 | 3 (×1), 4 (×1) | 11.5 (11.0–12.0) | 3 |"
    assert table[3] == "| 20 | 6 | 1 | 6 | 34.0 | 0 of 1 | 6 | 11.0 | 7 |"  # quantile time 33 ≠ 34
    assert S.guide_quantile_agreement(res) == "2 of 3"
    assert S.guide_iid_count(res) == "2 of 3"
    assert S.guide_iid_mode(res) == "2 of 3"
    assert S.guide_particle_n(res) == "N = 10⁴"
    # a run whose particles did not run is left out
    res["results"]["points"][2]["particles"]["iid"]["seconds"] = None
    assert S.guide_iid_count(res) == "1 of 2"


def test_slope_standard_error_propagates_the_sems():
    """The fitted slope's standard error from the per-N standard errors."""
    ns = [100, 1000, 10000]
    w = [0.2 * n ** -0.5 for n in ns]
    slope, se = S.slope_standard_error(ns, w, [0.0, 0.0, 0.0])
    assert slope == pytest.approx(-0.5) and se == 0.0
    # a relative error r at every N: the slope's standard error is r·√(Σ c_i²)
    slope, se = S.slope_standard_error(ns, w, [0.01 * v for v in w])
    x = np.log(ns)
    c = (x - x.mean()) / np.sum((x - x.mean()) ** 2)
    assert se == pytest.approx(0.01 * math.sqrt(np.sum(c ** 2)))
    assert S.slope_standard_error(ns, w, [None, 0.1, 0.1])[1] is None


PARTICLES_CFG = ("m: 4096\nparticles:\n  n: [100, 316, 1000]\n  repeats: [8, 4, 2]\n  dt: 0.1\n"
                 "  times: [0.0, 6.0]\n")


def _vs_particles():
    ns = [100, 316, 1000]
    per_t = {}
    for t, a in (("t=0", 0.15), ("t=6", 0.3)):
        w = [a * (n / 100) ** -0.5 for n in ns]
        per_t[t] = {"w1": w, "w1_sem": [0.01 * v for v in w], "slope": -0.5, "prefactor": 10 * a,
                    "density_grid_w1_error": 1e-5 if t == "t=6" else 2e-7,
                    "n_equivalent": (10 * a / 1e-5) ** 2 if t == "t=6" else 1.0,
                    "particle_step_seconds_at_n_equivalent": 1234.0}
    per_t["t=6"]["slope"] = -0.48
    fit = {"n": ns, "per_time": per_t, "particle_step_seconds": [1e-3, 3e-3, 1e-2],
           "density_step_seconds": 1.5e-3, "timing_m": 4096}
    return {"kind": "pde", "meta": _meta(PARTICLES_CFG), "results": {"points": [], "particles": [fit]}}


def test_particles_against_density():
    """W1 against N: table, slopes, seeds, the timed steps."""
    res = _vs_particles()
    table = S.guide_w1_table(res).splitlines()
    assert table[0].startswith("| t | W1 at N = 10², 10³ (mean ± standard error) | fitted slope (3 N)")
    assert "(M = 4096 against 16384)" in table[0]
    assert table[2] == "| 0 | 0.150 ± 0.002, 0.0474 ± 0.0005 | −0.500 ± 0.006 | 2.0e−7 |"
    assert table[3].endswith("| 1.0e−5 |")
    assert S.guide_w1_slope_dev(res) == "0.02"
    assert S.guide_w1_repeats(res) == "8, 4, 2 seeds for N = 10², 316, 10³"
    assert S.guide_fourier_run(res) == ("about 1 s of wall time (60 RK4 steps of 10 ms at N = 10³, timed "
                                        "in the run)")
    speed = S.guide_speed(res)
    assert speed.startswith("At t = 6 the density's W1 error is 1.0e−5; the particles reach it (W1 ≈ "
                            "3.00 N^{−1/2}, fitted) at N ≈ 9.0·10¹⁰.")
    assert "at M = 4096 took 1.5 ms and one Fourier RK4 particle step at N = 10³ 10 ms" in speed
    assert speed.endswith("with 9.5·10³ times the density's error, the particle step costs 6.7 density "
                          "steps, and at N ≈ 9.0·10¹⁰ it would cost about 1.2·10³ s (linear in N)")


S2_CFG = "t1: 1.5\nparticles:\n  n: [100, 400]\n  repeats: [8, 4]\n"


def _s2():
    per_t = {"t=0": {"w2_particles": [0.3, 0.15], "w2_null": [0.31, 0.15], "ratio": [0.968, 1.0],
                     "excess": [0.0, 0.0], "w2_particles_sem": [0.01, 0.004], "w2_null_sem": [0.01, 0.004]},
             "t=1.5": {"w2_particles": [0.27, 0.13], "w2_null": [0.2, 0.12], "ratio": [1.35, 1.083],
                       "excess": [0.18, 0.09], "w2_particles_sem": [0.01, 0.003],
                       "w2_null_sem": [0.008, 0.002]}}
    return {"kind": "pde", "meta": _meta(S2_CFG),
            "results": {"points": [{"n": [100, 400], "per_time": per_t, "steps": 831,
                                    "mass_error": 1.1e-16, "min_rho": 1e-3}],
                        "max_mass_error": 1.1e-16, "min_rho": 1e-3}}


def test_s2():
    """S²: the solve, the W2 table, the excess and the ratios."""
    res = _s2()
    assert S.guide_s2_solve(res) == "831 positivity steps to t = 1.5, mass error 1.1e−16, min ρ > 0"
    table = S.guide_s2_table(res).splitlines()
    assert table[0] == ("| t | d_pρ at N = 100, 400 | d_ρρ (null) | ratio d_pρ/d_ρρ | √(d_pρ² − d_ρρ²) |")
    assert table[2] == "| 0 | 0.30 ± 0.01, 0.150 ± 0.004 | 0.31 ± 0.01, 0.150 ± 0.004 | 0.968, 1.00 | 0, 0 |"
    assert table[3].endswith("| 1.35, 1.08 | 0.18, 0.090 |")
    assert S.guide_s2_repeats(res) == "8, 4 seeds for N = 100, 400"
    assert S.guide_s2_excess(res) == "0.18 → 0.090 over a factor 4 in N at t = 1.5: slope −0.50"
    assert S.guide_s2_excess_last(res) == "0.090"
    assert S.guide_s2_ratios_later(res) == "1.08–1.35"
    assert S.guide_s2_ratios_t0(res) == "0.968–1.00"


def test_renderers_are_registered_for_the_kind():
    """guide_numbers finds the kind's renderers."""
    table = gn.renderers("pde")
    assert set(S.GUIDE_RENDERERS) <= set(table)
    for name, fn in S.GUIDE_RENDERERS.items():
        assert table[name] is fn


def test_merge_masses_read_the_frame_before_the_merge():
    """The summary's ``before_merge_masses``: the cluster masses one saved time before the merge."""
    import xarray as xr

    m = 256
    theta = np.arange(m) * 2 * np.pi / m
    two = np.where((np.abs(theta - 1.0) < 0.2) | (np.abs(theta - 4.0) < 0.1), 1.0, 0.0)
    one = np.where(np.abs(theta - 1.0) < 0.3, 1.0, 0.0)
    rho = np.stack([two / (two.sum() * 2 * np.pi / m), one / (one.sum() * 2 * np.pi / m)])
    ds = xr.Dataset({"rho": (("t", "theta"), rho), "first_merge_time": ((), 1.0)},
                    coords={"t": [0.0, 1.0], "theta": theta})
    got = S._merge_masses(ds, ds)["before_merge_masses"]
    assert len(got) == 2 and sum(got) == pytest.approx(1.0, abs=1e-3) and got[0] < got[1]
    assert S._merge_masses(ds.assign(first_merge_time=np.nan), ds.assign(first_merge_time=np.nan)) == {}
