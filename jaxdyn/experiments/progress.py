"""Progress within a chunk: the engine's bar moves while a chunk computes.

The engine installs a sink for the chunk in flight (:func:`within_chunk`); a kind's long
loops report how far they are with :func:`advance` — the segment loop of
:func:`segments.integrate_segments` after every segment, a per-frame measurement after every
frame. A kind whose chunk has several long parts declares them with :func:`plan` (their
shares of the chunk's time, e.g. the integration and the W2 assignments) and enters each with
:func:`stage`; without a sink every call is a no-op. A kind may also say what it is doing
(:func:`note`: an optimiser's iteration and loss); the engine shows that text after the bar
with the time the chunk in flight has left, extrapolated from its fraction done. Both calls
also stop the chunk when a signal is pending: they are where a kind hands control back to
the host between its jitted parts.
"""

from __future__ import annotations

import contextlib
import threading
import time

_local = threading.local()


class _Chunk:
    def __init__(self, sink, note=None):
        self.sink = sink
        self.note = note
        self.t0 = time.monotonic()
        self.stages = {}
        self.offset = 0.0  # fraction of the chunk before the current stage
        self.weight = 1.0  # fraction of the chunk the current stage covers
        self.done = 0.0

    def set_stage(self, name):
        total = sum(self.stages.values()) or 1.0
        if name in self.stages:
            names = list(self.stages)
            self.offset = sum(self.stages[n] for n in names[:names.index(name)]) / total
            self.weight = self.stages[name] / total

    def report(self, frac):
        f = self.offset + self.weight * min(max(frac, 0.0), 1.0)
        if f > self.done:
            self.done = f
            self.sink(f)

    def left(self):
        """The chunk's seconds left, from its fraction done and its time so far (None early)."""
        if self.done <= 0.0:
            return None
        return (time.monotonic() - self.t0) * (1.0 - self.done) / self.done


@contextlib.contextmanager
def within_chunk(sink, note=None):
    """While the block runs, :func:`advance` calls ``sink(fraction_of_chunk_done)``.

    Args:
      sink: called with the fraction of the chunk done (0…1, never decreasing).
      note: called by :func:`note` with a line of text (what the chunk is doing, and the
        chunk's time left when known), or None.

    Yields:
      The chunk's progress record.
    """
    prev = getattr(_local, "chunk", None)
    _local.chunk = _Chunk(sink, note)
    try:
        yield _local.chunk
    finally:
        _local.chunk = prev


def plan(**weights):
    """The chunk in flight runs these stages in this order, with these shares of its time."""
    ch = getattr(_local, "chunk", None)
    if ch is not None:
        ch.stages = {k: float(v) for k, v in weights.items()}


def stage(name):
    """The chunk in flight enters stage ``name`` (unknown names leave the split unchanged)."""
    ch = getattr(_local, "chunk", None)
    if ch is not None:
        ch.set_stage(name)


def _stop_if_signalled():
    """Raise the ``KeyboardInterrupt`` of a signal the CLI's handler recorded.

    The handler's own exception can be lost (raised where a caller swallows it, or in a
    callback from XLA); a kind's loops report progress between their jitted parts, so the
    check here stops the chunk there.

    Raises:
      KeyboardInterrupt: a SIGINT/SIGTERM is pending.
    """
    from .. import io as jio

    if jio.PENDING_SIGNALS:
        raise KeyboardInterrupt(f"signal {jio.PENDING_SIGNALS[-1]}")


def advance(done, total):
    """``done`` of ``total`` units of the current stage are finished.

    In a chunk in flight a pending SIGINT/SIGTERM stops it here (``KeyboardInterrupt``).
    """
    ch = getattr(_local, "chunk", None)
    if ch is not None:
        _stop_if_signalled()
    if ch is not None and total > 0:
        ch.report(done / total)


def _duration(seconds):
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def note(text):
    """Say what the chunk in flight is doing (shown after the bar with the chunk's time left).

    A pending SIGINT/SIGTERM stops the chunk here (``KeyboardInterrupt``).
    """
    ch = getattr(_local, "chunk", None)
    if ch is not None:
        _stop_if_signalled()
    if ch is not None and ch.note is not None:
        left = ch.left()
        ch.note(text if left is None else f"{text}; chunk ~{_duration(left)} left")
