"""Kind ``concentration``: figures (W2 against t, the fits, mass fractions)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import plots
from .summary import analyse, reduce_beta, rows


def _r2(f):
    return "n/a" if f["r2"] is None else f"{f['r2']:.3f}"


def _num(x):
    """A fit's number for a title: "—" when there is none (fewer than 2 usable points)."""
    return "—" if x is None else f"{x:.3f}"


def _per_seed_curves(ds, var, betas):
    # one entry per β: the (seed, t) curves of ``var`` when the run has several seeds, else
    # the seed-averaged curve
    if "seed" in ds[var].dims and ds.sizes["seed"] > 1:
        da = ds[var].transpose("beta", "seed", ...) if "beta" in ds[var].dims else ds[var]
        other = [d for d in da.dims if d in ("n", "d", "t1", "dt")]
        da = da.mean(other) if other else da
        return [da.isel(beta=i).values if "beta" in da.dims else da.values for i in range(len(betas))]
    return rows(reduce_beta(ds, var), len(betas))


def _points(betas, res, key):
    """β and the readings ``key``: every seed's (``per_seed``), else the run's one per β."""
    ps = res.get("per_seed")
    if ps is None:
        return np.asarray(betas, float), np.asarray(res[key], float)
    vals = np.array([[np.nan if v is None else v for v in seed] for seed in ps[key]], float)
    return np.tile(np.asarray(betas, float), len(vals)), vals.reshape(-1)


def plot(cfg, ds, out_dir):
    """Draw the ``concentration`` figures (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.plot`).

    With several seeds, W2 against t shows every seed's curve and the fits' figures every
    seed's reading (the least-squares line through all of them); the mass fractions are the
    mean over the seeds.

    Returns:
      The paths written.
    """
    from .summary import per_seed

    out_dir = Path(out_dir)
    res = analyse(cfg, ds)
    seeds = per_seed(cfg, ds)
    if seeds is not None:
        res["per_seed"] = seeds
    k = 1 if seeds is None else len(seeds["seed"])
    tag = "" if k == 1 else f", {k} seeds"
    betas = np.asarray(res["beta"])
    var = res["w2_variable"]
    tdim = ds[var].dims[-1]
    w2 = _per_seed_curves(ds, var, betas)
    label = {"w2_exact": "exact", "w2_sinkhorn": "Sinkhorn", "w2_coupling": "coupling bound"}[var]
    figs = [plots.curves(ds[tdim].values, {f"β = {b:g}": r for b, r in zip(betas, w2)},
                         out_dir / "w2_vs_t.png", xlabel="t (depth)",
                         ylabel=rf"W2($\rho_t$, Π#ρ0) ({label})", logy=True,
                         title=f"{cfg['name']}: distance to Π#ρ0{tag}")]
    if len(betas) >= 2:
        bx, mins = _points(betas, res, "min_w2")
        theory = np.sqrt(np.log(betas + 1) / betas)
        scale = np.nanmean(mins[bx == betas[0]]) / theory[0]
        fit = res["fit_min_w2_vs_beta"] if seeds is None else None
        title = (f"slope {_num(fit['loglog_slope'])}; " if fit else f"{k} seeds; ") + \
            f"sqrt(log(β+1)/β): {_num(res['fit_min_w2_vs_beta']['theory_slope_sqrt_logb_over_b'])}" \
            " (Theorem 1 bounds, does not predict)"
        figs.append(plots.scatter_fit(
            bx, mins, out_dir / "min_w2_vs_beta.png", logx=True, logy=True, xlabel="β",
            ylabel=r"$\min_t$ W2", line=seeds is not None,
            reference=(betas, scale * theory, "C·sqrt(log(β+1)/β) (a bound's scale)"), title=title))
        bx, am = _points(betas, res, "argmin_t")
        f2 = res["fit_argmin_t_vs_log_beta"]
        figs.append(plots.scatter_fit(
            np.log(bx), am, out_dir / "argmin_t_vs_log_beta.png", xlabel="log β",
            ylabel=r"$\arg\min_t$ W2", line=True,
            title=(f"argmin t vs log β: slope {_num(f2['slope'])}, R² {_r2(f2)}" if seeds is None
                   else f"argmin t vs log β, {k} seeds (line: all points)")))
        f3 = res["fit_overtake_t_vs_log_beta"]
        # the overtakes the fit uses (summary.analyse's in_fit)
        if seeds is None:
            bx = betas
            ot = np.array([r["overtake_time"] if r["in_fit"] else np.nan
                           for r in res["terminal_phase"].values()], float)
        else:
            bx, ot = _points(betas, res, "overtake_time")
        if np.isfinite(ot).sum() >= 2:
            figs.append(plots.scatter_fit(
                np.log(bx), ot, out_dir / "overtake_t_vs_log_beta.png", xlabel="log β",
                ylabel="t: mass near E(V) overtakes mass near E", line=True,
                title=(f"overtake t vs log β: slope {_num(f3['slope'])}, "
                       f"R² {_r2(f3)} ({f3['n_points']} metastable β)" if seeds is None
                       else f"overtake t vs log β, {k} seeds (line: all points)")))
    mE = rows(reduce_beta(ds, "mass_E"), len(betas))
    mV = rows(reduce_beta(ds, "mass_V"), len(betas))
    figs.append(plots.mass_fractions(ds["t"].values, betas, mE, mV, out_dir / "mass_fractions.png",
                                     angle=cfg["near_angle_deg"],
                                     title=cfg["name"] + ("" if k == 1 else f" (mean of {k} seeds)")))
    if "mass_V_magnitude" in ds:  # Conjecture 1's two readings of "the top eigenspace of V"
        mM = rows(reduce_beta(ds, "mass_V_magnitude"), len(betas))
        ys = {}
        for b, v, m in zip(betas, mV, mM):
            ys[f"β = {b:g}, top by real part"] = v
            ys[f"β = {b:g}, dominant in magnitude"] = m
        figs.append(plots.curves(ds["t"].values, ys, out_dir / "conjecture_readings.png", xlabel="t (depth)",
                                 ylabel=f"mass within {cfg['near_angle_deg']:g}° of E(V)",
                                 title=f"{cfg['name']}: Conjecture 1's two readings"
                                       + ("" if k == 1 else f" (mean of {k} seeds)")))
    return figs
