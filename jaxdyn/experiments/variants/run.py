"""Kind ``variants``: integrate each point layer by layer (noisy or not).

Records the mean pairwise inner product of the directions and the mean radius per saved frame.
"""

from __future__ import annotations

import functools
import json
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from ...models import DepthAttention, layer_norm, redrawn_weights
from ...simulation import plan_steps, simulate, simulate_sde
from .. import sphere_common as sc
from .schema import n_layers, segment_steps


@functools.lru_cache(maxsize=2)
def _minilm(dtype_name):
    """MiniLM's (params, cfg, heads) (jaxdyn.encoder), loaded once per dtype."""
    from ...encoder import attention_heads, find_minilm, load_bert

    params, cfg = load_bert(find_minilm(), dtype=np.dtype(dtype_name))
    return params, cfg, attention_heads(params, cfg)


def token_clouds(pcs):
    """(P, N, 384) initial particles from MiniLM's token embeddings.

    The embeddings (word + position + token type, then the embedding LayerNorm) of N token ids
    drawn uniformly from PRNGKey(seed), normalised.

    Args:
      pcs: the chunk's point configs.

    Returns:
      The clouds.

    Raises:
      ValueError: more tokens than MiniLM's positions.
    """
    from ...encoder import embed

    p0 = pcs[0]
    params, cfg, _ = _minilm(np.dtype(sc.np_dtype(p0)).name)
    if p0["n"] > cfg.max_position_embeddings:
        raise ValueError(f"init_tokens: n = {p0['n']} tokens exceed MiniLM's "
                         f"{cfg.max_position_embeddings} positions")
    out = []
    for p in pcs:
        ids = jax.random.randint(jax.random.PRNGKey(p["seed"]), (1, p["n"]), 1000, cfg.vocab_size)
        h = embed(params, cfg, ids)[0]
        out.append(h / jnp.linalg.norm(h, axis=-1, keepdims=True))
    return jnp.stack(out)


def depth_model(pc):
    """The point's DepthAttention (all layers) before the head selection and placement."""
    dtype = sc.np_dtype(pc)
    depth, beta = pc["depth"], pc["beta"]
    if depth["source"] == "minilm":
        heads = _minilm(np.dtype(dtype).name)[2]
        return DepthAttention.from_heads(heads, beta=beta, period=depth["period"],
                                         biases=depth["biases"])
    H = depth["heads"]
    if depth["source"] == "constant" and H == 1:
        Q, K, V = sc.weights_for(pc)
        return DepthAttention(Q[None], K[None], V[None], beta, pc["t1"])
    Q, K, V = redrawn_weights(pc["weights"], pc["d"], n_layers(pc), H, dtype=dtype)
    period = pc["t1"] if depth["source"] == "constant" else depth["period"]
    return DepthAttention(Q, K, V / H, beta, period)


def point_model(pc, layer):
    """The field of one layer: the head selection, then the LayerNorm placement."""
    m = depth_model(pc).layer_model(layer)
    h = pc["head"]
    if h >= 0:
        m = DepthAttention(m.Q[:, h:h + 1], m.K[:, h:h + 1], m.V[:, h:h + 1], m.beta, m.period,
                           u=m.u[:, h:h + 1], c=m.c)
    return layer_norm(m, pc["norm"], **({"alpha": pc["alpha"]} if pc["norm"] == "ngpt" else {}))


def noise_key(pc):
    """The point's noise key: PRNGKey(seed) folded with a checksum of its other fields.

    The swept and physical fields, so that a run is reproducible and the members of a sweep (same
    seed: the same initial cloud) draw independent noises.

    Args:
      pc: a point config.

    Returns:
      The key.
    """
    tag = json.dumps({k: pc[k] for k in ("beta", "sigma", "norm", "head", "n", "d", "t1", "dt")},
                     sort_keys=True)
    return jax.random.fold_in(jax.random.PRNGKey(pc["seed"]), zlib.crc32(tag.encode()) & 0x7FFFFFFF)


@jax.jit
def _frames(xs):
    """Mean pairwise inner product of the directions, (N|x̄|² − 1)/(N − 1), and mean radius."""
    n = xs.shape[1]
    r = jnp.linalg.norm(xs, axis=-1)
    u = xs / r[..., None]
    ubar = jnp.mean(u, axis=1)
    return (n * jnp.sum(ubar * ubar, axis=-1) - 1.0) / max(n - 1, 1), jnp.mean(r, axis=1)


def layer_step(pc, t0: float, t1: float):
    """One layer's integration on [t0, t1] and the frames of its saved states.

    Args:
      pc: a point config.
      t0: the layer's start.
      t1: the layer's end.

    Returns:
      ``fn(model, x, key) -> (Trajectory, (mean inner product, mean radius))``: with noise
      (``sigma > 0``) :func:`jaxdyn.simulate_sde` (``key`` its noise), else
      :func:`jaxdyn.simulate` (``key`` unused).
    """
    _, _, dt, _ = plan_steps(0.0, pc["t1"], pc["dt"])

    def fn(m, x, key):
        if pc["sigma"] > 0:
            tr = simulate_sde(m, x, key, sigma=pc["sigma"], t0=t0, t1=t1, dt=dt,
                              save_every=pc["save_every"], method=pc["noise_method"])
        else:
            tr = simulate(m, x, t0=t0, t1=t1, dt=dt, save_every=pc["save_every"], method=pc["method"])
        return tr, _frames(tr.xs)

    return fn


def run_point(pc, x0):
    """Integrate one point layer by layer.

    Args:
      pc: a point config.
      x0: (N, d) initial particles.

    Returns:
      ``(mean inner product (S,), mean radius (S,), final state (N, d), finite)`` over the
      saved times.
    """
    _, _, dt, n_total = plan_steps(0.0, pc["t1"], pc["dt"])
    seg = segment_steps(pc) or n_total
    key = noise_key(pc)
    x, k0, outs, finite = x0, 0, [], True
    layer = 0
    while k0 < n_total:
        k1 = min(k0 + seg, n_total)
        m = point_model(pc, min(layer, n_layers(pc) - 1))
        tr, frames = layer_step(pc, k0 * dt, k1 * dt)(m, x, jax.random.fold_in(key, layer))
        outs.append([np.asarray(o) if k0 == 0 else np.asarray(o)[1:] for o in frames])
        finite = finite and bool(tr.ok)
        x = tr.xs[-1]
        k0, layer = k1, layer + 1
    ip, rad = (np.concatenate([o[i] for o in outs]) for i in range(2))
    return ip, rad, np.asarray(x), finite


def initial_states(pcs):
    """(P, N, d) initial particles of a chunk.

    MiniLM's token embeddings (``init_tokens``) or the sphere kinds' clouds.

    Args:
      pcs: the chunk's point configs.

    Returns:
      The clouds (NumPy).
    """
    return np.asarray(token_clouds(pcs) if pcs[0]["init_tokens"] else sc.initial_clouds(pcs))


def step_functions(pc):
    """The device computation of a point: its first layer's integration and frames.

    Args:
      pc: a point config.

    Returns:
      ``{"layer": StepFunction}`` (:func:`layer_step` of the first layer's segment).
    """
    from ..kinds import StepFunction

    _, _, dt, n_total = plan_steps(0.0, pc["t1"], pc["dt"])
    k1 = min(segment_steps(pc) or n_total, n_total)
    fn = layer_step(pc, 0.0, k1 * dt)
    args = (point_model(pc, 0), initial_states([pc])[0], jax.random.fold_in(noise_key(pc), 0))
    return {"layer": StepFunction(fn, args, pc["dtype"] == "float64")}


def run_points(pcs):
    """Compute a chunk of ``variants`` points (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.run_points`)."""
    x0s = initial_states(pcs)
    rows = [run_point(pc, jnp.asarray(x0)) for pc, x0 in zip(pcs, x0s)]
    ts = sc.save_times(pcs[0])
    vars_ = {
        "mean_inner_product": (("t",), np.stack([r[0] for r in rows])),
        "mean_radius": (("t",), np.stack([r[1] for r in rows])),
        "x_final": (("particle", "component"), np.stack([r[2] for r in rows])),
        "finite": ((), np.array([r[3] for r in rows])),
    }
    return vars_, {"t": ts}
