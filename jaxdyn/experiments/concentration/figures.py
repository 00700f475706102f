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


def plot(cfg, ds, out_dir):
    """Draw the ``concentration`` figures (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.plot`)."""
    out_dir = Path(out_dir)
    res = analyse(cfg, ds)
    betas = np.asarray(res["beta"])
    var = res["w2_variable"]
    tdim = ds[var].dims[-1]
    w2 = rows(reduce_beta(ds, var), len(betas))
    label = {"w2_exact": "exact", "w2_sinkhorn": "Sinkhorn", "w2_coupling": "coupling bound"}[var]
    figs = [plots.curves(ds[tdim].values, {f"β = {b:g}": r for b, r in zip(betas, w2)},
                         out_dir / "w2_vs_t.png", xlabel="t (depth)",
                         ylabel=rf"W2($\rho_t$, Π#ρ0) ({label})", logy=True,
                         title=f"{cfg['name']}: distance to Π#ρ0")]
    if len(betas) >= 2:
        mins = np.asarray(res["min_w2"])
        theory = np.sqrt(np.log(betas + 1) / betas)
        scale = mins[0] / theory[0]
        fit = res["fit_min_w2_vs_beta"]
        figs.append(plots.scatter_fit(
            betas, mins, out_dir / "min_w2_vs_beta.png", logx=True, logy=True, xlabel="β",
            ylabel=r"$\min_t$ W2", reference=(betas, scale * theory, "C·sqrt(log(β+1)/β) (a bound's scale)"),
            title=f"slope {_num(fit['loglog_slope'])}; sqrt(log(β+1)/β): {_num(fit['theory_slope_sqrt_logb_over_b'])}"
                  " (Theorem 1 bounds, does not predict)"))
        am = np.asarray(res["argmin_t"])
        f2 = res["fit_argmin_t_vs_log_beta"]
        figs.append(plots.scatter_fit(
            np.log(betas), am, out_dir / "argmin_t_vs_log_beta.png", xlabel="log β",
            ylabel=r"$\arg\min_t$ W2", line=True,
            title=f"argmin t vs log β: slope {_num(f2['slope'])}, R² {_r2(f2)}"))
        f3 = res["fit_overtake_t_vs_log_beta"]
        # the overtakes the fit uses (summary.analyse's in_fit)
        ot = np.array([r["overtake_time"] if r["in_fit"] else np.nan
                       for r in res["terminal_phase"].values()], float)
        if np.isfinite(ot).sum() >= 2:
            figs.append(plots.scatter_fit(
                np.log(betas), ot, out_dir / "overtake_t_vs_log_beta.png", xlabel="log β",
                ylabel="t: mass near E(V) overtakes mass near E", line=True,
                title=f"overtake t vs log β: slope {_num(f3['slope'])}, "
                      f"R² {_r2(f3)} ({f3['n_points']} metastable β)"))
    mE = rows(reduce_beta(ds, "mass_E"), len(betas))
    mV = rows(reduce_beta(ds, "mass_V"), len(betas))
    figs.append(plots.mass_fractions(ds["t"].values, betas, mE, mV, out_dir / "mass_fractions.png",
                                     angle=cfg["near_angle_deg"], title=cfg["name"]))
    if "mass_V_magnitude" in ds:  # Conjecture 1's two readings of "the top eigenspace of V"
        mM = rows(reduce_beta(ds, "mass_V_magnitude"), len(betas))
        ys = {}
        for b, v, m in zip(betas, mV, mM):
            ys[f"β = {b:g}, top by real part"] = v
            ys[f"β = {b:g}, dominant in magnitude"] = m
        figs.append(plots.curves(ds["t"].values, ys, out_dir / "conjecture_readings.png", xlabel="t (depth)",
                                 ylabel=f"mass within {cfg['near_angle_deg']:g}° of E(V)",
                                 title=f"{cfg['name']}: Conjecture 1's two readings"))
    return figs
