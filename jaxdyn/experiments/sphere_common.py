"""Pieces shared by the sphere experiment kinds (``sphere``, ``concentration``, ``variants``).

Building a batch of models and initial clouds for a chunk of grid points, and integrating it.
Their config (fields, checks, memory estimates) is :mod:`.sphere_fields`, which loads no JAX;
it is re-exported here.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..models import MultiHeadAttention, SphereAttention
from ..simulation import ENSEMBLE_METHODS, FASTER_MAX_PARTICLES
from ..sphere import sample_initial
from . import segments
from .segments import MAX_STEPS_PER_CALL
from .sphere_fields import (  # noqa: F401 - re-exported: the kinds' schemas and runs use them
    ATTENTIONS, INIT_SCHEMA, MASKS, POSITIONS, SPHERE_FIELDS, VARIANT_DEFAULTS, VARIANT_FIELDS,
    WEIGHTS_SCHEMA, build_weights, check_dtype, check_sphere, check_variants, estimate_bytes,
    is_variant, output_bytes, required_particles, save_times, x64_enabled)


def variant_model(pc, Q, K, V):
    """The :class:`~jaxdyn.MultiHeadAttention` of a point from its (Q, K, V).

    Head h has ``Q + s G_h/√d``, ``K + s G'_h/√d`` (``s = heads_spread``, G seeded by
    ``(weights.seed, h)``) and ``V/H``; ALiBi slopes ``alibi_slope · 2^(−8h/H)``.

    Args:
      pc: a point config.
      Q: (d, d) query weights.
      K: (d, d) key weights.
      V: (d, d) value weights.

    Returns:
      The model.
    """
    H, d = pc["heads"], pc["d"]
    dtype = Q.dtype
    Qs, Ks = [], []
    for h in range(H):
        if pc["heads_spread"] > 0:
            g = np.random.default_rng([int(pc["weights"].get("seed", 0)), h]).normal(size=(2, d, d))
            g = jnp.asarray(g * pc["heads_spread"] / math.sqrt(d), dtype)
            Qs.append(Q + g[0])
            Ks.append(K + g[1])
        else:
            Qs.append(Q)
            Ks.append(K)
    alibi = None
    if pc["positions"] == "alibi":
        alibi = jnp.asarray([pc["alibi_slope"] * 2.0 ** (-8.0 * h / H) for h in range(H)], dtype)
    return MultiHeadAttention(
        jnp.stack(Qs), jnp.stack(Ks), jnp.broadcast_to(V / H, (H, d, d)), pc["beta"],
        mask=pc["mask"], alibi=alibi, rope=True if pc["positions"] == "rope" else None,
        rope_base=pc["rope_base"], attention=pc["attention"],
        sinkhorn_iters=pc["sinkhorn_iters"], kernel=pc["kernel"], k_block=pc["k_block"],
        q_block=pc["q_block"], tol=pc["tol"])


def np_dtype(cfg):
    """The NumPy float type of a config (float64 needs x64 mode: a ``ConfigError`` otherwise).

    Args:
      cfg: a config with ``dtype``.

    Returns:
      ``np.float32`` or ``np.float64``.
    """
    check_dtype(cfg)
    return np.float64 if cfg["dtype"] == "float64" else np.float32


def weights_for(pc):
    """The point's (Q, K, V) on the device, cast on the host to its dtype.

    Args:
      pc: a point config.

    Returns:
      (Q, K, V).
    """
    dtype = np_dtype(pc)
    Q, K, V = build_weights(pc["weights"], pc["d"])
    return tuple(jax.device_put(np.asarray(m, dtype)) for m in (Q, K, V))  # cast on the host


def energy_forms(pc):
    """The bilinear forms B_h = Q_hᵀK_h (H, d, d) of a point's heads, for the ``energy`` statistic.

    E = (1/H) Σ_h E_β(B_h), each head weighted by its value share V_h = V/H, so H identical heads
    report the one head's E_β; masks and positions are not part of it: it is a statistic of the
    cloud. A plain point: QᵀK, H = 1.

    Args:
      pc: a point config.

    Returns:
      (H, d, d) forms.
    """
    Q, K, V = weights_for(pc)
    if not is_variant(pc):
        return jnp.matmul(Q.T, K, precision=jax.lax.Precision.HIGHEST)[None]
    m = variant_model(pc, Q, K, V)
    return jnp.einsum("hpd,hpe->hde", m.Q, m.K, precision=jax.lax.Precision.HIGHEST)


def models_for(pcs):
    """Stacked models (one per point) of a chunk sharing static fields.

    The chunk's weights are broadcast and β set per point (one model built, not one per point).

    Args:
      pcs: the chunk's point configs.

    Returns:
      A stacked :class:`~jaxdyn.SphereAttention` (or MultiHeadAttention for variant points).
    """
    import equinox as eqx

    Q, K, V = weights_for(pcs[0])
    p0 = pcs[0]
    if is_variant(p0):
        m = variant_model(p0, Q, K, V)
    else:
        m = SphereAttention(Q, K, V, jax.device_put(np.asarray(p0["beta"], Q.dtype)), kernel=p0["kernel"],
                            normalization=p0["normalization"], k_block=p0["k_block"],
                            q_block=p0["q_block"], tol=p0["tol"])
    P = len(pcs)
    stacked = jax.tree.map(lambda a: segments.host_broadcast(a, P) if eqx.is_array(a) else a, m)
    betas = jax.device_put(np.array([p["beta"] for p in pcs], m.beta.dtype))
    return eqx.tree_at(lambda t: t.beta, stacked, betas)


@functools.lru_cache(maxsize=32)
def _sampler(n, d, dist, dtype, kw):
    """A jitted sampler of one cloud per seed, cached so that chunks share one program.

    Its key ``PRNGKey(seed)`` is made inside: one program, not one more for the keys.

    Returns:
      ``sample(seeds) -> (P, n, d)``.
    """
    kw = dict(kw)
    if kw.get("mu") is not None:
        kw["mu"] = np.asarray(kw["mu"], dtype)
    sample = jax.vmap(lambda s: sample_initial(jax.random.PRNGKey(s), n, d, dist, dtype, **kw))
    return jax.jit(sample)


def initial_clouds(pcs):
    """(P, N, d) initial particles, one cloud per point, from its key PRNGKey(seed).

    Args:
      pcs: the chunk's point configs (sharing n, d, dtype, init).

    Returns:
      The clouds (a device array).
    """
    p0 = pcs[0]
    dtype = np_dtype(p0)
    init = dict(p0["init"])
    dist = init.pop("dist")
    kw = {}
    if dist in ("vmf", "mixture"):
        kw["kappa"] = init["kappa"]
        if init.get("mu") is not None:
            kw["mu"] = tuple(float(v) for v in init["mu"])
    if dist == "mixture":
        kw["weight"] = init["weight"]
    seeds = np.asarray([p["seed"] for p in pcs], np.uint32)  # seeds are checked to be < 2**32
    return _sampler(p0["n"], p0["d"], dist, dtype, tuple(sorted(kw.items())))(seeds)


def uses_ensemble(pc) -> bool:
    """Whether a chunk integrates with :func:`jaxdyn.simulate_ensemble` (systems on the vector lanes).

    Softmax or unnormalised weights, N <= ``FASTER_MAX_PARTICLES`` (48; beyond it vmap(simulate)
    is faster), a fixed-step method, and not switched off with ``ensemble: false``.

    Args:
      pc: a point config.

    Returns:
      True to use the ensemble integrator.
    """
    return (bool(pc.get("ensemble", True)) and not is_variant(pc)
            and pc["normalization"] in ("softmax", "unnormalized")
            and pc["n"] <= FASTER_MAX_PARTICLES and pc["method"] in ENSEMBLE_METHODS)


def schedule(pc: dict, max_steps_per_call: int = MAX_STEPS_PER_CALL) -> segments.Schedule:
    """The segments of a point's integration.

    Args:
      pc: a point config.
      max_steps_per_call: the longest segment.

    Returns:
      The :class:`segments.Schedule` (``ensemble`` as :func:`uses_ensemble`).
    """
    return segments.Schedule(pc["t1"], pc["dt"], pc["save_every"], pc["method"],
                             ensemble=uses_ensemble(pc), max_steps_per_call=max_steps_per_call)


def integrate_chunk(pcs, frame_fn, extra=(), consts=(), max_steps_per_call: int = MAX_STEPS_PER_CALL):
    """Integrate a chunk of sphere points (sharing every static field) in segments.

    :func:`segments.integrate_segments` with the chunk's stacked models (:func:`models_for`), its
    initial clouds (:func:`initial_clouds`), ``simulate_ensemble`` when :func:`uses_ensemble`.

    Args:
      pcs: the chunk's point configs.
      frame_fn: ``frame_fn(model, xs, *extra, *consts)``.
      extra: arrays with a leading point axis (per-system data such as Π(x0)).
      consts: arrays shared by all systems (broadcast to every system, not closed over, so that
        chunks share the compiled programs).
      max_steps_per_call: the longest segment.

    Returns:
      ``(outputs, finite)``: outputs a tuple of NumPy arrays (P, S_total, ...) over all saved
      times (``save_times``), finite a (P,) bool array.
    """
    P = len(pcs)
    extra = tuple(extra) + tuple(segments.host_broadcast(c, P) for c in consts)
    return segments.integrate_segments(models_for(pcs), initial_clouds(pcs), frame_fn, extra,
                                       schedule=schedule(pcs[0], max_steps_per_call))


def segment_steps(pc: dict, frame_fn, extra=(), consts=()) -> dict:
    """The device computation of a sphere point: its first segment and the segment's frames.

    Args:
      pc: a point config.
      frame_fn: the kind's frame function.
      extra: arrays with a leading point axis of length 1 (the point's per-system data).
      consts: arrays shared by all systems.

    Returns:
      ``{"segment": StepFunction}``: :func:`segments.segment_step` of one system (its model and
      cloud), or :func:`segments.ensemble_step` of a batch of one when :func:`uses_ensemble`.
    """
    import equinox as eqx

    from .kinds import StepFunction

    sched = schedule(pc)
    dt, bounds = sched.bounds()
    steps = bounds[1] - bounds[0] if len(bounds) > 1 else 0
    models, x0s = models_for([pc]), initial_clouds([pc])
    batch = (models, x0s, *extra, *(segments.host_broadcast(c, 1) for c in consts))
    x64 = pc["dtype"] == "float64"
    if sched.ensemble and steps:
        fn = segments.ensemble_step(frame_fn, steps, dt, sched.save_every, sched.method)
        return {"segment": StepFunction(fn, batch, x64)}
    one = jax.tree.map(lambda a: a[0] if eqx.is_array(a) else a, batch)
    fn = segments.segment_step(frame_fn, steps, dt, sched.save_every, sched.method)
    return {"segment": StepFunction(fn, one, x64)}
