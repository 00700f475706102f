"""Kind ``variants``: figures.

Mean inner product (and mean radius) against t per point; with a σ sweep, the time to a single
cluster against σ (one line per β).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import plots
from .summary import points, sigma_table


def by_seed(ds, var):
    """``var`` per grid point, the seeds of a point stacked: ``{label: (seeds, T) or (T,) array}``.

    Args:
      ds: the merged Dataset.
      var: a variable with a trailing ``t`` axis.

    Returns:
      label (the point's coordinates but the seed, with the seed count) → its curves.
    """
    da = ds[var]
    if "seed" not in da.dims or da.sizes["seed"] < 2:
        return {lab: da.isel(i).values for lab, i in points(ds)}
    rest = [a for a in da.dims if a not in ("seed", "t")]
    da = da.transpose(*rest, "seed", "t")
    out = {}
    for flat in np.ndindex(*[ds.sizes[a] for a in rest]):
        idx = dict(zip(rest, flat))
        lab = ", ".join(f"{'β' if a == 'beta' else 'σ' if a == 'sigma' else a} = {ds[a].values[k]:g}"
                        if np.issubdtype(ds[a].dtype, np.number) else f"{a} = {ds[a].values[k]}"
                        for a, k in idx.items())
        out[f"{lab or 'run'} ({da.sizes['seed']} seeds)"] = da.isel(idx).values
    return out


def plot(cfg, ds, out_dir):
    """Draw the ``variants`` figures (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.plot`)."""
    out_dir = Path(out_dir)
    t = ds["t"].values
    figs = [plots.curves(t, by_seed(ds, "mean_inner_product"),
                         out_dir / "mean_inner_product.png", xlabel="t (depth)",
                         ylabel=r"mean pairwise $\langle x_i, x_j\rangle$ (directions)",
                         title=f"{cfg['name']}: clustering against depth")]
    rad = by_seed(ds, "mean_radius")
    if any(np.ptp(r) > 1e-3 for r in rad.values()):
        figs.append(plots.curves(t, rad, out_dir / "mean_radius.png", xlabel="t (depth)",
                                 ylabel=r"mean $|z_i|$", logy=True,
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
                                 ylabel=rf"median time to mean $\langle x_i, x_j\rangle$ ≥ {thr:g}",
                                 title=f"{cfg['name']}: noise against metastability "
                                       f"(gaps: not reached by t1 = {cfg['t1']:g})"))
        figs.append(plots.curves(sig, frac, out_dir / "fraction_single_cluster.png",
                                 xlabel="σ (noise)", ylabel=rf"fraction reaching $\langle x_i, x_j\rangle$ ≥ {thr:g}",
                                 title=f"{cfg['name']}: runs reaching one cluster by t1"))
    return figs
