"""Kind ``long_context``: figures, each measurement beside the prediction it tests.

collapse: the largest weight and the entropy against c = β/n^{2/(d−1)} (median and quartiles
over queries and seeds, one line per n) beside the Poisson limit law's median and quartiles;
the regimes shaded where the limit's median largest weight is below 0.05 (spread) or above 0.95
(nearest key). phase: λ against γ/γ_c per ρ (mean and seed range, one line per n) beside the
exactly equiangular closed form, and the width of the transition against n. dynamics: the
first cluster count against the most unstable mode and the first-cluster time against 1/λ*
(count: all adds the count over its prediction and the fraction the clusters hold against λ* t).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import plots
from ...long_context_host import critical_gamma, first_cluster_count, poisson_limit_weights
from .summary import axis_values, factor_values, select, phase_table


def _limit_band(cs, d, samples):
    q = np.array([np.quantile(poisson_limit_weights(float(c), int(d), samples=samples, k=1)[i]
                              .ravel(), [0.25, 0.5, 0.75]) for c in cs for i in (0, 1)])
    return q[0::2], q[1::2]  # (C, 3) largest weight, entropy


def collapse_figure(cfg, ds, path):
    """Largest weight and entropy against c per d, the limit law's band beside."""
    plt = plots.pyplot()
    dims, cs, ns = axis_values(ds, "d", cfg), factor_values(cfg, ds, "c"), axis_values(ds, "n", cfg)
    fig, axes = plt.subplots(2, len(dims), figsize=(4.2 * len(dims), 7), squeeze=False)
    for di, d in enumerate(dims):
        lw, lh = _limit_band(cs, d, cfg["limit_samples"])
        for row, (var, lim) in enumerate((("max_weight", lw), ("entropy", lh))):
            ax = axes[row, di]
            ax.fill_between(cs, lim[:, 0], lim[:, 2], color="0.8", label="Poisson limit (quartiles)")
            ax.plot(cs, lim[:, 1], "k--", label="Poisson limit (median)")
            for ni, n in enumerate(ns):
                q = np.array([np.quantile(select(ds[var], d=di, n=ni, c=ci).values.ravel(),
                                          [0.25, 0.5, 0.75]) for ci in range(len(cs))])
                ax.errorbar(cs, q[:, 1], yerr=[q[:, 1] - q[:, 0], q[:, 2] - q[:, 1]], marker="o",
                            ms=3, capsize=2, label=f"n = {n:.0e}")
            sub = cs[lw[:, 1] < 0.05]
            sup = cs[lw[:, 1] > 0.95]
            if sub.size:
                ax.axvspan(cs[0], sub.max(), color="tab:blue", alpha=0.08)
            if sup.size:
                ax.axvspan(sup.min(), cs[-1], color="tab:red", alpha=0.08)
            ax.set_xscale("log")
            ax.set_xlabel(r"$c = \beta / n^{2/(d-1)}$")
            ax.set_ylabel("largest weight" if row == 0 else "entropy")
            ax.set_title(f"d = {d} (S^{d - 1})" if row == 0 else "")
        axes[0, di].legend(fontsize=7)
    fig.suptitle(f"{cfg['name']}: data collapse at β = c n^(2/(d−1)) (shaded: limit median "
                 f"< 0.05 spread, > 0.95 nearest key)", fontsize=9)
    return plots.save(fig, path)


def phase_figure(cfg, ds, path):
    """λ against γ/γ_c per ρ, the closed form beside; the transition width against n."""
    plt = plots.pyplot()
    rhos, ns, gam = axis_values(ds, "rho", cfg), axis_values(ds, "n", cfg), factor_values(cfg, ds, "gamma")
    fig, axes = plt.subplots(1, len(rhos) + 1, figsize=(3.8 * (len(rhos) + 1), 3.6), squeeze=False)
    for ri, rho in enumerate(rhos):
        ax, gc = axes[0, ri], float(critical_gamma(rho))
        for ni, n in enumerate(ns):
            lam = select(ds["angle_ratio"], n=ni, rho=ri)
            ex = select(ds["angle_ratio_equiangular"], n=ni, rho=ri)
            lo, mid, hi = ((lam.min("seed"), lam.mean("seed"), lam.max("seed"))
                           if "seed" in lam.dims else (lam, lam, lam))
            line = ax.plot(gam / gc, mid.values, marker="o", ms=3, label=f"n = {n}")[0]
            ax.fill_between(gam / gc, lo.values, hi.values, color=line.get_color(), alpha=0.2)
            exv = ex.isel(seed=0).values if "seed" in ex.dims else ex.values
            ax.plot(gam / gc, exv, ":", color=line.get_color())
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel(r"$\gamma / \gamma_c$,  $\gamma_c = 1/(1-\rho)$")
        ax.set_ylabel(r"angle ratio $\lambda$")
        ax.set_title(f"ρ = {rho:g} (dotted: exactly equiangular)", fontsize=8)
    axes[0, 0].legend(fontsize=7)
    table = phase_table(cfg, ds)
    ax = axes[0, -1]
    for rho in rhos:
        w = [table[f"n={n},rho={rho:g}"]["width_10_90"] for n in ns]
        ax.plot(ns, [np.nan if v is None else v / float(critical_gamma(rho)) for v in w],
                marker="o", label=f"ρ = {rho:g}")
    ax.set_xscale("log")
    ax.set_xlabel("n")
    ax.set_ylabel(r"width of $0.1<\lambda<0.9$ in $\gamma/\gamma_c$")
    ax.legend(fontsize=7)
    fig.suptitle(f"{cfg['name']}: one layer at β = γ log n (seed range shaded)", fontsize=9)
    return plots.save(fig, path)


def dynamics_figure(cfg, ds, path):
    """First cluster count against k* (l*) beside its prediction; first time × λ* against n.

    Returns:
      The figure's path.
    """
    plt = plots.pyplot()
    every = cfg["count"] == "all"
    fig, axes = plt.subplots(1, 3 if every else 2, figsize=(13.5 if every else 9, 3.8))
    ns = np.asarray(axis_values(ds, "n", cfg), float)
    for di, d in enumerate(axis_values(ds, "d", cfg)):
        sel = {"d": di}
        k = select(ds["mode_star"], **sel).values
        cnt = select(ds["first_count"], **sel).values
        dots = axes[0].scatter(k.ravel(), cnt.ravel(), s=12, label=f"S^{d - 1} (each seed)")
        modes = np.arange(1, int(np.nanmax(k)) + 1)
        axes[0].plot(modes, [first_cluster_count(d, m) for m in modes], "--", lw=0.8,
                     color=dots.get_facecolor()[0],
                     label="k* (S¹)" if d == 2 else "l(l+1)/(2√3) (S², random harmonic's maxima)")
        scaled = select(ds["first_time"] * ds["rate_star"], **sel)
        n_of = (scaled["n"].broadcast_like(scaled).values if "n" in scaled.dims
                else np.full(scaled.shape, ns[0]))
        axes[1].scatter(n_of.ravel(), scaled.values.ravel(), s=12, label=f"S^{d - 1}")
    if every:
        _count_in_time(cfg, ds, axes[2])
        axes[0].set_xscale("log")
        axes[0].set_yscale("log")
    axes[0].set_xlabel("most unstable mode k* (S¹) / degree l* (S²) at the same β")
    axes[0].set_ylabel("clusters that form first")
    axes[1].set_xscale("log")
    axes[1].set_ylim(0, 1.15 * axes[1].get_ylim()[1])
    axes[1].set_xlabel("n")
    axes[1].set_ylabel(r"time of the first clusters $\times \lambda^*$")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle(f"{cfg['name']}: dynamics at β = c n^(2/(d−1)) (dashed: predicted count)",
                 fontsize=9)
    return plots.save(fig, path)


def _count_in_time(cfg, ds, ax):
    """count: all — count / predicted count and the fraction held, against λ* t.

    Solid: the count over the predicted count; dotted: the fraction of the particles the
    counted clusters hold; one colour per n, every seed.
    """
    ns = axis_values(ds, "n", cfg)
    for di, d in enumerate(axis_values(ds, "d", cfg)):
        for ni, n in enumerate(ns):
            sel = {"d": di, "n": ni}
            k = int(select(ds["mode_star"], **sel).values.ravel()[0])
            rate = float(select(ds["rate_star"], **sel).values.ravel()[0])
            pred = first_cluster_count(int(d), k)
            cnt = select(ds["cluster_count"], **sel).values.reshape(-1, ds.sizes["t"])
            held = select(ds["clustered_fraction"], **sel).values.reshape(-1, ds.sizes["t"])
            x = ds["t"].values * rate
            color = f"C{ni}"
            for s, (c, h) in enumerate(zip(cnt, held)):
                c = np.where(c > 0, c / pred, np.nan)
                ax.plot(x, c, color=color, lw=1, label=f"n = {n:.0e}" if s == 0 else None)
                ax.plot(x, h, ":", color=color, lw=1)
    ax.axhline(1.0, color="k", lw=0.6)
    ax.axhline(cfg["formed_fraction"], color="0.5", lw=0.6, ls="--")
    ax.set_xlabel(r"$\lambda^* t$")
    ax.set_ylabel("count / predicted (solid), fraction held (dotted)")


def plot(cfg, ds, out_dir):
    """Draw the ``long_context`` figures (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.plot`)."""
    out_dir = Path(out_dir)
    fn = {"collapse": collapse_figure, "phase": phase_figure, "dynamics": dynamics_figure}
    path = out_dir / f"long_context_{cfg['study']}.png"
    fn[cfg["study"]](cfg, ds, path)
    return [path]
