"""Kind ``reachability``: figures (covariance along the way, loss, controls, transfer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import MaxNLocator

from ... import plots
from .summary import groups, iter_points, label_of


def figure_points(cfg, ds):
    """One point per mode (the first seed), in mode order."""
    seen = {}
    for labels, sel in iter_points(ds):
        mode = label_of(cfg, labels, "mode")
        if mode not in seen:
            seen[mode] = (labels, sel)
    return seen


def plot(cfg, ds, out_dir):
    """Draw the ``reachability`` figures (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.plot`)."""
    out_dir = Path(out_dir)
    pts = figure_points(cfg, ds)
    figs = [_covariance(cfg, ds, pts, out_dir), _loss(cfg, ds, out_dir), _controls(cfg, ds, pts, out_dir)]
    transfer = _transfer(cfg, ds, out_dir)
    return figs + ([transfer] if transfer is not None else [])


def _covariance(cfg, ds, pts, out_dir):
    """N(m(t), Σ(t)) along the optimised controls, one panel per mode (the first target)."""
    plt = plots.pyplot()
    ts = ds["t"].values
    modes = list(pts)
    d_first = int(label_of(cfg, next(iter(pts.values()))[0], "d"))
    # eigenvalue panels (d > 2) share their axis: the targets are comparable across modes
    fig, axes = plt.subplots(1, len(modes), figsize=(4.2 * len(modes), 4.0), squeeze=False,
                             sharey=all(int(label_of(cfg, pts[m][0], "d")) > 2 for m in modes),
                             layout="constrained")
    cmap = plt.get_cmap("viridis")
    for ax, mode in zip(axes[0], modes):
        labels, sel = pts[mode]
        d = int(label_of(cfg, labels, "d"))
        mean = ds["mean_t"].isel(sel).values[:, :d]
        cov = ds["cov_t"].isel(sel).values[:, :d, :d]
        tm = ds["target_mean"].isel(sel).values[:d]
        tc = ds["target_cov"].isel(sel).values[:d, :d]
        w2 = float(ds["w2"].isel(sel))
        if d == 2:
            for k in range(0, len(ts), max(1, len(ts) // 10)):
                if np.all(np.isfinite(cov[k])):
                    plots.ellipse(ax, mean[k], cov[k], color=cmap(ts[k] / ts[-1]), lw=1.0)
            if np.all(np.isfinite(cov[-1])):
                plots.ellipse(ax, mean[-1], cov[-1], color=cmap(1.0), lw=1.6, label="t = t1")
            plots.ellipse(ax, tm, tc, color="r", ls="--", lw=1.4, label="target")
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
    return plots.save(fig, out_dir / "covariance.png")


def _loss(cfg, ds, out_dir):
    """W2 at t1 against the optimiser's iterations, every target."""
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = {m: plt.get_cmap("tab10")(i) for i, m in enumerate(sorted(groups(cfg, ds).keys()))}
    done = set()
    for labels, sel in iter_points(ds):
        key = (label_of(cfg, labels, "mode"), int(label_of(cfg, labels, "d")))
        h = ds["w2_history"].isel(sel).values
        ax.plot(np.arange(len(h)), h, color=colors[key], lw=0.9, alpha=0.75,
                label=f"{key[0]} (d = {key[1]})" if key not in done else None)
        done.add(key)
    ax.axhline(cfg["tol"], color="k", ls="--", lw=0.8, label=f"tol = {cfg['tol']:g}")
    ax.set_yscale("log")
    ax.set_xlabel("optimiser iteration (Adam, then L-BFGS)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("W2 at t1 (optimiser's solve)")
    ax.set_title(f"{cfg['name']}: optimisation, every target")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return plots.save(fig, out_dir / "loss.png")


def _controls(cfg, ds, pts, out_dir):
    """The Frobenius norm of each control against t, one panel per mode (the first target)."""
    plt = plots.pyplot()
    modes = list(pts)
    fig, axes = plt.subplots(1, len(modes), figsize=(4.2 * len(modes), 3.6), squeeze=False,
                             sharey=True)
    for ax, mode in zip(axes[0], modes):
        labels, sel = pts[mode]
        d = int(label_of(cfg, labels, "d"))
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
    return plots.save(fig, out_dir / "controls.png")


def _transfer(cfg, ds, out_dir):
    """W2 of the transferred controls against N and against L; None without a transferred point."""
    plt = plots.pyplot()
    tr_pts = [(labels, sel) for labels, sel in iter_points(ds)
              if np.any(np.isfinite(ds["particle_w2_bures"].isel(sel).values))]
    if not tr_pts:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    Ns = ds["n_particles"].values
    Ls = ds["layers"].values
    for i, (labels, sel) in enumerate(tr_pts):
        c = plt.get_cmap("tab10")(i)
        lab = f"{label_of(cfg, labels, 'mode')}, seed {label_of(cfg, labels, 'seed')}"
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
                label=rf"{lab}: RMS $|x_L - x(t_1)|$ (layers vs continuous)")
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
    return plots.save(fig, out_dir / "transfer.png")
