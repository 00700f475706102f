"""Kind ``pde``: solve the density on S¹; clusters, growth rates, particles against the density."""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from ... import pde
from ...models import SphereAttention
from ...simulation import simulate


def _dtype(pc):
    return jnp.float64 if pc["dtype"] == "float64" else jnp.float32


def _model(pc, m=None):
    I2 = np.eye(2)
    return pde.CircleDensity(I2, I2, I2, pc["beta"], m or pc["m"], sigma=pc["sigma"],
                             normalization=pc["normalization"], diffusion=pc["diffusion"],
                             dtype=_dtype(pc))


def _particle_dtype(pc):
    return jnp.float64 if pc["particles"]["dtype"] == "float64" else jnp.float32


def _particle_field(pc):
    """The particles' field: SphereAttention (identity weights) on S¹, or on S² in mode s2.

    On S¹ with ``particles.kernel: fourier`` the O(N K) ``pde.CircleAttention`` (equal to the
    dense field to rounding).

    Returns:
      The field.
    """
    p = pc["particles"]
    d = 3 if pc["mode"] == "s2" else 2
    eye = np.eye(d, dtype=_particle_dtype(pc))  # NumPy: concrete also inside a traced function
    if d == 3:
        return SphereAttention(eye, eye, eye, pc["beta"], normalization=pc["normalization"])
    if p["kernel"] == "fourier":
        return pde.CircleAttention(eye, eye, eye, pc["beta"], normalization=pc["normalization"])
    return SphereAttention(eye, eye, eye, pc["beta"], kernel=p["kernel"], normalization=pc["normalization"])


def _s2_model(pc):
    I3 = np.eye(3)
    nl = pc["n_lat"]
    return pde.SphereDensity(I3, I3, I3, pc["beta"], nl, 2 * nl, sigma=pc["sigma"],
                             normalization=pc["normalization"], dtype=_dtype(pc))


def _s2_rho0(pc, model):
    rho0 = pde.sphere_cell_averages(model, _s2_bumps(pc))
    return rho0 / float(np.sum(rho0 * np.asarray(model.cell_measure)))


def _rho0(pc):
    m = pc["m"]
    if pc["mode"] == "clusters":
        return pde.perturbed_uniform(m, pc["eps"], jax.random.PRNGKey(pc["seed"]))
    k, a = pc["init_k"], pc["init_amp"]
    return (1 + a * np.asarray(pde.cos_mode(m, k, jnp.float64))) / (2 * math.pi)


def _median_seconds(fn, x, reps=5):
    jax.block_until_ready(fn(x))
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(x))
        out.append(time.perf_counter() - t0)
    return float(np.median(out))


def _one_point(pc):
    model = _model(pc)
    rho0 = _rho0(pc)
    ts = _save_times(pc)
    t0 = time.perf_counter()
    sol = pde.solve_density(model, rho0, t1=pc["t1"], ts=ts, cfl=pc["cfl"])
    rho = np.asarray(jax.block_until_ready(sol.rho), float)
    seconds = time.perf_counter() - t0
    ks = np.arange(1, pc["growth_k"] + 1)
    grow = np.asarray(pde.growth_rate(model, ks))
    theory = pde.linear_rates(pc["beta"], ks, sigma=pc["sigma"], normalization=pc["normalization"])
    # a solve that lost finiteness (ends as status nonfinite): the readings of its finite frames
    frame_ok = np.isfinite(rho).all(axis=-1)
    n_ok = len(ts) if frame_ok.all() else int(np.argmin(frame_ok))
    counts = np.full(len(ts), np.nan)
    t_first, n_first, merges = float("nan"), 0, []
    if n_ok:
        counts[:n_ok] = pde.cluster_counts(rho[:n_ok])
        t_first, n_first = pde.first_clusters(ts[:n_ok], rho[:n_ok])
        merges = pde.merge_times(ts[:n_ok], rho[:n_ok])
    out = {
        "rho": (("t", "theta"), rho),
        "cluster_count": (("t",), counts),
        "growth_measured": (("k",), grow),
        "growth_theory": (("k",), theory),
        "k_star": ((), float(pde.most_unstable_mode(pc["beta"], sigma=pc["sigma"]))),
        "first_cluster_time": ((), t_first),
        "first_cluster_count": ((), float(n_first)),
        "first_merge_time": ((), merges[0][0] if merges else float("nan")),
        "mass_error": ((), float(sol.stats["mass_error"])),
        "min_rho": ((), float(sol.stats["min_rho"])),
        "num_steps": ((), float(sol.stats["num_steps"])),
        "solve_seconds": ((), seconds),
        "finite": ((), bool(np.all(sol.ok)) and bool(np.all(np.isfinite(rho)))),
    }
    coords = {"t": ts, "theta": np.asarray(pde.circle_grid(pc["m"])[0]), "k": ks}
    if pc["mode"] == "clusters":
        t_mode, k_mode = _dominant_mode(ts[:n_ok], _density_modes(rho[:n_ok], ks), ks,
                                        pc["particles"]["mode_threshold"])
        out["first_mode_time"], out["first_mode"] = ((), t_mode), ((), float(k_mode))
        if pc["particles"]["cluster_n"]:
            pv, pcoords = _cluster_particles(pc, rho0, ts, t_first, ks)
            out.update(pv)
            coords.update(pcoords)
    if pc["mode"] == "particles":
        pv, pcoords = _particles(pc, model, rho0)
        out.update(pv)
        coords.update(pcoords)
    return out, coords


def _density_modes(rho, ks):
    """|∫ e^{ikθ} ρ dθ| for cell averages ρ (…, M): the cell-average spectrum.

    The empirical measure's modes of a cloud are on the same scale (1 for a point mass).

    Returns:
      (…, len ks) amplitudes.
    """
    m = rho.shape[-1]
    return np.abs(np.fft.rfft(rho, axis=-1)[..., ks]) * 2 * math.pi / m


def _dominant_mode(ts, amps, ks, threshold):
    """(time, k) at the first saved time at which max_k amps reaches ``threshold``; (nan, 0) if never."""
    hit = np.flatnonzero(amps.max(-1) >= threshold)
    if not hit.size:
        return float("nan"), 0
    return float(ts[hit[0]]), int(ks[np.argmax(amps[hit[0]])])


def _cluster_particles(pc, rho0, ts, t_first, ks):
    """Clusters: N particles from the solver's own start ρ0, read as the solver's density is.

    ``starts``: quantile or iid. The particles run by jaxdyn.simulate with the configured field
    to the solver's first-cluster time + t_extra; at every saved time of the solver the cloud's
    cell-average histogram on the same grid is read by the same ``pde.cluster_counts``, and its
    Fourier modes k = 1..growth_k.

    Returns:
      ``(vars, coords)`` of the particle runs.
    """
    p = pc["particles"]
    starts = list(p["starts"])
    n_t = len(ts)
    nan = np.full(len(starts), np.nan)
    vals = {"p_first_cluster_time": nan.copy(), "p_first_cluster_count": nan.copy(),
            "p_count_at_solver_time": nan.copy(), "p_first_mode_time": nan.copy(),
            "p_first_mode": nan.copy(), "p_seconds": nan.copy()}
    counts = np.full((len(starts), n_t), np.nan)
    amps = np.full((len(starts), n_t, len(ks)), np.nan)
    if not p["seeds"] or pc["seed"] in p["seeds"]:
        pdt = _particle_dtype(pc)
        field = _particle_field(pc)
        t_stop = pc["t1"] if not np.isfinite(t_first) else min(pc["t1"], t_first + p["t_extra"])
        save = ts[ts <= t_stop + 1e-9]
        for i, start in enumerate(starts):
            n = p["cluster_n"]
            x0 = (pde.quantile_points(rho0, n) if start == "quantile"
                  else pde.sample_density(jax.random.PRNGKey(1000 * pc["seed"] + 17), rho0, n))
            t0 = time.perf_counter()
            tr = simulate(field, jnp.asarray(x0, pdt), t1=float(max(save[-1], p["dt"])), dt=p["dt"],
                          saveat=[float(t) for t in save], method="rk4")
            xs = np.asarray(jax.block_until_ready(tr.xs), float)
            vals["p_seconds"][i] = time.perf_counter() - t0
            hist = pde.histogram_circle(xs, pc["m"])
            c = pde.cluster_counts(hist)
            counts[i, :len(save)] = c
            amps[i, :len(save)] = pde.empirical_modes(xs, ks)
            hit = np.flatnonzero(c > 0)
            if hit.size:
                vals["p_first_cluster_time"][i], vals["p_first_cluster_count"][i] = save[hit[0]], c[hit[0]]
            if np.isfinite(t_first):
                vals["p_count_at_solver_time"][i] = c[int(np.argmin(np.abs(save - t_first)))]
            tm, km = _dominant_mode(save, amps[i, :len(save)], ks, p["mode_threshold"])
            vals["p_first_mode_time"][i], vals["p_first_mode"][i] = tm, km
    out = {name: (("start",), v) for name, v in vals.items()}
    out["p_cluster_count"] = (("start", "t"), counts)
    out["p_modes"] = (("start", "t", "k"), amps)
    return out, {"start": np.arange(len(starts))}  # index into particles.starts


def _if_finite(fn, *arrays):
    """``fn(*arrays)``, or NaN where an array holds NaN or inf (a run that ends nonfinite)."""
    if all(np.all(np.isfinite(np.asarray(a))) for a in arrays):
        return fn(*arrays)
    return float("nan")


def _particles(pc, model, rho0):
    p = pc["particles"]
    times = np.asarray(p["times"], float)
    ref = pde.solve_density(model, rho0, t1=pc["t1"], ts=np.unique(np.concatenate([[0.0], times, [pc["t1"]]])),
                            cfl=pc["cfl"])
    ref_ts = np.asarray(ref.ts)
    ref_rho = np.asarray(ref.rho, float)
    rho_at = [ref_rho[int(np.argmin(np.abs(ref_ts - t)))] for t in times]
    reps = p["repeats"] * len(p["n"]) if len(p["repeats"]) == 1 else p["repeats"]
    pdt = _particle_dtype(pc)
    field = _particle_field(pc)
    w_mean, w_std, step_s = [], [], []
    kde = None
    for n, r in zip(p["n"], reps):
        vals = []
        for s in range(r):
            x0 = pde.sample_density(jax.random.PRNGKey(1000 * pc["seed"] + s), rho0, n)
            tr = simulate(field, jnp.asarray(x0, pdt), t1=float(times.max()) if times.max() > 0 else p["dt"],
                          dt=p["dt"], saveat=[float(t) for t in times] if times.max() > 0 else None,
                          method="rk4")
            xs = np.asarray(tr.xs, float)
            vals.append([_if_finite(pde.w1_circle, rho_at[i], xs[i]) for i in range(len(times))])
            if s == 0 and n == max(p["n"]):
                kde = np.stack([pde.kde_circle(xs[i], pc["m"], p["kde_bandwidth"]) for i in range(len(times))])
        vals = np.asarray(vals)
        w_mean.append(vals.mean(0))
        w_std.append(vals.std(0, ddof=1) / math.sqrt(len(vals)) if len(vals) > 1 else np.full(len(times), np.nan))
        # one RK4 step = 4 field evaluations
        x = jnp.asarray(pde.sample_density(jax.random.PRNGKey(7), rho0, n), pdt)
        step_s.append(4 * _median_seconds(jax.jit(lambda y: field(0.0, y)), x, reps=3))
    # one Heun step of the density = 2 right-hand sides, at M = timing_m
    big = _model(pc, p["timing_m"])
    rb = jnp.asarray(pde.uniform_density(p["timing_m"], _dtype(pc)))
    pde_step = 2 * _median_seconds(jax.jit(lambda y: big(0.0, y)), rb)
    # the density's own W1 error at M: against M·4 (the same run, a finer grid)
    fine_pc = dict(pc, m=4 * pc["m"])
    fine = pde.solve_density(_model(fine_pc), (1 + pc["init_amp"] * np.asarray(
        pde.cos_mode(4 * pc["m"], pc["init_k"], jnp.float64))) / (2 * math.pi), t1=float(max(times.max(), 1e-9)),
        ts=np.unique(np.concatenate([[0.0], times])), cfl=pc["cfl"])
    fine_rho = np.asarray(fine.rho, float)
    fts = np.asarray(fine.ts)
    grid_w1 = [_if_finite(pde.w1_circle_densities, rho_at[i], fine_rho[int(np.argmin(np.abs(fts - t)))])
               for i, t in enumerate(times)]
    out = {
        "w1": (("n", "t_compare"), np.asarray(w_mean)),
        "w1_sem": (("n", "t_compare"), np.asarray(w_std)),
        "rho_compare": (("t_compare", "theta"), np.stack(rho_at)),
        "kde_compare": (("t_compare", "theta"), kde),
        "particle_step_seconds": (("n",), np.asarray(step_s)),
        "density_step_seconds": ((), pde_step),
        "density_w1_grid_error": (("t_compare",), np.asarray(grid_w1)),
    }
    return out, {"n": np.asarray(p["n"]), "t_compare": times}


def _s2_bumps(pc):
    """ρ0 ∝ e^{κ(⟨x, c_1⟩ − 1)} + e^{κ(⟨x, c_2⟩ − 1)}, c_1 = e_1, c_2 = (0, 1, 1)/√2 (κ = s2_kappa)."""
    c1, c2 = np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 1.0]) / math.sqrt(2)
    k = pc["s2_kappa"]
    return lambda x: np.exp(k * (x @ c1 - 1)) + np.exp(k * (x @ c2 - 1))


def _one_point_s2(pc):
    """S²: the density from two bumps, particles against it, kernel density, zonal growth rates.

    The density on the lat–lon grid; N particles sampled from ρ0 and run by jaxdyn.simulate
    (d = 3); W2 (exact assignment) to samples of ρ(t) against the null level of two samples of
    ρ(t); the kernel density of one cloud; the zonal growth rates.

    Returns:
      ``(vars, coords)`` of the point.
    """
    model = _s2_model(pc)
    rho0 = _s2_rho0(pc, model)
    p = pc["particles"]
    times = np.asarray(p["times"], float)
    ts = _save_times(pc)
    t0 = time.perf_counter()
    sol = pde.solve_density(model, rho0, t1=pc["t1"], ts=ts, cfl=pc["cfl"])
    rho = np.asarray(jax.block_until_ready(sol.rho), float)
    seconds = time.perf_counter() - t0
    rho_at = [rho[int(np.argmin(np.abs(ts - t)))] for t in times]
    ls = np.arange(1, pc["growth_k"] + 1)
    grow = np.asarray(pde.zonal_growth_rate(model, ls))
    theory = pde.sphere_rates(pc["beta"], ls, sigma=pc["sigma"])
    reps = p["repeats"] * len(p["n"]) if len(p["repeats"]) == 1 else p["repeats"]
    pdt = _particle_dtype(pc)
    field = _particle_field(pc)
    dp_mean, dd_mean, dp_sem, dd_sem = [], [], [], []
    kde = None
    for n, r in zip(p["n"], reps):
        dp, dd = [], []
        for s in range(r):
            x0 = pde.sample_sphere_density(jax.random.PRNGKey(1000 * pc["seed"] + s), model, rho0, n)
            tr = simulate(field, jnp.asarray(x0, pdt), t1=float(max(times.max(), p["dt"])), dt=p["dt"],
                          saveat=[float(t) for t in times], method="rk4")
            xs = np.asarray(tr.xs, float)
            pairs = [pde.w2_sphere_check(jax.random.PRNGKey(10 ** 6 + 1000 * s + i), xs[i], model, rho_at[i])
                     for i in range(len(times))]
            dp.append([a for a, _ in pairs])
            dd.append([b for _, b in pairs])
            if s == 0 and n == max(p["n"]):
                kde = np.stack([pde.kde_sphere(xs[i], model, p["kde_bandwidth"]) for i in range(len(times))])
        for lst, mean, sem in ((dp, dp_mean, dp_sem), (dd, dd_mean, dd_sem)):
            a = np.asarray(lst)
            mean.append(a.mean(0))
            sem.append(a.std(0, ddof=1) / math.sqrt(len(a)) if len(a) > 1 else np.full(len(times), np.nan))
    out = {
        "rho": (("t", "lat", "lon"), rho),
        "growth_measured": (("k",), grow),
        "growth_theory": (("k",), theory),
        "mass_error": ((), float(sol.stats["mass_error"])),
        "min_rho": ((), float(sol.stats["min_rho"])),
        "num_steps": ((), float(sol.stats["num_steps"])),
        "solve_seconds": ((), seconds),
        "finite": ((), bool(np.all(sol.ok)) and bool(np.all(np.isfinite(rho)))),
        "w2_particles": (("n", "t_compare"), np.asarray(dp_mean)),
        "w2_particles_sem": (("n", "t_compare"), np.asarray(dp_sem)),
        "w2_null": (("n", "t_compare"), np.asarray(dd_mean)),
        "w2_null_sem": (("n", "t_compare"), np.asarray(dd_sem)),
        "rho_compare": (("t_compare", "lat", "lon"), np.stack(rho_at)),
        "kde_compare": (("t_compare", "lat", "lon"), kde),
    }
    g = model.geometry(jnp.float64)
    coords = {"t": ts, "k": ls, "lat": np.asarray(g["tc"]), "lon": np.asarray(g["pc"]),
              "n": np.asarray(p["n"]), "t_compare": times}
    return out, coords


def run_points(pcs):
    """Compute a chunk of ``pde`` points (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.run_points`)."""
    rows, coords = [], None
    for pc in pcs:
        v, coords = _one_point_s2(pc) if pc["mode"] == "s2" else _one_point(pc)
        rows.append(v)
    vars_ = {name: (rows[0][name][0], np.stack([np.asarray(r[name][1]) for r in rows]))
             for name in rows[0]}
    return vars_, coords


def _save_times(pc):
    ts = np.linspace(0.0, pc["t1"], pc["n_save"])
    if pc["mode"] == "s2":
        ts = np.unique(np.concatenate([ts, np.asarray(pc["particles"]["times"], float)]))
    return ts


def step_functions(pc):
    """The device computations of a point: the density solve, and the particles' integration.

    Args:
      pc: a point config.

    Returns:
      ``"density"`` (:func:`jaxdyn.pde.solve_density` of ρ0, the model built inside from NumPy
      weights, as ``run_points`` builds it) and, where the mode runs particles, ``"particles"``
      (:func:`jaxdyn.simulate` of N particles under the particles' field).
    """
    from ..kinds import StepFunction

    x64 = pc["dtype"] == "float64"
    ts = _save_times(pc)
    p = pc["particles"]
    with jax.enable_x64(x64 or p["dtype"] == "float64"):
        if pc["mode"] == "s2":
            rho0 = np.asarray(_s2_rho0(pc, _s2_model(pc)))
            make = _s2_model
        else:
            rho0 = np.asarray(_rho0(pc))
            make = _model
        n = max(p["n"]) if pc["mode"] != "clusters" else p["cluster_n"]
        x0 = None
        if n:
            x0 = np.asarray(pde.quantile_points(np.asarray(_rho0(pc)), n) if pc["mode"] != "s2"
                            else pde.sample_sphere_density(jax.random.PRNGKey(0), _s2_model(pc), rho0, n))

    def density(r0):
        return pde.solve_density(make(pc), r0, t1=pc["t1"], ts=ts, cfl=pc["cfl"])

    steps = {"density": StepFunction(density, (rho0,), x64)}
    if x0 is not None:
        times = [float(t) for t in p["times"]] if pc["mode"] != "clusters" else [float(ts[-1])]

        def particles(x):
            return simulate(_particle_field(pc), x, t1=max(max(times), p["dt"]), dt=p["dt"],
                            saveat=times, method="rk4")

        steps["particles"] = StepFunction(particles, (x0.astype(_particle_dtype(pc)),),
                                          p["dtype"] == "float64")
    return steps
