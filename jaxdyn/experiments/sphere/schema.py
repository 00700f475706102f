"""Kind ``sphere``: config fields, cross-field checks and memory estimates."""

from __future__ import annotations

import numpy as np

from ...config import Field
from .. import sphere_common as sc


SCHEMA = {
    **sc.SPHERE_FIELDS,
    "snapshots": Field("list", [0.0, 1.0, 3.0, 10.0], "times of particle snapshots (clipped to t1)",
                       item="float"),
    "figure_beta": Field("float", None, "β of the snapshot figure (default: the middle of the sweep)"),
}


BATCH_AXES = ("beta", "seed")


def check(cfg):
    return sc.check_sphere(cfg)


def estimate_bytes(pc):
    return sc.estimate_bytes(pc)


def output_bytes(pc):
    return sc.output_bytes(pc, per_frame_values=1, snapshots=len(pc["snapshots"]))


def snapshot_index(pc):
    ts = sc.save_times(pc)
    want = [min(max(s, 0.0), ts[-1]) for s in pc["snapshots"]]
    return sorted({int(np.argmin(np.abs(ts - s))) for s in want})
