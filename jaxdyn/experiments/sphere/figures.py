"""Kind ``sphere``: figures and the particle movie.

Particles on the sphere, mean inner product against t, the β × t heat maps of the cluster
statistics.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from ... import plots
from .summary import per_beta


def _snapshots(cfg, ds):
    """(betas, index of figure_beta, snapshots there at the first value of the other axes)."""
    betas = list(ds["beta"].values) if "beta" in ds.dims else [cfg["beta"]]
    fb = cfg["figure_beta"] if cfg["figure_beta"] is not None else betas[len(betas) // 2]
    bi = int(np.argmin(np.abs(np.asarray(betas) - fb)))
    sel = {d: 0 for d in ds["x_snapshot"].dims if d in ds.coords and d not in
           ("beta", "t_snapshot", "particle", "component")}
    if "beta" in ds["x_snapshot"].dims:
        sel["beta"] = bi
    return betas, bi, ds["x_snapshot"].isel(sel).values


def plot(cfg, ds, out_dir):
    """Draw the ``sphere`` figures (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.plot`)."""
    out_dir = Path(out_dir)
    figs = []
    betas, bi, xs = _snapshots(cfg, ds)
    figs.append(plots.sphere_snapshots(xs, ds["t_snapshot"].values, out_dir / "particles.png",
                                       title=f"{cfg['name']}: particles at β = {betas[bi]:.3g}"))
    ip = per_beta(ds, "mean_inner_product")
    curves = {f"β = {b:.3g}": (ip.isel(beta=i).values if "beta" in ip.dims else ip.values)
              for i, b in enumerate(betas)}
    figs.append(plots.curves(ds["t"].values, curves, out_dir / "mean_inner_product.png",
                             xlabel="t (depth)", ylabel=r"mean pairwise $\langle x_i, x_j\rangle$",
                             title=f"{cfg['name']}: clustering against time"))
    if "pair_fraction" in ds and "beta" in ds.dims and ds.sizes["beta"] > 1:
        pf = per_beta(ds, "pair_fraction")
        cc = per_beta(ds, "cluster_count")
        figs.append(plots.heatmaps(
            ds["t"].values, np.asarray(betas),
            {rf"fraction of pairs with $\langle x_i, x_j\rangle$ > {cfg['pair_threshold']:g}":
                 pf.transpose("beta", "t").values,
             f"mean cluster count (components, δ = {cfg['cluster_delta']:g})":
                 cc.transpose("beta", "t").values},
            out_dir / "phase_diagram.png", xlabel="t (depth)", ylabel="β", log_panels=(1,),
            title=f"{cfg['name']}: β × t phase diagram (mean over the other sweep axes)"))
    if "cluster_count" in ds and variant_axes(ds):
        figs.append(variants_figure(cfg, ds, out_dir / "variants_cluster_count.png"))
    return figs


#: sweep axes of the attention variants, drawn as curves of one panel per β
VARIANT_AXES = ("heads", "mask", "positions", "attention")


def variant_axes(ds):
    """The attention-variant sweep axes of the Dataset."""
    return [a for a in VARIANT_AXES if a in ds.dims]


def variant_curves(ds, var="cluster_count"):
    """``var`` for every combination of the variant sweep axes, per β.

    Averaged over the remaining axes (seeds).

    Args:
      ds: the merged Dataset.
      var: the variable.

    Returns:
      ``{β: {label: values against t}}``.
    """
    axes = variant_axes(ds)
    betas = list(ds["beta"].values) if "beta" in ds.dims else [None]
    out = {}
    for b in betas:
        da = ds[var] if b is None else ds[var].sel(beta=b)
        curves = {}
        for combo in itertools.product(*(list(ds[a].values) for a in axes)):
            sel = da.sel(dict(zip(axes, combo)))
            rest = [d for d in sel.dims if d != "t"]
            label = ", ".join(f"{a} {v}" for a, v in zip(axes, combo))
            curves[label] = (sel.mean(rest) if rest else sel).values
        out[b] = curves
    return out


def variants_figure(cfg, ds, path):
    """Mean cluster count against depth, one panel per β, one curve per variant combination.

    The combinations of the variant axes (heads, mask, positions, attention): solid for full
    attention, dashed for a causal mask.

    Args:
      cfg: the resolved config.
      ds: the merged Dataset.
      path: the PNG to write.

    Returns:
      The path written.
    """
    plt = plots.pyplot()
    per_beta_curves = variant_curves(ds)
    t = ds["t"].values
    fig, axs = plt.subplots(1, len(per_beta_curves), figsize=(4.2 * len(per_beta_curves), 3.6),
                            squeeze=False, sharey=True, layout="constrained")
    for ax, (b, curves) in zip(axs[0], per_beta_curves.items()):
        labels = list(curves)
        full = [lab for lab in labels if "mask causal" not in lab]
        colors = {lab: f"C{i}" for i, lab in enumerate(full)}
        for lab in labels:
            base = lab.replace("mask causal", "mask none")
            ax.plot(t, curves[lab], color=colors.get(base, colors.get(lab, "k")),
                    ls="--" if "mask causal" in lab else "-", lw=1.5, label=lab)
        ax.set_yscale("log")
        ax.set_xlabel("t (depth)")
        ax.set_title("" if b is None else f"β = {b:g}", fontsize=10)
        ax.grid(alpha=0.3)
    axs[0][0].set_ylabel(f"mean cluster count (δ = {cfg['cluster_delta']:g})")
    plots.legend_outside(axs[0][-1])
    fig.suptitle(f"{cfg['name']}: clusters against depth", fontsize=11)
    return plots.save(fig, path)


def movie(cfg, ds, out_dir, fmt="gif"):
    """An animation of the saved snapshots at ``figure_beta`` and the first value of every other axis.

    S¹ as a circle, S² as a sphere.

    Args:
      cfg: the resolved config.
      ds: the merged Dataset.
      out_dir: the run folder.
      fmt: ``gif`` or ``mp4``.

    Returns:
      The path written.
    """
    betas, bi, xs = _snapshots(cfg, ds)
    return plots.particle_movie(xs, ds["t_snapshot"].values, Path(out_dir) / f"movie.{fmt}",
                                title=f"β = {betas[bi]:.3g}")
