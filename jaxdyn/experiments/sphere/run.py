"""Kind ``sphere``: integrate a chunk of points; mean inner product, snapshots, cluster statistics.

The mean pairwise inner product and particle snapshots, and (``cluster_stats``) the cluster
statistics of every saved frame.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ... import clusters
from .. import sphere_common as sc
from .schema import snapshot_index


def _frames(model, xs):
    """Per saved frame: the mean pairwise inner product (N|x̄|² − 1)/(N − 1), and the cloud.

    Module-level so that chunks share its compiled program.

    Returns:
      ``(mean inner product (S,), xs)``.
    """
    n = xs.shape[1]
    xbar = jnp.mean(xs, axis=1)
    return ((n * jnp.sum(xbar * xbar, axis=-1) - 1.0) / max(n - 1, 1), xs)


def _cluster_stats_fn(xs, beta, B, pair_threshold, delta, gram_threshold):
    """Cluster statistics (jaxdyn.clusters) of saved frames xs (P, S, N, d).

    Pair fraction, component count, Gram rank, E_β (β per system; B (H, d, d) the heads' shared
    forms, E = (1/H) Σ_h E_β(B_h), one head at a time).

    Returns:
      ``(pair fraction, cluster count, Gram rank, energy)``, each (P, S).
    """
    if B.shape[0] == 1:
        en = clusters.interaction_energy(xs, beta[:, None], B[0])
    else:
        en = jnp.mean(jax.lax.map(lambda b: clusters.interaction_energy(xs, beta[:, None], b),
                                  B), axis=0)
    return (clusters.pair_fraction(xs, pair_threshold), clusters.cluster_count(xs, delta),
            clusters.gram_rank(xs, gram_threshold), en)


# one program (called eagerly: one for each of its operations)
_cluster_stats = jax.jit(_cluster_stats_fn)


#: systems per call of ``_cluster_stats`` (a fixed shape: one compiled program)
STATS_BLOCK = 128
#: at most this many Gram entries (systems × frames × N²) per call: at N = 512 a block of
#: 128 systems of 41 frames would hold 1.4·10⁹
STATS_ENTRIES = 2 ** 25


def stats_block(frames: int, n: int) -> int:
    """Systems per call of ``_cluster_stats``: ``STATS_BLOCK``, fewer at large N."""
    return int(max(1, min(STATS_BLOCK, STATS_ENTRIES // max(frames * n * n, 1))))


def cluster_stats_of(xs, pcs):
    """The cluster statistics of a chunk's saved frames, in blocks of systems on the default device.

    Blocks of ``stats_block(S, N)`` systems. Computed after the integration rather than in the
    sharded frame function: there, with thousands of systems on 2 host CPU devices, the XLA
    runtime (jax 0.10.2) stalled with every thread waiting.

    Args:
      xs: (P, S, N, d) host array of saved frames.
      pcs: the chunk's point configs.

    Returns:
      ``(pair fraction, cluster count, Gram rank, energy)``, each (P, S).
    """
    p0 = pcs[0]
    dtype = sc.np_dtype(p0)
    B = sc.energy_forms(p0)  # (H, d, d): B_h = Q_hᵀK_h of the point's heads
    # host arrays straight into the program (jnp.asarray of each is a copy program to load)
    thr = tuple(np.asarray(p0[k], dtype) for k in ("pair_threshold", "cluster_delta",
                                                   "gram_threshold"))
    betas = np.array([p["beta"] for p in pcs], dtype)
    P = xs.shape[0]
    blk = stats_block(xs.shape[1], xs.shape[2])
    parts = []
    for i in range(0, P, blk):
        xb, bb = xs[i:i + blk], betas[i:i + blk]
        k = xb.shape[0]
        if k < blk:  # pad with copies of the first system: one compiled shape
            xb = np.concatenate([xb, np.repeat(xb[:1], blk - k, axis=0)])
            bb = np.concatenate([bb, np.repeat(bb[:1], blk - k)])
        out = _cluster_stats(np.asarray(xb, dtype), bb, B, *thr)
        parts.append([np.asarray(o)[:k] for o in out])
    return tuple(np.concatenate([p[j] for p in parts]) for j in range(4))


def run_points(pcs):
    """Compute a chunk of ``sphere`` points (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.run_points`)."""
    p0 = pcs[0]
    snap = np.asarray(snapshot_index(p0))

    (ip, xs), finite = sc.integrate_chunk(pcs, _frames)
    ts = sc.save_times(p0)
    vars_ = {
        "mean_inner_product": (("t",), ip),
        "x_snapshot": (("t_snapshot", "particle", "component"), xs[:, snap]),
        "finite": ((), finite),
    }
    if p0["cluster_stats"]:
        pf, cc, gr, en = cluster_stats_of(xs, pcs)
        vars_.update({
            "pair_fraction": (("t",), pf),
            "cluster_count": (("t",), cc),
            "gram_rank": (("t",), gr),
            "energy": (("t",), en),
        })
    coords = {"t": ts, "t_snapshot": ts[snap]}
    return vars_, coords


def step_functions(pc):
    """The device computations of a point: its segment, and the cluster statistics of its frames.

    Args:
      pc: a point config.

    Returns:
      ``{"segment": ...}`` (:func:`sphere_common.segment_steps`), with ``"cluster_stats"`` (one
      block of systems) when ``cluster_stats`` is on.
    """
    from ..kinds import StepFunction

    steps = sc.segment_steps(pc, _frames)
    if pc["cluster_stats"]:
        dtype = sc.np_dtype(pc)
        xs = np.repeat(np.asarray(sc.initial_clouds([pc]))[:, None], 2, axis=1)  # (1, 2, N, d)
        thr = tuple(np.asarray(pc[k], dtype) for k in ("pair_threshold", "cluster_delta",
                                                       "gram_threshold"))
        args = (xs, np.array([pc["beta"]], dtype), sc.energy_forms(pc), *thr)
        steps["cluster_stats"] = StepFunction(_cluster_stats_fn, args, pc["dtype"] == "float64")
    return steps
