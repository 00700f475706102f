"""Host-side checks of a diffrax solve's times (``check_times``).

``diffrax.diffeqsolve`` checks its times inside the program with ``equinox.error_if`` (the
``SaveAt`` times increasing and within [t0, t1]; ``(t1 − t0)·dt0 ≥ 0``). ``diffeqsolve`` is itself
jitted, so those checks always see traced values and become host callbacks, and JAX writes no
program with a host callback to the persistent compilation cache: the Gaussian closure and
density solves are compiled again in every process. Concrete times are checked here first, on
the host, so that a bad input gets a clear ``ValueError`` before any tracing.

Tried and withdrawn (session 6): tracing those solves with equinox's checks switched off through
its module-level ``EQX_ON_ERROR`` default made the programs cacheable, but equinox's own jitted
check (``branched_error_if_impl_jit``) is not keyed on that default, so a trace made with the
checks off was reused afterwards by *every* ``error_if`` of the process — user code's included —
which then stopped raising. Caching these solves needs a way that leaves equinox's global state
alone."""

from __future__ import annotations

import numpy as np

__all__ = ["check_times"]


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
