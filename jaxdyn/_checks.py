"""Host-side checks of concrete inputs shared by the drivers.

Each raises a clear ``ValueError`` naming the problem before any tracing.
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_times"]


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
