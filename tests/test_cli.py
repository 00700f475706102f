"""The CLI and the experiment engine: config errors before compute, files written, status.

On non-finite states, resume and report. One ``jaxdyn run`` of TINY (a module fixture) is read
by the test of the files written and copied by the resume and report tests, which change their
copy.
"""

import contextlib
import io
import json
import shutil

import numpy as np
import pytest
import xarray as xr
import yaml

from jaxdyn import cli
from jaxdyn.config import ConfigError
from jaxdyn.experiments import resolve_config, run_experiment

TINY = {
    "kind": "sphere", "name": "tiny", "d": 3, "n": 48, "t1": 1.0, "dt": 0.1, "save_every": 2,
    "snapshots": [0.0, 1.0], "sweep": {"beta": [1.0, 10.0, 100.0]}, "chunk_size": 1,
}


def _write(tmp_path, cfg, name="c.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg))
    return str(p)


@pytest.mark.parametrize("patch,needle", [
    ({"colour": "red"}, "unknown config field 'colour'"),
    ({"weights": {"ensemble": "explicit", "Q": [[1, 0], [0, 1]], "K": [[1, 0], [0, 1]],
                  "V": [[1, 0], [0, 1]]}}, "weights.Q': expected a 3×3 matrix"),
    ({"beta": 0.0}, "'beta': must be > 0"),
    ({"sweep": {"beta": [1.0, -1.0]}}, "sweep.beta[1]': must be > 0"),
    ({"dt": -0.1}, "'dt': must be > 0"),
    ({"n": 0}, "'n': must be >= 1"),
    ({"n": 2.5}, "'n': expected an integer"),
    ({"method": "leapfrog"}, "'method': must be one of"),
    ({"weights": {"ensemble": "magic"}}, "unknown ensemble 'magic'"),
    ({"sweep": {"method": ["rk4"]}}, "cannot sweep over 'method'"),
    ({"kind": "nope"}, "unknown experiment kind 'nope'"),
    # (an OverflowError traceback, exit 1)
    ({"n": float("inf")}, "'n': expected an integer"),
    # an empty field read as its default without a word
    ({"t1": None}, "config field 't1' is empty"),
    # explicit weights under the default ensemble 'identity' were ignored without a word
    ({"weights": {"Q": [[2, 0, 0], [0, 1, 0], [0, 0, 1]]}}, "read by ensemble 'explicit' only"),
    # swept t1 gave frame indices where the times belong
    ({"sweep": {"t1": [1.0, 2.0]}}, "cannot sweep over 't1' (final time > 0 (not sweepable"),
    # (named the base d = 3, the one that fits)
    ({"init": {"mu": [1.0, 0.0, 0.0]}, "sweep": {"d": [3, 4]}}, "expected 4 numbers (d = 4 in sweep.d)"),
    # one grid point alone is too big: 'n' is named, not the sweep
    ({"n": 100_000_000}, "config field 'n' (= 100000000): the run needs"),
])
def test_bad_config_is_named_before_compute(tmp_path, capsys, patch, needle):
    cfg = {**TINY, **patch}
    rc = cli.main(["run", _write(tmp_path, cfg), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "chunks").exists()  # nothing computed


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """``jaxdyn run`` of TINY: (exit code, what it printed, the run folder)."""
    tmp = tmp_path_factory.mktemp("cli")
    out = tmp / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = cli.main(["run", _write(tmp, TINY), "--out", str(out), "--quiet"])
    return rc, printed.getvalue(), out


def _copy(run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


def test_run_writes_everything(cli_run):
    rc, printed, out = cli_run
    assert rc == 0
    assert str(out) in printed
    for f in ["config.yaml", "summary.json", "data.nc", "particles.png", "mean_inner_product.png"]:
        assert (out / f).exists(), f
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert summary["chunks_computed"] == 3
    # the process's CPU time is recorded beside the wall times (a number, not a speed claim)
    assert isinstance(summary["process_cpu_seconds"], float)
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["method"] == "rk4" and resolved["sweep"]["beta"] == [1.0, 10.0, 100.0]
    with xr.open_dataset(out / "data.nc", engine="h5netcdf") as ds:
        assert list(ds["beta"].values) == [1.0, 10.0, 100.0]
        assert ds["mean_inner_product"].dims == ("beta", "t")
        np.testing.assert_allclose(ds["t"].values, np.arange(0, 1.01, 0.2), atol=1e-6)
        assert bool(ds["finite"].all())
        x = ds["x_snapshot"].values
        np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, atol=1e-5)


def test_nonfinite_is_a_status(tmp_path, capsys):
    # Unnormalised attention at β = 1000 overflows float32: exp(1000) = inf.
    cfg = {**TINY, "normalization": "unnormalized", "sweep": {"beta": [1.0, 1000.0]}}
    out = tmp_path / "run"
    rc = cli.main(["run", _write(tmp_path, cfg), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 3
    assert "Traceback" not in err and "nonfinite" in err and len(err.strip().splitlines()) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "nonfinite"
    assert summary["nonfinite_points"] == [{"beta": 1000.0}]
    with xr.open_dataset(out / "data.nc", engine="h5netcdf") as ds:
        assert ds["finite"].values.tolist() == [True, False]


def test_resume_skips_finished_chunks(cli_run, tmp_path):
    rc, _, finished = cli_run
    assert rc == 0 and json.loads((finished / "summary.json").read_text())["status"] == "ok"
    out = _copy(finished, tmp_path)
    ref = xr.open_dataset(out / "data.nc", engine="h5netcdf").load()
    # Simulate an interruption after the first chunk: drop the later chunks and the data file.
    for i in (1, 2):
        (out / "chunks" / f"chunk_{i:05d}.npz").unlink()
    (out / "data.nc").unlink()
    computed = []
    res = run_experiment(TINY, out, resume=True, progress=False, log=lambda *_: None,
                         compute_hook=computed.append)
    assert computed == [1, 2] and res.chunks_skipped == 1
    again = xr.open_dataset(out / "data.nc", engine="h5netcdf").load()
    xr.testing.assert_identical(ref.drop_attrs(), again.drop_attrs())
    # Not resuming into a folder with results is refused; resuming another config too.
    with pytest.raises(ConfigError, match="already holds results"):
        run_experiment(TINY, out, progress=False, log=lambda *_: None)
    with pytest.raises(ConfigError, match="config differs"):
        run_experiment({**TINY, "n": 40}, out, resume=True, progress=False, log=lambda *_: None)


def test_report_redraws_figures(cli_run, tmp_path):
    out = _copy(cli_run[2], tmp_path)
    (out / "particles.png").unlink()
    assert cli.main(["report", str(out)]) == 0
    assert (out / "particles.png").exists()


def test_default_config_resolves_and_warns_on_resolution():
    from jaxdyn.config import default_config
    from jaxdyn.experiments import get_kind

    cfg = resolve_config(default_config())
    assert cfg["kind"] in ("sphere", "concentration")
    # N too small for the largest β gets a warning naming the N it would need.
    small = resolve_config({**TINY, "n": 10, "sweep": {"beta": [1.0, 1e4]}})
    warns = get_kind("sphere").check(small)
    assert any("10000" in w and "N = 10" in w for w in warns), warns


def test_kind_default_float64_switches_x64_on(tmp_path):
    # a pde config without a dtype (the kind's default: float64) was refused "float64 needs
    # JAX's x64 mode": the CLI switched x64 on for a dtype written in the file only
    import os
    import subprocess
    import sys

    cfg = _write(tmp_path, {"kind": "pde", "mode": "clusters", "m": 64, "t1": 5.0, "n_save": 11,
                            "sweep": {"beta": [2.0]}})
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    p = subprocess.run([sys.executable, "-m", "jaxdyn.cli", "config", cfg], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "dtype: float64" in p.stdout


@pytest.mark.slow
def test_force_removes_the_old_runs_figures_only(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    old = {**TINY, "name": "old", "sweep": {"beta": [1.0]}}
    (out / "config.yaml").write_text(yaml.safe_dump(resolve_config(old)))
    (out / "summary.json").write_text(json.dumps({"status": "ok", "figures": ["stale.png"]}))
    for f in ("stale.png", "notes.txt", "mine.png"):
        (out / f).write_text("x")
    cfg = {**TINY, "n": 8, "t1": 0.2, "sweep": {"beta": [1.0]}}
    res = run_experiment(cfg, out, progress=False, log=lambda *_: None, force=True)
    assert res.status == "ok"
    assert not (out / "stale.png").exists()  # the old run's figure (it stayed beside new data)
    assert (out / "notes.txt").exists() and (out / "mine.png").exists()  # the user's files
    assert (out / "mean_inner_product.png").exists()


def test_override_into_an_empty_section(tmp_path, capsys):
    # `sweep:` left empty in the YAML, then --set sweep.beta=[...] ("'sweep' is not a section")
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({k: v for k, v in TINY.items() if k != "sweep"}) + "sweep:\n")
    assert cli.main(["config", str(p), "--set", "sweep.beta=[1, 2]"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["sweep"] == {"beta": [1.0, 2.0]}


def test_empty_sections_and_sweep_are_empty():
    # `sweep:` (its lines commented out) is an empty sweep, not an empty field
    cfg = resolve_config({**TINY, "sweep": None, "weights": None})
    assert cfg["sweep"] == {}


def _status_ds(codes, dims=("n_layers",)):
    shape = np.shape(codes)
    coords = {d: np.arange(n) + 1 for d, n in zip(dims, shape)}
    return xr.Dataset({"status": (dims, np.asarray(codes, np.int64))}, coords=coords)


def test_point_results_make_the_status():
    """``ok`` only when every grid point's result code is ``successful``; counts by name."""
    from jaxdyn import status_code
    from jaxdyn.experiments.reporting import point_results

    ok, nc = status_code("successful"), status_code("not_converged")
    every = point_results(_status_ds([nc, nc]), ["n_layers"])
    assert every["status"] == "all_unsuccessful" and every["point_results"] == {"not_converged": 2}
    assert every["message"] == "2 of 2 grid point(s) not successful (not_converged at 2)"
    some = point_results(_status_ds([[ok, nc], [ok, ok]], ("n_layers", "seed")), ["n_layers", "seed"])
    assert some["status"] == "some_unsuccessful"
    assert some["point_results"] == {"successful": 3, "not_converged": 1}
    assert point_results(_status_ds([ok, ok]), ["n_layers"]) == {
        "status": "ok", "point_results": {"successful": 2}}
    assert point_results(_status_ds(nc, ()), [])["status"] == "all_unsuccessful"  # one point
    # as a results file stores them: float codes (the control kind's), read as whole numbers
    as_float = _status_ds([nc, ok]).astype(np.float64)
    assert point_results(as_float, ["n_layers"])["point_results"] == {"successful": 1,
                                                                       "not_converged": 1}
    assert point_results(_status_ds([nc, ok]).astype(np.float64) * np.nan, ["n_layers"]) == {}
    # codes of another shape than the grid's (one per member of a point) are not the points'
    assert point_results(_status_ds([[nc, nc]], ("a", "c")), []) == {}
    assert point_results(xr.Dataset(), ["beta"]) == {}


def test_unsuccessful_points_are_the_run_status(tmp_path, capsys, monkeypatch):
    """A run whose points end ``not_converged`` finishes (exit 0) with that status and the counts."""
    from jaxdyn import status_code
    from jaxdyn.experiments import reporting

    merge = reporting.merge_chunks

    def with_codes(*args, **kwargs):  # the sphere kind stores no result code: give it some
        ds = merge(*args, **kwargs)
        return ds.assign(status=("beta", np.full(ds.sizes["beta"], status_code("not_converged"))))

    monkeypatch.setattr(reporting, "merge_chunks", with_codes)
    # TINY's chunks (one point each): the program of the cli_run fixture's run
    cfg = {**TINY, "sweep": {"beta": [1.0, 10.0]}}
    out = tmp_path / "run"
    assert cli.main(["run", _write(tmp_path, cfg), "--out", str(out), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "jaxdyn: done in" in captured.out
    assert captured.err.strip() == (
        f"jaxdyn: status 'all_unsuccessful': 2 of 2 grid point(s) not successful "
        f"(not_converged at 2); see {out}/summary.json")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "all_unsuccessful"
    assert summary["point_results"] == {"not_converged": 2}
