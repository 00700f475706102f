"""The one chunk integrator of the experiments: a batch of autonomous particle systems run in
segments of at most ``MAX_STEPS_PER_CALL`` steps, reduced to per-frame outputs on the way.

Every kind that integrates particles (``sphere``, ``concentration``, the ``gaussian``
trajectory study) goes through :func:`integrate_segments`: one loop, one cache of compiled
segment programs shared across chunks (and across kinds when the frame function is the same
object)."""

from __future__ import annotations

import jax
import numpy as np

from . import progress
from ..simulation import (plan_steps, save_indices, sharded_vmap, simulate, simulate_ensemble,
                          sweep_mesh)

# XLA's CPU runtime with several host devices keeps memory that grows with the number of
# loop iterations of one call (measured with jax 0.10.2: +225 MiB for a 4000-step scan on 2
# host devices, +11 MiB on one). Chunks therefore integrate in segments of at most this
# many steps per call; the state is carried between calls.
MAX_STEPS_PER_CALL = 250

# Compiled segment functions, reused by every chunk with the same static signature (frame
# function, steps per call, dt, save_every, method): jit's own cache then skips
# recompilation whenever the chunk's shapes repeat. Bounded: a run has a handful of keys.
SEGMENTS: dict = {}
SEGMENTS_MAX = 64


def to_host(tree):
    """Device results as NumPy arrays; across several processes (``jax.distributed``) the
    sharded batch is gathered from all of them first."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return jax.tree.map(lambda a: np.asarray(multihost_utils.process_allgather(a, tiled=True)),
                            tree)
    return jax.tree.map(np.asarray, tree)


def host_broadcast(a, P):
    """``a`` repeated P times on a new leading axis, built on the host and moved to the device
    once: no program per shape (``jnp.broadcast_to`` on a device array compiles one, and so
    does ``jnp.asarray`` of a host array in jax 0.10: programs a second run traces and loads
    again; ``jax.device_put`` compiles none)."""
    a = np.asarray(a)
    return jax.device_put(np.repeat(a[None], P, axis=0))


def _placement(P):
    """How a segment's inputs (leading axis P) are placed: split over the devices when P is a
    multiple of their count (the segment program then expects them so, and an array on one
    device would be copied over by a resharding program of its own, one per shape), else on the
    default device (the program pads them inside)."""
    n = jax.device_count()
    if n == 1 or P % n or jax.process_count() > 1:
        return jax.device_put
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = sweep_mesh()  # the mesh sharded_vmap uses by default
    sharding = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
    return lambda a: jax.device_put(a, sharding)


def save_times(t1, dt, save_every):
    """The saved times of a run on [0, t1] with steps of (about) dt, every ``save_every`` steps."""
    _, _, dt, n = plan_steps(0.0, t1, dt)
    return np.asarray(save_indices(n, save_every)) * dt


def _remember(key, make):
    fn = SEGMENTS.get(key)
    if fn is None:
        if len(SEGMENTS) >= SEGMENTS_MAX:
            SEGMENTS.pop(next(iter(SEGMENTS)))
        fn = SEGMENTS[key] = make()
    return fn


def segment_fn(frame_fn, steps, dt, se, method):
    """``sharded_vmap`` of one segment: ``steps`` steps of ``dt`` from the given state, the
    frames of its saved states, the start included (the first segment keeps that frame, the
    others drop it: one program for every segment, the start's frame no program of its own);
    ``steps = 0``: the frames of the given state."""
    def make():
        if steps == 0:
            def seg(m, xx, *e):
                return frame_fn(m, xx[None], *e)
        else:
            def seg(m, xx, *e):
                tr = simulate(m, xx, t1=steps * dt, dt=dt, save_every=se, method=method)
                return tr.xs[-1], frame_fn(m, tr.xs, *e), tr.finite
        return sharded_vmap(seg)

    return _remember((frame_fn, steps, float(dt), int(se), method), make)


def frames_of_stack(frame_fn):
    """``frame_fn`` over a batch of saved stacks (P, S, N, d), sharded; cached per function."""
    return _remember((frame_fn, "stack"),
                     lambda: sharded_vmap(frame_fn))


def integrate_segments(models, x0, frame_fn, extra=(), *, t1, dt, save_every, method,
                       ensemble: bool = False, max_steps_per_call: int = MAX_STEPS_PER_CALL):
    """Integrate P systems (``models`` stacked on a leading axis, ``x0`` (P, N, d)) in
    segments and reduce every saved frame with ``frame_fn``.

    ``frame_fn(model, xs, *extra)`` maps the saved frames (S, N, d) of one system to a tuple of
    per-frame arrays (S, ...); ``extra`` are arrays with a leading point axis. The models are
    autonomous, so every segment starts at t = 0 and segments of equal length reuse one
    compiled program — across chunks too, when ``frame_fn`` is the same function object
    (define it at module level, with its data in ``extra`` rather than in a closure).
    ``ensemble=True`` integrates with :func:`jaxdyn.simulate_ensemble` (many small sphere
    systems on the vector lanes) and applies ``frame_fn`` to the saved stack.

    Returns (outputs, finite): outputs a tuple of NumPy arrays (P, S_total, ...) over all
    saved times (:func:`save_times`), finite a (P,) bool array.
    """
    _, _, dt, n = plan_steps(0.0, t1, dt)
    se = int(save_every)
    idx = list(save_indices(n, se))
    per = max(1, max_steps_per_call // se)
    # Segments of equal length where possible (50 frames by at most 12: 5 × 10, not
    # 4 × 12 + 2): one compiled segment program instead of two, the same steps.
    per = -(-(len(idx) - 1) // max(1, -(-(len(idx) - 1) // per)))
    bounds = idx[::max(per, 1)]
    if bounds[-1] != idx[-1]:
        bounds.append(idx[-1])
    P = x0.shape[0]
    place = _placement(P) if not ensemble else jax.device_put
    if not ensemble:  # the program's own input placement: no resharding programs on the way in
        models, extra = jax.tree.map(lambda a: place(np.asarray(a)) if isinstance(a, jax.Array) else a,
                                     (models, tuple(extra)))
        x0 = place(to_host(x0))
    x = x0
    parts = [] if len(bounds) > 1 else [to_host(segment_fn(frame_fn, 0, dt, se, method)(models, x, *extra))]
    finite = np.ones(P, bool)
    for a, b in zip(bounds[:-1], bounds[1:]):
        if ensemble:
            tr = simulate_ensemble(models, x, t1=(b - a) * dt, dt=dt, save_every=se, method=method)
            x, fin = tr.xs[:, -1], tr.finite
            out = frames_of_stack(frame_fn)(models, tr.xs, *extra)
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
