"""Host-side checks of concrete inputs shared by the drivers.

One set of checks (finite, sign, integer, shape, length) for every library entry point, so
that the next function inherits them: each raises a clear ``ValueError`` naming the argument
and the problem before any tracing. Traced values are skipped (the programs flag them through
their result codes) except where a check is about a shape, which is known when tracing.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from ._errors import DtypeError, HostOnlyError, dtype_message, host_only_message

__all__ = ["DTYPES_RULE", "DtypeError", "HostOnlyError", "any_nonfinite", "check_bounds", "check_cloud",
           "check_density", "check_dtype", "check_finite", "check_host", "check_integer",
           "check_same_length", "check_square", "check_times", "float_dtype", "is_traced",
           "nan_where", "real_arrays", "scalar_domain", "settings_problem", "with_settings"]

#: the dtype rule of the public entry points, stated once (docs and docstrings refer to it)
DTYPES_RULE = ("float32 or float64 (float16 and bfloat16 where a function says so); integers "
               "and booleans are converted to the float dtype of the other inputs (JAX's "
               "default float where none is a float); complex inputs are refused")


def check_times(t0, t1, ts, dt0=None, *, name: str = "saveat") -> None:
    """Check on the host what diffrax checks in the program.

    Args:
        t0: the start time.
        t1: the end time (t0 < t1).
        ts: the save times: 1-D, finite, non-decreasing, within [t0, t1].
        dt0: the step, if any (> 0).
        name: the argument's name, used in the messages.

    Raises:
        ValueError: naming the first condition that fails.
    """
    ts = np.asarray(ts, np.float64)
    t0, t1 = float(t0), float(t1)
    if ts.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of times, got shape {ts.shape}")
    if not np.all(np.isfinite(ts)):
        raise ValueError(f"{name} times must be finite")
    if np.any(ts[1:] < ts[:-1]):
        i = int(np.argmax(ts[1:] < ts[:-1]))
        raise ValueError(f"{name} times must be non-decreasing: {ts[i]!r} then {ts[i + 1]!r}")
    if ts.size and (ts.min() < t0 or ts.max() > t1):
        raise ValueError(f"{name} times must lie in [{t0!r}, {t1!r}], got [{ts.min()!r}, {ts.max()!r}]")
    if dt0 is not None and not float(dt0) > 0:
        raise ValueError(f"the step dt must be > 0, got {float(dt0)!r}")


def is_traced(a) -> bool:
    """Whether ``a`` is a tracer (a value known only when the program runs)."""
    return isinstance(a, jax.core.Tracer)


def _dtype_of(a) -> np.dtype:
    dtype = getattr(a, "dtype", None)
    if dtype is None:
        dtype = np.asarray(a).dtype
    return np.dtype(dtype)


def check_dtype(name: str, a, *, half: bool = False, integers: bool = True,
                fn: str = "") -> np.dtype:
    """Refuse an input whose dtype the computation cannot take, by the parameter's name.

    The rule of every public entry point: float32 and float64 are taken; float16 and bfloat16
    only where ``half`` (a linear-algebra or FFT step has no half-precision path); integers and
    booleans where ``integers`` (the caller converts them, :func:`float_dtype`); complex and
    non-numeric dtypes never (a real computation would drop the imaginary part). The dtype is
    known when tracing, so a tracer is checked like a concrete array.

    Args:
        name: the parameter's name, used in the message.
        a: an array-like or a tracer (None is skipped).
        half: accept float16 and bfloat16.
        integers: accept integer and boolean dtypes.
        fn: the function's name, prefixed to the message where given.

    Returns:
        ``a``'s dtype (None for None).

    Raises:
        DtypeError: (a TypeError) naming the parameter, the dtype it got and the dtypes taken.
    """
    if a is None:
        return None
    dtype = _dtype_of(a)
    msg = dtype_message(name, dtype, half=half, integers=integers, fn=fn)
    if msg:
        raise DtypeError(msg)
    return dtype


def float_dtype(*arrays):
    """The float dtype to compute in, by the integer rule of the entry points.

    Args:
        *arrays: the inputs (arrays, array-likes or tracers; None entries skipped).

    Returns:
        The dtype of the inputs promoted together, integers and booleans converted to the
        float dtype of the others (JAX's default float where none is a float).
    """
    import jax.numpy as jnp

    return jnp.result_type(*[_dtype_of(a) for a in arrays if a is not None], float)


def real_arrays(*, half: bool = False, fn: str = "", **arrays) -> list:
    """The arrays checked by :func:`check_dtype`, integers converted to float.

    Those of integer or boolean dtype are converted to the float dtype of all of them
    (:func:`float_dtype`); float inputs are returned as given. A dtype not taken raises
    :class:`DtypeError` (by :func:`check_dtype`), naming the first such parameter.

    Args:
        half: accept float16 and bfloat16.
        fn: the function's name, for the messages.
        **arrays: the inputs by parameter name (None entries are returned as None).

    Returns:
        The arrays, in the order given.
    """
    import jax.numpy as jnp

    for name, a in arrays.items():
        check_dtype(name, a, half=half, fn=fn)
    dtype = float_dtype(*arrays.values())
    return [a if a is None or jnp.issubdtype(_dtype_of(a), jnp.inexact)
            else jnp.asarray(a, dtype) for a in arrays.values()]


def check_host(fn: str, **arrays) -> None:
    """Refuse traced inputs to a host function (NumPy on its inputs), by the function's name.

    Args:
        fn: the function's name.
        **arrays: its array inputs by parameter name (None skipped).

    Raises:
        HostOnlyError: (a TypeError) naming the function and the first traced parameter.
    """
    for name, a in arrays.items():
        if is_traced(a):
            raise HostOnlyError(host_only_message(fn, name))


def any_nonfinite(*arrays):
    """A scalar flag for :func:`nan_where`: some floating entry of the arrays is NaN or inf.

    Args:
        *arrays: arrays or tracers (None, integer and boolean arrays skipped).

    Returns:
        A boolean scalar (a JAX array), or None where nothing is to check.
    """
    import jax.numpy as jnp

    bad = None
    for a in arrays:
        if a is None or not jnp.issubdtype(_dtype_of(a), jnp.inexact):
            continue
        b = jnp.any(~jnp.isfinite(a))
        bad = b if bad is None else bad | b
    return bad


def check_finite(name: str, a, *, what: str = "") -> None:
    """Refuse a concrete array that holds NaN or inf (a traced one is left to the program).

    Args:
        name: the argument's name, used in the message.
        a: an array-like (nested lists, NumPy, a concrete ``jax.Array``) or a tracer (skipped);
            None is skipped.
        what: what the argument is, appended to the name in the message.

    Raises:
        ValueError: naming the argument and how many of its entries are not finite.
    """
    if a is None or is_traced(a):
        return
    arr = np.asarray(a)
    if arr.dtype.kind == "V" and arr.dtype.itemsize <= 2:  # ml_dtypes' small floats (bfloat16)
        arr = arr.astype(np.float32)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"{name}{what} must hold real numbers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.inexact):
        bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
        if bad:
            raise ValueError(f"{name}{what} must be finite: {bad} of its {arr.size} entries "
                             "are NaN or inf")


def check_integer(name: str, v, *, minimum: int | None = None,
                  integral_floats: bool = False) -> int:
    """A concrete integer option (a size, a count of iterations), checked; returned as an int.

    Args:
        name: the argument's name, used in the message.
        v: the value: a Python or NumPy integer (a float with an integral value too when
            ``integral_floats``); never a bool, a non-integral number or a traced value.
        minimum: the least value allowed (None: any).
        integral_floats: accept floats with an integral value (``8.0``).

    Returns:
        ``v`` as a Python int.

    Raises:
        ValueError: naming the argument, for a traced value, a bool, a non-integral or
            non-numeric value, or one below ``minimum``.
    """
    bound = "" if minimum is None else f" >= {minimum}"
    if is_traced(v):
        raise ValueError(f"{name} must be a concrete integer{bound} (it fixes an array size or "
                         "a loop length), got a traced value")
    ok = isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
    if not ok and integral_floats and isinstance(v, (float, np.floating)):
        ok = math.isfinite(v) and float(v).is_integer()
    if not ok or (minimum is not None and int(v) < minimum):
        raise ValueError(f"{name} must be an integer{bound}, got {v!r}")
    return int(v)


def check_density(name: str, rho, *, axis_name: str = "cells", fn: str = "") -> np.ndarray:
    """Concrete cell averages of a density on the host: finite, >= 0, with positive mass.

    Every row along the last axis (one density each) must have positive mass. Negative entries
    at the rounding level of the input's dtype (down to −64 ε max|ρ|, as a solver's positivity-
    preserving step may leave in an empty gap) count as 0 and are returned as 0; below that a
    density is refused.

    Args:
        name: the argument's name, used in the message.
        rho: (..., M) cell averages, M >= 1 (concrete).
        axis_name: what the last axis holds, for the message.
        fn: the function's name, for the message of a traced value.

    Returns:
        ``rho`` as a float64 NumPy array (rounding-level negatives set to 0).

    Raises:
        HostOnlyError: (a TypeError and a ValueError) naming the function, for a traced value.
        DtypeError: (a TypeError and a ValueError) naming the argument, for a complex dtype.
        ValueError: naming the argument, for an empty last axis, a NaN/inf or negative entry,
            or a row of zero mass.
    """
    if is_traced(rho):
        raise HostOnlyError(host_only_message(fn or "this function", name))
    given = np.asarray(rho)
    msg = dtype_message(name, given.dtype, half=True)
    if msg:
        raise DtypeError(msg)
    if given.dtype.kind == "V":  # (bfloat16: NumPy's float conversion goes through float32)
        given = given.astype(np.float32)
    eps = np.finfo(given.dtype if np.issubdtype(given.dtype, np.floating) else np.float64).eps
    r = given.astype(np.float64)
    if r.ndim < 1 or r.shape[-1] < 1:
        raise ValueError(f"{name} must hold at least one {axis_name[:-1]} (shape (..., M), "
                         f"M >= 1), got shape {r.shape}")
    check_finite(name, r, what=" (cell averages of a density)")
    r = np.where((r < 0) & (r >= -64 * eps * np.abs(r).max(axis=-1, keepdims=True)), 0.0, r)
    if np.any(r < 0):
        at = tuple(int(i) for i in np.unravel_index(np.argmin(r), r.shape))
        raise ValueError(f"{name} (cell averages of a density) must be >= 0, got "
                         f"{float(r.min())!r} at index {at[0] if len(at) == 1 else at}")
    mass = r.sum(axis=-1)
    if np.any(mass <= 0):
        raise ValueError(f"{name} (cell averages of a density) must have positive mass; "
                         "it is 0 everywhere" + ("" if r.ndim == 1 else " in some row"))
    return r


def check_cloud(name: str, xs, *, min_points: int = 1, finite: bool = True) -> None:
    """Refuse clouds (..., N, d) with fewer than ``min_points`` points, d = 0, or NaN/inf.

    A dtype that is not real is refused too (complex: its imaginary part would be dropped).
    The shape and dtype are checked for concrete and traced values alike; finiteness on the
    host, for concrete values only (a traced cloud is the program's to flag).

    Args:
        name: the argument's name, used in the message.
        xs: (..., N, d) clouds.
        min_points: the least N.
        finite: check concrete values for NaN and inf.

    Raises:
        ValueError: naming the argument, its shape, its dtype, or the first cloud that is not
            finite.
    """
    shape = tuple(np.shape(xs))
    if len(shape) < 2:
        raise ValueError(f"{name} must have shape (..., N, d), got {shape}")
    if shape[-2] < min_points or shape[-1] < 1:
        raise ValueError(f"{name} must hold clouds of at least {min_points} point(s) of "
                         f"dimension d >= 1 (shape (..., N, d)), got shape {shape}")
    dtype = getattr(xs, "dtype", None)
    dtype = np.asarray(xs).dtype if dtype is None else np.dtype(dtype)
    if np.issubdtype(dtype, np.complexfloating) or not (
            np.issubdtype(dtype, np.number) or dtype == bool or dtype.kind == "V"):
        raise ValueError(f"{name} must hold real numbers, got dtype {dtype}")
    if not finite or is_traced(xs):
        return
    arr = np.asarray(xs)
    if np.issubdtype(arr.dtype, np.inexact):
        ok = np.isfinite(arr).all(axis=(-2, -1))
        if not np.all(ok):
            where = "" if arr.ndim == 2 else f" (cloud {tuple(int(i) for i in np.argwhere(~ok)[0])})"
            raise ValueError(f"{name} must be finite: it holds NaN or inf{where}")


def check_same_length(name_a: str, a, name_b: str, b, *, axis_b: int = -1) -> None:
    """Refuse two arrays that must run along one axis but have different lengths.

    Args:
        name_a: the first argument's name.
        a: a 1-D array (its length).
        name_b: the second argument's name.
        b: an array whose axis ``axis_b`` must have ``a``'s length.
        axis_b: that axis of ``b``.

    Raises:
        ValueError: naming both arguments and both lengths (or ``a`` not 1-D).
    """
    sa, sb = tuple(np.shape(a)), tuple(np.shape(b))
    if len(sa) != 1:
        raise ValueError(f"{name_a} must be 1-D, got shape {sa}")
    if not sb or sb[axis_b] != sa[0]:
        raise ValueError(f"{name_a} and {name_b} must have the same length: {name_a} has "
                         f"{sa[0]} entries, {name_b} {sb[axis_b] if sb else 0} (shape {sb})")


def check_bounds(name: str, v, *, low=None, high=None, low_open: bool = False,
                 high_open: bool = False, what: str = "") -> None:
    """Refuse a concrete number (or array of numbers) that is not finite or lies out of range.

    Traced values are skipped (the program flags them); None is skipped.

    Args:
        name: the argument's name, used in the message.
        v: a number, an array-like of numbers or a tracer.
        low: the least value allowed (None: no lower bound).
        high: the largest value allowed (None: no upper bound).
        low_open: exclude ``low`` itself (``> low`` rather than ``>= low``).
        high_open: exclude ``high`` itself.
        what: what the argument is, appended to the name in the message.

    Raises:
        ValueError: naming the argument, the range and the value at fault.
    """
    if v is None or is_traced(v):
        return
    arr = np.asarray(v)
    real = arr.dtype.kind in "iuf" or (arr.dtype.kind == "V" and arr.dtype.itemsize <= 2)
    if not real:  # (kind "V": the 8- and 16-bit floats of ml_dtypes, e.g. bfloat16)
        raise ValueError(f"{name}{what} must be a real number, got {v!r}")
    a = arr.astype(np.float64)
    conds, bad = [], ~np.isfinite(a)
    if low is not None:
        conds.append(f"{'>' if low_open else '>='} {low!r}")
        bad |= (a <= low) if low_open else (a < low)
    if high is not None:
        conds.append(f"{'<' if high_open else '<='} {high!r}")
        bad |= (a >= high) if high_open else (a > high)
    if np.any(bad):
        shown = a.item() if a.ndim == 0 else a[bad].flat[0].item()
        rule = " and ".join(conds + ["finite"])
        raise ValueError(f"{name}{what} must be {rule}, got {shown!r}")


def check_square(name: str, a, d: int | None = None, *, batch: bool = False) -> None:
    """Refuse an array that is not a square (d, d) matrix (or a stack (..., d, d) if ``batch``).

    The shape is checked for concrete and traced values alike.

    Args:
        name: the argument's name, used in the message.
        a: an array-like or a tracer.
        d: the size it must have (None: any).
        batch: allow leading axes.

    Raises:
        ValueError: naming the argument, the shape wanted and the shape given.
    """
    shape = tuple(np.shape(a))
    ok = (len(shape) >= 2 if batch else len(shape) == 2) and shape[-1] == shape[-2] \
        and (d is None or shape[-1] == d)
    if not ok:
        n = "d" if d is None else str(d)
        want = f"({'..., ' if batch else ''}{n}, {n})"
        raise ValueError(f"{name} must be a square matrix of shape {want}, got shape {shape}")


def scalar_domain(name: str, v, *, low=None, high=None, low_open: bool = False,
                  high_open: bool = False, what: str = ""):
    """One rule for a value-constrained parameter: concrete values refused, traced ones flagged.

    A concrete value outside the range (or not finite) gives the message of the ValueError the
    caller raises before compute (:func:`check_bounds`); a traced one gives the program's flag,
    which the caller turns into NaN (:func:`nan_where`) since a bare array has no status.

    Args:
        name: the parameter's name, used in the message.
        v: a number, an array-like of numbers or a tracer (None: nothing to check).
        low: the least value allowed (None: no lower bound).
        high: the largest value allowed (None: no upper bound).
        low_open: exclude ``low`` itself.
        high_open: exclude ``high`` itself.
        what: what the parameter is, appended to the name in the message.

    Returns:
        ``(message, bad)``: the ValueError's message for a concrete value out of its domain
        (else None), and for a traced value a boolean array of its shape, True where it is not
        finite or out of range (None for a concrete value).
    """
    if v is None:
        return None, None
    if not is_traced(v):
        try:
            check_bounds(name, v, low=low, high=high, low_open=low_open, high_open=high_open,
                         what=what)
        except ValueError as e:
            return str(e), None
        return None, None
    import jax.numpy as jnp  # (this module stays importable without tracing anything)

    bad = ~jnp.isfinite(v)
    if low is not None:
        bad = bad | ((v <= low) if low_open else (v < low))
    if high is not None:
        bad = bad | ((v >= high) if high_open else (v > high))
    return None, bad


def nan_where(bad, out):
    """``out`` with NaN where ``bad`` (−1 in integer leaves, False in boolean ones).

    Args:
        bad: None (``out`` unchanged) or flags that broadcast against each leaf's leading axes
            (a scalar flag poisons the whole leaf); several flags may be given as a tuple or
            list (None entries skipped), combined by "or".
        out: an array or a pytree of arrays.

    Returns:
        ``out`` with the flagged entries replaced.
    """
    import jax.numpy as jnp

    if isinstance(bad, (tuple, list)):
        flags = [b for b in bad if b is not None]
        bad = None
        for b in flags:
            bad = b if bad is None else jnp.logical_or(bad, b)
    if bad is None:
        return out

    def one(a):
        a = jnp.asarray(a)
        b = jnp.reshape(bad, jnp.shape(bad) + (1,) * max(a.ndim - jnp.ndim(bad), 0))
        if jnp.issubdtype(a.dtype, jnp.inexact):
            fill = jnp.nan
        elif a.dtype == jnp.bool_:
            fill = False
        else:
            fill = -1
        return jnp.where(b, jnp.asarray(fill, a.dtype), a)

    return jax.tree.map(one, out)


def settings_problem(cls, options, settings: dict, caller: str):
    """What is wrong with the ``options`` and keywords ``settings`` of a call, or None.

    The shared rule of the entry points that take an options dataclass and its fields as
    keywords (:func:`jaxdyn.reach`, :func:`jaxdyn.control.measure_control`,
    :func:`jaxdyn.solve_moments`, :func:`jaxdyn.solve_moments_batch`).

    Args:
        cls: the options class (a dataclass).
        options: an instance of ``cls`` or None.
        settings: the keywords given beside it.
        caller: the function named in the message.

    Returns:
        None when they fit, else the message of the TypeError the caller raises: options of
        another type, or the unknown keywords, each with the nearest field ("did you mean").
    """
    import dataclasses
    import difflib

    names = [f.name for f in dataclasses.fields(cls)]
    if options is not None and not isinstance(options, cls):
        return (f"{caller}() takes options={cls.__name__}(...) and its fields as keywords; got "
                f"options of type {type(options).__name__}")
    unknown = sorted(set(settings) - set(names))
    if not unknown:
        return None
    hints = [f"{near[0]!r} for {k!r}" for k in unknown
             if (near := difflib.get_close_matches(k, names, n=1))]
    return (f"{caller}() got unexpected keyword argument(s) {unknown}; the settings are the "
            f"fields of {cls.__name__}: {', '.join(names)}"
            + (f" (did you mean {', '.join(hints)}?)" if hints else ""))


def with_settings(cls, options, settings: dict):
    """``options`` (None: ``cls()``) with the keywords ``settings`` replacing its fields.

    Args:
        cls: the options class (a dataclass).
        options: an instance of ``cls`` or None.
        settings: field values by name (checked by :func:`settings_problem` first).

    Returns:
        The options (new ones, made and so checked, when ``settings`` is not empty).
    """
    import dataclasses

    base = options if options is not None else cls()
    return dataclasses.replace(base, **settings) if settings else base
