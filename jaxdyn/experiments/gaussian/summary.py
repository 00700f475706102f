"""Kind ``gaussian``: the summary.

The error against N and its rate, parting times, the ReLU study, the phase diagram against
theory.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ... import status_names
from ... import status_code
from ...gaussian import (bures_distance, fit_slope, lyapunov_limit, moment_rhs,
                         parting_time, predicted_exponent, relu_initial_rates)
from .schema import parameters


def status_label(code):
    """The RESULTS name of a stored status code (``jaxdyn.RESULTS``)."""
    return str(status_names(int(code)))


def finite_or_none(x):
    """``float(x)`` if finite, else None."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def axis_values(cfg, ds, name):
    """The values of sweep axis ``name`` (or the config's one value)."""
    return [v.item() if hasattr(v, "item") else v for v in ds[name].values] if name in ds.dims \
        else [cfg[name]]


def select(ds, var, **sel):
    """``ds[var]`` at the given sweep values (those of its dimensions)."""
    da = ds[var]
    return da.sel({k: v for k, v in sel.items() if k in da.dims})


def error_time(cfg, ds):
    """The time of the error-against-N measurement: ``error_time``, else t1, or T*/2 before a blow-up."""
    if cfg["error_time"] is not None:
        return float(cfg["error_time"])
    T = float(np.nanmin(ds["closure_blowup_time"].values))
    return 0.5 * T if T < cfg["t1"] else float(cfg["t1"])


def t_index(ds, t):
    """The index of the saved time nearest ``t``."""
    return int(np.argmin(np.abs(ds["t"].values - t)))


def rms_errors(cfg, ds, act):
    """(ns, errs (len ns, T)): RMS over seeds of the Bures error against the closure."""
    ns = axis_values(cfg, ds, "n")
    errs = []
    for n in ns:
        w = np.asarray(select(ds, "bures", activation=act, n=n).values).reshape(-1, ds.sizes["t"])
        with np.errstate(invalid="ignore"):
            errs.append(np.sqrt(np.nanmean(np.square(w), axis=0)))
    return np.asarray(ns), np.asarray(errs)


def seed_errors(cfg, ds, act):
    """(ns, errs (len ns, seeds, T)): the Bures error against the closure of each seed."""
    ns = axis_values(cfg, ds, "n")
    errs = [np.asarray(select(ds, "bures", activation=act, n=n).values).reshape(-1, ds.sizes["t"])
            for n in ns]
    return np.asarray(ns), np.asarray(errs)


def seed_slopes(ns, errs):
    """The log–log slope against N of each seed's error (``errs``: (len ns, seeds))."""
    return [finite_or_none(fit_slope(ns, errs[:, k])) for k in range(errs.shape[1])]


def jackknife_slope_se(ns, errs):
    """The jackknife standard error of the slope of the RMS error over the seeds.

    Args:
      ns: the particle counts.
      errs: each seed's error, (len ns, seeds).

    Returns:
      The standard error over leave-one-seed-out fits, or None with fewer than 3 seeds.
    """
    k = errs.shape[1]
    if k < 3:
        return None
    with np.errstate(invalid="ignore"):
        fits = np.array([fit_slope(ns, np.sqrt(np.nanmean(np.square(np.delete(errs, j, axis=1)), axis=1)))
                         for j in range(k)])
    fits = fits[np.isfinite(fits)]
    if fits.size < 3:
        return None
    return finite_or_none(math.sqrt((fits.size - 1) / fits.size * np.sum((fits - fits.mean()) ** 2)))


def error_table(cfg, ds):
    """{activation: (ns, rms Bures error over seeds at the error time)}."""
    ti = t_index(ds, error_time(cfg, ds))
    out = {}
    for act in axis_values(cfg, ds, "activation"):
        ns, errs = rms_errors(cfg, ds, act)
        out[act] = (ns, errs[:, ti])
    return out


def slopes_over_time(cfg, ds, act="identity"):
    """(ts, fitted log–log slope of the RMS error against N at each saved time t > 0)."""
    ns, errs = rms_errors(cfg, ds, act)
    ts = ds["t"].values
    sl = np.array([fit_slope(ns, errs[:, i]) if ts[i] > 0 else np.nan for i in range(ts.size)])
    return ts, sl


def main_activation(cfg, ds):
    """The activation the main readings use (identity when swept)."""
    acts = axis_values(cfg, ds, "activation")
    return "identity" if "identity" in acts else acts[0]


def closure_tilt(ds):
    """The closure's tilt index against t (one row)."""
    return np.asarray(ds["tilt_closure"].values).reshape(-1, ds.sizes["t"])[0]


def zscores(cfg, ds, act, n, t):
    """Deviations of the particles' moments from the closure at time t, per seed.

    Mean entries and upper covariance entries, in units of the seed-to-seed standard deviation
    (needs ≥ 2 seeds).

    Args:
      cfg: the resolved config.
      ds: the merged Dataset.
      act: the activation.
      n: the particle count.
      t: the time.

    Returns:
      ``(z (seeds, k), labels)``.
    """
    ti = t_index(ds, t)
    mp = select(ds, "mean_particles", activation=act, n=n).isel(t=ti).values
    Cp = select(ds, "cov_particles", activation=act, n=n).isel(t=ti).values
    mc = select(ds, "mean_closure", activation=act, n=n).isel(t=ti).values
    Cc = select(ds, "cov_closure", activation=act, n=n).isel(t=ti).values
    if mp.ndim == 1:
        return None, None
    d = mp.shape[-1]
    iu = np.triu_indices(d)
    vals = np.concatenate([mp, Cp[:, iu[0], iu[1]]], axis=1)
    ref = np.concatenate([mc.reshape(-1, d)[0], Cc.reshape(-1, d, d)[0][iu]])
    sd = vals.std(axis=0, ddof=1)
    labels = [f"m[{i}]" for i in range(d)] + [f"S[{i},{j}]" for i, j in zip(*iu)]
    return (vals - ref) / sd, labels


def _seed_bias(cfg, ds, te):
    """The seeds' mean particle moments against the closure at ``te``, in standard errors.

    Returns:
        The ``seed_mean_vs_closure`` entry, or None with fewer than two seeds.
    """
    seeds = axis_values(cfg, ds, "seed")
    if not (len(seeds) >= 2 and "seed" in ds.dims):
        return None
    zs = {}
    for act in axis_values(cfg, ds, "activation"):
        nmax = max(axis_values(cfg, ds, "n"))
        z, labels = zscores(cfg, ds, act, nmax, te)
        if z is not None:
            mz = np.abs(z.mean(axis=0)) * math.sqrt(z.shape[0])
            zs[act] = {"n": int(nmax), "seeds": int(z.shape[0]),
                       "bias_in_standard_errors": dict(zip(labels, [finite_or_none(x) for x in mz]))}
    return {"time": te, "per_activation": zs,
            "note": "|mean over seeds of (particle moment - closure)| / (seed sd / sqrt(seeds)): "
                    "a bias test; values above ~3 mean the closure is not the particles' limit"}


def _parting(cfg, ds, T):
    """When the particles part from a closure that blows up at ``T``, per N.

    Returns:
        The ``parting`` entry.
    """
    part = {}
    act0 = main_activation(cfg, ds)
    ts = ds["t"].values
    for n in axis_values(cfg, ds, "n"):
        tp = np.asarray(select(ds, "trace_particles", activation=act0, n=n).values)
        tcl = np.asarray(select(ds, "trace_closure", activation=act0, n=n).values)
        tp = tp.reshape(-1, ts.size)
        tcl = tcl.reshape(-1, ts.size)
        times = [parting_time(ts, a, c, cfg["parting_threshold"]) for a, c in zip(tp, tcl)]
        rad = np.asarray(select(ds, "radius", activation=act0, n=n).values).reshape(-1, ts.size)
        part[str(int(n))] = {"parting_time_mean": finite_or_none(np.nanmean(times)),
                             "parting_time_per_seed": [finite_or_none(x) for x in times],
                             "trace_ratio_at_blowup_detection": finite_or_none(np.nanmean(
                                 tp[:, np.searchsorted(ts, T) - 1] / tcl[:, np.searchsorted(ts, T) - 1])),
                             "max_radius_at_t1": finite_or_none(np.nanmax(rad[:, -1]))}
    return {"threshold": cfg["parting_threshold"], "closure_blowup_time": finite_or_none(T),
            "activation": act0, "per_n": part,
            "note": "first saved time with |tr Ŝ/tr Σ - 1| > threshold; the particles "
                    "stay finite past T*"}


def summarize(cfg, ds):
    """The ``gaussian`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`)."""
    if cfg["study"] == "phase_diagram":
        return _summarize_phase(cfg, ds)
    out = {}
    st = int(np.asarray(ds["closure_status"].values).reshape(-1)[0])
    T = float(np.asarray(ds["closure_blowup_time"].values).reshape(-1)[0])
    Tth = float(np.asarray(ds["theory_blowup_time"].values).reshape(-1)[0])
    out["closure"] = {"status": status_label(st),
                      "blowup_time": finite_or_none(T), "closed_form_blowup_time": finite_or_none(Tth),
                      "blowup_time_relative_error": finite_or_none(abs(T - Tth) / Tth)
                      if math.isfinite(T) and math.isfinite(Tth) else None}
    tc = np.asarray(ds["trace_closure"].values).reshape(-1, ds.sizes["t"])[0]
    tf = np.asarray(ds["trace_closed_form"].values).reshape(-1, ds.sizes["t"])[0]
    ok = np.isfinite(tc) & np.isfinite(tf)
    if ok.any():
        out["closure"]["trace_vs_closed_form_max_relative_error"] = finite_or_none(
            np.max(np.abs(tc[ok] - tf[ok]) / np.abs(tf[ok])))
    te = error_time(cfg, ds)
    ti = t_index(ds, te)
    table = error_table(cfg, ds)
    err = {}
    for act, (ns, errs) in table.items():
        per_seed = seed_errors(cfg, ds, act)[1][:, :, ti]
        err[act] = {"n": [int(n) for n in ns], "rms_bures_to_closure": [finite_or_none(e) for e in errs],
                    "fitted_loglog_slope": finite_or_none(fit_slope(ns, errs)),
                    "bures_to_closure_per_seed": [[finite_or_none(x) for x in row] for row in per_seed],
                    "fitted_loglog_slope_per_seed": seed_slopes(ns, per_seed),
                    "fitted_loglog_slope_jackknife_se": jackknife_slope_se(ns, per_seed)}
    tilt = closure_tilt(ds)
    pred = predicted_exponent(tilt)
    over = []
    if "identity" in axis_values(cfg, ds, "activation") and len(axis_values(cfg, ds, "n")) >= 2:
        ts_, sl = slopes_over_time(cfg, ds)
        ns_, per_seed = seed_errors(cfg, ds, "identity")
        for i in sorted({t_index(ds, t) for t in np.linspace(0, ts_[-1], 9)[1:]}):
            over.append({"t": float(ts_[i]), "fitted_slope": finite_or_none(sl[i]), "tilt_index": finite_or_none(tilt[i]),
                         "predicted_exponent": finite_or_none(pred[i]),
                         "fitted_slope_per_seed": seed_slopes(ns_, per_seed[:, :, i]),
                         "fitted_slope_jackknife_se": jackknife_slope_se(ns_, per_seed[:, :, i])})
    above = np.flatnonzero(np.nan_to_num(tilt, nan=np.inf) >= 1.0)
    out["error_vs_n"] = {"time": te, "per_activation": err,
                         "seeds": len(axis_values(cfg, ds, "seed")),
                         "tilt_index_at_time": finite_or_none(tilt[ti]),
                         "predicted_exponent_at_time": finite_or_none(pred[ti]),
                         "identity_slope_over_time": over,
                         "note": "RMS over seeds of the Bures W2 between N(m̂, Ŝ) of the particles "
                                 "and the identity closure N(m, Σ). Expected slope for the identity "
                                 "model: -min(1/2, 1/(1 + s²)), s = max over [0, t] of the tilt index "
                                 "‖Σ^½ B Σ^½‖₂ of the closure (derived here; -1/2 while s < 1); "
                                 "*_per_seed: the same of each seed's own error (its spread); "
                                 "*_jackknife_se: the leave-one-seed-out standard error of the slope"}
    out["tilt_index"] = {"initial": finite_or_none(tilt[0]),
                         "first_time_at_least_1": float(ds["t"].values[above[0]]) if above.size else None}
    seed_bias = _seed_bias(cfg, ds, te)
    if seed_bias is not None:
        out["seed_mean_vs_closure"] = seed_bias
    if math.isfinite(T) and T < cfg["t1"]:
        out["parting"] = _parting(cfg, ds, T)
    acts = axis_values(cfg, ds, "activation")
    if "relu" in acts:
        out["relu"] = _relu_summary(cfg, ds)
    fin = np.asarray(ds["finite"].values)
    out["finite_points"] = int(fin.sum())
    out["points"] = int(fin.size)
    return out


def relu_first_order(cfg, ds):
    """Bures W2 between the identity closure and its first-order ReLU perturbation.

    ``N(m(t) + t Δṁ, Σ(t) + t ΔΣ̇)``, Δ = ReLU initial rates − identity initial rates.

    Args:
      cfg: the resolved config.
      ds: the merged Dataset.

    Returns:
      The distances against t.
    """
    p = parameters(cfg)
    dm_r, dS_r = relu_initial_rates(**p)
    with jax.enable_x64(True):
        dm_i, dS_i = (np.asarray(x) for x in moment_rhs(*(jnp.asarray(p[k]) for k in
                                                         ("m0", "S0", "A", "B", "V", "b"))))
    ts = ds["t"].values
    mc = np.asarray(ds["mean_closure"].values).reshape(-1, ts.size, cfg["d"])[0]
    Cc = np.asarray(ds["cov_closure"].values).reshape(-1, ts.size, cfg["d"], cfg["d"])[0]
    S1 = Cc + ts[:, None, None] * (dS_r - dS_i)
    with np.errstate(invalid="ignore"):
        psd = np.all(np.linalg.eigvalsh(np.nan_to_num(S1)) >= 0, axis=-1)
    # a first-order statement: kept on the first quarter of [0, t1] while Σ + tΔΣ̇ is PSD
    # (bures_distance refuses a covariance that is not PSD, so the others are never passed)
    keep = psd & (ts <= 0.25 * ts[-1]) & np.all(np.isfinite(S1), axis=(-2, -1))
    w = np.full(ts.size, np.nan)
    if keep.any():
        w[keep] = bures_distance(mc[keep] + ts[keep, None] * (dm_r - dm_i), S1[keep],
                                 mc[keep], Cc[keep])
    return w, (dm_r - dm_i, dS_r - dS_i)


def _relu_summary(cfg, ds):
    ts = ds["t"].values
    nmax = max(axis_values(cfg, ds, "n"))
    pred, (ddm, ddS) = relu_first_order(cfg, ds)
    out = {"n": int(nmax), "initial_rate_difference_mean": [finite_or_none(x) for x in ddm],
           "initial_rate_difference_cov_frobenius": finite_or_none(np.linalg.norm(ddS))}
    picks = sorted({t_index(ds, t) for t in np.linspace(0, ts[-1], 5)} | {1, 2})
    rows = []
    for i in picks:
        row = {"t": float(ts[i]), "first_order_prediction": finite_or_none(pred[i])}
        for act in ("relu", "identity"):
            if act not in axis_values(cfg, ds, "activation"):
                continue
            w = np.asarray(select(ds, "bures", activation=act, n=nmax).isel(t=i).values)
            sk = np.asarray(select(ds, "skew", activation=act, n=nmax).isel(t=i).values)
            ku = np.asarray(select(ds, "kurt", activation=act, n=nmax).isel(t=i).values)
            row[f"{act}_bures_to_identity_closure"] = finite_or_none(np.nanmean(w))
            row[f"{act}_max_abs_skewness"] = finite_or_none(np.nanmean(sk))
            row[f"{act}_max_abs_excess_kurtosis"] = finite_or_none(np.nanmean(ku))
        rows.append(row)
    out["over_time"] = rows
    out["note"] = ("bures_to_identity_closure: Bures W2 between the cloud's empirical moments and the "
                   "identity closure (the identity cloud gives the Monte-Carlo floor); skewness and "
                   "excess kurtosis: the largest |value| over the projections (mean over seeds); "
                   "first_order_prediction: W2 between the closure and the closure moved by t times the "
                   "difference of the exact initial rates (ReLU minus identity, Stein's lemma); a "
                   "short-time statement, given on the first quarter of [0, t1]")
    return out


def _grid_spec(g):
    return [float(g[0]), float(g[1]), int(g[2])]


def _summarize_phase(cfg, ds):
    st = np.asarray(ds["status"].values).reshape(-1).astype(int)
    T = np.asarray(ds["blowup_time"].values).reshape(-1)
    Tth = np.asarray(ds["theory_blowup_time"].values).reshape(-1)
    t1 = cfg["t1"]
    blow = st == status_code("blowup")
    both = blow & np.isfinite(Tth)
    rel = np.abs(T[both] - Tth[both]) / Tth[both]
    pred = Tth < t1
    agree = blow == pred
    # disagreements: how close to the boundary T* = t1 they are
    dis = np.flatnonzero(~agree)
    tr = np.asarray(ds["trace_final"].values).reshape(-1)
    trth = np.asarray(ds["theory_trace"].values).reshape(-1)
    okt = (st == status_code("successful")) & np.isfinite(trth)
    trel = np.abs(tr[okt] - trth[okt]) / np.abs(trth[okt])
    counts = {status_label(k): int(np.sum(st == k)) for k in np.unique(st)}
    return {
        "grid": {"a": _grid_spec(cfg["phase"]["a"]), "c": _grid_spec(cfg["phase"]["c"]),
                 "v": cfg["phase"]["v"],
                 "points": int(st.size)},
        "status_counts": counts,
        "stiff_members": int(np.sum(np.asarray(ds["stiff"].values))),
        "blowup_classification_agreement": finite_or_none(np.mean(agree)),
        "disagreements": int(dis.size),
        "disagreements_theory_blowup_time_minus_t1": [finite_or_none(Tth[i] - t1) for i in dis[:20]],
        "large_theory_blowup_time_minus_t1": [finite_or_none(Tth[i] - t1) for i in
                                              np.flatnonzero(st == status_code("large"))[:20]],
        "blowup_time_max_relative_error": finite_or_none(rel.max()) if rel.size else None,
        "blowup_time_median_relative_error": finite_or_none(np.median(rel)) if rel.size else None,
        "trace_t1_max_relative_error": finite_or_none(trel.max()) if trel.size else None,
        "note": "theory: each eigenvalue of Σ follows σ' = 2aσ + 2vcσ²; T* = scalar_blowup_time("
                "λmax(S0), a, vc); blow-up before t1 iff T* < t1",
    }


def equilibrium_trace(cfg):
    """Tr Σ* of the attracting equilibrium (:func:`jaxdyn.gaussian.lyapunov_limit`), or None."""
    p = parameters(cfg)
    eq = lyapunov_limit(p["A"], p["B"], p["V"])
    return None if eq is None else float(np.trace(eq))


# ---------------------------------------------------------------- the guide's numbers


def _seed_spread(values, digits=2) -> str:
    """Mean (range) of per-seed values, with their count."""
    from ..guide_numbers import spread

    return f"{spread(values, digits)} over {len(values)} seeds"


def _ns_words(ns) -> str:
    return f"N = {min(ns)}–{max(ns)}" if len(ns) > 1 else f"N = {ns[0]}"


def _slope_pm(slope, se) -> str:
    """A fitted slope with its jackknife standard error (two digits without one)."""
    from ..guide_numbers import num, pm

    return num(slope, 2) if se is None or slope is None else pm(slope, se)


def guide_slope(res) -> str:
    """The error-against-N slope of the identity model at the error time (pooled and per seed)."""
    from ..guide_numbers import num

    e = res["results"]["error_vs_n"]
    r = e["per_activation"]["identity"]
    return (f"log–log slope of the RMS error over the seeds **"
            f"{_slope_pm(r['fitted_loglog_slope'], r.get('fitted_loglog_slope_jackknife_se'))}** "
            f"(± its leave-one-seed-out jackknife standard error); the slope of each seed's own "
            f"error is {_seed_spread(r['fitted_loglog_slope_per_seed'])} (mean (range); "
            f"t = {num(e['time'], 2)}, {_ns_words(r['n'])})")


def guide_closed_form(res) -> str:
    """The closure's tr Σ against its closed form: the largest relative difference."""
    from ..guide_numbers import num

    return num(res["results"]["closure"]["trace_vs_closed_form_max_relative_error"], 1)


def guide_relu(res) -> str:
    """The ReLU cloud's Bures distance to the closure at the error time, smallest and largest N."""
    from ..guide_numbers import num, spread

    e = res["results"]["error_vs_n"]
    r = e["per_activation"]["relu"]
    rows = r["bures_to_closure_per_seed"]
    return (f"{spread(rows[0], 2)} at N = {r['n'][0]} and {spread(rows[-1], 2)} at N = {r['n'][-1]} "
            f"(mean (range) over {len(rows[-1])} seeds, t = {num(e['time'], 2)}; log–log slope "
            f"against N of each seed's distance {spread(r['fitted_loglog_slope_per_seed'], 2)})")


def guide_blowup_time(res) -> str:
    """The closure's blow-up time T* as refined by the solver."""
    from ..guide_numbers import num

    return num(res["results"]["closure"]["blowup_time"], 6)


def guide_parting(res) -> str:
    """Table: per N, when the particles part from the closure (mean (range) over the seeds)."""
    from ..guide_numbers import spread

    p = res["results"]["parting"]
    per_n = p["per_n"]
    lines = ["| N | " + " | ".join(sorted(per_n, key=int)) + " |",
             "|---" * (len(per_n) + 1) + "|",
             f"| parting time (mean (range) over {len(next(iter(per_n.values()))['parting_time_per_seed'])} seeds) | "
             + " | ".join(spread(per_n[n]["parting_time_per_seed"], 2) for n in sorted(per_n, key=int))
             + " |"]
    return "\n".join(lines)


def guide_parting_threshold(res) -> str:
    """The parting threshold on |tr Ŝ/tr Σ − 1|."""
    return f"{res['results']['parting']['threshold']:g}"


def guide_slopes_over_time(res) -> str:
    """Table: the fitted exponent of the error against N over time, against its prediction."""
    from ..guide_numbers import num, spread

    e = res["results"]["error_vs_n"]
    lines = ["| t | tilt index s | predicted exponent −min(1/2, 1/(1+s²)) | slope of the RMS error "
             "over the seeds ± jackknife SE | (slope − predicted) / SE | slope of each seed's "
             f"error (mean (range) over {e['seeds']} seeds) |",
             "|---|---|---|---|---|---|"]
    for row in e["identity_slope_over_time"]:
        if row["fitted_slope"] is None:
            continue  # no finite error left to fit (after the particles part from the closure)
        se = row.get("fitted_slope_jackknife_se")
        z = (None if se is None or row["predicted_exponent"] is None
             else (row["fitted_slope"] - row["predicted_exponent"]) / se)
        lines.append(f"| {num(row['t'], 2)} | {num(row['tilt_index'], 2)} | "
                     f"{num(row['predicted_exponent'], 2)} | {_slope_pm(row['fitted_slope'], se)} | "
                     f"{num(z, 2)} | {spread(row['fitted_slope_per_seed'], 2)} |")
    return "\n".join(lines)


def guide_tilt_crossing(res) -> str:
    """The first saved time at which the closure's tilt index reaches 1."""
    from ..guide_numbers import num

    t = res["results"]["tilt_index"]["first_time_at_least_1"]
    return "never" if t is None else f"t = {num(t, 2)}"


def guide_seeds_ns(res) -> str:
    """The run's particle counts and seeds, in words."""
    e = res["results"]["error_vs_n"]
    return f"{_ns_words(e['per_activation']['identity']['n'])}, {e['seeds']} seeds"


def guide_phase_grid(res) -> str:
    """The phase diagram's grid and its agreement with the closed form."""
    r = res["results"]
    g = r["grid"]
    agree = round(r["blowup_classification_agreement"] * g["points"])
    return (f"a {g['a'][2]} × {g['c'][2]} grid in one batched solve; blow-up or not agrees with "
            f"the closed form at {agree} of its {g['points']} points")


def guide_phase_large(res) -> str:
    """How many grid points ended ``large``, and their closed-form T* against t1."""
    from ..guide_numbers import num

    r = res["results"]
    k = r["status_counts"].get("large", 0)
    gaps = r.get("large_theory_blowup_time_minus_t1", [])
    if not k:
        return "no point ends `large`"
    words = "point ends" if k == 1 else "points end"
    text = f"{k} {words} `large`"
    if gaps and len(gaps) == k:
        text += (f" (closed-form T* − t1 = {', '.join(num(g, 2) for g in gaps)})" if k <= 5 else
                 f" (closed-form T* − t1 from {num(min(gaps), 2)} to {num(max(gaps), 2)})")
    return text


def guide_wall(res) -> str:
    """The run's wall time."""
    return f"{res['meta']['wall_seconds']:.0f} s"


def guide_machine(res) -> str:
    """The machine the run was recorded on."""
    from ..guide_numbers import machine_words

    return machine_words(res["meta"])


def guide_slopes_max_z(res) -> str:
    """The largest |slope − predicted| over the times, in jackknife standard errors."""
    from ..guide_numbers import num

    zs = [abs(r["fitted_slope"] - r["predicted_exponent"]) / r["fitted_slope_jackknife_se"]
          for r in res["results"]["error_vs_n"]["identity_slope_over_time"]
          if None not in (r["fitted_slope"], r["predicted_exponent"], r.get("fitted_slope_jackknife_se"))
          and r["fitted_slope_jackknife_se"] > 0]
    return num(max(zs), 2) if zs else "—"


def guide_phase_agreement(res) -> str:
    """The phase diagram's classification against the closed form.

    Returns:
      The agreement, the disagreements' closed-form T* − t1 and the largest relative error of
      T* (the float32 run's precision claim), as a phrase.
    """
    from ..guide_numbers import num

    r = res["results"]
    n = r["grid"]["points"]
    agree = round(r["blowup_classification_agreement"] * n)
    text = f"{agree} of its {n} members as the closed form does"
    gaps = r.get("disagreements_theory_blowup_time_minus_t1", [])
    if gaps:
        text += (f" (the {'other has' if len(gaps) == 1 else 'others have'} closed-form "
                 f"T* − t1 = {', '.join(num(g, 2) for g in gaps[:5])})")
    return text + f", with T* within {num(r['blowup_time_max_relative_error'], 2)} relative"


#: the renderers of a gaussian result file (jaxdyn.experiments.guide_numbers)
GUIDE_RENDERERS = {"phase_agreement": guide_phase_agreement, "slope": guide_slope, "closed_form": guide_closed_form, "relu": guide_relu,
                   "blowup_time": guide_blowup_time, "parting": guide_parting,
                   "parting_threshold": guide_parting_threshold,
                   "slopes_over_time": guide_slopes_over_time, "tilt_crossing": guide_tilt_crossing,
                   "seeds_ns": guide_seeds_ns, "phase_grid": guide_phase_grid,
                   "phase_large": guide_phase_large, "wall": guide_wall,
                   "machine": guide_machine, "slopes_max_z": guide_slopes_max_z}
