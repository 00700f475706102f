"""Kind ``sphere``: the summary (time to one cluster per β)."""

from __future__ import annotations

import numpy as np


def per_beta(ds, var):
    """Reduce over every sweep axis but β (mean over seeds etc.)."""
    da = ds[var]
    other = [d for d in da.dims if d in ds.coords and d not in ("beta", "t", "t_snapshot",
                                                                  "particle", "component")]
    return da.mean(other) if other else da


def summarize(cfg, ds):
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
    return {"per_beta": out}
