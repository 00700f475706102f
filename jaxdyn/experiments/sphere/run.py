"""Kind ``sphere``: integrate a chunk of points and record the mean pairwise inner product,
particle snapshots and (``cluster_stats``) the cluster statistics of every saved frame."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ... import clusters
from .. import sphere_common as sc
from .schema import snapshot_index


def _frames(model, xs):
    """Per saved frame: the mean pairwise inner product (N|x̄|² − 1)/(N − 1), and the cloud.
    Module-level so that chunks share its compiled program."""
    n = xs.shape[1]
    xbar = jnp.mean(xs, axis=1)
    return ((n * jnp.sum(xbar * xbar, axis=-1) - 1.0) / max(n - 1, 1), xs)


def _frames_clusters(model, xs, pair_threshold, delta, gram_threshold):
    """``_frames`` plus the cluster statistics of every saved frame (jaxdyn.clusters): pair
    fraction, component count, Gram rank, interaction energy E_β. Thresholds arrive as
    arrays (not closed over), so chunks share one compiled program."""
    ip, xs_ = _frames(model, xs)
    return (ip, xs_, clusters.pair_fraction(xs, pair_threshold),
            clusters.cluster_count(xs, delta), clusters.gram_rank(xs, gram_threshold),
            clusters.interaction_energy(xs, model.beta, model.B))


def run_points(pcs):
    p0 = pcs[0]
    snap = np.asarray(snapshot_index(p0))

    if p0["cluster_stats"]:
        consts = tuple(np.asarray(p0[k], sc.np_dtype(p0))
                       for k in ("pair_threshold", "cluster_delta", "gram_threshold"))
        (ip, xs, pf, cc, gr, en), finite = sc.integrate_chunk(pcs, _frames_clusters,
                                                              consts=consts)
    else:
        (ip, xs), finite = sc.integrate_chunk(pcs, _frames)
    ts = sc.save_times(p0)
    vars_ = {
        "mean_inner_product": (("t",), ip),
        "x_snapshot": (("t_snapshot", "particle", "component"), xs[:, snap]),
        "finite": ((), finite),
    }
    if p0["cluster_stats"]:
        vars_.update({
            "pair_fraction": (("t",), pf),
            "cluster_count": (("t",), cc),
            "gram_rank": (("t",), gr),
            "energy": (("t",), en),
        })
    coords = {"t": ts, "t_snapshot": ts[snap]}
    return vars_, coords
