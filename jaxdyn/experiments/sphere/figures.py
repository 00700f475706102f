"""Kind ``sphere``: figures (particles on the sphere, mean inner product against t, the β × t
heat maps of the cluster statistics) and the particle movie."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import plots
from .summary import per_beta


def _snapshots(cfg, ds):
    """(betas, index of figure_beta, snapshots there at the first value of the other axes)."""
    betas = list(ds["beta"].values) if "beta" in ds.dims else [cfg["beta"]]
    fb = cfg["figure_beta"] if cfg["figure_beta"] is not None else betas[len(betas) // 2]
    bi = int(np.argmin(np.abs(np.asarray(betas) - fb)))
    sel = {d: 0 for d in ds["x_snapshot"].dims if d in ds.coords and d not in
           ("beta", "t_snapshot", "particle", "component")}
    if "beta" in ds["x_snapshot"].dims:
        sel["beta"] = bi
    return betas, bi, ds["x_snapshot"].isel(sel).values


def plot(cfg, ds, out_dir):
    out_dir = Path(out_dir)
    figs = []
    betas, bi, xs = _snapshots(cfg, ds)
    figs.append(plots.sphere_snapshots(xs, ds["t_snapshot"].values, out_dir / "particles.png",
                                       title=f"{cfg['name']}: particles at β = {betas[bi]:.3g}"))
    ip = per_beta(ds, "mean_inner_product")
    curves = {f"β = {b:.3g}": (ip.isel(beta=i).values if "beta" in ip.dims else ip.values)
              for i, b in enumerate(betas)}
    figs.append(plots.curves(ds["t"].values, curves, out_dir / "mean_inner_product.png",
                             xlabel="t (depth)", ylabel="mean pairwise ⟨x_i, x_j⟩",
                             title=f"{cfg['name']}: clustering against time"))
    if "pair_fraction" in ds and "beta" in ds.dims and ds.sizes["beta"] > 1:
        pf = per_beta(ds, "pair_fraction")
        cc = per_beta(ds, "cluster_count")
        figs.append(plots.heatmaps(
            ds["t"].values, np.asarray(betas),
            {f"fraction of pairs with ⟨x_i, x_j⟩ > {cfg['pair_threshold']:g}":
                 pf.transpose("beta", "t").values,
             f"mean cluster count (components, δ = {cfg['cluster_delta']:g})":
                 cc.transpose("beta", "t").values},
            out_dir / "phase_diagram.png", xlabel="t (depth)", ylabel="β", log_panels=(1,),
            title=f"{cfg['name']}: β × t phase diagram (mean over the other sweep axes)"))
    return figs


def movie(cfg, ds, out_dir, fmt="gif"):
    """An animation of the saved snapshots (``snapshots`` times) at ``figure_beta`` and the
    first value of every other sweep axis: S¹ as a circle, S² as a sphere."""
    betas, bi, xs = _snapshots(cfg, ds)
    return plots.particle_movie(xs, ds["t_snapshot"].values, Path(out_dir) / f"movie.{fmt}",
                                title=f"β = {betas[bi]:.3g}")
