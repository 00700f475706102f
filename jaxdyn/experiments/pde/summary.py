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


def _sems(d, name, j):
    """Column ``j`` of a (n, t_compare) standard-error variable (None where one seed gave no spread)."""
    if name not in d:
        return None
    return [_f(v) for v in np.asarray(d[name].values)[:, j]]


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
                                 "w2_particles_sem": _sems(d, "w2_particles_sem", j),
                                 "w2_null_sem": _sems(d, "w2_null_sem", j),
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


def _merge_masses(ds, d):
    """Before the first merge: the cluster masses at the last saved time with the larger count.

    Returns:
      ``{"before_merge_masses": [...]}`` (ascending), or {} without a merge.
    """
    from ... import pde

    t_merge = _f(d["first_merge_time"])
    if t_merge is None or "rho" not in d:
        return {}
    ts = np.asarray(ds["t"].values, float)
    i = int(np.argmin(np.abs(ts - t_merge)))
    if i == 0:
        return {}
    masses, _ = pde.clusters(np.asarray(d["rho"].values, float)[i - 1])
    return {"before_merge_masses": None if masses is None else sorted(round(float(x), 4) for x in masses)}


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
            **_merge_masses(ds, d),
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
                                 "w1": [float(v) for v in w[:, j]], "w1_sem": _sems(d, "w1_sem", j),
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


# ---------------------------------------------------------------- the guide's numbers
# (jaxdyn.experiments.guide_numbers: a result file {"kind": "pde", "meta", "results"})


def _config(res) -> dict:
    """The run's resolved config (the YAML text its result file records)."""
    from ...config import parse_yaml

    return parse_yaml(res["meta"]["config"], "the result file's config")


def _by_beta(res) -> dict:
    """β → the points of that β (one per seed), in seed order."""
    out = {}
    for r in sorted(res["results"]["points"], key=lambda r: (r.get("beta", 0.0), r.get("seed", 0.0))):
        out.setdefault(r.get("beta"), []).append(r)
    return out


def _seeds(points) -> int:
    return len(points)


def _of(ok) -> str:
    return f"{sum(ok)} of {len(ok)}"


def _counts_seen(values) -> str:
    """Integer readings over the seeds: "6" when all agree, else "9 (×1), 10 (×4)"."""
    vals = [v for v in values if v is not None]
    kinds = sorted(set(vals))
    if len(kinds) == 1 and len(vals) == len(values):
        return str(kinds[0])
    text = ", ".join(f"{k} (×{vals.count(k)})" for k in kinds)
    return text + (f", none (×{len(values) - len(vals)})" if len(vals) < len(values) else "")


def _beta(b) -> str:
    return f"{b:g}"


def guide_run(res) -> str:
    """The run's cost: CPU seconds where measured, wall seconds, the machine."""
    from ..guide_numbers import run_cost

    return run_cost(res["meta"])


def guide_growth_abs(res) -> str:
    """The largest absolute error of the solver's linear rates against λ_k, over every point."""
    from ..guide_numbers import num

    return num(max(r["growth_rate_max_abs_error"] for r in res["results"]["points"]), 2)


def guide_growth_rel_beta10(res) -> str:
    """The largest relative error of the rates at β ≥ 10 (modes above rounding)."""
    from ..guide_numbers import num

    return num(max(r["growth_rate_max_rel_error"] for r in res["results"]["points"]
                   if r["beta"] >= 10), 2)


def guide_growth_k(res) -> str:
    """The modes whose rates were measured, k = 1..K."""
    return f"k = 1..{_config(res)['growth_k']}"


def guide_first_count(res) -> str:
    """How often the first count is k*, over every (β, seed) of the run."""
    pts = res["results"]["points"]
    return _of([r["first_cluster_count"] == r["k_star"] for r in pts]) + " runs"


def guide_first_exceptions(res) -> str:
    """The runs whose first count is not k*, with their count."""
    bad = [r for r in res["results"]["points"] if r["first_cluster_count"] != r["k_star"]]
    if not bad:
        return "no exception"
    return "; ".join(f"β = {_beta(r['beta'])}, seed {r['seed']:.0f}: {r['first_cluster_count']} "
                     f"instead of {r['k_star']}" for r in bad)


def guide_solver_mode(res) -> str:
    """How often the solver's dominant mode (when it reaches the threshold) is k*."""
    return _of([r["first_mode"] == r["k_star"] for r in res["results"]["points"]])


def guide_sweep(res) -> str:
    """β values × seeds of the run, and k* per β."""
    by = _by_beta(res)
    n = {len(v) for v in by.values()}
    return (f"β ∈ {{{', '.join(_beta(b) for b in by)}}} × {'/'.join(str(k) for k in sorted(n))} "
            f"seeds; k* = {', '.join(str(v[0]['k_star']) for v in by.values())}")


def guide_first_time_range(res) -> str:
    """The first-cluster times, smallest to largest, over every run."""
    from ..guide_numbers import num

    ts = [r["first_cluster_time"] for r in res["results"]["points"] if r["first_cluster_time"] is not None]
    return f"{num(min(ts), 2)}–{num(max(ts), 2)}"


def guide_clusters_table(res) -> str:
    """Per β: k*, the solver's first counts and times, its dominant mode and time, over the seeds."""
    from ..guide_numbers import spread

    out = ["| β | k\\* | seeds | first count | first-cluster time | dominant mode | its time |",
           "|---|---|---|---|---|---|---|"]
    for b, pts in _by_beta(res).items():
        out.append(f"| {_beta(b)} | {pts[0]['k_star']} | {_seeds(pts)} | "
                   f"{_counts_seen([r['first_cluster_count'] for r in pts])} | "
                   f"{spread([r['first_cluster_time'] for r in pts], 3)} | "
                   f"{_counts_seen([r['first_mode'] for r in pts])} | "
                   f"{spread([r['first_mode_time'] for r in pts], 3)} |")
    return "\n".join(out)


def guide_merges(res) -> str:
    """The drops of the cluster count after the first clusters, by run, or none by t1."""
    from ..guide_numbers import num

    t1 = _config(res)["t1"]
    hit = [r for r in res["results"]["points"] if r["first_merge_time"] is not None]
    if not hit:
        return f"no merge happens by t = {t1:g} in any of its {len(res['results']['points'])} runs"
    return (f"{len(hit)} of its {len(res['results']['points'])} runs drop a cluster by t = {t1:g} ("
            + "; ".join(f"β = {_beta(r['beta'])} seed {r['seed']:.0f} at t = {num(r['first_merge_time'], 2)}"
                        + _merge_words(r) for r in hit) + ")")


def _merge_words(r) -> str:
    """A merge in words: how long after the first clusters, and the clusters' masses just before.

    Returns:
      The words ("" without ``before_merge_masses``).
    """
    from ..guide_numbers import num

    m = r.get("before_merge_masses")
    if not m or len(m) < 2:
        return ""
    return (f", {num(r['first_merge_time'] - r['first_cluster_time'], 2)} time units after the first "
            f"clusters; just before it the smallest cluster held {num(m[0], 2)} of the mass and the "
            f"others {num(m[1], 2)}–{num(m[-1], 2)}")


def guide_merges_table(res) -> str:
    """Per β (with noise): k*, the first counts, the first merge's time over the seeds."""
    from ..guide_numbers import spread

    t1 = _config(res)["t1"]
    out = ["| β | k\\* | seeds | first count | first-cluster time | runs with a merge by "
           f"t = {t1:g} | first merge time | count at t = {t1:g} |", "|---|---|---|---|---|---|---|---|"]
    for b, pts in _by_beta(res).items():
        merged = [r["first_merge_time"] for r in pts if r["first_merge_time"] is not None]
        out.append(f"| {_beta(b)} | {pts[0]['k_star']} | {_seeds(pts)} | "
                   f"{_counts_seen([r['first_cluster_count'] for r in pts])} | "
                   f"{spread([r['first_cluster_time'] for r in pts], 3)} | {len(merged)} of {len(pts)} | "
                   f"{spread(merged, 3) if merged else '—'} | "
                   f"{_counts_seen([r['final_cluster_count'] for r in pts])} |")
    return "\n".join(out)


def guide_mass(res) -> str:
    """The largest mass error over the run."""
    from ..guide_numbers import num

    return num(res["results"]["max_mass_error"], 2)


def guide_min_rho(res) -> str:
    """The smallest cell average over the run (≥ 0 is the claim)."""
    from ..guide_numbers import num

    return num(res["results"]["min_rho"], 2)


def _particle_runs(res, start):
    """(point, particle entry) of the runs where the particles ran from ``start``."""
    return [(r, r["particles"][start]) for r in res["results"]["points"]
            if r.get("particles", {}).get(start, {}).get("seconds") is not None]


def guide_particles_table(res) -> str:
    """Per β: the solver's first clusters and the particles' (quantile and iid starts) over the seeds."""
    from ..guide_numbers import spread

    out = ["| β | k\\* | seeds | solver: first count | solver: first-cluster time | quantile: count, "
           "time, mode equal to the solver's | iid: first count | iid: first-cluster time | "
           "iid: dominant mode |", "|---|---|---|---|---|---|---|---|---|"]
    for b, pts in _by_beta(res).items():
        ran = [r for r in pts if r.get("particles", {}).get("quantile", {}).get("seconds") is not None]
        if not ran:
            continue
        q = [r["particles"]["quantile"] for r in ran]
        i = [r["particles"]["iid"] for r in ran if r["particles"].get("iid", {}).get("seconds") is not None]
        same = [p["first_cluster_count"] == r["first_cluster_count"] and p["first_mode"] == r["first_mode"]
                and p["first_cluster_time"] == r["first_cluster_time"] for r, p in zip(ran, q)]
        out.append(f"| {_beta(b)} | {ran[0]['k_star']} | {len(ran)} | "
                   f"{_counts_seen([r['first_cluster_count'] for r in ran])} | "
                   f"{spread([r['first_cluster_time'] for r in ran], 3)} | {_of(same)} | "
                   f"{_counts_seen([p['first_cluster_count'] for p in i])} | "
                   f"{spread([p['first_cluster_time'] for p in i], 3)} | "
                   f"{_counts_seen([p['first_mode'] for p in i])} |")
    return "\n".join(out)


def guide_quantile_agreement(res) -> str:
    """How often the quantile-start particles give the solver's count, mode and time."""
    ran = _particle_runs(res, "quantile")
    return _of([p["first_cluster_count"] == r["first_cluster_count"] and p["first_mode"] == r["first_mode"]
                and p["first_cluster_time"] == r["first_cluster_time"] for r, p in ran])


def guide_iid_count(res) -> str:
    """How often the iid-start particles' first count is k*."""
    return _of([p["first_cluster_count"] == r["k_star"] for r, p in _particle_runs(res, "iid")])


def guide_iid_mode(res) -> str:
    """How often the iid-start particles' dominant mode is k*."""
    return _of([p["first_mode"] == r["k_star"] for r, p in _particle_runs(res, "iid")])


def guide_particle_n(res) -> str:
    """N of the cluster runs' particles."""
    n = int(_config(res)["particles"]["cluster_n"])
    e = int(round(np.log10(n)))
    return f"N = 10{_sup(e)}" if 10 ** e == n else f"N = {n}"


_SUP = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def _sup(e) -> str:
    return str(e).translate(_SUP)


def _ten(n) -> str:
    """10² for 100, else the integer."""
    e = int(round(np.log10(n)))
    return f"10{_sup(e)}" if 10 ** e == n else f"{n}"


def slope_standard_error(ns, values, sems):
    """The least-squares slope of log ``values`` against log N, and its standard error.

    The error propagates each N's standard error of the mean (independent seeds at each N)
    through the unweighted fit: the slope is Σ c_i log v_i with c_i = (x_i − x̄)/Σ(x_j − x̄)²,
    so its variance is Σ c_i² (sem_i/v_i)².

    Args:
      ns: the N.
      values: the means.
      sems: their standard errors (None where unknown).

    Returns:
      (slope, standard error or None).
    """
    x = np.log(np.asarray(ns, float))
    y = np.log(np.asarray(values, float))
    c = (x - x.mean()) / np.sum((x - x.mean()) ** 2)
    slope = float(np.sum(c * y))
    if sems is None or any(s is None for s in sems):
        return slope, None
    rel = np.asarray(sems, float) / np.asarray(values, float)
    return slope, float(np.sqrt(np.sum(c ** 2 * rel ** 2)))


def _mean_sem(x, err, digits=3) -> str:
    from ..guide_numbers import num, pm

    return num(x, digits) if err is None or not err else pm(x, err)


def _fit(res):
    return res["results"]["particles"][0]


def guide_w1_table(res) -> str:
    """Per compared time: W1(particles, ρ) at N = 10², 10³, …, the fitted slope, the grid's own error."""
    from ..guide_numbers import num

    fit = _fit(res)
    ns = fit["n"]
    show = [i for i, n in enumerate(ns) if 10 ** int(round(np.log10(n))) == n]
    m = _config(res)["m"]
    out = [f"| t | W1 at N = {', '.join(_ten(ns[i]) for i in show)} (mean ± standard error) | fitted slope "
           f"({len(ns)} N) ± standard error | the density's own W1 error (M = {m} against {4 * m}) |",
           "|---|---|---|---|"]
    for key, e in fit["per_time"].items():
        slope, se = slope_standard_error(ns, e["w1"], e.get("w1_sem"))
        sems = e.get("w1_sem") or [None] * len(ns)
        out.append(f"| {key[2:]} | {', '.join(_mean_sem(e['w1'][i], sems[i]) for i in show)} | "
                   f"{_mean_sem(slope, se) if se else num(slope, 3)} | {num(e['density_grid_w1_error'], 2)} |")
    return "\n".join(out)


def guide_w1_slope_dev(res) -> str:
    """The largest distance of a fitted slope from −1/2."""
    from ..guide_numbers import num

    return num(max(abs(e["slope"] + 0.5) for e in _fit(res)["per_time"].values()), 1)


def guide_w1_repeats(res) -> str:
    """Seeds per N."""
    cfg = _config(res)["particles"]
    reps = cfg["repeats"] * len(cfg["n"]) if len(cfg["repeats"]) == 1 else cfg["repeats"]
    return (", ".join(str(r) for r in reps) + " seeds for N = "
            + ", ".join(_ten(n) for n in cfg["n"]))


def _step_at(fit, n):
    return fit["particle_step_seconds"][fit["n"].index(n)]


def _sig(x, digits=2) -> str:
    """``x`` to ``digits`` significant digits, as m·10ᵉ from 1000 on (num below)."""
    from ..guide_numbers import num

    if abs(x) < 1000:
        return num(x, digits)
    m, e = f"{x:.{digits - 1}e}".split("e")
    return f"{m}·10{_sup(int(e))}"


def _ms(s) -> str:
    from ..guide_numbers import num

    return f"{num(s * 1e3, 2)} ms" if s < 1 else f"{num(s, 2)} s"


def guide_fourier_run(res) -> str:
    """The Fourier field's run at the largest N: steps × the timed step."""
    fit = _fit(res)
    cfg = _config(res)
    n = max(fit["n"])
    steps = int(round(max(cfg["particles"]["times"]) / cfg["particles"]["dt"]))
    s = _step_at(fit, n)
    return (f"about {steps * s:.0f} s of wall time ({steps} RK4 steps of {_ms(s)} at N = {_ten(n)}, "
            f"timed in the run)")


def guide_speed(res) -> str:
    """The N at which the particles match the grid's own error, and the steps' cost, timed in the run."""
    from ..guide_numbers import num

    fit = _fit(res)
    last = list(fit["per_time"])[-1]
    e = fit["per_time"][last]
    d = fit["density_step_seconds"]
    big = max(fit["n"])
    return (f"At {last.replace('=', ' = ')} the density's W1 error is {num(e['density_grid_w1_error'], 2)}; "
            f"the particles reach it (W1 ≈ {num(e['prefactor'], 3)} N^{{−1/2}}, fitted) at N ≈ "
            f"{_sig(e['n_equivalent'])}. Timed in the same run (wall-clock medians of the compiled "
            f"right-hand side and field, on a machine shared with other jobs), one Heun step of the density at M = {fit['timing_m']} took "
            f"{_ms(d)} and one Fourier RK4 particle step at N = {_ten(big)} {_ms(_step_at(fit, big))}: "
            f"at N = {_ten(big)}, with {_sig(e['w1'][-1] / e['density_grid_w1_error'])} times the "
            f"density's error, the particle step costs {_sig(_step_at(fit, big) / d)} density steps, "
            f"and at N ≈ {_sig(e['n_equivalent'])} it would cost about "
            f"{_sig(e['particle_step_seconds_at_n_equivalent'])} s (linear in N)")


def _s2_point(res):
    return res["results"]["points"][0]


def guide_s2_solve(res) -> str:
    """The S² solve: its steps, mass error, smallest cell average."""
    from ..guide_numbers import num

    p = _s2_point(res)
    cfg = _config(res)
    return (f"{p['steps']} positivity steps to t = {cfg['t1']:g}, mass error {num(p['mass_error'], 2)}, "
            f"min ρ {'> 0' if p['min_rho'] > 0 else '= ' + num(p['min_rho'], 2)}")


def guide_s2_table(res) -> str:
    """Per compared time: d_pρ and d_ρρ (mean ± standard error) per N, their ratio, the excess."""
    from ..guide_numbers import num

    p = _s2_point(res)
    ns = p["n"]
    out = [f"| t | d_pρ at N = {', '.join(str(n) for n in ns)} | d_ρρ (null) | ratio d_pρ/d_ρρ "
           "| √(d_pρ² − d_ρρ²) |", "|---|---|---|---|---|"]
    for key, e in p["per_time"].items():
        sp = e.get("w2_particles_sem") or [None] * len(ns)
        sn = e.get("w2_null_sem") or [None] * len(ns)
        out.append(f"| {key[2:]} | {', '.join(_mean_sem(a, s) for a, s in zip(e['w2_particles'], sp))} | "
                   f"{', '.join(_mean_sem(a, s) for a, s in zip(e['w2_null'], sn))} | "
                   f"{', '.join(num(r, 3) for r in e['ratio'])} | "
                   f"{', '.join(num(x, 2) if x else '0' for x in e['excess'])} |")
    return "\n".join(out)


def guide_s2_repeats(res) -> str:
    """Seeds per N of the S² run."""
    cfg = _config(res)["particles"]
    reps = cfg["repeats"] * len(cfg["n"]) if len(cfg["repeats"]) == 1 else cfg["repeats"]
    return f"{', '.join(str(r) for r in reps)} seeds for N = {', '.join(str(n) for n in cfg['n'])}"


def guide_s2_excess(res) -> str:
    """At the last compared time: the excess at the smallest and largest N, and its fitted slope."""
    from ..guide_numbers import num

    p = _s2_point(res)
    key = list(p["per_time"])[-1]
    ex = p["per_time"][key]["excess"]
    ns = p["n"]
    ok = [(n, x) for n, x in zip(ns, ex) if x > 0]
    slope = slope_standard_error([n for n, _ in ok], [x for _, x in ok], None)[0]
    return (f"{num(ex[0], 2)} → {num(ex[-1], 2)} over a factor {ns[-1] / ns[0]:g} in N at "
            f"{key.replace('=', ' = ')}: slope {num(slope, 2)}")


def guide_s2_excess_last(res) -> str:
    """The excess at the largest N and last compared time (a bound on a fixed bias of the grid)."""
    from ..guide_numbers import num

    p = _s2_point(res)
    return num(p["per_time"][list(p["per_time"])[-1]]["excess"][-1], 2)


def guide_s2_ratios_later(res) -> str:
    """The ratios d_pρ/d_ρρ after t = 0, smallest to largest."""
    from ..guide_numbers import num

    p = _s2_point(res)
    r = [x for k, e in p["per_time"].items() if float(k[2:]) > 0 for x in e["ratio"]]
    return f"{num(min(r), 3)}–{num(max(r), 3)}"


def guide_s2_ratios_t0(res) -> str:
    """The ratios d_pρ/d_ρρ at t = 0 (1 in law), smallest to largest."""
    from ..guide_numbers import num

    r = _s2_point(res)["per_time"]["t=0"]["ratio"]
    return f"{num(min(r), 3)}–{num(max(r), 3)}"


# the closed-form rates at the cluster runs' β (result file of jaxdyn.experiments.pde.linear_rates)


def guide_rates_table(res) -> str:
    """Per β: k*, λ* and the rates of k* ± 1 relative to λ*."""
    from ..guide_numbers import num

    out = ["| β | k\\* | λ\\* | λ_{k\\*−1}/λ\\* | λ_{k\\*+1}/λ\\* |", "|---|---|---|---|---|"]
    for p in res["results"]["points"]:
        out.append(f"| {_beta(p['beta'])} | {p['k_star']} | {num(p['lambda_star'], 3)} | "
                   f"{num(p['prev_ratio'], 3)} | {num(p['next_ratio'], 3)} |")
    return "\n".join(out)


def guide_rates_next_beta10(res) -> str:
    """λ_{k*+1}/λ* over the β ≥ 10, smallest–largest (two digits)."""
    from ..guide_numbers import num

    r = [p["next_ratio"] for p in res["results"]["points"] if p["beta"] >= 10]
    lo, hi = num(min(r), 2), num(max(r), 2)
    return lo if lo == hi else f"{lo}–{hi}"


def _particle_rates(res):
    return res["results"]["particles"]["points"]


def _at_betas(res) -> str:
    return "β = " + ", ".join(_beta(p["beta"]) for p in _particle_rates(res))


def guide_rates_particle_next(res) -> str:
    """λ_{k*+1}/λ* at the particle run's β."""
    from ..guide_numbers import num

    return (", ".join(num(p["next_ratio"], 2) for p in _particle_rates(res))
            + f" at {_at_betas(res)}")


def guide_rates_particle_next_slower(res) -> str:
    """How much slower than λ* the mode k* + 1 grows (1 − λ_{k*+1}/λ*), at the particle run's β."""
    from ..guide_numbers import num

    return (", ".join(f"{num(100 * (1 - p['next_ratio']), 2)} %" for p in _particle_rates(res))
            + f" at {_at_betas(res)}")


def guide_rates_iid_window(res) -> str:
    """ln(c·√N)/λ* at the particle run's β (c the mode threshold)."""
    from ..guide_numbers import num

    return (", ".join(num(p["iid_window"], 2) for p in _particle_rates(res))
            + f" time units at {_at_betas(res)}")


# the solver's accuracy checks (result file of jaxdyn.experiments.pde.solver_checks)


def _checks(res, name):
    return res["results"][name]


def guide_checks_example_f32(res) -> str:
    """The example script's printed mass drift in float32."""
    from ..guide_numbers import num

    return num(_checks(res, "example")["mass_drift_float32"], 2)


def guide_checks_example_f64(res) -> str:
    """The example script's printed mass drift with float64."""
    from ..guide_numbers import num

    return num(_checks(res, "example")["mass_drift_float64"], 2)


def guide_checks_rates_worst(res) -> str:
    """The largest relative error of the JVP rates against λ_k, and where it is."""
    from ..guide_numbers import num

    w = _checks(res, "linear_rates")["worst"]
    return (f"{num(w['rel_error'], 1)}, at β = {_beta(w['beta'])} ({w['normalization']}, k = {w['k']}, "
            f"where λ_{w['k']} = {num(w['lambda_k'], 2)})")


def guide_checks_fourier_max(res) -> str:
    """The largest relative difference of the Fourier field from the dense one."""
    from ..guide_numbers import num

    return num(_checks(res, "fourier_field")["max_rel_difference"], 2)


def guide_checks_fourier_k(res) -> str:
    """The number of Fourier modes K at β = 5."""
    return f"K = {_checks(res, 'fourier_field')['k_modes_beta5']} at β = 5"


def guide_checks_rk4(res) -> str:
    """Fourier against dense RK4 trajectories: the difference at the middle dt and the ratios per halving."""
    from ..guide_numbers import num

    r = _checks(res, "fourier_rk4")
    i = len(r["dt"]) // 2
    ratios = [num(x, 3) for x in r["ratios"]]
    return (f"{num(r['max_difference'][i], 2)} at dt = {r['dt'][i]:g}, t = {r['t']:g}, N = {r['n']}; "
            f"ratios {' and '.join(ratios)} per halving of dt from {r['dt'][0]:g} to {r['dt'][-1]:g}")


def guide_checks_quantile(res) -> str:
    """The quantile cloud's largest relative mode error."""
    from ..guide_numbers import num

    return num(_checks(res, "quantile_modes")["max_rel_error"], 1)


def _orders(key):
    def render(res) -> str:
        from ..guide_numbers import num

        return ", ".join(num(x, 3) for x in _checks(res, "grid_orders")[key]["orders"])
    return render


def guide_checks_s2_rates(res) -> str:
    """S²: the largest relative error of the zonal rates per grid."""
    from ..guide_numbers import num

    g = _checks(res, "s2")["grids"]
    return (", ".join(num(x["max_rel_error"], 2) for x in g) + " on "
            + ", ".join(f"{x['cells'][0]}×{x['cells'][1]}" for x in g) + " cells")


def guide_checks_s2_dt(res) -> str:
    """S²: the positivity step on 32×64 cells."""
    from ..guide_numbers import num

    return num(_checks(res, "s2")["positivity_dt_32x64"], 2)


def guide_checks_s2_rhs(res) -> str:
    """S²: the wall-clock median of one right-hand side on 32×64 cells."""
    s = _checks(res, "s2")
    return f"{_ms(s['rhs_seconds_32x64_median'])} (wall-clock median of {s['rhs_repeats']} calls)"


#: the renderers of a pde result file (jaxdyn.experiments.guide_numbers)
GUIDE_RENDERERS = {
    "run": guide_run, "mass": guide_mass, "min_rho": guide_min_rho,
    "growth_abs": guide_growth_abs, "growth_rel_beta10": guide_growth_rel_beta10,
    "growth_k": guide_growth_k,
    "first_count": guide_first_count, "first_exceptions": guide_first_exceptions,
    "solver_mode": guide_solver_mode, "sweep": guide_sweep, "first_time_range": guide_first_time_range,
    "clusters_table": guide_clusters_table, "merges": guide_merges, "merges_table": guide_merges_table,
    "particles_table": guide_particles_table, "quantile_agreement": guide_quantile_agreement,
    "iid_count": guide_iid_count, "iid_mode": guide_iid_mode, "particle_n": guide_particle_n,
    "w1_table": guide_w1_table, "w1_slope_dev": guide_w1_slope_dev, "w1_repeats": guide_w1_repeats,
    "fourier_run": guide_fourier_run, "speed": guide_speed,
    "s2_solve": guide_s2_solve, "s2_table": guide_s2_table, "s2_repeats": guide_s2_repeats,
    "s2_excess": guide_s2_excess, "s2_excess_last": guide_s2_excess_last,
    "s2_ratios_later": guide_s2_ratios_later, "s2_ratios_t0": guide_s2_ratios_t0,
    "rates_table": guide_rates_table, "rates_next_beta10": guide_rates_next_beta10,
    "rates_particle_next": guide_rates_particle_next,
    "rates_particle_next_slower": guide_rates_particle_next_slower,
    "rates_iid_window": guide_rates_iid_window,
    "checks_example_f32": guide_checks_example_f32, "checks_example_f64": guide_checks_example_f64,
    "checks_rates_worst": guide_checks_rates_worst, "checks_fourier_max": guide_checks_fourier_max,
    "checks_fourier_k": guide_checks_fourier_k, "checks_rk4": guide_checks_rk4,
    "checks_quantile": guide_checks_quantile, "checks_orders_sigma0": _orders("sigma=0"),
    "checks_orders_sigma05": _orders("sigma=0.5"), "checks_s2_rates": guide_checks_s2_rates,
    "checks_s2_dt": guide_checks_s2_dt, "checks_s2_rhs": guide_checks_s2_rhs,
}
