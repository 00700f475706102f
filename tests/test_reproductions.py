"""The paper reproductions in reproductions/: where they write, and the whole runs (slow).

Default tests (no reproduction is run): every reproduction script and its tracked result sit
in reproductions/, a run writes under the ignored reproductions/runs/ unless ``--record``
(then reproductions/results/), and the docs name the scripts where they are.
Slow tests (``-m slow``): tfdy's split experiment and castin's covariance experiments run
whole, their verdicts against the published numbers (the step and the right-hand side they
rest on are checked in the default suite by tests/test_peer_reproductions.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "reproductions"
SCRIPTS = ("phase_reference", "tfdy_split_reference", "castin_covariance_reference")
RESULTS = ("phase_reference.json", "tfdy_split.json", "tfdy_split.png",
           "castin_covariance.json", "castin_covariance.png")


def _import(name, tmp_path, monkeypatch):
    """Import a reproduction script, its results redirected to tmp_path."""
    monkeypatch.syspath_prepend(str(REPRO))
    for mod in ("common", name):
        sys.modules.pop(mod, None)
    mod = __import__(name)
    common = sys.modules["common"]
    assert Path(common.__file__).parent == REPRO
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.delenv("OUT", raising=False)
    return mod


def test_scripts_and_results_live_in_reproductions():
    """The scripts and their tracked results are in reproductions/, none in benchmarks/."""
    for s in SCRIPTS:
        assert (REPRO / f"{s}.py").is_file(), s
        assert not (ROOT / "benchmarks" / f"{s}.py").exists(), s
    for r in RESULTS:
        assert (REPRO / "results" / r).is_file(), r
        assert not (ROOT / "benchmarks" / "results" / r).exists(), r
    tracked = subprocess.run(["git", "ls-files", "reproductions/results"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60).stdout.split()
    assert sorted(Path(t).name for t in tracked) == sorted(RESULTS)


def test_runs_write_under_runs_unless_recorded(tmp_path, monkeypatch):
    """A run writes to reproductions/runs/ (ignored by git); --record to reproductions/results/."""
    monkeypatch.syspath_prepend(str(REPRO))
    sys.modules.pop("common", None)
    import common

    assert common.RESULTS == REPRO / "runs" and common.RECORDED == REPRO / "results"
    ignored = subprocess.run(["git", "check-ignore", "reproductions/runs/x.json"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60).stdout
    assert ignored.strip()
    p = common.add_common_args(argparse.ArgumentParser())
    monkeypatch.setattr(common, "RESULTS", common.RESULTS)
    monkeypatch.setenv("JAXDYN_NO_HOST_DEVICES", "1")
    common.setup(p, ["--no-plot"])
    assert common.RESULTS == REPRO / "runs"
    common.setup(p, ["--record"])
    assert common.RESULTS == REPRO / "results"
    with pytest.raises(SystemExit):
        common.setup(p, ["--record", "--tiny"])
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    path = common.write_json("probe", {"x": 1})
    run = __import__("json").loads(path.read_text())["run"]
    assert run["wall_s"] >= 0 and run["cpu_s"] >= 0 and "loadavg_end" in run


def test_docs_name_the_scripts_where_they_are():
    """docs/reproductions.md runs the scripts from reproductions/ and quotes their results."""
    page = (ROOT / "docs" / "reproductions.md").read_text()
    for s in SCRIPTS:
        assert f"reproductions/{s}.py" in page and f"benchmarks/{s}.py" not in page, s
    assert "benchmarks/results/" not in page


@pytest.mark.slow
def test_castin_reproduction_verdicts_and_first_order(tmp_path, monkeypatch):
    """Castin's four experiments: jaxdyn and the published Euler agree member by member."""
    mod = _import("castin_covariance_reference", tmp_path, monkeypatch)
    out = mod.main(["--no-plot", "--tag", "_test"])
    for name, r in out["experiments"].items():
        assert r["agree"] == r["members"], (name, r["disagree_members"])
    zero = out["experiments"]["zero"]
    assert zero["euler_verdicts"]["converged"] == zero["members"]
    blowup = out["experiments"]["blowup"]
    assert blowup["jaxdyn_verdicts"]["blowup"] == blowup["members"]
    mixed = out["experiments"]["mixed"]["jaxdyn_verdicts"]
    assert mixed["converged"] > 0 and mixed["blowup"] > 0
    for name, s in out["order_study"].items():
        assert 0.9 < s["fitted_order"] < 1.1, (name, s["fitted_order"])


@pytest.mark.slow
def test_tfdy_split_reproduction_matches_published_fractions(tmp_path, monkeypatch):
    """The split experiment of tfdy: every dd within binomial noise of the published fraction."""
    mod = _import("tfdy_split_reference", tmp_path, monkeypatch)
    out = mod.main(["--no-plot", "--tag", "_test"])
    assert out["max_abs_z"] < 3.5
