"""The ``control`` experiment kind through the engine: a sweep over L in chunks, resume, statuses."""

import json

import numpy as np
import pytest
import xarray as xr

from jaxdyn.experiments import run_experiment

TINY = {
    "kind": "control", "name": "tiny_control", "problem": "sphere_clusters", "n_particles": 10,
    "dtype": "float64", "adam_steps": 4, "continuation_adam_steps": 2, "lbfgs_steps": 2,
    "max_layers": 2, "n_depths": 2, "target": {"clusters": 3},
    "sweep": {"n_layers": [1, 2]},
}


def _quiet(cfg, out, **kw):
    return run_experiment(cfg, out, progress=False, log=lambda *_: None, **kw)


def _load(path):
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return ds.load()


@pytest.mark.slow  # over 30 s of CPU (the compilations of two depths' optimisers)
def test_sweep_over_depth_resumes_to_the_same_dataset_and_reports_the_budget(tmp_path):
    """One chunk a depth; a run cut after the first chunk resumes to the uninterrupted Dataset.

    Two L-BFGS iterations do not reach a stationary point: every point is ``not_converged``,
    named with the reason in ``summary.json``, and the run's status is ``all_unsuccessful``
    with the points counted by result (no point is non-finite: exit 0).
    """
    out = tmp_path / "run"
    first = _quiet(TINY, out)
    assert first.status == "all_unsuccessful" and first.chunks_computed == 2
    ref = _load(out / "data.nc")
    # an interruption after the first chunk: the later chunk and the data file are missing
    (out / "chunks" / "chunk_00001.npz").unlink()
    (out / "data.nc").unlink()
    computed = []
    again = _quiet(TINY, out, resume=True, compute_hook=computed.append)
    assert computed == [1] and again.chunks_skipped == 1
    new = _load(out / "data.nc")
    wall = ["seconds"]  # the optimisation's wall time, the one value a rerun changes
    xr.testing.assert_identical(ref.drop_vars(wall).drop_attrs(), new.drop_vars(wall).drop_attrs())
    assert ref["particles"].dims == ("n_layers", "depth", "particle", "component")
    np.testing.assert_allclose(np.linalg.norm(ref["particles"].values, axis=-1), 1.0, atol=1e-12)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "all_unsuccessful"
    assert summary["point_results"] == {"not_converged": 2}
    res = summary["results"]
    assert [r["n_layers"] for r in res["by_depth"]] == [1, 2]
    assert all(r["statuses"] == ["not_converged"] for r in res["by_depth"])
    assert [p["n_layers"] for p in res["not_converged"]] == [1, 2]
    assert all("budget" in p["stop"] for p in res["not_converged"]) and res["nonfinite"] == []
    floor = res["by_particles"][0]["w2_floor"]
    assert floor > 0 and floor == pytest.approx(float(ref["w2_floor"].values[0]))


@pytest.mark.slow  # 73 s of CPU measured (one optimiser's compilation)
def test_nonfinite_optimisation_is_the_run_status(tmp_path):
    """A start whose flow overflows ends ``nonfinite``: the point is named, with the reason."""
    cfg = {**TINY, "problem": "gaussian_to_mixture", "init_scale": 1e3, "n_layers": 1,
           "max_layers": 1, "target": {"clusters": 2}, "sweep": {"seed": [0]}}
    res = _quiet(cfg, tmp_path / "run")
    assert res.status == "nonfinite"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "nonfinite" and summary["nonfinite_points"] == [{"seed": 0}]
    bad = summary["results"]["nonfinite"]
    assert [p["seed"] for p in bad] == [0] and "non-finite" in bad[0]["stop"]
    assert summary["results"]["by_depth"][0]["statuses"] == ["nonfinite"]


def test_guide_sentence_of_a_recorded_run_states_its_grid_statuses_and_cost():
    """The guide's ``run`` renderer: depths, sizes, seeds a point, statuses with reasons, cost;
    no W2 (the shipped configs run one seed a point)."""
    from jaxdyn.experiments.control.summary import GUIDE_RENDERERS

    row = lambda L, st: {"n_layers": L, "n_particles": 64, "points": 2, "statuses": st,  # noqa: E731
                         "w2_exact": 0.123456}
    res = {"results": {"by_depth": [row(1, ["successful", "not_converged"]),
                                    row(4, ["not_converged", "not_converged"])],
                       "not_converged": [{"n_layers": 1, "seed": 1, "stop": "the budget ran out"},
                                         {"n_layers": 4, "seed": 0, "stop": "stalled"}]},
           "meta": {"cpu_seconds": 12.4, "wall_seconds": 20.0,
                    "machine": {"cores": 2, "cpu": "Test CPU"}}}
    text = GUIDE_RENDERERS["run"](res)
    assert text.startswith("L = 1, 4 at N = 64, 2 seeds a point: 4 points, "
                           "3 `not_converged`, 1 `successful` (stalled; the budget ran out); "
                           "12 CPU-s, 20 s wall on 2 CPU cores"), text
    assert "0.12" not in text
