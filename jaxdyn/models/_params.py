"""The parameters of the models: host checks, conversion without device work, traced checks.

Concrete values are checked on the host and converted without device work; traced ones are
checked by :func:`invalid_parameters`, which the drivers turn into ``RESULTS.invalid_input``.

A model's constructor may run inside ``jax.jit`` (or ``jax.export``) on NumPy weights. A ``jnp``
operation on a concrete value there, or an eager device computation outside a trace, would
compile a program of its own at every construction (and a program run on the CPU backend cannot
sit inside one lowered for an accelerator). So concrete inputs are checked and cast with NumPy on
the host and placed with ``jax.device_put`` (a transfer, not a program); traced inputs are cast
inside the caller's trace and checked by the program (:func:`invalid_parameters`).

Each model class declares the domain of its value-constrained parameters once, in its
``domains`` table (name → :class:`Domain`): the constructor's host check and ``invalid()``
both read it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Domain(NamedTuple):
    """Where a parameter's values must lie.

    Attributes:
      lower: ``"positive"`` (finite and > 0), ``"nonnegative"`` (finite and >= 0) or
        ``"finite"`` (any finite value).
      rank: the parameter's own number of axes (0 for a scalar); axes before them are a stack's
        (a batch of models built by ``stack_models``).
      what: the parameter's meaning, for error messages (e.g. ``"inverse temperature"``).
    """

    lower: str
    rank: int = 0
    what: str = ""


def is_traced(a) -> bool:
    """Whether ``a`` is a tracer (a value known only when the program runs)."""
    return isinstance(a, jax.core.Tracer)


def float_dtype(*arrays, default=np.float32) -> np.dtype:
    """The floating dtype the arrays promote to (JAX's canonical one: float32 without x64).

    Arrays without a floating dtype (Python numbers, integer arrays) do not take part.

    Args:
      *arrays: arrays, tracers or other values.
      default: the dtype when none of them has a floating one.

    Returns:
      A NumPy dtype.
    """
    dts = [jax.dtypes.canonicalize_dtype(a.dtype) for a in arrays
           if hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)]
    return np.dtype(jax.dtypes.canonicalize_dtype(jnp.result_type(*dts) if dts else default))


def to_array(a, dtype):
    """``a`` as a JAX array of ``dtype`` without a program of its own.

    A tracer is cast inside its trace; a concrete array of the dtype (not weakly typed) is kept;
    anything else is cast with NumPy on the host and placed with ``jax.device_put``.

    Args:
      a: an array-like or a tracer.
      dtype: the dtype wanted.

    Returns:
      A JAX array (or a tracer) of ``dtype``.
    """
    dtype = np.dtype(dtype)
    if is_traced(a):
        return a if a.dtype == dtype else a.astype(dtype)
    if isinstance(a, jax.Array) and a.dtype == dtype and not a.weak_type:
        return a
    return jax.device_put(np.asarray(a, dtype))


def _label(name: str, domain: Domain) -> str:
    """The parameter as an error message names it: ``what`` if it starts with the name."""
    if domain.what.startswith(name):
        return domain.what
    return f"{name} ({domain.what})" if domain.what else name


def _out_of_domain(xp, v, domain: Domain):
    """Boolean array (the stack's shape): some entry of ``v`` outside ``domain``."""
    if domain.lower == "finite":
        ok = xp.isfinite(v)
    else:
        ok = xp.isfinite(v) & ((v > 0) if domain.lower == "positive" else (v >= 0))
    return ~xp.all(ok, axis=tuple(range(v.ndim - domain.rank, v.ndim))) if domain.rank else ~ok


def check_domain(name: str, value, domain: Domain) -> None:
    """Check a parameter against its domain: its number of axes always, its values on the host.

    The values of a tracer are left to :func:`invalid_parameters` (checked when the program runs).

    Args:
      name: the parameter's name, as the error message shows it.
      value: the parameter (any array-like, or a tracer; None is skipped).
      domain: where its values must lie.

    Raises:
      ValueError: naming the parameter, if it has the wrong number of axes, a dtype that is not
        real, or a concrete value outside ``domain`` (non-finite, negative, or zero where it
        must be positive).
    """
    if value is None:
        return
    v = value if is_traced(value) else np.asarray(value)
    if v.ndim != domain.rank:
        want = "a scalar" if domain.rank == 0 else f"an array of {domain.rank} axes"
        hint = ("; to sweep it, vmap over a stack of models (jaxdyn.stack_models)"
                if domain.rank == 0 else "")
        raise ValueError(f"{_label(name, domain)} must be {want}, got shape {tuple(v.shape)}{hint}")
    if not (jnp.issubdtype(v.dtype, jnp.integer) or jnp.issubdtype(v.dtype, jnp.floating)
            or v.dtype == bool):
        raise ValueError(f"{_label(name, domain)} must be real numbers, got dtype {v.dtype}")
    if not is_traced(v) and bool(_out_of_domain(np, v.astype(np.float64), domain)):
        bound = {"positive": "> 0 and finite", "nonnegative": ">= 0 and finite"}.get(
            domain.lower, "finite")
        shown = v.item() if v.ndim == 0 else (v.tolist() if v.size <= 16 else f"shape {v.shape}")
        raise ValueError(f"{_label(name, domain)} must be {bound}, got {shown!r}")


def parameter(cls, name: str, value, dtype):
    """A parameter checked against ``cls.domains[name]`` on the host, then as an array of dtype.

    Args:
      cls: the model class (its ``domains`` table names the parameter's domain).
      name: the parameter's name.
      value: the value given to the constructor (concrete or traced).
      dtype: the floating dtype of the model.

    Returns:
      The parameter as a JAX array of ``dtype`` (a tracer stays a tracer).
    """
    check_domain(name, value, cls.domains[name])
    return to_array(value, dtype)


def invalid_parameters(module):
    """Whether some parameter of ``module`` lies outside its domain (traced values included).

    Reads the ``domains`` table of the module's class and, recursively, every field that is a
    model or a control of its own (anything with an ``invalid()`` method). Concrete parameters
    were checked on the host when the model was built, so this is false for them unless a value
    was changed afterwards.

    Args:
      module: a model or control.

    Returns:
      A boolean array, True where a parameter lies outside its domain: a scalar for one model,
      the stack's shape for a stack of models. NumPy when every parameter involved is concrete
      (no device work), a JAX array otherwise.
    """
    bad = []
    for name, domain in type(module).domains.items():
        v = getattr(module, name, None)
        if v is not None:
            bad.append(_out_of_domain(jnp, v, domain) if is_traced(v)
                       else _out_of_domain(np, np.asarray(v), domain))
    for f in getattr(module, "__dataclass_fields__", {}):
        sub = getattr(module, f, None)
        if f not in type(module).domains and callable(getattr(sub, "invalid", None)) \
                and not isinstance(sub, type):
            bad.append(sub.invalid())
    if not bad:
        return np.False_
    out = bad[0]
    for b in bad[1:]:
        out = (jnp if any(is_traced(x) for x in (out, b)) else np).logical_or(out, b)
    return out
