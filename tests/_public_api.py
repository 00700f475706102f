"""The public functions of the package, shared by the tests that walk them."""

from __future__ import annotations

import importlib
import inspect

import jaxdyn


def public_functions() -> dict:
    """``{name: function}`` over ``__all__`` of jaxdyn and its subpackages (first name wins)."""
    out = {}
    for mod in ["jaxdyn"] + [f"jaxdyn.{s}" for s in jaxdyn._SUBPACKAGES]:
        m = importlib.import_module(mod)
        for name in getattr(m, "__all__", ()):
            obj = getattr(m, name, None)
            if callable(obj) and not inspect.isclass(obj) and not inspect.ismodule(obj):
                out.setdefault(name, obj)
    return out
