"""Every example of examples/ runs, writes its figure to ``--out``, and is shown in a guide.

The Python examples run in this process (``runpy``, as ``python examples/NAME.py --out DIR``
would: their own folder on ``sys.path``, matplotlib on Agg), so that they share this test
run's compiled programs; each asserts its own claims (a blow-up time against its closed
form, a causal first particle that stays put, a reached target). The two-process sweep starts
two ``jaxdyn`` processes; it and the reachability example run under ``-m slow``. Each figure is
read back: no legend over a curve, no literal underscore in its text (mathtext for subscripts),
integer ticks on count axes (clusters, iterations).
"""

from __future__ import annotations

import ast
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
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


@pytest.mark.parametrize("name", [*PYTHON_EXAMPLES, "two_process_sweep"])
def test_guide_names_its_example_file(name):
    """Each guide names its example file in its text; README's table links it.

    A ``--8<--`` line shows as itself outside mkdocs (GitHub, a terminal).
    """
    file = f"examples/{name}{'.sh' if name == 'two_process_sweep' else '.py'}"
    pages = [p for p in (ROOT / "docs" / "guides").glob("*.md") if f'--8<-- "{file}"' in p.read_text()]
    assert pages, file
    for page in pages:
        text = [line for line in page.read_text().splitlines() if not line.startswith("--8<--")]
        assert any(f"`{file}`" in line for line in text), f"{page.name} does not name {file}"
    assert f"[`{file}`]({file})" in (ROOT / "README.md").read_text(), file


def test_one_device_per_process_is_one_mechanism():
    """One CPU device per process is asked for one way, which ``jaxdyn --help`` names.

    Guides and examples use JAXDYN_NO_HOST_DEVICES=1 or ``--no-host-devices``.
    """
    from jaxdyn.cli import build_parser

    help_text = " ".join(build_parser().format_help().split())
    assert "--no-host-devices" in help_text and "JAXDYN_NO_HOST_DEVICES=1" in help_text
    for p in [*(ROOT / "docs").rglob("*.md"), *EXAMPLES.iterdir(), ROOT / "README.md"]:
        assert "xla_force_host_platform_device_count" not in p.read_text(), p


def _figure_checks(fig):
    """Legends off the curves, no literal underscore, integer ticks on count axes."""
    import matplotlib.text

    fig.draw_without_rendering()  # the layout (positions, extents) without rasterizing
    renderer = fig.canvas.get_renderer()
    for text in fig.findobj(matplotlib.text.Text):
        shown = re.sub(r"\$[^$]*\$", "", text.get_text())
        assert "_" not in shown, f"literal underscore in {text.get_text()!r} (use mathtext)"
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None:
            box = legend.get_window_extent(renderer)
            for line in ax.get_lines():
                xy = line.get_transform().transform(np.asarray(line.get_xydata(), float))
                xy = xy[np.all(np.isfinite(xy), axis=1)]
                # the polyline, sampled between its points (a segment can cross the box)
                s = np.linspace(0.0, 1.0, 16)[:, None, None]
                pts = (xy[:-1] + s * (xy[1:] - xy[:-1])).reshape(-1, 2) if len(xy) > 1 else xy
                inside = ((pts[:, 0] > box.x0) & (pts[:, 0] < box.x1)
                          & (pts[:, 1] > box.y0) & (pts[:, 1] < box.y1))
                assert not inside.any(), f"the legend covers {line.get_label()!r}"
        for axis in (ax.xaxis, ax.yaxis):
            label = axis.get_label().get_text()
            if "clusters" in label or "iteration" in label:  # a count: integer tick labels
                lo, hi = sorted(axis.get_view_interval())
                ticks = [t for t in axis.get_ticklocs() if lo <= t <= hi]
                assert ticks and all(float(t).is_integer() for t in ticks), (label, ticks)
                shown = [re.sub(r"\$|\\mathdefault\{|\}", "", t.get_text()).replace("−", "-")
                         for t in [*axis.get_ticklabels(), *axis.get_ticklabels(minor=True)]]
                assert all(re.fullmatch(r"-?\d+", t) for t in shown if t), (label, shown)


@pytest.mark.docs
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_EXAMPLES
                                  else n for n in PYTHON_EXAMPLES])
def test_example_runs_and_writes_its_figure(name, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / f"{name}.py"), "--out", str(tmp_path)])
    monkeypatch.syspath_prepend(str(EXAMPLES))
    names = runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name="__main__")
    figure = tmp_path / f"{name}.png"
    assert figure.exists() and figure.stat().st_size > 10_000, figure
    _figure_checks(names["fig"])


@pytest.mark.docs
def test_gaussian_blowup_example_with_another_A(tmp_path, monkeypatch):
    """The Gaussian example with A ≠ 0 still runs: its closed form then is the general one."""
    import matplotlib

    matplotlib.use("Agg")
    source = (EXAMPLES / "gaussian_blowup.py").read_text()
    assert source.count("A = jnp.zeros((2, 2))\n") == 1
    script = tmp_path / "gaussian_blowup.py"
    script.write_text(source.replace("A = jnp.zeros((2, 2))\n",
                                     "A = jnp.array([[0.3, -0.5], [0.5, -0.1]])\n"))
    monkeypatch.setattr(sys, "argv", [str(script), "--out", str(tmp_path)])
    monkeypatch.syspath_prepend(str(EXAMPLES))
    names = runpy.run_path(str(script), run_name="__main__")
    assert names["sol"].names == "blowup"
    # the A = 0 closed form is another time: the example must not have used it
    import jaxdyn

    T_zero = float(jaxdyn.gaussian.vi_blowup_time(names["S0"], names["B"], 1.0))
    assert abs(names["T_closed"] / T_zero - 1) > 1e-2


def test_two_process_sweep_help():
    """``--help`` prints the usage; an unknown option is refused (exit 2)."""
    p = subprocess.run(["bash", str(EXAMPLES / "two_process_sweep.sh"), "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "--out OUT" in p.stdout and not p.stderr, p
    p = subprocess.run(["bash", str(EXAMPLES / "two_process_sweep.sh"), "--bogus"], cwd=ROOT,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "--bogus" in p.stderr, p


FIGURE_MODULES = ["jaxdyn/plots.py", *sorted(str(p.relative_to(ROOT)) for p in
                                            (ROOT / "jaxdyn" / "experiments").glob("*/figures.py"))]


@pytest.mark.parametrize("module", FIGURE_MODULES)
def test_figure_text_has_no_literal_underscore(module):
    """The experiments' figure texts write subscripts in mathtext.

    Labels, titles and legend entries (read from the source): an underscore outside ``$…$``
    shows as itself.
    """
    path = ROOT / module
    tree = ast.parse(path.read_text())
    skip = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr)}  # docstrings
    skip |= {id(c) for n in ast.walk(tree) if isinstance(n, ast.Raise) for c in ast.walk(n)}
    bad = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip:
            shown = re.sub(r"\$[^$]*\$", "", n.value)
            # text meant for a reader (spaces or non-ASCII), not a variable or key name
            if "_" in shown and (" " in shown or any(ord(c) > 127 for c in shown)):
                bad.append(f"{module}:{n.lineno}: {n.value!r}")
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_two_process_sweep(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k != "XLA_FLAGS" and not k.startswith(("JAXDYN_PROCESS_ID", "JAXDYN_NUM_PROCESSES",
                                                       "JAX_COORDINATOR", "SLURM_", "OMPI_"))}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    out = tmp_path / "sweep"
    p = subprocess.run(["bash", str(EXAMPLES / "two_process_sweep.sh"), "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (out / "data.nc").exists() and (out / "summary.json").exists()
    import json

    import xarray as xr

    assert json.loads((out / "summary.json").read_text())["status"] == "ok"
    assert "status ok: 8 systems in 2 chunks over 2 processes" in p.stdout, p.stdout
    assert f"results in {out}" in p.stdout and "process 1 of 2" in p.stdout + p.stderr
    with xr.open_dataset(out / "data.nc") as ds:  # the figure shows clustering: β = 0.5 near one
        ip = ds["mean_inner_product"].mean("seed").isel(t=-1)
        assert float(ip.max()) > 0.9 and float(ip.min()) < 0.9, ip.values
