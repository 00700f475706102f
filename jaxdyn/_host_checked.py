"""Trace a diffrax solve without host callbacks, so that JAX can cache its program.

``diffrax.diffeqsolve`` checks its times inside the program with ``equinox.error_if`` (the
``SaveAt`` times increasing and within [t0, t1]; ``(t1 − t0)·dt0 ≥ 0``). ``diffeqsolve`` is itself
jitted, so those checks always see traced values and become host callbacks, and JAX writes no
program with a host callback to the persistent compilation cache ("Not writing persistent cache
entry … because it uses host callbacks"): such a solve was compiled again in every process.

:func:`host_checked` traces with equinox's runtime checks off (equinox's documented
``EQX_ON_ERROR=off`` behaviour, for the duration of the call only). A caller uses it only when it
has checked the same conditions on the host (concrete times; a clear ``ValueError`` otherwise),
passes ``throw=False`` to diffrax and raises nothing from inside the program; its jitted
function takes the flag as a static argument, so that a program traced with the checks off is
never reused for traced times. The numbers computed are those of the checked program."""

from __future__ import annotations

import contextlib

import numpy as np

__all__ = ["host_checked", "check_times"]


@contextlib.contextmanager
def host_checked(active: bool = True):
    """While active, ``equinox.error_if`` adds nothing to a traced program (unless the user
    chose another mode than the default ``raise`` through ``EQX_ON_ERROR``: then left as is)."""
    if not active:
        yield
        return
    try:  # the module-level default that ``error_if`` reads (private to equinox: if a
        # later equinox moves it, the solve keeps its checks and is merely not cached)
        from equinox import _errors
    except ImportError:
        _errors = None
    prev = getattr(_errors, "EQX_ON_ERROR", None)
    if prev != "raise":
        yield
        return
    _errors.EQX_ON_ERROR = "off"
    try:
        yield
    finally:
        _errors.EQX_ON_ERROR = prev


def check_times(t0, t1, ts, dt0=None, *, name: str = "saveat") -> None:
    """On the host, what diffrax checks in the program: ``ts`` non-decreasing and within
    [t0, t1] (t0 < t1), and ``dt0`` (if given) > 0. ValueError naming the problem."""
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
