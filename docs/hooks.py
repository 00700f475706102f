"""MkDocs hooks of the jaxdyn site: the API pages list every public name.

A line ``::: jaxdyn.<subpackage>`` alone (no options) becomes the mkdocstrings block of that
subpackage with ``members`` set to its public names (its runtime ``__all__`` less
:data:`NOT_API`), so that a page documents exactly the public names and cannot drift from the
code. The line ``::: jaxdyn`` becomes a table of the
top-level names, each linked to its entry in its subpackage's page, followed by the full entries
of the names that no subpackage page documents.
"""

from __future__ import annotations

import importlib
import re

SUBPACKAGES = ("sphere", "kernels", "models", "integrators", "simulation", "spectral",
               "clusters", "gaussian", "distances", "control", "pde", "encoder", "weights",
               "choices")
#: names that a subpackage's ``__all__`` exports for the CLI's process machinery
#: (``jaxdyn.experiments``) and that are not part of the library's API: the pages leave them out
NOT_API = {"simulation": ("abandon_cluster", "all_gather_rows", "backends_initialized",
                          "is_lost_process_error")}
_DIRECTIVE = re.compile(r"^::: (jaxdyn(?:\.(\w+))?)[ \t]*$", re.M)


def public_names(module: str) -> list[str]:
    """The public names of a jaxdyn module: its ``__all__`` (modules, metadata, NOT_API excluded)."""
    mod = importlib.import_module(module)
    hidden = NOT_API.get(module.partition(".")[2], ())
    names = [n for n in getattr(mod, "__all__", []) if n not in hidden]
    if module == "jaxdyn":
        names = [n for n in names if n not in SUBPACKAGES and n not in ("io", "__version__")]
    return sorted(names, key=str.lower)


def documented_at(name: str) -> str | None:
    """Where a top-level name is documented: ``jaxdyn.<subpackage>.<name>``, or None."""
    obj = getattr(importlib.import_module("jaxdyn"), name)
    for sub in SUBPACKAGES:
        mod = importlib.import_module(f"jaxdyn.{sub}")
        if name in getattr(mod, "__all__", ()) and getattr(mod, name) is obj:
            return f"jaxdyn.{sub}.{name}"
    return None


def _summary(obj) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    return doc[0].replace("|", "\\|") if doc else ""


def _block(module: str, members: list[str]) -> str:
    listed = "\n".join(f"        - {m}" for m in members)
    return f"::: {module}\n    options:\n      members:\n{listed}\n"


def _top_level() -> str:
    jaxdyn = importlib.import_module("jaxdyn")
    rows, own = [], []
    for name in public_names("jaxdyn"):
        where = documented_at(name)
        if where is None:
            own.append(name)
            rows.append(f"| [`{name}`](#jaxdyn.{name}) | below | {_summary(getattr(jaxdyn, name))} |")
        else:
            sub = where.split(".")[1]
            rows.append(f"| [`{name}`][{where}] | [`jaxdyn.{sub}`]({sub}.md) "
                        f"| {_summary(getattr(jaxdyn, name))} |")
    table = "| name | documented in | summary |\n|---|---|---|\n" + "\n".join(rows) + "\n"
    entries = "\n".join(f"::: jaxdyn.{name}\n    options:\n      show_root_heading: true\n"
                        for name in own)
    return table + "\n" + entries


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (the hook's signature)
    """Expand the API directives of a page (see the module docstring)."""
    def expand(m):
        module, sub = m.group(1), m.group(2)
        if sub is None:
            return _top_level()
        return _block(module, public_names(module))

    return _DIRECTIVE.sub(expand, markdown)
