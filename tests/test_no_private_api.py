"""jaxdyn stands on the public interfaces of its dependencies: no ``jax._src``, no private
module or attribute of jax, jaxlib, equinox, diffrax, optax, optimistix, lineax or ott-jax, no
serialized executables. A grep over the package's sources (comments included: a private name
in a comment is usually one in the code nearby)."""

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jaxdyn"
DEPS = r"(?:jax|jaxlib|jnp|lax|eqx|equinox|diffrax|dfx|optax|optimistix|optx|lineax|lx|ott)"
PATTERNS = {
    "a private module of a dependency": re.compile(
        rf"\b{DEPS}(?:\.[A-Za-z]\w*)*\._[A-Za-z]\w*"),
    "an import from a private module": re.compile(
        rf"from\s+{DEPS}(?:\.\w+)*\._\w+|import\s+{DEPS}(?:\.\w+)*\._\w+"),
    "a private name imported from a dependency": re.compile(
        rf"from\s+{DEPS}(?:\.\w+)*\s+import\s+(?:\(\s*)?_[A-Za-z]"),
    "a private attribute of a result enumeration": re.compile(
        r"(?<!self)\.(?:_value|_name_to_item|_index_to_message|_enumeration|_base_offsets)\b"),
    "a private attribute of a compiled program": re.compile(
        r"\._(?:executable|unloaded_executable|cache_size|clear_cache|fun|jaxpr)\b"),
    "serialized executables": re.compile(r"serialize_executable|deserialize_and_load|\bpickle\b"),
    "equinox's internal error mode": re.compile(r"\w\.EQX_ON_ERROR\s*=(?!=)"),
}


def _offences(text: str):
    for line_no, line in enumerate(text.splitlines(), start=1):
        for what, pattern in PATTERNS.items():
            m = pattern.search(line)
            if m:
                yield line_no, what, m.group(0)


def test_patterns_catch_what_they_are_for():
    bad = ["from jax._src import xla_bridge", "x = jax._src.config", "r = sol.result._value",
           "from equinox import _errors", "import optax._src.base", "f._cache_size()",
           "from jax.experimental import serialize_executable", "ott.geometry._foo",
           "from diffrax._solver import euler", "compiled._executable", "_errors.EQX_ON_ERROR = 'off'"]
    for line in bad:
        assert list(_offences(line)), line
    good = ["import jax.numpy as jnp", "from jax.experimental import mesh_utils",
            "eqx.filter_jit(f)", "diffrax.diffeqsolve(term)", "self._value = 1",
            "from ._results import RESULTS", "optax.lbfgs()"]
    for line in good:
        assert not list(_offences(line)), line


def test_no_private_api_in_the_package():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line_no, what, hit in _offences(path.read_text()):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{line_no}: {what}: {hit}")
    assert not found, "\n".join(found)
