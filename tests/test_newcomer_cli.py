"""What a newcomer reaches for first in the CLI.

``jaxdyn --version``, ``jaxdyn kinds`` (the experiment kinds, and one kind's config fields), the
config reference page generated from the same schemas (docs/guides/config-reference.md), and
``jaxdyn config``'s output ending with a newline. These commands load no JAX (checked by the
modules they import).
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import jaxdyn
from jaxdyn import cli
from jaxdyn.config import REQUIRED
from jaxdyn.experiments import KINDS, get_kind
from jaxdyn.experiments.planning import ENGINE_FIELDS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "guides" / "config-reference.md"
HEAVY = ("jax", "jaxlib", "diffrax", "equinox", "ott", "optax", "scipy", "matplotlib", "xarray")


def _main(argv, capsys):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _fields(schema, prefix=""):
    """``(dotted name, Field)`` of every field of a schema, sections' fields included."""
    for key, f in schema.items():
        yield f"{prefix}{key}", f
        if f.kind == "section" and f.schema is not None:
            yield from _fields(f.schema, f"{prefix}{key}.")


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"jaxdyn {jaxdyn.__version__}\n"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == jaxdyn.__version__
    try:
        installed = importlib.metadata.version("jaxdyn")
    except importlib.metadata.PackageNotFoundError:
        return  # a source tree on the path, not installed
    assert installed == jaxdyn.__version__


def test_version_and_kinds_load_no_jax():
    code = (
        "import contextlib, io, sys\n"
        "from jaxdyn.cli import main\n"
        "for argv in (['--version'], ['kinds'], ['kinds', 'pde'], ['kinds', '--markdown']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        try:\n"
        "            rc = main(argv)\n"
        "        except SystemExit as e:\n"
        "            rc = e.code\n"
        "    assert rc == 0 and out.getvalue().endswith('\\n'), (argv, rc)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"


def test_kinds_lists_every_kind_with_its_description(capsys):
    rc, out, _ = _main(["kinds"], capsys)
    assert rc == 0 and out.endswith("\n")
    for name in KINDS:
        first = get_kind(name).__doc__.strip().splitlines()[0]
        what = first.split(": ", 1)[1]  # "Experiment kind ``sphere``: attention dynamics ..."
        assert re.search(rf"^  {name} +{re.escape(what)}$", out, re.M), (name, out)


@pytest.mark.parametrize("kind", list(KINDS))
def test_kind_lists_its_fields_types_defaults_and_values(kind, capsys):
    rc, out, _ = _main(["kinds", kind], capsys)
    assert rc == 0 and out.endswith("\n")
    heads = {line.split(":", 1)[0].strip(): line for line in out.splitlines()
             if re.match(r"^  \S+: ", line)}
    for name, f in [*_fields(get_kind(kind).SCHEMA), *_fields(ENGINE_FIELDS)]:
        assert name in heads, (kind, name)
        line = heads[name]
        assert f": {f.kind if f.kind != 'list' or f.item == 'any' else 'list of ' + f.item}" in line
        if f.default is REQUIRED:
            assert "(required)" in line, line
        elif not (f.kind == "section" and f.schema is not None):
            assert " = " in line, line
        for c in f.choices or ():
            assert str(c) in line.split("one of:", 1)[1], (line, c)
        assert ("; sweepable" in line) == f.sweepable, line
        if f.doc:
            assert f.doc.split()[0] in out


def test_kind_listing_reads_as_documented(capsys):
    _, out, _ = _main(["kinds", "pde"], capsys)
    assert out.startswith("kind pde: the mean-field equation itself, solved for the density")
    assert "\n  mode: str = clusters; one of: clusters, particles, s2\n      what the run measures\n" in out
    assert "\n  beta: float = 5.0; sweepable\n" in out
    assert "\n  particles.n: list of int = [100, 1000]\n" in out
    assert "\n  kind: str (required)\n" in out
    _, out, _ = _main(["kinds", "sphere"], capsys)
    assert "\n  snapshots: list of float = [0.0, 1.0, 3.0, 10.0]\n" in out
    assert "\n  figure_beta: float = null\n" in out


def test_unknown_kind_is_a_bad_input(capsys):
    rc, out, err = _main(["kinds", "spheer"], capsys)
    assert rc == 2 and not out
    assert "unknown experiment kind 'spheer'" in err and "sphere" in err
    rc, _, err = _main(["kinds", "pde", "--markdown"], capsys)
    assert rc == 2 and "--markdown" in err


def test_config_reference_page_is_generated_from_the_schemas(capsys):
    rc, out, _ = _main(["kinds", "--markdown"], capsys)
    assert rc == 0
    assert PAGE.read_text() == out, (
        "docs/guides/config-reference.md is out of date: regenerate it with "
        "`jaxdyn kinds --markdown > docs/guides/config-reference.md`")


def test_config_reference_page_lists_every_field_of_every_kind():
    text = PAGE.read_text()
    sections = dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    assert set(sections) == {"Fields of every kind", *KINDS}
    for title, schema in [("Fields of every kind", ENGINE_FIELDS),
                          *((k, get_kind(k).SCHEMA) for k in KINDS)]:
        rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)` \|.*$", sections[title], re.M)}
        for name, f in _fields(schema):
            assert name in rows, (title, name)
            for c in f.choices or ():
                assert f"`{c}`" in rows[name], (title, name, c)
            assert ("sweepable" in rows[name].split("|")[2]) == f.sweepable, rows[name]
    # reachable: in the site's navigation and linked from the CLI guide
    assert "guides/config-reference.md" in (ROOT / "mkdocs.yml").read_text()
    assert "](config-reference.md)" in (ROOT / "docs" / "guides" / "cli.md").read_text()


def test_config_output_ends_with_a_newline(capsys):
    for argv in (["config"], ["config", str(ROOT / "configs" / "pde_s2.yaml")]):
        rc, out, _ = _main(argv, capsys)
        assert rc == 0 and out.endswith("\n") and not out.endswith("\n\n"), argv
        assert yaml.safe_load(out)["kind"]


def test_figure_beta_outside_the_sweep_is_named_with_the_beta_shown(capsys):
    cfg = str(ROOT / "configs" / "beta_sweep_s2.yaml")  # figure_beta: 30
    rc, _, err = _main(["config", cfg, "--set", "sweep.beta=[1,10,100]"], capsys)
    assert rc == 0
    assert ("figure_beta = 30 is not among the run's β values [1.0, 10.0, 100.0]: the snapshot "
            "figure shows the nearest, β = 10") in err
    rc, _, err = _main(["config", cfg], capsys)
    assert rc == 0 and "figure_beta" not in err
