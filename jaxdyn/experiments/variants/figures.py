"""Kind ``variants``: mean inner product (and mean radius) against t per point; with a σ
sweep, the time to a single cluster against σ (one line per β)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import plots
from .summary import points, time_to_single_cluster


def plot(cfg, ds, out_dir):
    out_dir = Path(out_dir)
    t = ds["t"].values
    pts = points(ds)
    figs = [plots.curves(t, {lab: ds["mean_inner_product"].isel(i).values for lab, i in pts},
                         out_dir / "mean_inner_product.png", xlabel="t (depth)",
                         ylabel="mean pairwise ⟨x_i, x_j⟩ (directions)",
                         title=f"{cfg['name']}: clustering against depth")]
    rad = {lab: ds["mean_radius"].isel(i).values for lab, i in pts}
    if any(np.ptp(r) > 1e-9 for r in rad.values()):
        figs.append(plots.curves(t, rad, out_dir / "mean_radius.png", xlabel="t (depth)",
                                 ylabel="mean |z_i|", logy=True,
                                 title=f"{cfg['name']}: the radius (pre-/peri-LN)"))
    if "sigma" in ds.dims and ds.sizes["sigma"] > 1:
        thr = cfg["single_cluster_ip"]
        sig = ds["sigma"].values
        lines = {}
        betas = ds["beta"].values if "beta" in ds.dims else [cfg["beta"]]
        for bi, b in enumerate(betas):
            ip = ds["mean_inner_product"]
            if "beta" in ip.dims:
                ip = ip.isel(beta=bi)
            other = [d for d in ip.dims if d not in ("sigma", "t")]
            if other:  # the mean curve over seeds (and any other axis)
                ip = ip.mean(other)
            tt = [time_to_single_cluster(t, ip.isel(sigma=s).values, thr) for s in range(len(sig))]
            lines[f"β = {b:g}"] = np.array([np.nan if v is None else v for v in tt])
        figs.append(plots.curves(sig, lines, out_dir / "time_to_single_cluster.png",
                                 xlabel="σ (noise)", ylabel=f"time to mean ⟨x_i, x_j⟩ ≥ {thr:g}",
                                 title=f"{cfg['name']}: noise and metastability"))
    return figs
