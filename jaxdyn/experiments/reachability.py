"""Experiment kind ``reachability``: steering N(m0, S0) to random Gaussian targets (Paper B).

Each grid point (``mode``, ``seed``, ``d``) draws a random target ``N(m1, S1)``
(:func:`jaxdyn._control.random_target`: ``m1 ~ mean_scale · N(0, I)``, eigenvalues of S1
log-uniform in ``[eig_min, eig_max]``, Haar eigenvectors) and optimises the controls of the
moment dynamics with :func:`jaxdyn._control.reach` in one of the modes

* ``all``: A, b, V, B free;  ``attention``: A = 0, b = 0 (only V, B);
* ``bounded``: all free with ‖u(t)‖_F ≤ ``bound`` for each control;
* ``energy``: all free, loss W2² + λ ∫ Σ‖u‖² dt, with λ continuation until reached.

Recorded per point: the verified final W2 (independent Dopri8 solve) and its mean and
covariance parts, reached (W2 < ``tol``), control energy, iterations, wall time, the
certificate's W2 and energy (the constructive solution, V = B = 0), the loss and W2
histories, the controls, and ``N(m(t), Σ(t))`` at ``n_save`` times. For the points selected by
``transfer`` the optimised controls also drive the finite-N particle system (RK4) and the
L-layer transformer (one Euler step a layer), and the cloud is compared with the target
(Bures W2 between empirical moments — from i.i.d. starts and from starts with exact initial
moments — and exact W2 against a target sample with its sampling floor).

Figures: covariance ellipses along the way (d = 2) or eigenvalues of Σ(t) (d > 2), loss
curves, control profiles, and transfer W2 against N and L.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import numpy as np

from ..config import ConfigError, Field, at_least, nonnegative, positive

SCHEMA = {
    "d": Field("int", 2, "dimension of the tokens", check=at_least(1), sweepable=True),
    "mode": Field("str", "all", "control mode", choices=("all", "attention", "bounded", "energy"),
                  sweepable=True),
    "seed": Field("int", 0, "seed of the random target (and of a random init)", sweepable=True),
    "dtype": Field("str", "float64", "floating type (float64 advised: W2 < 1e-4 is W2² < 1e-8)",
                   choices=("float32", "float64")),
    "t1": Field("float", 1.0, "horizon", check=positive),
    "n_pieces": Field("int", 8, "pieces of the control grid on [0, t1]", check=at_least(1)),
    "control_kind": Field("str", "piecewise", "piecewise-constant or piecewise-linear controls",
                          choices=("piecewise", "linear")),
    "m0": Field("any", 1.0, "initial mean: a number c (c·e1), a list of d numbers, or null (0)"),
    "s0_scale": Field("float", 1.0, "initial covariance S0 = s0_scale · I", check=positive),
    "target": Field("section", {}, "random targets", schema={
        "mean_scale": Field("float", 1.0, "m1 ~ mean_scale · N(0, I)", check=nonnegative),
        "eig_min": Field("float", 0.25, "smallest eigenvalue range end of S1", check=positive),
        "eig_max": Field("float", 4.0, "largest eigenvalue range end of S1", check=positive),
    }),
    "bound": Field("float", 1.0, "mode bounded: ‖u(t)‖_F ≤ bound for each control", check=positive),
    "energy_weight": Field("float", 1e-3, "mode energy: initial energy weight λ", check=positive),
    "init": Field("str", "random", "start of the optimiser",
                  choices=("auto", "zero", "random", "certificate")),
    "init_scale": Field("float", 0.1, "std of a random init", check=nonnegative),
    "adam_steps": Field("int", 0, "Adam iterations before L-BFGS", check=at_least(0)),
    "adam_lr": Field("float", 0.02, "Adam learning rate", check=positive),
    "lbfgs_steps": Field("int", 500, "L-BFGS iterations (per energy stage)", check=at_least(0)),
    "tol": Field("float", 1e-4, "success threshold on the final W2", check=positive),
    "n_save": Field("int", 41, "saved times of N(m(t), Σ(t)) on [0, t1]", check=at_least(2)),
    "transfer": Field("section", {}, "transfer of the controls to particles and layers", schema={
        "modes": Field("list", ["all", "attention"], "modes whose results are transferred",
                       item="str"),
        "seeds": Field("list", [0], "target seeds whose results are transferred", item="int"),
        "n_particles": Field("list", [100, 300, 1000], "particle counts N", item="int"),
        "repeats": Field("int", 2, "independent initial clouds per N (averaged)", check=at_least(1)),
        "layers": Field("list", [8, 32, 128], "depths L of the discrete transformer", item="int"),
        "layer_n": Field("int", 1000, "N of the L-layer runs", check=at_least(2)),
        "steps_per_piece": Field("int", 16, "RK4 steps per control piece (particles)",
                                 check=at_least(1)),
        "exact_max": Field("int", 1000, "largest N for exact W2 (O(N³))", check=at_least(0)),
    }),
}

# Points are computed one by one (each optimisation is its own host loop).
BATCH_AXES = ()


def _dtype(cfg):
    return np.float64 if cfg["dtype"] == "float64" else np.float32


def _m0(cfg, d):
    v = cfg["m0"]
    if v is None:
        return np.zeros(d)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        out = np.zeros(d)
        out[0] = float(v)
        return out
    if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) for x in v):
        if len(v) != d:
            raise ConfigError(f"config field 'm0': a list must have d = {d} entries, got {len(v)}")
        return np.asarray(v, float)
    raise ConfigError(f"config field 'm0': expected a number, a list of d numbers or null, got {v!r}")


def check(cfg):
    warns = []
    ds_ = cfg["sweep"].get("d", [cfg["d"]])
    for d in ds_:
        _m0(cfg, d)
    tg = cfg["target"]
    if not tg["eig_min"] <= tg["eig_max"]:
        raise ConfigError(f"config field 'target.eig_min': must be <= target.eig_max, got "
                          f"{tg['eig_min']} > {tg['eig_max']}")
    tr = cfg["transfer"]
    bad = [m for m in tr["modes"] if m not in SCHEMA["mode"].choices]
    if bad:
        raise ConfigError(f"config field 'transfer.modes': unknown modes {bad}; known: "
                          f"{list(SCHEMA['mode'].choices)}")
    if any(n < 2 for n in tr["n_particles"]):
        raise ConfigError(f"config field 'transfer.n_particles': every N must be >= 2, got "
                          f"{tr['n_particles']}")
    if any(L < 1 for L in tr["layers"]):
        raise ConfigError(f"config field 'transfer.layers': every L must be >= 1, got {tr['layers']}")
    if len(set(tr["n_particles"])) != len(tr["n_particles"]) or len(set(tr["layers"])) != len(tr["layers"]):
        raise ConfigError("config field 'transfer': n_particles and layers must be distinct values")
    big = max(list(tr["n_particles"]) + [tr["layer_n"]]) if tr["modes"] else 0
    if big > 4000 and jax.default_backend() == "cpu":
        warns.append(f"transfer: N = {big} particles with dense attention is slow on CPU "
                     "(O(N²) per step)")
    if cfg["dtype"] == "float32" and cfg["tol"] < 1e-3:
        warns.append(f"tol = {cfg['tol']:g} in float32: W2² = {cfg['tol'] ** 2:.0e} is near float32 "
                     "resolution; use dtype: float64")
    if cfg["control_kind"] == "linear" and cfg["init"] in ("auto", "certificate"):
        warns.append("the certificate is piecewise constant; on a linear grid it is sampled at the "
                     "nodes (an approximate start)")
    return warns


def estimate_bytes(pc):
    d = pc["d"]
    tr = pc["transfer"]
    n = max(list(tr["n_particles"]) + [tr["layer_n"]]) if tr["modes"] else 0
    # dense attention logits (N²) in a few RK4 stages, the saved moments, optimiser state.
    return int(8 * (6 * n * n + pc["n_save"] * d * d * 4 + 64 * pc["n_pieces"] * d * d) + 64 * 2**20)


def output_bytes(pc):
    d = pc["d"]
    iters = 1 + pc["adam_steps"] + 7 * pc["lbfgs_steps"]
    return int(8 * (2 * iters + pc["n_save"] * (d * d + 2 * d) + (pc["n_pieces"] + 1) * (3 * d * d + d)))


def _transferred(pc):
    tr = pc["transfer"]
    return pc["mode"] in tr["modes"] and pc["seed"] in tr["seeds"]


def run_points(pcs):
    # float64 runs inside jax.enable_x64(True), whatever the process-wide setting.
    with jax.enable_x64(pcs[0]["dtype"] == "float64"):
        return _run_points(pcs)


def _run_points(pcs):
    import jax.numpy as jnp

    from ..control import (ControlledEuclideanAttention, cloud_w2_to_gaussian,
                            controlled_moments, gaussian_cloud, mode_options, random_target,
                            reach, transfer_particles, transformer_layers)
    from ..gaussian._solve import MomentStatus

    rows = []
    p0 = pcs[0]
    ts = np.linspace(0.0, p0["t1"], p0["n_save"])
    tr0 = p0["transfer"]
    for pc in pcs:
        dt = _dtype(pc)
        d = pc["d"]
        tg = pc["target"]
        m1, S1 = random_target(pc["seed"], d, mean_scale=tg["mean_scale"],
                               eig_range=(tg["eig_min"], tg["eig_max"]), dtype=dt)
        m0 = _m0(pc, d).astype(dt)
        S0 = (pc["s0_scale"] * np.eye(d)).astype(dt)
        opts = mode_options(pc["mode"], bound=pc["bound"], energy_weight=pc["energy_weight"])
        res = reach(m0, S0, m1, S1, t1=pc["t1"], n_pieces=pc["n_pieces"], kind=pc["control_kind"],
                    init=pc["init"], init_scale=pc["init_scale"], seed=pc["seed"],
                    adam_steps=pc["adam_steps"], adam_lr=pc["adam_lr"],
                    lbfgs_steps=pc["lbfgs_steps"], tol=pc["tol"], **opts)
        sol = controlled_moments(res.controls, m0, S0, t1=pc["t1"], saveat=jnp.asarray(ts, dt))
        cov_t = np.asarray(sol.cov, np.float64)
        eig_t = np.linalg.eigvalsh(np.nan_to_num(cov_t))[:, ::-1]
        eig_t[~np.all(np.isfinite(cov_t), axis=(1, 2))] = np.nan
        cert = res.certificate
        row = {
            "w2": res.w2, "w2_mean": res.w2_mean, "w2_cov": res.w2_cov,
            "w2_optimizer": res.w2_optimizer, "energy": res.energy, "reached": res.converged,
            "iterations": res.iterations, "evaluations": res.evaluations,
            "rejected": res.rejected, "seconds": res.seconds, "rank": res.rank,
            "energy_weight_final": res.energy_weight_final,
            "certificate_w2": np.nan if cert is None or cert.w2 is None else cert.w2,
            "certificate_energy": np.nan if cert is None else cert.energy,
            "finite": bool(res.status == MomentStatus.OK and math.isfinite(res.w2)
                           and int(sol.status) == MomentStatus.OK),
            "loss_history": res.loss_history, "w2_history": res.w2_history,
            "mean_t": np.asarray(sol.mean, np.float64), "cov_t": cov_t, "eig_t": eig_t,
            "target_mean": np.asarray(m1, np.float64), "target_cov": np.asarray(S1, np.float64),
            "initial_mean": np.asarray(m0, np.float64),
        }
        for k in ("A", "B", "V", "b"):
            row[f"control_{k}"] = np.asarray(res.controls[k].values, np.float64)
        nN, nL = len(tr0["n_particles"]), len(tr0["layers"])
        pw = {k: np.full(nN, np.nan)
              for k in ("bures", "bures_exact_start", "exact", "floor", "initial")}
        lw = {k: np.full(nL, np.nan) for k in ("bures", "exact", "gap")}
        if _transferred(pc) and row["finite"]:
            tr = pc["transfer"]
            model = ControlledEuclideanAttention.from_controls(res.controls)
            for i, N in enumerate(tr["n_particles"]):
                acc = {k: [] for k in pw}
                for r in range(tr["repeats"]):
                    x0 = gaussian_cloud([pc["seed"], N, r], m0, S0, N, dtype=dt)
                    xs = transfer_particles(model, x0, t1=pc["t1"],
                                            steps_per_piece=tr["steps_per_piece"])
                    w = cloud_w2_to_gaussian(np.asarray(xs[-1]), m1, S1, seed=r,
                                             exact_max=tr["exact_max"])
                    w0 = cloud_w2_to_gaussian(x0, m0, S0, exact=False)
                    for k in ("bures", "exact", "floor"):
                        acc[k].append(w[k])
                    acc["initial"].append(w0["bures"])
                    if N > d:  # same draw with exact initial moments
                        x0e = gaussian_cloud([pc["seed"], N, r], m0, S0, N, exact_moments=True,
                                             dtype=dt)
                        xe = transfer_particles(model, x0e, t1=pc["t1"],
                                                steps_per_piece=tr["steps_per_piece"])
                        acc["bures_exact_start"].append(
                            cloud_w2_to_gaussian(np.asarray(xe[-1]), m1, S1, exact=False)["bures"])
                for k in pw:
                    pw[k][i] = float(np.mean(acc[k])) if acc[k] else np.nan
            x0 = gaussian_cloud([pc["seed"], tr["layer_n"], 991], m0, S0, tr["layer_n"],
                                exact_moments=tr["layer_n"] > d, dtype=dt)
            # the continuous-time cloud from the same x0: the L → ∞ limit of the layers
            xc = np.asarray(transfer_particles(model, x0, t1=pc["t1"],
                                               steps_per_piece=tr["steps_per_piece"])[-1])
            wc = cloud_w2_to_gaussian(xc, m1, S1, exact=False)
            row["layer_limit_w2_bures"] = wc["bures"]
            for j, L in enumerate(tr["layers"]):
                x = np.asarray(transformer_layers(model, x0, t1=pc["t1"], n_layers=L))
                w = cloud_w2_to_gaussian(x, m1, S1, seed=0, exact_max=tr["exact_max"])
                lw["bures"][j], lw["exact"][j] = w["bures"], w["exact"]
                lw["gap"][j] = float(np.sqrt(np.mean(np.sum((x - xc) ** 2, axis=-1))))
        else:
            row["layer_limit_w2_bures"] = np.nan
        for k, v in pw.items():
            row[f"particle_w2_{k}"] = v
        for k, v in lw.items():
            row[f"layer_w2_{k}"] = v
        rows.append(row)

    dims = {
        "loss_history": ("iteration",), "w2_history": ("iteration",),
        "mean_t": ("t", "component"), "cov_t": ("t", "component", "component_b"),
        "eig_t": ("t", "component"), "target_mean": ("component",),
        "target_cov": ("component", "component_b"), "initial_mean": ("component",),
        "control_A": ("node", "component", "component_b"),
        "control_B": ("node", "component", "component_b"),
        "control_V": ("node", "component", "component_b"), "control_b": ("node", "component"),
    }
    for k in ("bures", "bures_exact_start", "exact", "floor", "initial"):
        dims[f"particle_w2_{k}"] = ("n_particles",)
    for k in ("bures", "exact", "gap"):
        dims[f"layer_w2_{k}"] = ("layers",)
    vars_ = {}
    for name in rows[0]:
        vals = [r[name] for r in rows]
        dim = dims.get(name, ())
        if dim and dim[0] == "iteration":
            n = max(len(v) for v in vals)
            arr = np.full((len(vals), n), np.nan)
            for i, v in enumerate(vals):
                arr[i, :len(v)] = v
        else:
            arr = np.asarray(vals)
        vars_[name] = (dim, arr)
    coords = {"t": ts, "n_particles": np.asarray(tr0["n_particles"]),
              "layers": np.asarray(tr0["layers"])}
    return vars_, coords


# ---------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------


def _sweep_dims(ds):
    return [d for d in ds["w2"].dims]


def _iter_points(ds):
    """Yield (labels, selection) for every grid point."""
    dims = _sweep_dims(ds)
    shape = [ds.sizes[d] for d in dims]
    for idx in np.ndindex(*shape):
        sel = dict(zip(dims, idx))
        labels = {d: ds[d].values[i].item() if hasattr(ds[d].values[i], "item") else ds[d].values[i]
                  for d, i in sel.items()}
        yield labels, sel


def _label(cfg, labels, key):
    return labels.get(key, cfg[key])


def _groups(cfg, ds):
    """{(mode, d): [selection, …]} over the grid."""
    out = {}
    for labels, sel in _iter_points(ds):
        key = (_label(cfg, labels, "mode"), int(_label(cfg, labels, "d")))
        out.setdefault(key, []).append((labels, sel))
    return out


def _f(x):
    x = float(x)
    return x if math.isfinite(x) else None


def summarize(cfg, ds):
    table = []
    for (mode, d), pts in sorted(_groups(cfg, ds).items()):
        w2 = np.array([float(ds["w2"].isel(sel)) for _, sel in pts])
        reached = np.array([bool(ds["reached"].isel(sel)) for _, sel in pts])
        en = np.array([float(ds["energy"].isel(sel)) for _, sel in pts])
        cen = np.array([float(ds["certificate_energy"].isel(sel)) for _, sel in pts])
        cw2 = np.array([float(ds["certificate_w2"].isel(sel)) for _, sel in pts])
        wm = np.array([float(ds["w2_mean"].isel(sel)) for _, sel in pts])
        wc = np.array([float(ds["w2_cov"].isel(sel)) for _, sel in pts])
        it = np.array([float(ds["iterations"].isel(sel)) for _, sel in pts])
        sec = np.array([float(ds["seconds"].isel(sel)) for _, sel in pts])
        row = {
            "mode": mode, "d": d, "targets": len(pts),
            "reached_fraction": float(np.mean(reached)),
            "tol": cfg["tol"],
            "w2_median": _f(np.nanmedian(w2)), "w2_max": _f(np.nanmax(w2)),
            "w2_mean_part_median": _f(np.nanmedian(wm)), "w2_cov_part_median": _f(np.nanmedian(wc)),
            "energy_median": _f(np.nanmedian(en)),
            "energy_ratio_to_certificate_median": _f(np.nanmedian(en / cen)),
            "certificate_w2_max": _f(np.nanmax(cw2)),
            "iterations_median": _f(np.median(it)),
            "seconds_median": _f(np.median(sec)),
        }
        if mode == "bounded":
            row["bound"] = cfg["bound"]
        if mode == "energy":
            row["energy_weight_initial"] = cfg["energy_weight"]
        table.append(row)
    transfer = []
    for labels, sel in _iter_points(ds):
        pb = ds["particle_w2_bures"].isel(sel).values
        if not np.any(np.isfinite(pb)):
            continue
        transfer.append({
            "mode": _label(cfg, labels, "mode"), "d": int(_label(cfg, labels, "d")),
            "seed": int(_label(cfg, labels, "seed")),
            "moment_w2": _f(ds["w2"].isel(sel)),
            "n_particles": [int(n) for n in ds["n_particles"].values],
            "particle_w2_bures_moments": [_f(x) for x in pb],
            "particle_w2_bures_moments_exact_start": [
                _f(x) for x in ds["particle_w2_bures_exact_start"].isel(sel).values],
            "particle_w2_exact_vs_target_sample": [_f(x) for x in ds["particle_w2_exact"].isel(sel).values],
            "sampling_floor_exact": [_f(x) for x in ds["particle_w2_floor"].isel(sel).values],
            "initial_cloud_w2_bures": [_f(x) for x in ds["particle_w2_initial"].isel(sel).values],
            "layers": [int(n) for n in ds["layers"].values],
            "layer_n": cfg["transfer"]["layer_n"],
            "layer_w2_bures_moments": [_f(x) for x in ds["layer_w2_bures"].isel(sel).values],
            "layer_w2_exact_vs_target_sample": [_f(x) for x in ds["layer_w2_exact"].isel(sel).values],
            "continuous_limit_w2_bures_moments": _f(ds["layer_limit_w2_bures"].isel(sel)),
            "layer_rms_gap_to_continuous": [_f(x) for x in ds["layer_w2_gap"].isel(sel).values],
        })
    return {"modes": table, "transfer": transfer,
            "notes": ("Transfer '..._exact_start': the same initial draws whitened to the exact "
                      "initial moments, so the error is the one the finite-N dynamics add; the "
                      "L-layer runs start from such a cloud. "
                      "Transfer 'layer_rms_gap_to_continuous' is the RMS distance between each "
                      "particle after L layers and after the continuous-time flow from the same start "
                      "(an upper bound on the W2 between the two clouds; Euler: O(1/L)). "
                      "w2: Bures W2 at t1 of an independent Dopri8 solve (rtol 1e-11) of the "
                      "optimised controls; reached: w2 < tol. Transfer: 'bures_moments' compares the "
                      "cloud's empirical mean/covariance with the target; 'exact_vs_target_sample' is "
                      "the optimal-assignment W2 to an N-sample of the target, whose value for a "
                      "perfect cloud is 'sampling_floor_exact'.")}


# ---------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path):
    from .. import plots

    return plots._save(fig, path)


def _figure_points(cfg, ds):
    """One point per mode (the first seed), in mode order."""
    seen = {}
    for labels, sel in _iter_points(ds):
        mode = _label(cfg, labels, "mode")
        if mode not in seen:
            seen[mode] = (labels, sel)
    return seen


def _ellipse(ax, m, S, **kw):
    w, u = np.linalg.eigh(0.5 * (S + S.T))
    th = np.linspace(0, 2 * np.pi, 100)
    circ = np.stack([np.cos(th), np.sin(th)])
    pts = m[:, None] + 2.0 * (u * np.sqrt(np.maximum(w, 0))) @ circ  # 2σ ellipse
    ax.plot(pts[0], pts[1], **kw)


def plot(cfg, ds, out_dir):
    plt = _plt()
    out_dir = Path(out_dir)
    figs = []
    pts = _figure_points(cfg, ds)
    ts = ds["t"].values
    modes = list(pts)
    d_first = int(_label(cfg, next(iter(pts.values()))[0], "d"))

    # 1. covariance along the way
    fig, axes = plt.subplots(1, len(modes), figsize=(4.2 * len(modes), 4.0), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, mode in zip(axes[0], modes):
        labels, sel = pts[mode]
        d = int(_label(cfg, labels, "d"))
        mean = ds["mean_t"].isel(sel).values[:, :d]
        cov = ds["cov_t"].isel(sel).values[:, :d, :d]
        tm = ds["target_mean"].isel(sel).values[:d]
        tc = ds["target_cov"].isel(sel).values[:d, :d]
        w2 = float(ds["w2"].isel(sel))
        if d == 2:
            for k in range(0, len(ts), max(1, len(ts) // 10)):
                if np.all(np.isfinite(cov[k])):
                    _ellipse(ax, mean[k], cov[k], color=cmap(ts[k] / ts[-1]), lw=1.0)
            if np.all(np.isfinite(cov[-1])):
                _ellipse(ax, mean[-1], cov[-1], color=cmap(1.0), lw=1.6, label="t = t1")
            _ellipse(ax, tm, tc, color="r", ls="--", lw=1.4, label="target")
            ax.plot(mean[:, 0], mean[:, 1], "k:", lw=0.8)
            ax.set_aspect("equal", adjustable="datalim")
            ax.set_xlabel("x1")
            ax.set_ylabel("x2")
        else:
            eig = ds["eig_t"].isel(sel).values[:, :d]
            teig = np.linalg.eigvalsh(tc)[::-1]
            for j in range(d):
                ax.plot(ts, eig[:, j], color=cmap(j / max(d - 1, 1)), lw=1.3)
                ax.axhline(teig[j], color=cmap(j / max(d - 1, 1)), ls="--", lw=0.8)
            ax.set_yscale("log")
            ax.set_xlabel("t")
            if ax is axes[0][0]:
                ax.set_ylabel("eigenvalues of Σ(t) (dashed: target)")
        ax.set_title(f"{mode}: W2(t1) = {w2:.2e}", fontsize=9)
        ax.grid(alpha=0.3)
        if d == 2:
            ax.legend(fontsize=7)
    fig.suptitle(f"{cfg['name']}: N(m(t), Σ(t)) along the optimised controls"
                 + (" (2σ ellipses, colour = t)" if d_first == 2 else ""))
    figs.append(_save(fig, out_dir / "covariance.png"))

    # 2. loss curves
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = {m: plt.get_cmap("tab10")(i) for i, m in enumerate(sorted(_groups(cfg, ds).keys()))}
    done = set()
    for labels, sel in _iter_points(ds):
        key = (_label(cfg, labels, "mode"), int(_label(cfg, labels, "d")))
        h = ds["w2_history"].isel(sel).values
        ax.plot(np.arange(len(h)), h, color=colors[key], lw=0.9, alpha=0.75,
                label=f"{key[0]} (d = {key[1]})" if key not in done else None)
        done.add(key)
    ax.axhline(cfg["tol"], color="k", ls="--", lw=0.8, label=f"tol = {cfg['tol']:g}")
    ax.set_yscale("log")
    ax.set_xlabel("optimiser iteration (Adam, then L-BFGS)")
    ax.set_ylabel("W2 at t1 (optimiser's solve)")
    ax.set_title(f"{cfg['name']}: optimisation, every target")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    figs.append(_save(fig, out_dir / "loss.png"))

    # 3. control profiles
    fig, axes = plt.subplots(1, len(modes), figsize=(4.2 * len(modes), 3.6), squeeze=False,
                             sharey=True)
    for ax, mode in zip(axes[0], modes):
        labels, sel = pts[mode]
        d = int(_label(cfg, labels, "d"))
        for k, c in zip(("A", "B", "V", "b"), ("C0", "C1", "C2", "C3")):
            v = ds[f"control_{k}"].isel(sel).values
            v = v[:, :d, :d] if k != "b" else v[:, :d]
            v = v[np.all(np.isfinite(v.reshape(v.shape[0], -1)), axis=1)]
            nrm = np.sqrt(np.sum(v.reshape(v.shape[0], -1) ** 2, axis=1))
            if cfg["control_kind"] == "piecewise":
                edges = np.linspace(0, cfg["t1"], len(nrm) + 1)
                ax.stairs(nrm, edges, color=c, lw=1.5, label=f"‖{k}(t)‖")
            else:
                ax.plot(np.linspace(0, cfg["t1"], len(nrm)), nrm, color=c, lw=1.5, label=f"‖{k}(t)‖")
        if mode == "bounded":
            ax.axhline(cfg["bound"], color="k", ls="--", lw=0.8, label="bound")
        ax.set_title(mode, fontsize=9)
        ax.set_xlabel("t")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("Frobenius norm")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{cfg['name']}: control profiles (first target)")
    figs.append(_save(fig, out_dir / "controls.png"))

    # 4. transfer
    tr_pts = [(labels, sel) for labels, sel in _iter_points(ds)
              if np.any(np.isfinite(ds["particle_w2_bures"].isel(sel).values))]
    if tr_pts:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        Ns = ds["n_particles"].values
        Ls = ds["layers"].values
        for i, (labels, sel) in enumerate(tr_pts):
            c = plt.get_cmap("tab10")(i)
            lab = f"{_label(cfg, labels, 'mode')}, seed {_label(cfg, labels, 'seed')}"
            a1.plot(Ns, ds["particle_w2_bures"].isel(sel).values, "o-", color=c,
                    label=f"{lab}: Bures(moments)")
            a1.plot(Ns, ds["particle_w2_bures_exact_start"].isel(sel).values, "d-.", color=c,
                    label=f"{lab}: Bures(moments), start with exact moments")
            ex = ds["particle_w2_exact"].isel(sel).values
            if np.any(np.isfinite(ex)):
                a1.plot(Ns, ex, "s--", color=c, label=f"{lab}: exact vs sample")
            a2.plot(Ls, ds["layer_w2_bures"].isel(sel).values, "o-", color=c,
                    label=f"{lab}: Bures(moments) to target")
            a2.axhline(float(ds["layer_limit_w2_bures"].isel(sel)), color=c, ls=":", lw=1.0,
                       label=f"{lab}: continuous time, same x0")
            a2.plot(Ls, ds["layer_w2_gap"].isel(sel).values, "^--", color=c, lw=1.0,
                    label=f"{lab}: RMS |x_L − x(t1)| (layers vs continuous)")
        sel0 = tr_pts[0][1]
        fl = ds["particle_w2_floor"].isel(sel0).values
        if np.any(np.isfinite(fl)):
            a1.plot(Ns, fl, "k:", label="exact: two target samples (floor)")
        a1.plot(Ns, ds["particle_w2_initial"].isel(sel0).values, "k-.", lw=0.8,
                label="initial cloud vs N(m0, S0) (Bures)")
        for a in (a1, a2):
            a.set_xscale("log")
            a.set_yscale("log")
            a.grid(alpha=0.3)
            a.legend(fontsize=6)
        a1.set_xlabel("N (particles)")
        a1.set_ylabel("W2 to the target at t1")
        a1.set_title("continuous-time particles (RK4)")
        a2.set_xlabel("L (layers, one Euler step each)")
        a2.set_title(f"L-layer transformer, N = {cfg['transfer']['layer_n']}")
        fig.suptitle(f"{cfg['name']}: transfer of the optimised controls")
        figs.append(_save(fig, out_dir / "transfer.png"))
    return figs
