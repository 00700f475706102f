"""Kind ``pde``: figures.

ρ(θ, t) space–time images across β, growth rates against the formula, first cluster count
against k*, particles against the density.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import plots
from .summary import grid_points



def _style(ax, xlabel, ylabel, title=None):
    """Axis labels, an optional small title, a light grid and a small legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _label(lab, cfg=None):
    text = ", ".join(f"{'β' if k == 'beta' else 'σ' if k == 'sigma' else k} = {v:g}" for k, v in lab.items())
    return text or (f"β = {cfg['beta']:g}" if cfg else "")


def _plot_s2(cfg, ds, out_dir, plt):
    """S²: the density against the kernel density of the largest cloud, and W2 against its null level.

    Lat–lon maps at the compared times; W2 of the particles to ρ(t) against the null level of two
    samples.

    Returns:
      The figure paths.
    """
    lab, d = grid_points(ds)[0]
    tc = np.asarray(ds["t_compare"].values)
    lon, lat = np.asarray(ds["lon"].values), np.asarray(ds["lat"].values)
    ns = np.asarray(ds["n"].values, float)
    figs = []
    fig, axes = plt.subplots(2, len(tc), figsize=(3.0 * len(tc) + 1.2, 5.6), squeeze=False,
                             sharex=True, sharey=True, layout="constrained")
    top = 4 * np.pi * max(float(np.asarray(d["rho_compare"].values).max()),
                          float(np.asarray(d["kde_compare"].values).max()))
    for j, t in enumerate(tc):
        for row, (name, what) in enumerate((("rho_compare", "density"), ("kde_compare", f"KDE, N = {int(ns.max())}"))):
            ax = axes[row][j]
            im = ax.pcolormesh(np.degrees(lon), 90 - np.degrees(lat), 4 * np.pi * np.asarray(d[name].values)[j],
                               vmin=0, vmax=top, shading="auto", cmap="magma", rasterized=True)
            ax.set_title(f"{what}, t = {t:g}", fontsize=9)
            ax.set_xlabel("longitude (°)" if row else "")
            ax.set_xticks([0, 90, 180, 270, 360])
            ax.set_yticks([-90, -45, 0, 45, 90])
            if j == 0:
                ax.set_ylabel("latitude (°)")
    fig.get_layout_engine().set(wspace=0.09)  # one panel's "360" and the next one's "0" apart
    fig.colorbar(im, ax=axes.ravel().tolist(), label="4π ρ", shrink=0.8)
    figs.append(plots.save(fig, out_dir / "s2_density_vs_kde.png"))
    fig, ax = plt.subplots(figsize=(5.4, 4.0))
    for j, t in enumerate(tc):
        ax.errorbar(ns, np.asarray(d["w2_particles"].values)[:, j], yerr=np.asarray(d["w2_particles_sem"].values)[:, j],
                    fmt="o-", color=f"C{j}", ms=4, capsize=2, label=f"particles vs ρ(t), t = {t:g}")
        ax.errorbar(ns, np.asarray(d["w2_null"].values)[:, j], yerr=np.asarray(d["w2_null_sem"].values)[:, j],
                    fmt="s--", color=f"C{j}", ms=3, mfc="none", capsize=2, label=f"two samples of ρ(t), t = {t:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _style(ax, "particles N", "W2 (exact assignment)",
           f"S², β = {cfg['beta']:g}, {cfg['n_lat']}×{2 * cfg['n_lat']} cells")
    figs.append(plots.save(fig, out_dir / "s2_w2.png"))
    return figs


def _plot_k_star_particles(cfg, ds, pts, out_dir, plt):
    """Clusters with particles: β against k*, the solver's and the particles' first clusters.

    The solver's first cluster count, and each particle start's first cluster count and dominant
    mode (small horizontal offsets keep markers apart).

    Returns:
      The figure path.
    """
    starts = list(cfg["particles"]["starts"])
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    bs = np.array([lab.get("beta", cfg["beta"]) for lab, _ in pts])
    kst = np.array([int(d["k_star"]) for _, d in pts])
    order = np.argsort(bs)
    bb = np.geomspace(bs.min(), bs.max(), 100)
    ax.plot(bs[order], kst[order], "k-", lw=1, label=r"$k^* = \arg\max_k\, k^2 I_k(\beta)/I_0(\beta)$")
    ax.plot(bb, np.sqrt(2 * bb), ":", color="0.4", label="√(2β)")
    ax.plot(bs * 0.94, [int(d["first_cluster_count"]) for _, d in pts], "o", mfc="none", color="C0",
            label="solver: first cluster count (each seed)")
    marks = {"quantile": ("s", "D"), "iid": ("^", "v")}
    for i, st in enumerate(starts):
        c = np.array([float(np.asarray(d["p_first_cluster_count"].values)[i]) for _, d in pts])
        k = np.array([float(np.asarray(d["p_first_mode"].values)[i]) for _, d in pts])
        ran = np.isfinite(np.array([float(np.asarray(d["p_seconds"].values)[i]) for _, d in pts]))
        fc, fk = marks.get(st, ("s", "D"))
        ax.plot(bs[ran] * (1.0 + 0.06 * i), c[ran], fc, ms=5, mfc="none", color=f"C{1 + 2 * i}",
                label=f"particles ({st} start): first cluster count")
        ax.plot(bs[ran] * (1.03 + 0.06 * i), k[ran], fk, ms=3, color=f"C{2 + 2 * i}",
                label=f"particles ({st} start): dominant mode")
    plots.log_value_ticks(ax, bs)
    _style(ax, "β", "clusters / mode",
           f"first clusters from a near-uniform start: solver (M = {cfg['m']}) and "
           f"N = {cfg['particles']['cluster_n']:,} particles")
    return plots.save(fig, out_dir / "k_star_particles.png")


def _shown(cfg, pts):
    """One point per β (the first seed / σ), among ``figure_betas`` if set: the space–time images'."""
    seen, show = set(), []
    for lab, d in pts:
        b = lab.get("beta", cfg["beta"])
        if b in seen or (cfg["figure_betas"] and not any(abs(b - fb) < 1e-9 for fb in cfg["figure_betas"])):
            continue
        seen.add(b)
        show.append((lab, d))
    return show


def _plot_spacetime(cfg, ds, show, out_dir, plt):
    """ρ(θ, t) of each shown point, one panel each."""
    from matplotlib.colors import LogNorm

    theta = np.asarray(ds["theta"].values)
    t = np.asarray(ds["t"].values)
    rows, cols = plots.grid_shape(len(show), max_cols=4)
    fig, axes = plt.subplots(rows, cols, figsize=(2.9 * cols + 1.3, 3.4 * rows + 0.5), squeeze=False,
                             sharey=True, layout="constrained")
    used = list(axes.flat[:len(show)])
    for ax in axes.flat[len(show):]:
        ax.remove()
    for j, (ax, (lab, d)) in enumerate(zip(used, show)):
        rho = np.asarray(d["rho"].values) * 2 * np.pi
        im = ax.pcolormesh(theta, t, np.maximum(rho, 1e-3), norm=LogNorm(1e-3, max(rho.max(), 10)),
                           shading="auto", cmap="magma", rasterized=True)
        ax.set_title(_label({k: v for k, v in lab.items() if k != "seed"}, cfg) +
                     f"\nk* = {int(d['k_star'])}, first clusters: {int(d['first_cluster_count'])}", fontsize=9)
        ax.set_xticks([0, np.pi, 2 * np.pi], ["0", "π", "2π"])
        ax.set_xlabel("θ")
        if j % cols == 0:
            ax.set_ylabel("t")
    fig.get_layout_engine().set(wspace=0.06)  # θ's "2π" and the next panel's "0" apart
    fig.colorbar(im, ax=used, label="2π ρ(θ, t)", shrink=0.8)
    fig.suptitle(f"{cfg['name']}: the density ρ(θ, t) on S¹ ({cfg['mode']})", fontsize=10)
    return plots.save(fig, out_dir / "spacetime.png")


def _plot_growth(cfg, ds, show, out_dir, plt):
    """The solver's growth rates (circles) against the formula (lines)."""
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    ks = np.asarray(ds["k"].values)
    for i, (lab, d) in enumerate(show):
        th, g = np.asarray(d["growth_theory"].values), np.asarray(d["growth_measured"].values)
        ax.plot(ks, th, "-", color=f"C{i}", lw=1.2, label=_label({k: v for k, v in lab.items() if k != "seed"}, cfg))
        ax.plot(ks, g, "o", color=f"C{i}", ms=4, mfc="none")
    _style(ax, "mode k", r"growth rate $\lambda_k$",
           r"solver (circles) against $(k^2/\beta)\, I_k(\beta)/I_0(\beta) - \sigma^2 k^2/2$ (lines)")
    return plots.save(fig, out_dir / "growth_rates.png")


def _plot_cluster_counts(cfg, ds, pts, show, out_dir, plt):
    """First cluster count against k* and √(2β), and the count against t of each shown point."""
    t = np.asarray(ds["t"].values)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    bs = np.array([lab.get("beta", cfg["beta"]) for lab, _ in pts])
    counts = np.array([int(d["first_cluster_count"]) for _, d in pts])
    kst = np.array([int(d["k_star"]) for _, d in pts])
    jitter = np.linspace(-0.04, 0.04, max(1, len(pts)))[np.arange(len(pts)) % max(1, len(pts))]
    a1.plot(bs * (1 + 0 * jitter), counts, "o", mfc="none", label="first clusters (solver, each seed)")
    order = np.argsort(bs)
    a1.plot(bs[order], kst[order], "k-", lw=1, label=r"$k^* = \arg\max_k\, k^2 I_k/I_0$")
    bb = np.geomspace(bs.min(), bs.max(), 100)
    a1.plot(bb, np.sqrt(2 * bb), ":", color="0.4", label="√(2β)")
    plots.log_value_ticks(a1, bs)
    _style(a1, "β", "clusters")
    for i, (lab, d) in enumerate(show):
        a2.step(t, np.asarray(d["cluster_count"].values), where="post", color=f"C{i}",
                label=_label({k: v for k, v in lab.items() if k != "seed"}, cfg))
    _style(a2, "t", "cluster count (0: not yet broken up)", "clusters appear, then merge")
    plots.legend_outside(a2)  # the counts' steps fill the panel
    return plots.save(fig, out_dir / "cluster_counts.png")


def _plot_particles_vs_density(ds, pts, out_dir, plt):
    """W1(particles, ρ(t)) against N, and the density against the particles' kernel density."""
    theta = np.asarray(ds["theta"].values)
    lab, d = pts[0]
    ns = np.asarray(ds["n"].values, float)
    tc = np.asarray(ds["t_compare"].values)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.5, 3.9))
    for j, tt in enumerate(tc):
        w = np.asarray(d["w1"].values)[:, j]
        e = np.asarray(d["w1_sem"].values)[:, j]
        slope = np.polyfit(np.log(ns), np.log(w), 1)[0]
        a1.errorbar(ns, w, yerr=e, fmt="o-", ms=4, capsize=2, label=f"t = {tt:g} (slope {slope:.2f})")
    a1.plot(ns, np.asarray(d["w1"].values)[0, 0] * np.sqrt(ns[0] / ns), "k:", label="N^{-1/2}")
    a1.set_xscale("log")
    a1.set_yscale("log")
    a1.set_xlabel("particles N")
    a1.set_ylabel("W1(particles, ρ(t)) on S¹")
    a1.legend(fontsize=7)
    a1.grid(alpha=0.3, which="both")
    for j, tt in enumerate(tc):
        a2.plot(theta, np.asarray(d["rho_compare"].values)[j] * 2 * np.pi, "-", color=f"C{j}", lw=1.2,
                label=f"density, t = {tt:g}")
        a2.plot(theta, np.asarray(d["kde_compare"].values)[j] * 2 * np.pi, "--", color=f"C{j}", lw=0.9)
    a2.set_yscale("log")
    a2.set_ylim(1e-2, None)
    a2.set_xlabel("θ")
    a2.set_ylabel("2π ρ")
    a2.set_title(f"density (solid) vs kernel density of N = {int(ns.max())} particles (dashed)",
                 fontsize=9)
    a2.legend(fontsize=7)
    return plots.save(fig, out_dir / "particles_vs_density.png")


def plot(cfg, ds, out_dir):
    """Draw the ``pde`` figures (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.plot`)."""
    plt = plots.pyplot()
    if cfg["mode"] == "s2":
        return _plot_s2(cfg, ds, Path(out_dir), plt)
    out_dir = Path(out_dir)
    pts = grid_points(ds)
    show = _shown(cfg, pts)
    figs = [_plot_spacetime(cfg, ds, show, out_dir, plt), _plot_growth(cfg, ds, show, out_dir, plt)]
    if cfg["mode"] == "clusters":
        figs.append(_plot_cluster_counts(cfg, ds, pts, show, out_dir, plt))
    if cfg["mode"] == "clusters" and "start" in ds.dims:
        figs.append(_plot_k_star_particles(cfg, ds, pts, out_dir, plt))
    if "w1" in ds:
        figs.append(_plot_particles_vs_density(ds, pts, out_dir, plt))
    return figs
