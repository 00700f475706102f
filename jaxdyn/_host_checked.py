"""Diffrax solves traced without host callbacks, so that JAX caches their programs; and the
host-side checks of their times that make this safe.

``diffrax.diffeqsolve`` checks its times inside the program with ``equinox.error_if`` (the
``SaveAt`` times increasing and within [t0, t1]; ``(t1 − t0)·dt0 ≥ 0``). ``diffeqsolve`` is itself
jitted, so those checks always see traced values and become host callbacks, and JAX writes no
program with a host callback to the persistent compilation cache: such a solve would be compiled
again in every process.

:func:`check_times` checks the same conditions on the host (a clear ``ValueError`` before any
tracing). :func:`host_checked` then traces the solve with equinox's runtime checks off (equinox's
documented ``EQX_ON_ERROR=off`` behaviour, swapped in for the duration of the call only) **inside a
JAX user context** (``jax.make_user_context``), a value that JAX puts in the key of every jit,
tracing and lowering cache. That context is what makes the swap safe:

- session 6 tried the swap alone and withdrew it: equinox's own jitted check
  (``branched_error_if_impl_jit``) is keyed on its arguments, not on the module-level default, so a
  trace made with the checks off was reused afterwards by every ``error_if`` of the process with
  the same shapes (user code included), which then stopped raising;
- inside the context every jitted function is traced and cached apart from the same function
  outside it, so the traces made with the checks off are only ever reused inside the context (by
  the next host-checked solve), and a trace made outside (with the checks on) is never reused by a
  host-checked solve.

Callers use it only when they have checked the times on the host and raise nothing from inside
the program (``throw=False`` to diffrax; a solve asked to raise keeps equinox's checks, and is not
cached). The numbers computed are those of the checked program. The swap of equinox's default is
process-wide while it lasts: a *different thread* tracing an ``error_if`` at that moment (outside
the context) would trace it with the checks off; jaxdyn traces from one thread. If equinox's
private default is not where this module expects it, or the user chose another mode than the
default ``raise`` (``EQX_ON_ERROR``), the checks are left as they are (the solve is then merely not
cached)."""

from __future__ import annotations

import contextlib
import threading

import numpy as np

__all__ = ["check_times", "host_checked"]

_LOCK = threading.RLock()
_CONTEXT = None


def _context():
    """The user context (made once, lazily: ``jax.make_user_context`` is not thread-safe and
    importing this module must not import JAX)."""
    global _CONTEXT
    with _LOCK:
        if _CONTEXT is None:
            import jax

            _CONTEXT = jax.make_user_context(None)
        return _CONTEXT


@contextlib.contextmanager
def host_checked(active: bool = True):
    """While active: JAX's caches keyed on a jaxdyn context, and ``equinox.error_if`` adding
    nothing to a program traced meanwhile (see the module docstring for why both)."""
    if not active:
        yield
        return
    try:  # equinox's module-level default that ``error_if`` reads (private to equinox)
        from equinox import _errors
    except ImportError:  # pragma: no cover - a later equinox
        _errors = None
    if getattr(_errors, "EQX_ON_ERROR", None) != "raise":
        yield
        return
    with _context()("jaxdyn.host_checked"), _LOCK:
        prev = _errors.EQX_ON_ERROR
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
