"""Kind ``sphere``: the summary (time to one cluster per β)."""

from __future__ import annotations

import itertools

import numpy as np


def per_beta(ds, var):
    """Reduce over every sweep axis but β (mean over seeds etc.)."""
    da = ds[var]
    other = [d for d in da.dims if d in ds.coords and d not in ("beta", "t", "t_snapshot",
                                                                  "particle", "component")]
    return da.mean(other) if other else da


def summarize(cfg, ds):
    """The ``sphere`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`)."""
    ip = per_beta(ds, "mean_inner_product")
    out = {}
    betas = ds["beta"].values if "beta" in ds.dims else [cfg["beta"]]
    t = ds["t"].values
    for i, b in enumerate(betas):
        row = ip.isel(beta=i).values if "beta" in ip.dims else ip.values
        above = np.flatnonzero(row >= 0.99)
        out[f"beta={b:g}"] = {
            "final_mean_inner_product": float(row[-1]),
            "time_to_mean_inner_product_0.99": float(t[above[0]]) if above.size else None,
        }
    if "pair_fraction" in ds:
        pf, cc, gr = (per_beta(ds, v) for v in ("pair_fraction", "cluster_count", "gram_rank"))
        agree = per_beta(ds.assign(_agree=(ds["cluster_count"] == ds["gram_rank"]).astype(float)),
                         "_agree")
        for i, b in enumerate(betas):
            def row(da):
                return da.isel(beta=i).values if "beta" in da.dims else da.values

            out[f"beta={b:g}"].update({
                "final_pair_fraction": float(row(pf)[-1]),
                "final_mean_cluster_count": float(row(cc)[-1]),
                "final_mean_gram_rank": float(row(gr)[-1]),
                "fraction_of_saved_frames_count_equals_gram_rank": float(np.mean(row(agree))),
            })
    res = {"per_beta": out}
    axes = [a for a in ("heads", "mask", "positions", "attention") if a in ds.dims]
    if "cluster_count" in ds and axes:  # attention variants: per combination and β
        t = ds["t"].values
        var = {}
        for i, b in enumerate(betas):
            da = ds["cluster_count"].isel(beta=i) if "beta" in ds.dims else ds["cluster_count"]
            for combo in itertools.product(*(list(ds[a].values) for a in axes)):
                sel = da.sel(dict(zip(axes, combo)))
                rest = [d for d in sel.dims if d != "t"]
                row = (sel.mean(rest) if rest else sel).values
                key = f"beta={b:g}, " + ", ".join(f"{a}={v}" for a, v in zip(axes, combo))
                few = np.flatnonzero(row <= 2)
                var[key] = {
                    "final_mean_cluster_count": float(row[-1]),
                    "mean_cluster_count_at": {f"t={t[j]:g}": float(row[j])
                                              for j in np.linspace(0, len(t) - 1, 5).astype(int)},
                    "time_to_at_most_2_clusters": float(t[few[0]]) if few.size else None,
                }
        res["per_variant"] = var
        if "energy" in ds:
            res["energy_definition"] = ("(1/H) sum_h E_beta(B_h), B_h = Q_h^T K_h of each "
                                        "head (masks and positions not included)")
    return res
