"""Experiment kind ``concentration``: Paper A's Theorem 1 and Conjecture 1, measured.

For each grid point (β, seed, …) the particles run under softmax attention; at the saved
times it records

* ``w2_<method>(t)``: W2(ρ^β_t, Π_# ρ0) with ρ0's sample pushed by Π (the cloud Π(x_i(0))),
  by each method of ``w2_methods`` (``exact`` assignment, debiased ``sinkhorn`` with ε
  following the distance, the ``coupling`` upper bound |x_i(t) − Π(x_i(0))|);
* ``lyapunov_mean``/``lyapunov_median``: L(x) = |P_{E⊥}x|²/|P_E x|² over the particles;
* ``mass_E``/``mass_V``: the fraction of particles within ``near_angle_deg`` of E (the top
  eigenspace of VBᵀ) and of the top eigenspace of V.

``summary.json`` holds the fits: (a) the log–log slope of min_t W2 against β beside the
slope of sqrt(log(β+1)/β) on the same β; (b) argmin_t W2 against log β (slope, R²);
(c) the time at which mass_V overtakes mass_E, per β, if it does.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .. import plots
from ..distances import w2_coupling, w2_exact, w2_sinkhorn
from ..spectral import check_assumptions, mass_near, projection, subspace_angle, top_eigenspace
from ..config import ConfigError, Field, at_least, positive
from . import sphere_common as sc

W2_METHODS = ("exact", "sinkhorn", "coupling")

SCHEMA = {
    **sc.SPHERE_FIELDS,
    "w2_methods": Field("list", ["exact", "coupling"], f"W2 methods, a subset of {list(W2_METHODS)}",
                        item="str"),
    "w2_every": Field("int", 1, "compute W2 (exact/sinkhorn) at every k-th saved time", check=at_least(1)),
    "exact_max_n": Field("int", 4096, "largest N for the O(N³) exact assignment", check=at_least(1)),
    "near_angle_deg": Field("float", 8.0, "angle (degrees) defining 'near' a subspace", check=positive),
    "force": Field("bool", False, "run even when Assumption 1 fails (the conjecture regime)"),
}

BATCH_AXES = ("beta", "seed")


def check(cfg):
    warns = sc.check_sphere(cfg)
    bad = [m for m in cfg["w2_methods"] if m not in W2_METHODS]
    if bad or not cfg["w2_methods"]:
        raise ConfigError(f"config field 'w2_methods': expected a non-empty subset of {list(W2_METHODS)}, "
                          f"got {cfg['w2_methods']}")
    ns = cfg["sweep"].get("n", [cfg["n"]])
    if "exact" in cfg["w2_methods"] and max(ns) > cfg["exact_max_n"]:
        raise ConfigError(f"config field 'w2_methods': 'exact' is O(N³) and N = {max(ns)} exceeds "
                          f"exact_max_n = {cfg['exact_max_n']}; use 'sinkhorn' or raise exact_max_n")
    for d in cfg["sweep"].get("d", [cfg["d"]]):
        Q, K, V = sc.build_weights(cfg["weights"], d)
        rep = check_assumptions(Q, K, V)
        if not rep.ok:
            msg = "Assumption 1 fails: " + "; ".join(rep.failures)
            if not cfg["force"]:
                raise ConfigError(f"config section 'weights': {msg} (set force: true to run anyway)")
            warns.append(msg + " — running anyway (force: true)")
        _, bE, bV = spectral_info({"weights": cfg["weights"], "d": d})
        ang = math.degrees(subspace_angle(bE, bV))
        if 0 < ang < 2 * cfg["near_angle_deg"]:
            warns.append(f"E(VBᵀ) and E(V) are {ang:.2f}° apart, less than twice near_angle_deg = "
                         f"{cfg['near_angle_deg']}°: the two 'near' regions overlap")
    return warns


def estimate_bytes(pc):
    return sc.estimate_bytes(pc)


def output_bytes(pc):
    return sc.output_bytes(pc, per_frame_values=10)


def spectral_info(pc):
    """Π, E (top eigenspace of VBᵀ) and E(V), from float64 weights."""
    Q, K, V = sc.build_weights(pc["weights"], pc["d"])
    with jax.enable_x64(True):  # float64 weights stay float64 whatever the global mode
        pr = projection(Q, K, V, force=True)
        ev = top_eigenspace(V, symmetric=False)
        return np.asarray(pr.projector), np.asarray(pr.basis), np.asarray(ev.basis)


def _frames(model, xs, target, P_E, bE, bV, near):
    """Per saved frame: the cloud, coupling W2 to Π(x0), Lyapunov mean/median, mass near E
    and near E(V). Module-level so that chunks share its compiled program."""
    px = jnp.matmul(xs, P_E)
    L = jnp.sum((xs - px) ** 2, -1) / jnp.sum(px**2, -1)
    return (xs, w2_coupling(xs, target[None]), jnp.mean(L, -1), jnp.median(L, -1),
            mass_near(xs, bE, near), mass_near(xs, bV, near))


def run_points(pcs):
    p0 = pcs[0]
    dtype = sc.np_dtype(p0)
    P_E, basis_E, basis_V = spectral_info(p0)
    P_E = jnp.asarray(P_E, dtype)
    bE, bV = jnp.asarray(basis_E, dtype), jnp.asarray(basis_V, dtype)
    near = math.radians(p0["near_angle_deg"])
    x0 = sc.initial_clouds(pcs)
    targets = jnp.matmul(x0, P_E)
    targets = targets / jnp.linalg.norm(targets, axis=-1, keepdims=True)  # Π(x_i(0))

    near = jnp.asarray(near, dtype)
    (xs_np, coup, Lmean, Lmed, mE, mV), finite = sc.integrate_chunk(
        pcs, _frames, (targets,), consts=(P_E, bE, bV, near))
    tg_np = np.asarray(targets)
    ts = sc.save_times(p0)
    k = np.arange(0, len(ts), p0["w2_every"])
    if k[-1] != len(ts) - 1:
        k = np.append(k, len(ts) - 1)
    vars_ = {
        "lyapunov_mean": (("t",), Lmean),
        "lyapunov_median": (("t",), Lmed),
        "mass_E": (("t",), mE),
        "mass_V": (("t",), mV),
        "finite": ((), finite),
    }
    if "coupling" in p0["w2_methods"]:
        vars_["w2_coupling"] = (("t",), coup)
    P = len(pcs)
    if "exact" in p0["w2_methods"]:
        vals = np.full((P, len(k)), np.nan)
        for i in range(P):
            if bool(finite[i]):
                vals[i] = [w2_exact(xs_np[i, j], tg_np[i]) for j in k]
        vars_["w2_exact"] = (("t_w2",), vals)
    if "sinkhorn" in p0["w2_methods"]:
        vals = np.full((P, len(k)), np.nan)
        eps = np.full((P, len(k)), np.nan)
        conv = np.zeros((P, len(k)), bool)
        for i in range(P):
            if not bool(finite[i]):
                continue
            for jj, j in enumerate(k):
                r = w2_sinkhorn(xs_np[i, j], tg_np[i])
                vals[i, jj], eps[i, jj], conv[i, jj] = r.value, r.epsilon, r.converged
        vars_["w2_sinkhorn"] = (("t_w2",), vals)
        vars_["sinkhorn_epsilon"] = (("t_w2",), eps)
        vars_["sinkhorn_converged"] = (("t_w2",), conv)
    coords = {"t": ts, "t_w2": ts[k]}
    return vars_, coords


# ----------------------------------------------------------------------------- analysis

def primary_w2(ds):
    for name in ("w2_exact", "w2_sinkhorn", "w2_coupling"):
        if name in ds:
            return name
    raise KeyError("no W2 variable in the dataset")


def _reduce(ds, var):
    da = ds[var]
    other = [d for d in da.dims if d in ("seed", "n", "d", "t1", "dt")]
    return da.mean(other) if other else da


def _betas(cfg, ds):
    return np.asarray(ds["beta"].values if "beta" in ds.dims else [cfg["beta"]], float)


def _rows(da, nb):
    return [da.isel(beta=i).values if "beta" in da.dims else da.values for i in range(nb)]


def _fit(x, y):
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2:
        return None, None
    slope, icpt = np.polyfit(x[ok], y[ok], 1)
    pred = slope * x[ok] + icpt
    ss = np.sum((y[ok] - y[ok].mean()) ** 2)
    r2 = 1 - np.sum((y[ok] - pred) ** 2) / ss if ss > 0 else float("nan")
    return float(slope), float(r2)


def _crossing(t, mE, mV):
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
    betas = _betas(cfg, ds)
    w2 = _rows(_reduce(ds, var), len(betas))
    mins = np.array([np.nanmin(r) if np.isfinite(r).any() else np.nan for r in w2])
    argmins = np.array([t[np.nanargmin(r)] if np.isfinite(r).any() else np.nan for r in w2])
    theory = np.sqrt(np.log(betas + 1) / betas)
    res = {"w2_variable": var, "beta": betas.tolist(), "min_w2": mins.tolist(),
           "argmin_t": argmins.tolist()}
    if len(betas) >= 2:
        s, r2 = _fit(np.log(betas), np.log(mins))
        st, _ = _fit(np.log(betas), np.log(theory))
        res["fit_min_w2_vs_beta"] = {"loglog_slope": s, "r2": r2, "theory_slope_sqrt_logb_over_b": st}
        s2, r22 = _fit(np.log(betas), argmins)
        res["fit_argmin_t_vs_log_beta"] = {"slope": s2, "r2": r22}
    tt = ds["t"].values
    mE, mV = _rows(_reduce(ds, "mass_E"), len(betas)), _rows(_reduce(ds, "mass_V"), len(betas))
    res["terminal_phase"] = {
        f"beta={b:g}": {"overtake_time": _crossing(tt, e, v), "max_mass_E": float(np.nanmax(e)),
                        "final_mass_E": float(e[-1]), "final_mass_V": float(v[-1])}
        for b, e, v in zip(betas, mE, mV)}
    if "w2_exact" in ds and "w2_sinkhorn" in ds:
        a, s_ = ds["w2_exact"].values, ds["w2_sinkhorn"].values
        ok = np.isfinite(a) & np.isfinite(s_) & (a > 0)
        res["sinkhorn_vs_exact_max_rel_error"] = float(np.max(np.abs(s_[ok] - a[ok]) / a[ok])) if ok.any() else None
    return res


def summarize(cfg, ds):
    _, bE, bV = spectral_info(cfg)
    Q, K, V = sc.build_weights(cfg["weights"], cfg["d"])
    rep = check_assumptions(Q, K, V)
    out = {"assumption_1": {"ok": rep.ok, "cond_B": rep.cond_B, "asymmetry": rep.asymmetry,
                            "eigenvalues": list(rep.eigenvalues), "gap": rep.gap, "dim_E": rep.dim_E,
                            "failures": list(rep.failures)},
           "angle_E_EV_deg": math.degrees(subspace_angle(bE, bV))}
    out.update(analyse(cfg, ds))
    return out


def plot(cfg, ds, out_dir):
    out_dir = Path(out_dir)
    res = analyse(cfg, ds)
    betas = np.asarray(res["beta"])
    var = res["w2_variable"]
    tdim = ds[var].dims[-1]
    w2 = _rows(_reduce(ds, var), len(betas))
    label = {"w2_exact": "exact", "w2_sinkhorn": "Sinkhorn", "w2_coupling": "coupling bound"}[var]
    figs = [plots.curves(ds[tdim].values, {f"β = {b:g}": r for b, r in zip(betas, w2)},
                         out_dir / "w2_vs_t.png", xlabel="t (depth)",
                         ylabel=f"W2(ρ_t, Π#ρ0) ({label})", logy=True,
                         title=f"{cfg['name']}: distance to Π#ρ0")]
    if len(betas) >= 2:
        mins = np.asarray(res["min_w2"])
        theory = np.sqrt(np.log(betas + 1) / betas)
        scale = mins[0] / theory[0]
        fit = res["fit_min_w2_vs_beta"]
        figs.append(plots.scatter_fit(
            betas, mins, out_dir / "min_w2_vs_beta.png", logx=True, logy=True, xlabel="β",
            ylabel="min_t W2", reference=(betas, scale * theory, "C·sqrt(log(β+1)/β)"),
            title=f"slope {fit['loglog_slope']:.3f} (theory {fit['theory_slope_sqrt_logb_over_b']:.3f})"))
        am = np.asarray(res["argmin_t"])
        f2 = res["fit_argmin_t_vs_log_beta"]
        figs.append(plots.scatter_fit(
            np.log(betas), am, out_dir / "argmin_t_vs_log_beta.png", xlabel="log β",
            ylabel="argmin_t W2", line=True,
            title=f"argmin t vs log β: slope {f2['slope']:.3f}, R² {f2['r2']:.3f}"))
    mE = _rows(_reduce(ds, "mass_E"), len(betas))
    mV = _rows(_reduce(ds, "mass_V"), len(betas))
    figs.append(plots.mass_fractions(ds["t"].values, betas, mE, mV, out_dir / "mass_fractions.png",
                                     angle=cfg["near_angle_deg"], title=cfg["name"]))
    return figs
