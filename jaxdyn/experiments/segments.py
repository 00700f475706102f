"""The one chunk integrator of the experiments: calls of ``simulate`` in segments.

A batch of autonomous particle systems runs in segments of at most ``MAX_STEPS_PER_CALL`` steps,
reduced to per-frame outputs on the way. Each segment is one call of :func:`jaxdyn.simulate`
(``sharded_vmap`` over the systems) or of :func:`jaxdyn.simulate_ensemble` (small sphere
systems); this module holds no integration loop of its own, only the chunking of the time
interval and the carrying of the state between calls.

Every kind that integrates particles (``sphere``, ``concentration``, the ``gaussian``
trajectory study) goes through :func:`integrate_segments`: one cache of compiled segment
programs shared across chunks (and across kinds when the frame function is the same object).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from . import progress
from ..simulation import (plan_steps, save_indices, sharded_vmap, simulate, simulate_ensemble,
                          sweep_mesh)

# XLA's CPU runtime with several host devices keeps memory that grows with the number of
# loop iterations of one call. Chunks therefore integrate in segments of at most this many
# steps per call; the state is carried between calls.
MAX_STEPS_PER_CALL = 250

# Compiled segment functions, reused by every chunk with the same static signature (frame
# function, steps per call, dt, save_every, method): jit's own cache then skips
# recompilation whenever the chunk's shapes repeat. Bounded: a run has a handful of keys.
SEGMENTS: dict = {}
SEGMENTS_MAX = 64


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The time grid of a chunk and how it is cut into calls.

    Attributes:
      t1: final time (every run starts at t = 0).
      dt: the step (rounded so that the steps tile [0, t1]).
      save_every: steps between saved states.
      method: the fixed-step method of :func:`jaxdyn.simulate`.
      ensemble: integrate with :func:`jaxdyn.simulate_ensemble` (many small sphere systems on
        the vector lanes) instead of ``sharded_vmap(simulate)``.
      max_steps_per_call: the longest segment.
    """

    t1: float
    dt: float
    save_every: int
    method: str
    ensemble: bool = False
    max_steps_per_call: int = MAX_STEPS_PER_CALL

    def bounds(self) -> tuple[float, list]:
        """The rounded step and the step indices at which segments start and end.

        Returns:
          ``(dt, bounds)``: segments of equal length where possible (50 frames by at most 12:
          5 × 10, not 4 × 12 + 2), so that one compiled program serves them all.
        """
        _, _, dt, n = plan_steps(0.0, self.t1, self.dt)
        idx = list(save_indices(n, int(self.save_every)))
        per = max(1, self.max_steps_per_call // int(self.save_every))
        per = -(-(len(idx) - 1) // max(1, -(-(len(idx) - 1) // per)))
        bounds = idx[::max(per, 1)]
        if bounds[-1] != idx[-1]:
            bounds.append(idx[-1])
        return dt, bounds


def _whole(a):
    """A NumPy copy of ``a``, gathered first if it spans other processes' devices.

    An array this process holds whole (such as an initial cloud every process drew alike) is not
    gathered: that would repeat it once per process.

    Returns:
      The array.
    """
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(a, tiled=True))
    return np.asarray(a)


def to_host(tree):
    """Device results as NumPy arrays (arrays sharded over several processes gathered).

    Args:
      tree: a pytree of arrays.

    Returns:
      The same tree of NumPy arrays.
    """
    return jax.tree.map(_whole, tree)


def host_broadcast(a, P: int):
    """``a`` repeated P times on a new leading axis, built on the host and moved to the device once.

    No program per shape: ``jnp.broadcast_to`` on a device array compiles one, and so does
    ``jnp.asarray`` of a host array in jax 0.10 (programs a second run traces and loads again);
    ``jax.device_put`` compiles none.

    Args:
      a: an array.
      P: the number of copies.

    Returns:
      A device array (P, *a.shape).
    """
    a = np.asarray(a)
    return jax.device_put(np.repeat(a[None], P, axis=0))


def _placement(P):
    """How a segment's inputs (leading axis P) are placed.

    Split over the devices when P is a multiple of their count (the segment program then expects
    them so, and an array on one device would be copied over by a resharding program of its own,
    one per shape), else on the default device (the program pads them inside).

    Returns:
      A function that places an array.
    """
    n = jax.device_count()
    if n == 1 or P % n or jax.process_count() > 1:
        return jax.device_put
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = sweep_mesh()  # the mesh sharded_vmap uses by default
    sharding = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
    return lambda a: jax.device_put(a, sharding)


def save_times(t1, dt, save_every) -> np.ndarray:
    """The saved times of a run on [0, t1] with steps of (about) dt, every ``save_every`` steps.

    Args:
      t1: final time.
      dt: the step (rounded as :func:`jaxdyn.simulate` rounds it).
      save_every: steps between saved states.

    Returns:
      The times (S,).
    """
    _, _, dt, n = plan_steps(0.0, t1, dt)
    return np.asarray(save_indices(n, save_every)) * dt


def _remember(key, make):
    fn = SEGMENTS.get(key)
    if fn is None:
        if len(SEGMENTS) >= SEGMENTS_MAX:
            SEGMENTS.pop(next(iter(SEGMENTS)))
        fn = SEGMENTS[key] = make()
    return fn


def segment_step(frame_fn, steps: int, dt: float, save_every: int, method: str):
    """One system's segment: ``steps`` steps of ``dt`` by :func:`jaxdyn.simulate`, and its frames.

    The frames of the segment's saved states include its start (the first segment keeps that
    frame, the others drop it: one program for every segment, the start's frame no program of
    its own).

    Args:
      frame_fn: ``frame_fn(model, xs, *extra)`` → a tuple of per-frame arrays (S, ...).
      steps: the segment's steps; 0: the frames of the given state.
      dt: the step.
      save_every: steps between saved states.
      method: the fixed-step method.

    Returns:
      ``seg(model, x, *extra)`` → ``(x at the end, frames, finite)`` (``steps = 0``: the frames).
    """
    if steps == 0:
        def seg(m, xx, *e):
            return frame_fn(m, xx[None], *e)
    else:
        def seg(m, xx, *e):
            tr = simulate(m, xx, t1=steps * dt, dt=dt, save_every=save_every, method=method)
            return tr.xs[-1], frame_fn(m, tr.xs, *e), tr.finite
    return seg


def ensemble_step(frame_fn, steps: int, dt: float, save_every: int, method: str):
    """A batch's segment by :func:`jaxdyn.simulate_ensemble`, and the frames of each system.

    Args:
      frame_fn: as in :func:`segment_step`.
      steps: the segment's steps (>= 1).
      dt: the step.
      save_every: steps between saved states.
      method: the fixed-step method.

    Returns:
      ``seg(models, x, *extra, frames=jax.vmap(frame_fn))`` (a leading system axis on every
      argument) → ``(x at the end, frames, finite)``; the chunk integrator passes
      ``frames=frames_of_stack(frame_fn)`` (sharded over the devices).
    """
    def seg(models, x, *e, frames=jax.vmap(frame_fn)):
        tr = simulate_ensemble(models, x, t1=steps * dt, dt=dt, save_every=save_every, method=method)
        return tr.xs[:, -1], frames(models, tr.xs, *e), tr.finite

    return seg


def segment_fn(frame_fn, steps: int, dt: float, se: int, method: str):
    """``sharded_vmap`` of :func:`segment_step`, cached per static signature.

    Args:
      frame_fn: the frame function.
      steps: the segment's steps (0: the frames of the given state).
      dt: the step.
      se: steps between saved states.
      method: the fixed-step method.

    Returns:
      The batched segment function.
    """
    return _remember((frame_fn, steps, float(dt), int(se), method),
                     lambda: sharded_vmap(segment_step(frame_fn, steps, dt, se, method)))


def frames_of_stack(frame_fn):
    """``frame_fn`` over a batch of saved stacks (P, S, N, d), sharded; cached per function.

    Args:
      frame_fn: the frame function.

    Returns:
      The batched frame function.
    """
    return _remember((frame_fn, "stack"), lambda: sharded_vmap(frame_fn))


def integrate_segments(models, x0, frame_fn, extra=(), *, schedule: Schedule):
    """Integrate P systems in segments and reduce every saved frame with ``frame_fn``.

    The models are autonomous, so every segment starts at t = 0 and segments of equal length
    reuse one compiled program — across chunks too, when ``frame_fn`` is the same function
    object (define it at module level, with its data in ``extra`` rather than in a closure).

    Args:
      models: the systems' models stacked on a leading axis.
      x0: (P, N, d) initial states.
      frame_fn: ``frame_fn(model, xs, *extra)`` maps the saved frames (S, N, d) of one system to
        a tuple of per-frame arrays (S, ...).
      extra: arrays with a leading point axis.
      schedule: the time grid and its segments (``schedule.ensemble``: integrate with
        :func:`jaxdyn.simulate_ensemble` and apply ``frame_fn`` to the saved stack).

    Returns:
      ``(outputs, finite)``: outputs a tuple of NumPy arrays (P, S_total, ...) over all saved
      times (:func:`save_times`), finite a (P,) bool array.
    """
    dt, bounds = schedule.bounds()
    se, method = int(schedule.save_every), schedule.method
    P = x0.shape[0]
    if not schedule.ensemble:  # the program's own input placement: no resharding on the way in
        place = _placement(P)
        models, extra = jax.tree.map(lambda a: place(np.asarray(a)) if isinstance(a, jax.Array) else a,
                                     (models, tuple(extra)))
        x0 = place(to_host(x0))
    x = x0
    parts = [] if len(bounds) > 1 else [to_host(segment_fn(frame_fn, 0, dt, se, method)(models, x, *extra))]
    finite = np.ones(P, bool)
    for a, b in zip(bounds[:-1], bounds[1:]):
        if schedule.ensemble:
            step = ensemble_step(frame_fn, b - a, dt, se, method)
            x, out, fin = step(models, x, *extra, frames=frames_of_stack(frame_fn))
            if not x.is_fully_addressable:  # the next call checks its x0 on the host
                x = to_host(x)
        else:
            x, out, fin = segment_fn(frame_fn, b - a, dt, se, method)(models, x, *extra)
            # the next segment starts from the state as the first did, on the default device:
            # the output's sharding over the devices would compile the same program again
            x = place(to_host(x))
        # every segment's frames start with its start state: the first segment keeps it (t = 0),
        # the others drop it (the previous segment's last frame)
        parts.append(tuple(o[:, 1:] for o in to_host(out)) if parts else to_host(out))
        finite &= np.asarray(to_host(fin), bool)
        progress.advance(b, bounds[-1])  # the engine's bar moves within the chunk
    outputs = tuple(np.concatenate([p[i] for p in parts], axis=1) for i in range(len(parts[0])))
    return outputs, finite
