"""Kind ``variants``: figures.

Mean inner product (and mean radius) against t per point; with a σ sweep, the time to a single
cluster against σ (one line per β).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import plots
from .summary import points, sigma_table


def plot(cfg, ds, out_dir):
    """Draw the ``variants`` figures (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.plot`)."""
    out_dir = Path(out_dir)
    t = ds["t"].values
    pts = points(ds)
    figs = [plots.curves(t, {lab: ds["mean_inner_product"].isel(i).values for lab, i in pts},
                         out_dir / "mean_inner_product.png", xlabel="t (depth)",
                         ylabel="mean pairwise ⟨x_i, x_j⟩ (directions)",
                         title=f"{cfg['name']}: clustering against depth")]
    rad = {lab: ds["mean_radius"].isel(i).values for lab, i in pts}
    if any(np.ptp(r) > 1e-3 for r in rad.values()):
        figs.append(plots.curves(t, rad, out_dir / "mean_radius.png", xlabel="t (depth)",
                                 ylabel="mean |z_i|", logy=True,
                                 title=f"{cfg['name']}: the radius (pre-/peri-LN)"))
    table = sigma_table(cfg, ds)
    if table is not None and ds.sizes["sigma"] > 1:
        thr = cfg["single_cluster_ip"]
        sig = ds["sigma"].values
        betas = ds["beta"].values if "beta" in ds.dims else [cfg["beta"]]
        med, frac = {}, {}
        for b in betas:
            rows = [table[f"beta={b:g},sigma={s:g}"] for s in sig]
            v = [r["median_time_to_single_cluster"] for r in rows]
            med[f"β = {b:g}"] = np.array([np.nan if x is None else x for x in v])
            frac[f"β = {b:g}"] = np.array([r["fraction_reaching_single_cluster"] for r in rows])
        figs.append(plots.curves(sig, med, out_dir / "time_to_single_cluster.png",
                                 xlabel="σ (noise)",
                                 ylabel=f"median time to mean ⟨x_i, x_j⟩ ≥ {thr:g}",
                                 title=f"{cfg['name']}: noise against metastability "
                                       f"(gaps: not reached by t1 = {cfg['t1']:g})"))
        figs.append(plots.curves(sig, frac, out_dir / "fraction_single_cluster.png",
                                 xlabel="σ (noise)", ylabel=f"fraction reaching ⟨x_i, x_j⟩ ≥ {thr:g}",
                                 title=f"{cfg['name']}: runs reaching one cluster by t1"))
    return figs
