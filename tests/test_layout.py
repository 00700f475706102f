"""The package layout keeps its rules (docs/layout.md): no import circle, the application
layer on the public API, plotting only in the figure modules, the core without the shell."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "jaxdyn"
SHELL = {"cli", "config", "io", "plots", "experiments"}


def _modules():
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        mods[".".join(parts)] = (p, parts if is_pkg else parts[:-1])
    return mods


def _imports(path, pkg):
    """Absolute names of the jaxdyn modules (or module.attribute) a file imports, lazily too."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                target = ".".join(base + (node.module.split(".") if node.module else []))
            elif node.module and node.module.split(".")[0] == "jaxdyn":
                target = node.module
            else:
                continue
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "jaxdyn")
    return out


def _graph():
    mods = _modules()
    return mods, {m: {t for t in _imports(p, pkg) if t in mods and t != m}
                  for m, (p, pkg) in mods.items()}


def _cycle(graph):
    """One import cycle (list of modules) or None. A package importing its own submodules
    (re-exports) is not a cycle; everything else is."""
    state = {}

    def visit(v, stack):
        state[v] = 1
        for w in sorted(graph[v]):
            if v.startswith(w + "."):
                continue
            if state.get(w) == 1:
                return stack + [v, w]
            if w not in state:
                found = visit(w, stack + [v])
                if found:
                    return found
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v, [])
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"p": {"p.x"}, "p.x": {"p"}}) is None  # re-export, not a circle
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle():
    _, graph = _graph()
    assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph))}"


def test_core_never_imports_the_shell():
    _, graph = _graph()
    def role(m):
        return m.split(".")[1] if "." in m else ""

    bad = [(m, t) for m, ts in graph.items() for t in ts
           if m != "jaxdyn" and role(m) not in SHELL and role(t) in SHELL]
    assert not bad, bad
    # the top level re-exports io.open_results only
    assert {role(t) for t in graph["jaxdyn"]} & SHELL <= {"io"}


def test_application_layer_uses_public_names_only():
    pattern = re.compile(r"from jaxdyn(\.\w+)*\._\w+ import|from \.\.(\w+\.)*_\w+ import"
                         r"|from \.\. import _|jaxdyn\._\w+")
    private_name = re.compile(r"^\s*from [\w.]+ import .*\b_[A-Za-z]\w*")
    files = list((PKG / "experiments").rglob("*.py")) + list((ROOT / "benchmarks").glob("*.py"))
    files += list((ROOT / "reproductions").glob("*.py"))
    hits = []
    for f in files:
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if pattern.search(line) or private_name.search(line) or re.search(r"from \.+_\w+ import", line):
                hits.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_matplotlib_only_in_figure_modules():
    allowed = {PKG / "plots.py"} | set((PKG / "experiments").rglob("figures.py"))
    hits = [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py")
            if p not in allowed and re.search(r"^\s*(import|from) matplotlib", p.read_text(), re.M)]
    assert not hits, hits
