"""The errors of the input rules and the dtype rule's message, in NumPy only (no JAX).

The host modules that import no JAX (:mod:`jaxdyn.spectral_host`) share them with
:mod:`jaxdyn._checks`, which re-exports them.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["DtypeError", "HostOnlyError", "dtype_message", "host_only_message", "is_half"]


class DtypeError(TypeError, ValueError):
    """An input of a dtype the function does not take: a TypeError (and a ValueError).

    A ``ValueError`` too, as the refusals of a non-real input were before one rule covered
    every entry point: ``except ValueError`` keeps catching them.
    """


class HostOnlyError(TypeError, ValueError):
    """A traced input to a host-only function: a TypeError (and a ValueError).

    A ``ValueError`` too, as some host functions refused a traced value with one before one
    rule covered them all.
    """


def is_half(dtype) -> bool:
    """Whether ``dtype`` is float16, bfloat16 or another float of at most 16 bits."""
    dtype = np.dtype(dtype)
    return dtype == np.float16 or (dtype.kind == "V" and dtype.itemsize <= 2)  # (ml_dtypes')


def dtype_message(name: str, dtype, *, half: bool = False, integers: bool = True,
                  fn: str = "") -> Optional[str]:
    """The message refusing ``dtype`` for the parameter ``name`` (None where it is taken).

    Args:
        name: the parameter's name.
        dtype: its dtype.
        half: float16 and bfloat16 are taken.
        integers: integers and booleans are taken (converted to float by the function).
        fn: the function's name, prefixed to the message where given.

    Returns:
        The message naming the parameter, the dtype it got and the dtypes taken, or None.
    """
    dtype = np.dtype(dtype)
    if dtype in (np.float32, np.float64) or (half and is_half(dtype)) or (
            integers and (np.issubdtype(dtype, np.integer) or dtype == bool)):
        return None
    taken = "float32 or float64" + (", float16 or bfloat16" if half else "")
    if integers:
        taken += " (or integers, converted to float)"
    if np.issubdtype(dtype, np.complexfloating):
        why = " (real numbers: the imaginary part would be dropped)"
    elif is_half(dtype):
        why = " (no half-precision path)"
    else:
        why = ""
    return f"{fn + ': ' if fn else ''}{name} must hold {taken} numbers{why}, got dtype {dtype}"


def host_only_message(fn: str, name: str) -> str:
    """The message refusing a traced ``name`` to the host-only function ``fn``.

    Args:
        fn: the function's name.
        name: the traced parameter's name.

    Returns:
        The message: the function is host-only, the parameter must be a concrete array.
    """
    return (f"{fn} is host-only: {name} must be a concrete array, not a traced value under "
            "jit, vmap or grad (it runs NumPy on the host); call it outside the transformation")
