"""Every code block of README.md runs in a test, so that none can rot.

The rule, block by block (a block is a fenced ```python, ```bash or ```text block):

* ```python blocks run **as written**, in order, in one namespace, in a fresh temporary
  working directory (matplotlib on its Agg backend). A block that opens
  ``runs/default/data.nc`` reads the folder made by the quick start's own command
  ``jaxdyn run --out runs/default`` — run here with ``--set n=64 --set t1=2.0`` (the
  same config, smaller: the data have the same variables, dimensions and coordinates).
  A claim a block's comment makes is asserted on its namespace afterwards.
* ```bash blocks are parsed by ``bash -n``. They install packages or run whole
  experiments (minutes each), so they are checked, not run: every ``jaxdyn …`` command line
  parses with the CLI's own parser; every ``jaxdyn run CONFIG`` resolves (``jaxdyn config CONFIG`` exits 0, in-process); ``jaxdyn run`` without a
  CONFIG is the one run above (tiny override); every ``pip install -e ".[EXTRAS]"`` names
  extras that pyproject.toml declares; every ``benchmarks/…``/``configs/…`` path exists.
* ```text blocks (the Layout tree) are not code: every ``jaxdyn/…`` path they name exists.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from jaxdyn import cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


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


def test_every_block_has_a_rule():
    langs = {lang for lang, _, _ in blocks()}
    assert langs <= {"python", "bash", "text"}, langs


def _jaxdyn_commands(code):
    for line in code.splitlines():
        line = line.split("#", 1)[0]
        for part in re.split(r"&&|;", line):
            words = shlex.split(part)
            if words[:1] == ["jaxdyn"]:
                yield words[1:]


def test_bash_blocks(tmp_path, capsys):
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                 ["optional-dependencies"])
    bash = [(start, code) for lang, start, code in blocks() if lang == "bash"]
    assert len(bash) >= 10
    for start, code in bash:
        p = subprocess.run(["bash", "-n"], input=code, text=True, capture_output=True)
        assert p.returncode == 0, (start, p.stderr)
        for m in re.finditer(r'pip install -e "?\.\[([\w,]+)\]', code):
            assert set(m.group(1).split(",")) <= extras, (start, m.group(0))
        for path in re.findall(r"\b((?:configs|benchmarks)/[\w./-]+\.(?:yaml|py|sh))", code):
            assert (ROOT / path).exists(), (start, path)
        for args in _jaxdyn_commands(code):
            try:  # every jaxdyn command line parses (report, config, … included)
                cli.build_parser().parse_args(args)
            except SystemExit:
                pytest.fail(f"README.md:{start}: `jaxdyn {' '.join(args)}` does not parse: "
                            f"{capsys.readouterr().err}")
            if args[0] != "run":
                continue
            config, rest = [], iter(args[1:])
            for a in rest:
                if a in ("--out", "--resume", "--set"):
                    next(rest)
                elif not a.startswith("-"):
                    config.append(a)
            if config:
                rc = cli.main(["config", str(ROOT / config[0])])
                err = capsys.readouterr().err
                assert rc == 0, (start, config, err)
            else:
                assert args[1:] == ["--out", "runs/default"], (start, args)


def test_text_blocks_name_real_files():
    for lang, start, code in blocks():
        if lang != "text":
            continue
        for path in re.findall(r"\b(jaxdyn/[\w/]+\.py)", code):
            assert (ROOT / path).exists(), (start, path)


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
    for start, code in python:
        exec(compile(code, f"README.md:{start}", "exec"), ns)  # noqa: S102 - our own README
    # the Library block's claims
    import numpy as np

    if "conc" in ns:
        jaxdyn, x0, Pi = ns["jaxdyn"], ns["x0"], ns["Pi"]
        before, after = float(jaxdyn.w2(x0, Pi(x0))), float(jaxdyn.w2(ns["conc"].xs[-1], Pi(x0)))
        assert after < 0.5 * before, (before, after)
        assert bool(np.all(np.asarray(ns["r"].converged)))
        assert str(np.asarray(ns["traj"].names)) == "successful"
