"""Kind ``pde``: the summary.

First clusters against k*, merges, growth-rate errors, mass and positivity; particles: W1
against N, its fitted slope, step costs.
"""

from __future__ import annotations

import numpy as np


def grid_points(ds):
    """(label dict, dataset slice) for every grid point."""
    axes = [d for d in ("beta", "sigma", "seed") if d in ds.dims]
    if not axes:
        return [({}, ds)]
    stacked = ds.stack(point=axes)
    out = []
    for i in range(stacked.sizes["point"]):
        d = stacked.isel(point=i)
        out.append(({a: float(d[a].values) for a in axes}, d))
    return out


def _f(x):
    x = float(x)
    return None if not np.isfinite(x) else x


def _slope(ns, w):
    return round(float(np.polyfit(np.log(ns), np.log(w), 1)[0]), 3)


def _summarize_s2(cfg, ds):
    """S²: W2 of the particles to samples of ρ(t) against the null level, per N and t.

    Means over seeds, fitted slopes, the excess √(d_pρ² − d_ρρ²), mass, positivity, zonal growth
    rates against λ_l.

    Returns:
      The results.
    """
    rows = []
    for label, d in grid_points(ds):
        ns = np.asarray(ds["n"].values, float)
        g, th = np.asarray(d["growth_measured"].values), np.asarray(d["growth_theory"].values)
        per_t = {}
        for j, t in enumerate(np.asarray(ds["t_compare"].values)):
            dp = np.asarray(d["w2_particles"].values)[:, j]
            dd = np.asarray(d["w2_null"].values)[:, j]
            per_t[f"t={t:g}"] = {"w2_particles": [float(v) for v in dp], "w2_null": [float(v) for v in dd],
                                 "ratio": [round(float(a / b), 3) for a, b in zip(dp, dd)],
                                 "excess": [float(np.sqrt(max(a * a - b * b, 0.0))) for a, b in zip(dp, dd)],
                                 "slope_particles": _slope(ns, dp), "slope_null": _slope(ns, dd)}
        rows.append({**label, "n": [int(v) for v in ns], "per_time": per_t,
                     "growth_rate_max_rel_error": float(np.max(np.abs(g / th - 1))),
                     "mass_error": float(d["mass_error"]), "min_rho": float(d["min_rho"]),
                     "solve_seconds": round(float(d["solve_seconds"]), 2), "steps": int(d["num_steps"])})
    return {"points": rows, "max_mass_error": max(r["mass_error"] for r in rows),
            "min_rho": min(r["min_rho"] for r in rows)}


def _int_or_none(x):
    x = float(x)
    return int(x) if np.isfinite(x) else None


def _particle_entry(cfg, ds, d):
    """Clusters: the solver's dominant mode, and per particle start its first clusters.

    Per start: its first clusters (time, count), its count at the solver's first-cluster time, its
    dominant mode.

    Returns:
      The entry.
    """
    out = {"first_mode": _int_or_none(d["first_mode"]) if "first_mode" in d else None,
           "first_mode_time": _f(d["first_mode_time"]) if "first_mode_time" in d else None}
    if "start" not in ds.dims:
        return out
    per = {}
    for i, st in enumerate(list(cfg["particles"]["starts"])):
        g = lambda name: np.asarray(d[name].values)[i]  # noqa: E731
        per[st] = {"first_cluster_count": _int_or_none(g("p_first_cluster_count")),
                   "first_cluster_time": _f(g("p_first_cluster_time")),
                   "count_at_solver_time": _int_or_none(g("p_count_at_solver_time")),
                   "first_mode": _int_or_none(g("p_first_mode")), "first_mode_time": _f(g("p_first_mode_time")),
                   "seconds": None if not np.isfinite(g("p_seconds")) else round(float(g("p_seconds")), 1)}
    out["particles"] = per
    return out


def _count(v):
    """An integer count, or None where the run lost finiteness (NaN)."""
    return int(v) if np.isfinite(v) else None


def _point_row(cfg, ds, label, d):
    """One grid point's entry of ``points``: clusters, particles, growth-rate errors, mass, time."""
    g, th = np.asarray(d["growth_measured"].values), np.asarray(d["growth_theory"].values)
    ks = np.asarray(ds["k"].values)
    sig = label.get("sigma", cfg["sigma"])
    core = th + sig ** 2 * ks ** 2 / 2  # the attention part (k²/β) I_k/I_0
    scale = np.abs(core) + sig ** 2 * ks ** 2 / 2
    # relative error on the modes whose rate is above rounding (1e-10 of the largest):
    # at β = 1, λ_16 ≈ 1e-16 and its relative error means nothing
    keep = scale >= 1e-10 * scale.max()
    rel = float(np.max(np.abs(g - th)[keep] / scale[keep]))
    absolute = float(np.max(np.abs(g - th)))
    return {**label, "k_star": int(d["k_star"]), "first_cluster_count": int(d["first_cluster_count"]),
            "first_cluster_time": _f(d["first_cluster_time"]),
            "first_merge_time": _f(d["first_merge_time"]),
            "final_cluster_count": _count(np.asarray(d["cluster_count"].values)[-1]),
            **_particle_entry(cfg, ds, d),
            "growth_rate_max_rel_error": rel, "growth_rate_max_abs_error": absolute, "mass_error": float(d["mass_error"]),
            "min_rho": float(d["min_rho"]), "solve_seconds": round(float(d["solve_seconds"]), 2),
            "steps": int(d["num_steps"])}


def _particles_k_star(cfg, rows):
    """Per particle start: how often the particles' first clusters agree with k* and the solver."""
    per = {}
    for st in list(cfg["particles"]["starts"]):
        ran = [(r, r["particles"][st]) for r in rows if r["particles"][st]["seconds"] is not None]

        def frac(ok):
            return f"{sum(ok)} of {len(ran)}"

        per[st] = {"n": int(cfg["particles"]["cluster_n"]),
                   "first_count_equals_k_star": frac([q["first_cluster_count"] == r["k_star"] for r, q in ran]),
                   "first_count_equals_solver": frac([q["first_cluster_count"] == r["first_cluster_count"]
                                                      for r, q in ran]),
                   "first_mode_equals_k_star": frac([q["first_mode"] == r["k_star"] for r, q in ran]),
                   "particle_seconds": round(sum(q["seconds"] for _, q in ran), 1)}
    return per


def _particle_fits(cfg, ds):
    """Per grid point: W1(particles, ρ) against N fitted as prefactor·N^slope at each compared time."""
    fits = []
    for label, d in grid_points(ds):
        ns = np.asarray(ds["n"].values, float)
        w = np.asarray(d["w1"].values)
        per_t = {}
        for j, t in enumerate(np.asarray(ds["t_compare"].values)):
            slope, icpt = np.polyfit(np.log(ns), np.log(w[:, j]), 1)
            per_t[f"t={t:g}"] = {"slope": round(float(slope), 3), "prefactor": round(float(np.exp(icpt)), 3),
                                 "w1": [float(v) for v in w[:, j]],
                                 "density_grid_w1_error": float(d["density_w1_grid_error"].values[j])}
        ps = np.asarray(d["particle_step_seconds"].values)
        power = 1 if cfg["particles"]["kernel"] == "fourier" else 2
        for key, entry in per_t.items():
            # the N whose particle W1 (prefactor·N^{-1/2}, fitted) equals the density's own
            # W1 error at this M, and the particle step there (extrapolated from the largest
            # N timed, ∝ N² for the dense/blocked kernels, ∝ N for the Fourier one, whose K
            # does not depend on N; only meaningful when M equals timing_m)
            err = entry["density_grid_w1_error"]
            if err > 0:
                n_eq = (entry["prefactor"] / err) ** 2
                entry["n_equivalent"] = float(f"{n_eq:.3g}")
                entry["particle_step_seconds_at_n_equivalent"] = float(
                    f"{ps[-1] * (n_eq / ns[-1]) ** power:.3g}")
        fits.append({**label, "per_time": per_t, "n": [int(v) for v in ns],
                     "particle_step_seconds": [float(v) for v in ps],
                     "density_step_seconds": float(d["density_step_seconds"]),
                     "timing_m": int(cfg["particles"]["timing_m"])})
    return fits


def summarize(cfg, ds):
    """The ``pde`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`)."""
    if cfg["mode"] == "s2":
        return _summarize_s2(cfg, ds)
    rows = [_point_row(cfg, ds, label, d) for label, d in grid_points(ds)]
    out = {"points": rows,
           "growth_rate_max_rel_error": max([0.0] + [r["growth_rate_max_rel_error"] for r in rows]),
           "max_mass_error": max(r["mass_error"] for r in rows),
           "min_rho": min(r["min_rho"] for r in rows)}
    if cfg["mode"] == "clusters":
        agree = [r["first_cluster_count"] == r["k_star"] for r in rows]
        out["first_count_equals_k_star"] = f"{sum(agree)} of {len(agree)}"
        agree = [r["first_mode"] == r["k_star"] for r in rows]
        out["solver_first_mode_equals_k_star"] = f"{sum(agree)} of {len(agree)}"
        if "start" in ds.dims:
            out["particles_k_star"] = _particles_k_star(cfg, rows)
    if "w1" in ds:
        out["particles"] = _particle_fits(cfg, ds)
    return out
