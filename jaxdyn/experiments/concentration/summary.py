"""Kind ``concentration``: the fits of the summary (min W2 against β, argmin t against log β,
the time mass_V overtakes mass_E) and the Assumption 1 report."""

from __future__ import annotations

import math

import numpy as np

from ...spectral import check_assumptions, subspace_angle
from .. import sphere_common as sc
from .schema import spectral_info


def primary_w2(ds):
    for name in ("w2_exact", "w2_sinkhorn", "w2_coupling"):
        if name in ds:
            return name
    raise KeyError("no W2 variable in the dataset")


def reduce_beta(ds, var):
    da = ds[var]
    other = [d for d in da.dims if d in ("seed", "n", "d", "t1", "dt")]
    return da.mean(other) if other else da


def betas_of(cfg, ds):
    return np.asarray(ds["beta"].values if "beta" in ds.dims else [cfg["beta"]], float)


def rows(da, nb):
    return [da.isel(beta=i).values if "beta" in da.dims else da.values for i in range(nb)]


def fit(x, y):
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2:
        return None, None
    slope, icpt = np.polyfit(x[ok], y[ok], 1)
    pred = slope * x[ok] + icpt
    ss = np.sum((y[ok] - y[ok].mean()) ** 2)
    r2 = 1 - np.sum((y[ok] - pred) ** 2) / ss if ss > 0 else float("nan")
    return float(slope), float(r2)


def crossing(t, mE, mV):
    """First time mass_V > mass_E after a time where mass_E > mass_V (None if never)."""
    led = np.flatnonzero(mE > mV)
    if led.size == 0:
        return None
    after = np.flatnonzero((mV > mE) & (np.arange(len(t)) > led[0]))
    return float(t[after[0]]) if after.size else None


def analyse(cfg, ds):
    var = primary_w2(ds)
    tdim = ds[var].dims[-1]
    t = ds[tdim].values
    betas = betas_of(cfg, ds)
    w2 = rows(reduce_beta(ds, var), len(betas))
    mins = np.array([np.nanmin(r) if np.isfinite(r).any() else np.nan for r in w2])
    argmins = np.array([t[np.nanargmin(r)] if np.isfinite(r).any() else np.nan for r in w2])
    theory = np.sqrt(np.log(betas + 1) / betas)
    res = {"w2_variable": var, "beta": betas.tolist(), "min_w2": mins.tolist(),
           "argmin_t": argmins.tolist()}
    if len(betas) >= 2:
        s, r2 = fit(np.log(betas), np.log(mins))
        st, _ = fit(np.log(betas), np.log(theory))
        res["fit_min_w2_vs_beta"] = {"loglog_slope": s, "r2": r2, "theory_slope_sqrt_logb_over_b": st}
        s2, r22 = fit(np.log(betas), argmins)
        res["fit_argmin_t_vs_log_beta"] = {"slope": s2, "r2": r22}
    tt = ds["t"].values
    mE, mV = rows(reduce_beta(ds, "mass_E"), len(betas)), rows(reduce_beta(ds, "mass_V"), len(betas))
    res["terminal_phase"] = {
        f"beta={b:g}": {"overtake_time": crossing(tt, e, v), "max_mass_E": float(np.nanmax(e)),
                        "final_mass_E": float(e[-1]), "final_mass_V": float(v[-1])}
        for b, e, v in zip(betas, mE, mV)}
    if "w2_exact" in ds and "w2_sinkhorn" in ds:
        a, s_ = ds["w2_exact"].values, ds["w2_sinkhorn"].values
        ok = np.isfinite(a) & np.isfinite(s_) & (a > 0)
        res["sinkhorn_vs_exact_max_rel_error"] = float(np.max(np.abs(s_[ok] - a[ok]) / a[ok])) if ok.any() else None
    return res


def summarize(cfg, ds):
    pi, bV = spectral_info(cfg)
    bE = np.asarray(pi.basis)
    Q, K, V = sc.build_weights(cfg["weights"], cfg["d"])
    rep = check_assumptions(Q, K, V)
    out = {"assumption_1": {"ok": rep.ok, "cond_B": rep.cond_B, "asymmetry": rep.asymmetry,
                            "eigenvalues": list(rep.eigenvalues), "gap": rep.gap, "dim_E": rep.dim_E,
                            "failures": list(rep.failures)},
           "angle_E_EV_deg": math.degrees(subspace_angle(bE, bV))}
    out.update(analyse(cfg, ds))
    return out
