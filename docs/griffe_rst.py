"""A griffe extension of the jaxdyn site: the package's reST markup in Markdown.

The docstrings follow the Google convention with a little reStructuredText inside (Sphinx
roles such as :func:`simulate`, double-backquoted literals, ``.. math::`` blocks). mkdocstrings
renders Markdown, so this extension rewrites, on every docstring as griffe loads it:

* ``:role:`target``` (func, class, meth, mod, attr, data, obj, exc) -> `` `target` ``
  (a leading ``~`` or ``!`` dropped);
* double backquotes -> single backquotes (code);
* a ``.. math::`` block -> a ``$$ ... $$`` display (typeset by MathJax on the site);
* ``docs/math.md §B.4.2`` -> a link to that section of the maths page.
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


class RestToMarkdown(griffe.Extension):
    """Rewrite every docstring of the loaded package (see the module docstring)."""

    def on_instance(self, *, node, obj, agent, **kwargs):  # noqa: ARG002 (griffe's signature)
        """Rewrite ``obj``'s docstring in place."""
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
