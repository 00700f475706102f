"""Kind ``sphere``: config fields, cross-field checks and memory estimates."""

from __future__ import annotations

import numpy as np

from ...config import Field, nonempty, positive
from .. import sphere_fields as sc


def cosine(v):
    """A field check: None if ``v`` lies in [−1, 1] (an inner product of unit vectors), else the problem."""
    return None if -1 <= v <= 1 else "must lie in [-1, 1] (an inner product of unit vectors)"


SCHEMA = {
    **sc.SPHERE_FIELDS,
    **sc.VARIANT_FIELDS,
    "snapshots": Field("list", [0.0, 1.0, 3.0, 10.0], "times of particle snapshots (clipped to t1)",
                       item="float", check=nonempty),
    "figure_beta": Field("float", None, "β of the snapshot figure (default: the middle of the sweep)"),
    "cluster_stats": Field("bool", False, "record per frame the pair fraction, the cluster count, "
                           "the Gram rank and E_β (jaxdyn.clusters; an N×N Gram matrix a frame) "
                           "and draw the β × t heat maps"),
    "pair_threshold": Field("float", 0.999, "pair fraction: pairs i < j with ⟨x_i, x_j⟩ above this",
                            check=cosine),
    "cluster_delta": Field("float", 1e-4, "cluster count: components of ⟨x_i, x_j⟩ > 1 − δ",
                           check=positive),
    "gram_threshold": Field("float", 0.9999, "Gram rank: rank of 1[⟨x_i, x_j⟩ > this]",
                            check=cosine),
}


BATCH_AXES = ("beta", "seed")


def check(cfg):
    """Cross-field checks of a ``sphere`` config (:meth:`~jaxdyn.experiments.ExperimentKind.check`)."""
    sc.check_variants(cfg)
    warns = sc.check_sphere(cfg)
    betas = list(cfg.get("sweep", {}).get("beta") or [cfg["beta"]])
    fb = cfg.get("figure_beta")
    if fb is not None and not any(abs(fb - b) < 1e-9 for b in betas):
        near = min(betas, key=lambda b: abs(b - fb))
        warns.append(f"figure_beta = {fb:g} is not among the run's β values {betas}: the "
                     f"snapshot figure shows the nearest, β = {near:g} (set figure_beta to one of "
                     "them)")
    return warns


def process_split(cfg):
    """Several processes share each chunk: its systems are sharded over every process's devices."""
    return "devices"


def estimate_bytes(pc):
    """Memory of one ``sphere`` grid point (:meth:`~jaxdyn.experiments.ExperimentKind.estimate_bytes`)."""
    # cluster statistics run afterwards in blocks of a fixed number of systems (run.py):
    # a constant working set, not a per-point cost
    return sc.estimate_bytes(pc)


def output_bytes(pc):
    """What one ``sphere`` grid point adds to the Dataset (:meth:`~jaxdyn.experiments.ExperimentKind.output_bytes`)."""
    return sc.output_bytes(pc, per_frame_values=5 if pc["cluster_stats"] else 1,
                           snapshots=len(pc["snapshots"]))


def snapshot_index(pc):
    """Indices of the saved times nearest the ``snapshots`` times (clipped to [0, t1])."""
    ts = sc.save_times(pc)
    want = [min(max(s, 0.0), ts[-1]) for s in pc["snapshots"]]
    return sorted({int(np.argmin(np.abs(ts - s))) for s in want})
