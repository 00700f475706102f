"""Kind ``variants``: the summary (time to a single cluster per point, final radius)."""

from __future__ import annotations

import numpy as np


def _label(ds, idx):
    return ",".join(f"{a}={ds[a].values[i]}" for a, i in idx.items())


def points(ds):
    """(label, index dict) for every grid point, in grid order."""
    axes = [a for a in ds["mean_inner_product"].dims if a != "t"]
    out = []
    for flat in np.ndindex(*[ds.sizes[a] for a in axes]):
        idx = dict(zip(axes, flat))
        out.append((_label(ds, idx) if axes else "run", idx))
    return out


def time_to_single_cluster(t, ip, threshold):
    """First saved time with mean inner product >= threshold (None if never)."""
    above = np.flatnonzero(np.asarray(ip) >= threshold)
    return float(t[above[0]]) if above.size else None


def summarize(cfg, ds):
    t = ds["t"].values
    thr = cfg["single_cluster_ip"]
    out = {}
    for label, idx in points(ds):
        ip = ds["mean_inner_product"].isel(idx).values
        rad = ds["mean_radius"].isel(idx).values
        out[label] = {
            "final_mean_inner_product": float(ip[-1]),
            f"time_to_single_cluster (ip >= {thr:g})": time_to_single_cluster(t, ip, thr),
            "final_mean_radius": float(rad[-1]),
        }
    return {"per_point": out}
