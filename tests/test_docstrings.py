"""One docstring convention for the package: Google style (``Args:``, ``Returns:``, ``Raises:``),
checked by ruff's pydocstyle (D) and pydoclint (DOC) rules as configured in pyproject.toml, and
every public callable of every subpackage documents its arguments."""

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = ("clusters", "control", "distances", "encoder", "gaussian", "integrators",
               "kernels", "models", "pde", "simulation", "spectral", "sphere", "weights")


def test_ruff_docstring_rules_pass_on_the_package():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "jaxdyn"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def _public_callables():
    import jaxdyn

    seen = {}
    for pkg in ("jaxdyn",) + tuple(f"jaxdyn.{s}" for s in SUBPACKAGES):
        mod = importlib.import_module(pkg)
        names = getattr(mod, "__all__", None)
        assert names is not None, f"{pkg} has no __all__"
        for name in names:
            obj = getattr(mod, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and id(obj) not in seen:
                seen[id(obj)] = (f"{pkg}.{name}", obj)
    assert len(seen) > 100 and jaxdyn.simulate in [o for _, o in seen.values()]
    return list(seen.values())


def _takes_arguments(obj) -> bool:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return False
    return any(p.name not in ("self", "cls") for p in sig.parameters.values())


@pytest.mark.parametrize("section", ["Args:"])
def test_every_public_callable_documents_its_arguments(section):
    missing = []
    for where, obj in _public_callables():
        doc = inspect.getdoc(obj) or ""
        if not doc:
            missing.append(f"{where}: no docstring")
            continue
        if not _takes_arguments(obj):
            continue
        wanted = (section, "Attributes:") if inspect.isclass(obj) else (section,)
        if not any(w in doc for w in wanted):
            missing.append(f"{where}: no {' / '.join(wanted)} section")
    assert not missing, f"{len(missing)} public callables:\n" + "\n".join(sorted(missing))
