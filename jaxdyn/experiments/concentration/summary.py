"""Kind ``concentration``: the fits of the summary, the Assumption 1 report, the regime warnings.

The fits: min W2 against β, argmin t against log β, the time mass_V overtakes mass_E against
log β. The warnings: too few β for a fit, no metastable phase, phases that cannot separate.
"""

from __future__ import annotations

import math

import numpy as np

from ...spectral import check_assumptions, subspace_angle
from .. import sphere_common as sc
from .schema import MIN_FIT_POINTS, SEPARATION, magnitude_basis, regime_warnings, softmax_width, spectral_info

BOUND_NOTE = ("Theorem 1 is an upper bound with unknown constants: it gives min_t W2 ≤ "
              "const·(log β/β)^{c/(2(C1+c))}, any exponent in (0, 1/2), so any negative slope is "
              "consistent with it and the slope of sqrt(log(β+1)/β) is no prediction (docs/math.md §A.7)")


def primary_w2(ds):
    """The name of the W2 variable the fits read (exact, else Sinkhorn, else the coupling bound)."""
    for name in ("w2_exact", "w2_sinkhorn", "w2_coupling"):
        if name in ds:
            return name
    raise KeyError("no W2 variable in the dataset")


def reduce_beta(ds, var):
    """``var`` averaged over every sweep axis but β."""
    da = ds[var]
    other = [d for d in da.dims if d in ("seed", "n", "d", "t1", "dt")]
    return da.mean(other) if other else da


def betas_of(cfg, ds):
    """The β values of a run (the sweep's, or the config's one)."""
    return np.asarray(ds["beta"].values if "beta" in ds.dims else [cfg["beta"]], float)


def rows(da, nb):
    """One row per β of ``da`` (its first ``nb`` rows, or the one row without a β axis)."""
    return [da.isel(beta=i).values if "beta" in da.dims else da.values for i in range(nb)]


def fit(x, y):
    """Least-squares slope and R² over the finite points.

    Args:
      x: abscissae.
      y: ordinates.

    Returns:
      ``(slope, R²)``: R² is None on 2 points (where it is 1 by construction), both None on fewer.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2:
        return None, None
    slope, icpt = np.polyfit(x[ok], y[ok], 1)
    if ok.sum() == 2:
        return float(slope), None
    pred = slope * x[ok] + icpt
    ss = np.sum((y[ok] - y[ok].mean()) ** 2)
    r2 = 1 - np.sum((y[ok] - pred) ** 2) / ss if ss > 0 else float("nan")
    return float(slope), float(r2)


def fit_report(name, x, y, warns):
    """:func:`fit` with its point count, and a warning when the points are too few.

    Args:
      name: the fit's name (in the warning).
      x: abscissae.
      y: ordinates.
      warns: the warnings (appended to when the points are fewer than MIN_FIT_POINTS).

    Returns:
      ``{"slope", "r2", "n_points"}``.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = int(np.sum(np.isfinite(x) & np.isfinite(y)))
    s, r2 = fit(x, y)
    out = {"slope": s, "r2": r2, "n_points": n}
    if n < 2:
        out["warning"] = f"{n} usable point(s): no fit"
    elif n < MIN_FIT_POINTS:
        out["warning"] = (f"{n} points: fewer than {MIN_FIT_POINTS}, the fit is indicative only"
                          + (" (R² is not reported on 2 points)" if n == 2 else ""))
    if "warning" in out:
        warns.append(f"{name}: {out['warning']}")
    return out


def largest_lead(mE, mV, min_mass=0.0):
    """Index of mass_E's largest lead over mass_V.

    Among the times where mass_E >= min_mass (a metastable phase), else over all times.

    Args:
      mE: mass near E against t.
      mV: mass near E(V) against t.
      min_mass: ``metastable_mass``.

    Returns:
      The index, or None if mass_E never leads.
    """
    mE = np.asarray(mE, float)
    lead = mE - np.asarray(mV, float)
    if not np.isfinite(lead).any():
        return None
    held = np.where(mE >= min_mass, lead, -np.inf)
    if np.nanmax(held) > 0:
        return int(np.nanargmax(held))
    k = int(np.nanargmax(lead))
    return k if lead[k] > 0 else None


def crossing(t, mE, mV, min_mass=0.0):
    """The end of the metastable phase: the first time mass_V > mass_E after mass_E's largest lead.

    The lead is :func:`largest_lead`'s (while mass_E >= ``min_mass`` if it ever leads there),
    not any lead: with a non-uniform ρ0 a lead of one particle near t = 0 comes long before
    mass_E's peak.

    Args:
      t: the saved times.
      mE: mass near E against t.
      mV: mass near E(V) against t.
      min_mass: ``metastable_mass``.

    Returns:
      The time, or None if mass_E never leads, or mass_V never overtakes it after.
    """
    k = largest_lead(mE, mV, min_mass)
    if k is None:
        return None
    lead = np.asarray(mE, float) - np.asarray(mV, float)
    after = np.flatnonzero((lead < 0) & (np.arange(len(t)) > k))
    return float(t[after[0]]) if after.size else None


def analyse(cfg, ds, angle_rad=None):
    """The fits and per-β readings of a run.

    Args:
      cfg: the resolved config.
      ds: the merged Dataset.
      angle_rad: the angle between E and E(V); when given, adds whether the phases can separate
        at each β.

    Returns:
      The analysis (the summary's ``results``).
    """
    warns = []
    var = primary_w2(ds)
    tdim = ds[var].dims[-1]
    t = ds[tdim].values
    betas = betas_of(cfg, ds)
    w2 = rows(reduce_beta(ds, var), len(betas))
    mins = np.array([np.nanmin(r) if np.isfinite(r).any() else np.nan for r in w2])
    idx = [int(np.nanargmin(r)) if np.isfinite(r).any() else -1 for r in w2]
    argmins = np.array([t[i] if i >= 0 else np.nan for i in idx])
    # a minimum at the first or last saved time is no minimum the run resolved (W2 still
    # falling at t1, or rising from t = 0): reported, flagged, and left out of the fits
    edge = np.array([i >= 0 and i in (0, len(t) - 1) for i in idx])
    for b, e, a in zip(betas, edge, argmins):
        if e:
            warns.append(f"β = {b:g}: W2 is smallest at the {'last' if a == t[-1] else 'first'} "
                         f"saved time (t = {a:g}): the run does not resolve its minimum (a longer "
                         f"t1?); left out of the min-W2 and argmin fits")
    theory = np.sqrt(np.log(betas + 1) / betas)
    res = {"w2_variable": var, "beta": betas.tolist(), "min_w2": mins.tolist(),
           "argmin_t": argmins.tolist(), "argmin_at_boundary": edge.tolist()}
    if len(betas) >= 2:
        fmins, fargs = np.where(edge, np.nan, mins), np.where(edge, np.nan, argmins)
        f1 = fit_report("fit_min_w2_vs_beta", np.log(betas), np.log(fmins), warns)
        st, _ = fit(np.log(betas), np.log(theory))
        res["fit_min_w2_vs_beta"] = {"loglog_slope": f1.pop("slope"), **f1,
                                     "theory_slope_sqrt_logb_over_b": st, "note": BOUND_NOTE}
        res["fit_argmin_t_vs_log_beta"] = fit_report("fit_argmin_t_vs_log_beta", np.log(betas),
                                                     fargs, warns)
    tt = ds["t"].values
    mE, mV = rows(reduce_beta(ds, "mass_E"), len(betas)), rows(reduce_beta(ds, "mass_V"), len(betas))
    thr = float(cfg.get("metastable_mass", 0.1))
    tp, over = {}, np.full(len(betas), np.nan)
    for i, (b, e, v) in enumerate(zip(betas, mE, mV)):
        ot = crossing(tt, e, v, thr)
        peak = float(np.nanmax(e))
        k = largest_lead(e, v, thr)
        lead_mass = float(e[k]) if k is not None else None
        r = {"overtake_time": ot, "max_mass_E": peak, "metastable": peak >= thr,
             "mass_E_at_largest_lead": lead_mass,
             "final_mass_E": float(e[-1]), "final_mass_V": float(v[-1])}
        if angle_rad is not None and angle_rad > 0:
            r["phases_separate"] = softmax_width(b) < angle_rad / SEPARATION
        if ot is not None and not r["metastable"]:
            warns.append(f"β = {b:g}: an overtake time {ot:g} is reported but the mass near E never "
                         f"exceeded metastable_mass = {thr:g} (max {peak:.3g}): no metastable phase "
                         f"before the terminal one")
        elif ot is not None and lead_mass < thr:
            warns.append(f"β = {b:g}: an overtake time {ot:g} is reported but mass_E led mass_V only "
                         f"while below metastable_mass = {thr:g} (at its largest lead, t = "
                         f"{tt[k]:g}, mass_E = {lead_mass:.3g}); mass_V led through mass_E's peak "
                         f"({peak:.3g}): not the end of a metastable phase, left out of the fit")
        r["in_fit"] = bool(ot is not None and r["metastable"] and lead_mass >= thr)
        if r["in_fit"]:
            over[i] = ot
        tp[f"beta={b:g}"] = r
    res["terminal_phase"] = tp
    if len(betas) >= 2:
        # The observable of Theorem 1's log β time scale: when the mass near E(V) overtakes the
        # mass near E, over the β with a metastable phase (phases_separate says where the
        # softmax width also lies well below the angle between E and E(V)).
        res["fit_overtake_t_vs_log_beta"] = fit_report(
            "fit_overtake_t_vs_log_beta (β with a metastable phase)",
            np.log(betas), over, warns)
    if "mass_V_magnitude" in ds:
        mM = rows(reduce_beta(ds, "mass_V_magnitude"), len(betas))
        res["conjecture_1_readings"] = {
            f"beta={b:g}": {"final_mass_V_real_part": float(v[-1]), "final_mass_V_magnitude": float(m[-1]),
                            "max_mass_V_magnitude": float(np.nanmax(m)),
                            "chosen": ("real part" if v[-1] > m[-1] else "magnitude" if m[-1] > v[-1]
                                       else "neither")}
            for b, v, m in zip(betas, mV, mM)}
    if "w2_exact" in ds and "w2_sinkhorn" in ds:
        a, s_ = ds["w2_exact"].values, ds["w2_sinkhorn"].values
        ok = np.isfinite(a) & np.isfinite(s_) & (a > 0)
        res["sinkhorn_vs_exact_max_rel_error"] = float(np.max(np.abs(s_[ok] - a[ok]) / a[ok])) if ok.any() else None
    res["warnings"] = warns
    return res


def spread(values):
    """Mean, smallest, largest and count of the finite ``values`` (all None when none is finite)."""
    v = np.asarray([np.nan if x is None else x for x in values], float)
    v = v[np.isfinite(v)]
    if not v.size:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max()), "n": int(v.size)}


def per_seed(cfg, ds, angle_rad=None):
    """Each seed's readings and fits, and their spread over the seeds, for a run with a seed axis.

    :func:`analyse` averages the curves over the seeds before it reads their minimum; a minimum
    of W2, its time, a peak mass or an overtake time moves with the seed, so this reads each
    seed's own curves (``analyse`` on each seed) and gives the distribution of every reading.

    Args:
      cfg: the resolved config.
      ds: the merged Dataset.
      angle_rad: as in :func:`analyse`.

    Returns:
      ``{"seed", "beta", "<reading>": [seed][β], "fits": {name: {"slope", "r2"}: [seed]},
      "spread": {"<reading>": [β] of {"mean", "min", "max", "n"}, "fits": ...}, "warnings":
      [seed][...]}``; None when the run has fewer than 2 seeds.
    """
    if "seed" not in ds.dims or ds.sizes["seed"] < 2:
        return None
    runs = [analyse(cfg, ds.isel(seed=i), angle_rad) for i in range(ds.sizes["seed"])]
    out = {"seed": [int(s) for s in ds["seed"].values], "beta": runs[0]["beta"],
           "min_w2": [r["min_w2"] for r in runs], "argmin_t": [r["argmin_t"] for r in runs],
           "argmin_at_boundary": [r["argmin_at_boundary"] for r in runs]}
    tps = [list(r["terminal_phase"].values()) for r in runs]
    out["max_mass_E"] = [[v["max_mass_E"] for v in tp] for tp in tps]
    # the overtake times the fit uses (a metastable phase ended); None where there is none
    out["overtake_time"] = [[v["overtake_time"] if v["in_fit"] else None for v in tp] for tp in tps]
    # those reported but flagged (no metastable phase before them), left out of the fit
    out["overtake_time_flagged"] = [[v["overtake_time"] if not v["in_fit"] else None for v in tp]
                                    for tp in tps]
    out["final_mass_V"] = [[v["final_mass_V"] for v in tp] for tp in tps]
    if "conjecture_1_readings" in runs[0]:
        rd = [list(r["conjecture_1_readings"].values()) for r in runs]
        out["max_mass_V_magnitude"] = [[v["max_mass_V_magnitude"] for v in x] for x in rd]
        out["chosen"] = [[v["chosen"] for v in x] for x in rd]
    if "sinkhorn_vs_exact_max_rel_error" in runs[0]:
        out["sinkhorn_vs_exact_max_rel_error"] = [r["sinkhorn_vs_exact_max_rel_error"] for r in runs]
    fits = {}
    for name, slope in (("fit_min_w2_vs_beta", "loglog_slope"), ("fit_argmin_t_vs_log_beta", "slope"),
                        ("fit_overtake_t_vs_log_beta", "slope")):
        if name in runs[0]:
            fits[name] = {"slope": [r[name][slope] for r in runs], "r2": [r[name]["r2"] for r in runs],
                          "n_points": [r[name]["n_points"] for r in runs]}
    out["fits"] = fits
    out["spread"] = {k: [spread(col) for col in zip(*out[k])]
                     for k in ("min_w2", "argmin_t", "max_mass_E", "overtake_time", "final_mass_V")}
    out["spread"]["fits"] = {name: {"slope": spread(f["slope"]), "r2": spread(f["r2"])}
                             for name, f in fits.items()}
    out["warnings"] = [r["warnings"] for r in runs]
    return out


def summarize(cfg, ds):
    """The ``concentration`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`)."""
    pi, bV = spectral_info(cfg)
    bE = np.asarray(pi.basis)
    Q, K, V = sc.build_weights(cfg["weights"], cfg["d"])
    rep = check_assumptions(Q, K, V)
    out = {"assumption_1": {"ok": rep.ok, "cond_B": rep.cond_B, "asymmetry": rep.asymmetry,
                            "eigenvalues": list(rep.eigenvalues), "gap": rep.gap, "dim_E": rep.dim_E,
                            "failures": list(rep.failures)},
           "angle_E_EV_deg": math.degrees(subspace_angle(bE, bV))}
    if "mass_V_magnitude" in ds:
        out["angle_E_EV_magnitude_deg"] = math.degrees(subspace_angle(bE, magnitude_basis(cfg)))
    ang = math.radians(out["angle_E_EV_deg"])
    res = analyse(cfg, ds, ang)
    res["warnings"] = regime_warnings(res["beta"], cfg["d"], ang, cfg["near_angle_deg"]) + res["warnings"]
    out.update(res)
    seeds = per_seed(cfg, ds, ang)
    if seeds is not None:
        # the readings above are of the curves averaged over the seeds
        out["per_seed"] = seeds
    return out
