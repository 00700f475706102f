"""Kind ``sphere``: integrate a chunk of points and record the mean pairwise inner product
and particle snapshots."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import sphere_common as sc
from .schema import snapshot_index


def _frames(model, xs):
    """Per saved frame: the mean pairwise inner product (N|x̄|² − 1)/(N − 1), and the cloud.
    Module-level so that chunks share its compiled program."""
    n = xs.shape[1]
    xbar = jnp.mean(xs, axis=1)
    return ((n * jnp.sum(xbar * xbar, axis=-1) - 1.0) / max(n - 1, 1), xs)


def run_points(pcs):
    p0 = pcs[0]
    snap = np.asarray(snapshot_index(p0))

    (ip, xs), finite = sc.integrate_chunk(pcs, _frames)
    ts = sc.save_times(p0)
    vars_ = {
        "mean_inner_product": (("t",), ip),
        "x_snapshot": (("t_snapshot", "particle", "component"), xs[:, snap]),
        "finite": ((), finite),
    }
    coords = {"t": ts, "t_snapshot": ts[snap]}
    return vars_, coords
