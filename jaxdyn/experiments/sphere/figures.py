"""Kind ``sphere``: figures (particles on the sphere, mean inner product against t)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import plots
from .summary import per_beta


def plot(cfg, ds, out_dir):
    out_dir = Path(out_dir)
    figs = []
    betas = list(ds["beta"].values) if "beta" in ds.dims else [cfg["beta"]]
    fb = cfg["figure_beta"] if cfg["figure_beta"] is not None else betas[len(betas) // 2]
    bi = int(np.argmin(np.abs(np.asarray(betas) - fb)))
    sel = {d: 0 for d in ds["x_snapshot"].dims if d in ds.coords and d not in
           ("beta", "t_snapshot", "particle", "component")}
    if "beta" in ds["x_snapshot"].dims:
        sel["beta"] = bi
    xs = ds["x_snapshot"].isel(sel).values
    figs.append(plots.sphere_snapshots(xs, ds["t_snapshot"].values, out_dir / "particles.png",
                                       title=f"{cfg['name']}: particles at β = {betas[bi]:.3g}"))
    ip = per_beta(ds, "mean_inner_product")
    curves = {f"β = {b:.3g}": (ip.isel(beta=i).values if "beta" in ip.dims else ip.values)
              for i, b in enumerate(betas)}
    figs.append(plots.curves(ds["t"].values, curves, out_dir / "mean_inner_product.png",
                             xlabel="t (depth)", ylabel="mean pairwise ⟨x_i, x_j⟩",
                             title=f"{cfg['name']}: clustering against time"))
    return figs
