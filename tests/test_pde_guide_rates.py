"""The density guide's closed-form rates (docs/results/pde/pde_linear_rates.json) and the engine-run phrase."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxdyn import pde
from jaxdyn.experiments import guide_numbers as gn
from jaxdyn.experiments.pde import linear_rates
from jaxdyn.experiments.pde import summary as pde_summary
from jaxdyn.experiments.sphere import summary as sphere_summary

ROOT = Path(__file__).resolve().parents[1]
RATES = ROOT / "docs/results/pde/pde_linear_rates.json"


def test_committed_rates_are_the_closed_form_at_the_cluster_runs_beta():
    """The result file holds λ_k at the cluster run's β, with its k* and the neighbours' ratios."""
    res = json.loads(RATES.read_text())
    fresh = linear_rates.measure(ROOT / linear_rates.CLUSTERS, ROOT / linear_rates.PARTICLES)
    clusters = json.loads((ROOT / linear_rates.CLUSTERS).read_text())["results"]["points"]
    k_star = {p["beta"]: p["k_star"] for p in clusters}
    assert [p["beta"] for p in res["results"]["points"]] == sorted(k_star)
    for got, new in zip(res["results"]["points"], fresh["points"]):
        assert got["k_star"] == new["k_star"] == k_star[got["beta"]]
        np.testing.assert_allclose(got["rates"], new["rates"], rtol=1e-12)
        lam = got["rates"]
        k = got["k_star"]
        assert lam[k - 1] == max(lam)
        np.testing.assert_allclose(got["next_ratio"], lam[k] / lam[k - 1], rtol=1e-12)
    for got, new in zip(res["results"]["particles"]["points"], fresh["particles"]["points"]):
        np.testing.assert_allclose(got["iid_window"], new["iid_window"], rtol=1e-12)


def test_rates_renderers_on_a_small_result():
    ks = np.arange(1, 9)
    pts = []
    for b in (3.0, 5.0, 20.0):
        lam = pde.linear_rates(b, ks)
        k = pde.most_unstable_mode(b)
        pts.append({"beta": b, "k_star": k, "lambda_star": float(lam[k - 1]),
                    "rates": lam.tolist(), "prev_ratio": float(lam[k - 2] / lam[k - 1]),
                    "next_ratio": float(lam[k] / lam[k - 1]),
                    "iid_window": float(np.log(0.1 * 100) / lam[k - 1])})
    res = {"results": {"points": pts, "particles": {"n": 10000, "mode_threshold": 0.1, "points": pts}}}
    R = pde_summary.GUIDE_RENDERERS
    assert R["rates_particle_next"](res) == "0.96, 0.88, 0.98 at β = 3, 5, 20"
    assert R["rates_particle_next_slower"](res) == "3.8 %, 12 %, 1.9 % at β = 3, 5, 20"
    assert R["rates_iid_window"](res) == "3.8, 3.4, 3.2 time units at β = 3, 5, 20"
    assert R["rates_next_beta10"](res) == "0.98"
    table = R["rates_table"](res).splitlines()
    assert len(table) == 2 + len(pts) and table[3].startswith("| 5 | 3 | 0.683 | 0.753 | 0.879 |")
    assert "rates_table" in gn.renderers("pde")


def test_engine_run_phrase():
    meta = {"machine": {"cores": 2, "cpu": "CPU"}, "n_chunks": 24, "wall_seconds": 73.5,
            "compile_seconds": 8.1, "cpu_seconds": 60.2, "estimated_process_bytes": 781 * 2 ** 20,
            "measured_peak_rss_bytes": 435.2 * 2 ** 20}
    assert sphere_summary.GUIDE_RENDERERS["engine_run"]({"meta": meta}) == (
        "on 2 CPU cores (CPU): 24 chunks in 74 s of wall time for the whole run (8.1 s compiling, "
        "60 CPU-s); the engine estimated ≤ 781 MiB for the process at start and measured a peak "
        "of 435 MiB")
