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
    return round(float(t[above[0]]), 9) if above.size else None


def summarize(cfg, ds):
    """The ``variants`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`)."""
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
    res = {"per_point": out}
    table = sigma_table(cfg, ds)
    if table is not None:
        res["per_beta_sigma"] = table
    return res


def sigma_table(cfg, ds):
    """Per (β, σ): the fraction of the other points reaching a single cluster by t1, and the median time.

    The other points are the seeds etc.; a point that never reaches it counts as t1 + ∞, so the
    median is None when half or more never reach it.

    Args:
      cfg: the resolved config.
      ds: the merged Dataset.

    Returns:
      The table.
    """
    if "sigma" not in ds.dims:
        return None
    t = ds["t"].values
    thr = cfg["single_cluster_ip"]
    ip = ds["mean_inner_product"]
    if "beta" not in ip.dims:
        ip = ip.expand_dims(beta=[cfg["beta"]])
    other = [d for d in ip.dims if d not in ("beta", "sigma", "t")]
    stacked = ip.stack(member=other) if other else ip.expand_dims(member=[0])
    out = {}
    for bi, b in enumerate(ip["beta"].values):
        for si, s in enumerate(ip["sigma"].values):
            rows = stacked.isel(beta=bi, sigma=si).transpose("member", "t").values
            times = [time_to_single_cluster(t, r, thr) for r in rows]
            hit = sorted(v for v in times if v is not None)
            tt = np.array([np.inf if v is None else v for v in times])
            med = float(np.median(tt))
            out[f"beta={b:g},sigma={s:g}"] = {
                "fraction_reaching_single_cluster": len(hit) / len(times),
                "median_time_to_single_cluster": med if np.isfinite(med) else None,
            }
    return out
