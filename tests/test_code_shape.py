"""The package's functions stay short enough to read: a walk of ``jaxdyn/**.py`` with ``ast``.

A function's length is its body's lines, from the first statement after the docstring to its
last line (blank and comment lines inside included, the signature, decorators and docstring
not). A public function or method (a name without a leading underscore, in any module; dunder
methods such as ``__init__`` and ``__call__`` count as public) has at most ``PUBLIC_MAX`` lines,
a private one at most ``PRIVATE_MAX``. Nested functions are measured on their own as well as
inside their parent.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jaxdyn"

#: body lines of a public function or method
PUBLIC_MAX = 80
#: body lines of a private function or method (leading underscore, not a dunder)
PRIVATE_MAX = 100

#: functions over their limit that are being split elsewhere, with the length they may not
#: exceed meanwhile ("path::qualname": lines). Each entry goes once its function is split.
ALLOWED: dict[str, int] = {}


def _is_public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _body_lines(node) -> int:
    """Lines from the first statement after the docstring to the function's last line."""
    body = node.body
    if (len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        body = body[1:]
    return node.end_lineno - body[0].lineno + 1


def _functions(source: str):
    """``(qualname, public, body lines)`` of every function and method in ``source``."""
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out.append((name, _is_public(child.name), _body_lines(child)))
                walk(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return out


def _over_limit():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for name, public, lines in _functions(path.read_text()):
            limit = PUBLIC_MAX if public else PRIVATE_MAX
            key = f"{rel}::{name}"
            limit = max(limit, ALLOWED.get(key, 0))
            if lines > limit:
                kind = "public" if public else "private"
                found.append(f"{key}: {lines} body lines (limit for a {kind} function: {limit})")
    return found


def test_measure_counts_the_body_without_docstring_and_names_methods():
    src = '''
def f(x):
    """Doc.

    More doc.
    """
    y = x + 1

    return y


class C:
    def __call__(self):
        return 1

    def _g(self):
        def inner():
            pass
        return inner


def h():
    """Only a docstring."""
'''
    got = {name: (public, lines) for name, public, lines in _functions(src)}
    assert got == {"f": (True, 3), "C.__call__": (True, 1), "C._g": (False, 3),
                   "C._g.<locals>.inner": (True, 1), "h": (True, 1)}


def test_no_function_over_its_limit():
    found = _over_limit()
    assert not found, "split these into named helpers:\n" + "\n".join(found)
