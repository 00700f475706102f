"""The contract between the engine and the experiment kinds, and the shape of the engine itself:
every kind satisfies the ``ExperimentKind`` Protocol, importing a kind loads no JAX, and no
function of the engine, the CLI or the config layer takes more than 8 parameters."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from jaxdyn.experiments import KINDS, ExperimentKind, StepFunction, get_kind

ROOT = Path(__file__).resolve().parents[1]
SHELL = [*sorted((ROOT / "jaxdyn" / "experiments").rglob("*.py"))] + [
    ROOT / "jaxdyn" / p for p in ("cli.py", "config.py", "io.py", "plots.py", "simulation/_distributed.py")]
PROTOCOL_MEMBERS = ("SCHEMA", "BATCH_AXES", "check", "estimate_bytes", "output_bytes", "process_split",
                    "run_points",
                    "step_functions", "summarize", "plot")


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_satisfies_the_protocol(name):
    kind = get_kind(name)
    assert isinstance(kind, ExperimentKind), name
    for member in PROTOCOL_MEMBERS:
        assert member in kind.__all__, (name, member)
        value = getattr(kind, member)
        assert callable(value) or member.isupper(), (name, member)
    assert isinstance(kind.BATCH_AXES, tuple)
    assert all(kind.SCHEMA[a].sweepable for a in kind.BATCH_AXES), name


def test_a_module_without_a_member_is_not_a_kind():
    import types

    partial = types.SimpleNamespace(**{m: getattr(get_kind("sphere"), m) for m in PROTOCOL_MEMBERS
                                       if m != "step_functions"})
    assert not isinstance(partial, ExperimentKind)
    assert isinstance(types.SimpleNamespace(**{m: getattr(get_kind("sphere"), m)
                                               for m in PROTOCOL_MEMBERS}), ExperimentKind)


def test_importing_the_kinds_loads_no_jax():
    code = ("import sys\nfrom jaxdyn.experiments import KINDS, get_kind\n"
            "for k in KINDS:\n    m = get_kind(k)\n    m.SCHEMA, m.check, m.estimate_bytes, m.output_bytes\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('jax', 'jaxlib', 'matplotlib')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_step_function_is_a_plain_record():
    s = StepFunction(abs, (1.0,))
    assert s.fn is abs and s.args == (1.0,) and s.x64 is False


def _parameter_counts(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
            if names and names[0] in ("self", "cls"):
                n -= 1
            yield getattr(node, "name", "<lambda>"), node.lineno, n


def test_no_function_of_the_shell_takes_more_than_8_parameters():
    wide = [f"{p.relative_to(ROOT)}:{line} {name} ({n})" for p in SHELL
            for name, line, n in _parameter_counts(p) if n > 8]
    assert not wide, wide
