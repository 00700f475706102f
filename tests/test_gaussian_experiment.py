"""The ``gaussian`` experiment kind end to end from the CLI (tiny sizes): trajectory and
phase-diagram studies, their numbers against closed forms, and config errors named before
any compute."""

import json
import math

import numpy as np
import pytest
import xarray as xr
import yaml
from scipy.linalg import sqrtm

from _references import riccati_blowup_time, riccati_covariance
from jaxdyn import cli
from jaxdyn.experiments import gaussian as G
from jaxdyn.gaussian import bures_distance, relu_initial_rates

STABLE = {
    "kind": "gaussian", "name": "tiny_stable", "study": "trajectory", "d": 2, "dtype": "float64",
    "A": [[0.4, 1.5], [-1.5, 0.3]], "B": [[0.8, 0.4], [-0.2, 0.5]],
    "V": [[-0.8, 0.0], [0.0, -0.8]], "b": [0.5, -0.3], "m0": [0.3, -0.5],
    "S0": [[0.8, 0.3], [0.3, 0.4]], "t1": 0.5, "dt": 0.05, "save_every": 1,
    "snapshots": [0.0, 0.5], "snapshot_particles": 50,
    "sweep": {"n": [64, 256], "seed": [0, 1, 2], "activation": ["identity", "relu"]},
}

BLOWUP = {
    "kind": "gaussian", "name": "tiny_blowup", "study": "trajectory", "d": 2, "dtype": "float64",
    "A": [[0.2, 0.5], [-0.5, 0.1]], "B": [[1.0, 0.2], [-0.2, 0.5]], "V": [[1.0, 0.0], [0.0, 1.0]],
    "b": [0.2, 0.0], "m0": [0.5, 0.0], "S0": [[0.5, 0.15], [0.15, 0.3]], "t1": 1.0, "dt": 0.05,
    "save_every": 2, "snapshots": [0.0, 1.0], "snapshot_particles": 20,
    "sweep": {"n": [100, 200], "seed": [0, 1]},
}

PHASE = {
    "kind": "gaussian", "name": "tiny_phase", "study": "phase_diagram", "d": 2, "dtype": "float64",
    "S0": [[1.0, 0.0], [0.0, 0.5]], "t1": 2.0,
    "phase": {"a": [-1.9, 1.7, 7], "c": [-1.7, 1.9, 7], "v": 1.0},
}


def _write(tmp_path, cfg, name="c.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    return str(p)


def _run(tmp_path, cfg, capsys):
    out = tmp_path / "run"
    rc = cli.main(["run", _write(tmp_path, cfg), "--out", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return out, json.loads((out / "summary.json").read_text())


@pytest.mark.slow  # a whole CLI experiment (20 s); the kind's other tests run in the default suite
def test_blowup_trajectory_runs_from_the_cli(tmp_path, capsys):
    """The default end-to-end test: blow-up of the closure, identity and ReLU particles."""
    cfg = {**BLOWUP, "sweep": {**BLOWUP["sweep"], "activation": ["identity", "relu"]}}
    out, summary = _run(tmp_path, cfg, capsys)
    assert summary["status"] == "ok"  # a blow-up of the closure is not a non-finite run
    for f in ["config.yaml", "summary.json", "data.nc", "ellipses.png", "trace.png",
              "error_vs_n.png", "parting.png", "relu.png"]:
        assert (out / f).exists(), f
    res = summary["results"]
    c = res["closure"]
    assert c["status"] == "blowup"
    assert c["blowup_time_relative_error"] < 1e-8
    assert c["trace_vs_closed_form_max_relative_error"] < 1e-7
    T = c["blowup_time"]
    # against T* computed independently of jaxdyn (the linear ODE of Σ⁻¹, V = I: expm)
    T_ref = riccati_blowup_time(BLOWUP["A"], BLOWUP["B"], BLOWUP["S0"], BLOWUP["t1"])
    assert abs(T - T_ref) < 1e-8
    for n, row in res["parting"]["per_n"].items():
        assert all(0.0 < t <= T for t in row["parting_time_per_seed"]), row
        assert row["trace_ratio_at_blowup_detection"] < 0.75  # last save before T*: t = 0.7
        assert math.isfinite(row["max_radius_at_t1"])
    # the tilt index ‖Σ^½ B Σ^½‖₂ of the exact Σ(t) (expm, scipy's sqrtm) first reaches 1 at a
    # saved time (every 0.1) before T*: the summary's time
    saved = [t for t in np.linspace(0.0, 1.0, 11) if t < T_ref]
    B = np.asarray(BLOWUP["B"])
    tilt = [np.linalg.norm(sqrtm(S) @ B @ sqrtm(S), 2) for S in
            (riccati_covariance(BLOWUP["A"], B, BLOWUP["S0"], t) for t in saved)]
    first = saved[next(i for i, s in enumerate(tilt) if s >= 1)]
    assert res["tilt_index"]["first_time_at_least_1"] == pytest.approx(first, abs=1e-9)
    err = res["error_vs_n"]["per_activation"]
    assert err["identity"]["n"] == [100, 200] and len(err["relu"]["rms_bures_to_closure"]) == 2
    assert set(res["relu"]) >= {"over_time", "initial_rate_difference_mean"}
    with xr.open_dataset(out / "data.nc", engine="h5netcdf") as ds:
        assert set(ds["bures"].dims) == {"n", "seed", "activation", "t"}
        np.testing.assert_allclose(ds["t"].values, np.linspace(0.0, 1.0, 11), atol=1e-12)
        assert bool(ds["finite"].all())
        assert np.all(np.isnan(ds["cov_closure"].sel(t=slice(0.8, None)).values))
        # the stored Bures error is the distance between the stored moments
        sel = dict(n=1, seed=1, activation=0, t=5)
        w = bures_distance(ds["mean_particles"].isel(sel).values, ds["cov_particles"].isel(sel).values,
                    ds["mean_closure"].isel(sel).values, ds["cov_closure"].isel(sel).values)
        np.testing.assert_allclose(w, ds["bures"].isel(sel).values, rtol=1e-10)
        # ReLU and identity runs start from the same clouds, then differ
        x = ds["x_snapshot"]
        np.testing.assert_array_equal(x.sel(activation="identity").isel(t_snapshot=0).values,
                                      x.sel(activation="relu").isel(t_snapshot=0).values)
        assert not np.allclose(x.sel(activation="identity").isel(t_snapshot=-1).values,
                               x.sel(activation="relu").isel(t_snapshot=-1).values)
    # redraw from saved results
    rc = cli.main(["report", str(out)])
    assert rc == 0 and "redrew 5 figure(s)" in capsys.readouterr().out


@pytest.mark.slow
def test_stable_trajectory_runs_from_the_cli(tmp_path, capsys):
    out, summary = _run(tmp_path, STABLE, capsys)
    assert summary["status"] == "ok"
    res = summary["results"]
    assert res["closure"]["status"] == "successful"
    # closure (Dopri8) against the closed form Σ = P⁻¹ (V = vI)
    assert res["closure"]["trace_vs_closed_form_max_relative_error"] < 1e-8
    assert res["tilt_index"]["first_time_at_least_1"] is None
    assert "parting" not in res
    with xr.open_dataset(out / "data.nc", engine="h5netcdf") as ds:
        # at t = 0 the particles are i.i.d. N(m0, S0): seed mean of m̂ within 4 SE of m0
        m = ds["mean_particles"].sel(n=256, activation="identity").isel(t=0).values  # (seed, d)
        se = np.sqrt(np.diag(np.asarray(STABLE["S0"])) / 256 / 3)
        assert np.all(np.abs(m.mean(0) - np.asarray(STABLE["m0"])) < 4 * se)
    for f in ["ellipses.png", "trace.png", "error_vs_n.png", "relu.png"]:
        assert (out / f).exists(), f


@pytest.mark.slow
def test_phase_diagram_matches_scalar_closed_form(tmp_path, capsys):
    out, summary = _run(tmp_path, PHASE, capsys)
    res = summary["results"]
    assert res["grid"]["points"] == 49
    assert res["blowup_classification_agreement"] == 1.0
    assert res["blowup_time_max_relative_error"] < 1e-7
    assert res["trace_t1_max_relative_error"] < 1e-7
    assert res["status_counts"].get("blowup", 0) > 5 and res["status_counts"].get("successful", 0) > 5
    with xr.open_dataset(out / "data.nc", engine="h5netcdf") as ds:
        assert ds["blowup_time"].dims == ("a", "c")
        np.testing.assert_allclose(ds["a"].values, np.linspace(-1.9, 1.7, 7))
        # blow-up iff c > 0 and c λmax + a > 0 with T* < t1; spot check a = 1.1, c = 1.3
        i, j = 5, 5
        a, cc = ds["a"].values[i], ds["c"].values[j]
        T = math.log(1 + a / (cc * 1.0)) / (2 * a)
        assert abs(float(ds["blowup_time"].values[i, j]) - T) < 1e-8 * T
    assert (out / "phase_diagram.png").exists()


@pytest.mark.parametrize("name", ["gaussian_stable", "gaussian_blowup", "gaussian_phase_diagram"])
def test_configs_resolve_and_survive_a_yaml_round_trip(name):
    """The shipped configs validate, and the resolved config hashes the same after being
    written and read back (what ``--resume`` compares)."""
    from pathlib import Path

    from jaxdyn.config import config_hash
    from jaxdyn.experiments import get_kind, resolve_config

    raw = yaml.safe_load((Path(__file__).parents[1] / "configs" / f"{name}.yaml").read_text())
    cfg = resolve_config(raw)
    assert cfg["kind"] == "gaussian"
    get_kind("gaussian").check(cfg)
    again = resolve_config(yaml.safe_load(yaml.safe_dump(cfg, sort_keys=False)))
    assert config_hash(again) == config_hash(cfg)


@pytest.mark.parametrize("patch,needle", [
    ({"A": [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]}, "'A': expected a 2×2 matrix"),
    ({"S0": [[1.0, 0.5], [0.0, 1.0]]}, "'S0': must be symmetric"),
    ({"S0": [[1.0, 2.0], [2.0, 1.0]]}, "'S0': must be positive semi-definite"),
    ({"b": [1.0, 2.0, 3.0]}, "'b': expected 2 numbers"),
    ({"m0": [1.0]}, "'m0': expected 2 numbers"),
    ({"error_time": 5.0}, "'error_time': must be <= t1"),
    ({"parting_threshold": 1.5}, "'parting_threshold': must be in (0, 1)"),
    ({"activation": "tanh"}, "'activation': must be one of"),
    ({"n": 1}, "'n': must be >= 2"),
    ({"study": "phase_diagram", "phase": {"a": [1.0, -1.0, 5]}}, "'phase.a'"),
    ({"study": "phase_diagram"}, "study phase_diagram"),  # sweeps over n/seed/activation
])
def test_bad_config_is_named_before_compute(tmp_path, capsys, patch, needle):
    cfg = {**STABLE, **patch}
    rc = cli.main(["run", _write(tmp_path, cfg), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert needle in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "chunks").exists()


def test_relu_initial_rates_limits():
    """Stein rates of the ReLU field: the identity closure's rates far in the positive orthant,
    the attention-only rates (A = 0) far in the negative orthant."""
    p = G.parameters({**STABLE, "sweep": {}})
    dm, dS = relu_initial_rates(**p)
    # Stein rates reduce to the identity closure's rates when the cloud is far in the
    # positive orthant (D = I, E relu(x) = m)
    q = {**p, "m0": np.array([30.0, 40.0])}
    from jaxdyn.gaussian import moment_rhs
    import jax.numpy as jnp

    dmq, dSq = relu_initial_rates(**q)
    dmi, dSi = moment_rhs(*(jnp.asarray(q[k], jnp.float64) for k in ("m0", "S0", "A", "B", "V", "b")))
    np.testing.assert_allclose(dmq, np.asarray(dmi), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dSq, np.asarray(dSi), rtol=1e-12, atol=1e-12)
    # and to A·0 for the feed-forward part when it is far in the negative orthant
    r = {**p, "m0": np.array([-30.0, -40.0])}
    dmr, dSr = relu_initial_rates(**r)
    dmi0, dSi0 = moment_rhs(*(jnp.asarray({**r, "A": np.zeros((2, 2))}[k], jnp.float64)
                              for k in ("m0", "S0", "A", "B", "V", "b")))
    np.testing.assert_allclose(dmr, np.asarray(dmi0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dSr, np.asarray(dSi0), rtol=1e-12, atol=1e-12)
    assert np.linalg.norm(dm) > 0 and np.all(np.isfinite(dS))
