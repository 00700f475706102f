"""Every example of examples/ runs, writes its figure to ``--out``, and is shown in a guide.

The Python examples run in this process (``runpy``, as ``python examples/NAME.py --out DIR``
would: their own folder on ``sys.path``, matplotlib on Agg), so that they share this test
run's compiled programs; each asserts its own claims (a blow-up time against its closed
form, a causal first particle that stays put, a reached target). The two-process sweep starts
two ``jaxdyn`` processes; it and the reachability example run under ``-m slow``.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PYTHON_EXAMPLES = ["beta_sweep", "multihead_causal", "noisy_run", "density_solver",
                   "gaussian_blowup", "reachability"]
# reachability's optimisation loop (about 7 CPU-s) runs under -m slow; reach itself runs by
# default in tests/test_control_compose.py
SLOW_EXAMPLES = {"reachability"}


def test_every_example_is_listed_and_shown_in_a_guide():
    scripts = {p.stem for p in EXAMPLES.glob("*.py") if not p.stem.startswith("_")}
    assert scripts == set(PYTHON_EXAMPLES)
    guides = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    for name in [*PYTHON_EXAMPLES, "two_process_sweep"]:
        suffix = ".sh" if name == "two_process_sweep" else ".py"
        assert f'--8<-- "examples/{name}{suffix}"' in guides, name
        if suffix == ".py":
            assert (ROOT / "docs" / "figures" / f"example_{name}.png").exists(), name


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_EXAMPLES
                                  else n for n in PYTHON_EXAMPLES])
def test_example_runs_and_writes_its_figure(name, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / f"{name}.py"), "--out", str(tmp_path)])
    monkeypatch.syspath_prepend(str(EXAMPLES))
    runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name="__main__")
    figure = tmp_path / f"{name}.png"
    assert figure.exists() and figure.stat().st_size > 10_000, figure


@pytest.mark.slow
def test_two_process_sweep(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k != "XLA_FLAGS" and not k.startswith(("JAX_PROCESS", "JAX_NUM_PROCESSES",
                                                       "JAX_COORDINATOR", "SLURM_", "OMPI_"))}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    out = tmp_path / "sweep"
    p = subprocess.run(["bash", str(EXAMPLES / "two_process_sweep.sh"), str(out)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (out / "data.nc").exists() and (out / "summary.json").exists()
    import json

    assert json.loads((out / "summary.json").read_text())["status"] == "ok"
