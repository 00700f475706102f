"""A griffe extension of the jaxdyn site: the package's reST markup in Markdown.

The docstrings follow the Google convention with a little reStructuredText inside (Sphinx
roles such as :func:`simulate`, double-backquoted literals, ``.. math::`` blocks). mkdocstrings
renders Markdown, so this extension rewrites, on every docstring as griffe loads it:

* ``:role:`target``` (func, class, meth, mod, attr, data, obj, exc) -> `` `target` ``
  (a leading ``~`` or ``!`` dropped);
* double backquotes -> single backquotes (code);
* a ``.. math::`` block -> a ``$$ ... $$`` display (typeset by MathJax on the site);
* ``docs/math.md §B.4.2`` -> a link to that section of the maths page;
* a module constant without a docstring takes the ``#:`` comment lines right above its
  assignment as its docstring (the Sphinx convention the package uses; griffe reads only
  string literals after the assignment).
"""

from __future__ import annotations

import re
from pathlib import Path

import griffe
from markdown.extensions.toc import slugify

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc|const):`[~!]?([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.S)


def _math_blocks(text: str) -> str:
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)\.\. math::\s*(.*)$", lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, body = m.group(1), [m.group(2)] if m.group(2) else []
        i += 1
        while i < len(lines) and (not lines[i].strip() or
                                  len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
            body.append(lines[i].strip())
            i += 1
        formula = "\n".join(b for b in body if b)
        out += [f"{indent}$$", *[f"{indent}{f}" for f in formula.splitlines()], f"{indent}$$", ""]
    return "\n".join(out)


def _math_sections() -> dict[str, str]:
    """Section number (``B.4.2``) -> its anchor on the maths page."""
    sections = {}
    for line in (Path(__file__).parent / "math.md").read_text().splitlines():
        m = re.match(r"^#{2,4} ([A-H](?:\.\d+)*)\.? ", line)
        if m:
            sections[m.group(1)] = slugify(line.lstrip("#").strip(), "-")
    return sections


_SECTIONS = _math_sections()
_CITATION = re.compile(r"docs/math\.md,? §([A-H](?:\.\d+)*)")


def _link(m: re.Match) -> str:
    number = m.group(1).rstrip(".")
    anchor = _SECTIONS.get(number)
    # the API pages are docs/api/<name>.md: the maths page is one folder up
    return f"[§{number}](../math.md#{anchor})" if anchor else m.group(0)


def markdown_of(text: str) -> str:
    """The docstring ``text`` with its reST roles, literals, math blocks and citations in Markdown."""
    text = _CITATION.sub(_link, _math_blocks(text))
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    return _LITERAL.sub(lambda m: f"`{m.group(1)}`", text)


def comment_doc(lines: list[str], lineno: int) -> str | None:
    """The ``#:`` comment lines right above line ``lineno`` (1-based) of ``lines``, joined."""
    doc, i = [], lineno - 2
    while i >= 0 and lines[i].lstrip().startswith("#:"):
        doc.append(lines[i].lstrip()[2:].strip())
        i -= 1
    return "\n".join(reversed(doc)) or None


class RestToMarkdown(griffe.Extension):
    """Rewrite every docstring of the loaded package (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self._sources: dict[Path, list[str]] = {}

    def on_instance(self, *, node, obj, agent, **kwargs):  # noqa: ARG002 (griffe's signature)
        """Rewrite ``obj``'s docstring in place; give a commented constant its comment."""
        if obj.docstring is None and obj.kind is griffe.Kind.ATTRIBUTE and obj.lineno:
            path = Path(obj.filepath)
            if path not in self._sources:
                self._sources[path] = path.read_text().splitlines()
            text = comment_doc(self._sources[path], obj.lineno)
            if text:
                obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj,
                                                 parser=agent.docstring_parser,
                                                 parser_options=agent.docstring_options)
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
