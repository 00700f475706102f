"""Progress within a chunk: the engine's bar moves while a chunk computes.

The engine installs a sink for the chunk in flight (:func:`within_chunk`); a kind's long
loops report how far they are with :func:`advance` — the segment loop of
:func:`segments.integrate_segments` after every segment, a per-frame measurement after every
frame. A kind whose chunk has several long parts declares them with :func:`plan` (their
shares of the chunk's time, e.g. the integration and the W2 assignments) and enters each with
:func:`stage`; without a sink every call is a no-op.
"""

from __future__ import annotations

import contextlib
import threading

_local = threading.local()


class _Chunk:
    def __init__(self, sink):
        self.sink = sink
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


@contextlib.contextmanager
def within_chunk(sink):
    """While the block runs, :func:`advance` calls ``sink(fraction_of_chunk_done)``.

    Args:
      sink: called with the fraction of the chunk done (0…1, never decreasing).

    Yields:
      The chunk's progress record.
    """
    prev = getattr(_local, "chunk", None)
    _local.chunk = _Chunk(sink)
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


def advance(done, total):
    """``done`` of ``total`` units of the current stage are finished."""
    ch = getattr(_local, "chunk", None)
    if ch is not None and total > 0:
        ch.report(done / total)
