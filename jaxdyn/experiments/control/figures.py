"""Kind ``control``: loss and W2 against iterations, W2 against depth, particles, control heat maps."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import plots
from .schema import MODEL_WEIGHTS, free_of, model_of
from .summary import depth_rate, depth_table, iter_points, layers_of, particles_of


def _deepest(cfg, ds):
    """(L, selection) of the point of largest (N, L) (its first seed)."""
    best = None
    for labels, sel in iter_points(ds):
        key = (particles_of(cfg, labels), layers_of(cfg, labels))
        if best is None or key > best[0]:
            best = (key, sel)
    return best[0][1], best[1]


def _loss_history(plt, cfg, ds, out_dir):
    """Figure 1: loss and W2 against iterations, one line a point.

    Returns:
        The saved figure's path.
    """
    cmap = plt.get_cmap("viridis")
    pts = list(iter_points(ds))
    Ls = sorted({layers_of(cfg, lab) for lab, _ in pts})
    ns = sorted({particles_of(cfg, lab) for lab, _ in pts})
    styles = ("-", "--", ":", "-.")  # one a swept N
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for lab, sel in pts:
        L = layers_of(cfg, lab)
        c = cmap(Ls.index(L) / max(len(Ls) - 1, 1))
        axes[0].semilogy(ds["loss_history"].isel(sel).values, color=c, lw=1, label=f"L = {L}",
                         ls=styles[ns.index(particles_of(cfg, lab)) % len(styles)])
        axes[1].semilogy(ds["w2_history"].isel(sel).values, color=c, lw=1)
    axes[0].set_ylabel("loss J")
    axes[1].set_ylabel(r"W2 ≈ sqrt($S_\varepsilon$)")
    for ax in axes:
        ax.set_xlabel("iteration (Adam, then L-BFGS)")
        ax.axvline(cfg["adam_steps"], color="0.6", ls=":", lw=0.8)
    handles, labels = axes[0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    axes[0].legend(uniq.values(), uniq.keys(), fontsize=7)
    fig.suptitle(f"{cfg['problem']}: optimisation")
    return plots.save(fig, out_dir / "loss_history.png")


def _w2_vs_depth(plt, cfg, ds, out_dir):
    """Figure 2: W2 (exact, Sinkhorn) against depth, one colour a swept N.

    Returns:
        The saved figure's path.
    """
    rows = depth_table(cfg, ds)
    ns = sorted({r["n_particles"] for r in rows})
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    slopes = []
    for i, n in enumerate(ns):
        rs = [r for r in rows if r["n_particles"] == n]
        c = plt.get_cmap("tab10")(i % 10)
        tag = f" N = {n}" if len(ns) > 1 else ""
        for key, mk in (("w2_exact", "o-"), ("w2_sinkhorn", "s--")):
            xs = [r["n_layers"] for r in rs if r[key]]
            if xs:
                ax.loglog(xs, [r[key] for r in rs if r[key]], mk, color=c, ms=4,
                          label=key.replace("_", " ") + tag)
        if rs[0]["w2_floor"]:
            ax.axhline(rs[0]["w2_floor"], color=c, ls="-.", lw=0.8,
                       label=r"W2($\nu_N$, $\nu'_N$) floor" + tag)
        slope = depth_rate(rs)
        if slope is not None:
            slopes.append(f"{slope:.2f}")
    if rows and rows[0]["w2_start"]:
        ax.axhline(rows[0]["w2_start"], color="0.5", ls=":", lw=0.8, label="start")
    ax.set_title(f"W2 against depth (slope {', '.join(slopes)})" if slopes
                 else "W2 against depth", fontsize=9)
    ax.set_xlabel("layers L")
    ax.set_ylabel("W2 to the target")
    ax.legend(fontsize=7)
    return plots.save(fig, out_dir / "w2_vs_depth.png")


def _particles_by_depth(plt, cfg, ds, out_dir, model):
    """Figure 3: the deepest point's particles at several depths, and the target.

    Returns:
        The saved figure's path.
    """
    cmap = plt.get_cmap("viridis")
    L, sel = _deepest(cfg, ds)
    parts = ds["particles"].isel(sel).values
    tgt = ds["target"].isel(sel).values
    depths = ds["depth"].values
    layer = ds["depth_layer"].isel(sel).values
    nd = len(depths)
    globe = model == "sphere" and parts.shape[-1] >= 3
    fig, axs = plots.panel_grid(nd + 1, max_cols=4, panel=(3.0, 3.0),
                                projection="3d" if globe else None)
    for j, ax in enumerate(axs):
        pts_j, title = (tgt, "target") if j == nd else (parts[j], f"layer {int(layer[j])} of {L}")
        color = "r" if j == nd else cmap(j / max(nd - 1, 1))
        if globe:
            ax.scatter(pts_j[:, 0], pts_j[:, 1], pts_j[:, 2], s=3, color=color)
            ax.set_box_aspect((1, 1, 1))
        else:
            ax.scatter(pts_j[:, 0], pts_j[:, 1], s=3, color=color)
            ax.set_aspect("equal", adjustable="datalim")
        ax.set_title(title, fontsize=8)
    fig.suptitle(f"particles by depth (L = {L}; colour: depth, red: the target)", fontsize=10)
    return plots.save(fig, out_dir / "particles_by_depth.png")


def _controls_heatmap(plt, cfg, ds, out_dir, model):
    """Figure 4: the deepest point's controls against depth, one heat map a free weight.

    Returns:
        The saved figure's path.
    """
    L, sel = _deepest(cfg, ds)
    names = [n for n in MODEL_WEIGHTS[model] if n in free_of(cfg)]
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.2), squeeze=False,
                             layout="constrained")
    for ax, name in zip(axes[0], names):
        v = ds[f"control_{name}"].isel(sel).values[:L].reshape(L, -1).T
        im = ax.imshow(v, aspect="auto", cmap="RdBu_r", vmin=-np.nanmax(np.abs(v)),
                       vmax=np.nanmax(np.abs(v)), interpolation="nearest")
        ax.set_title(name)
        ax.set_xlabel("layer")
        ax.set_ylabel("entry")
        fig.colorbar(im, ax=ax, fraction=0.05)
    fig.suptitle(f"controls against depth (L = {L})")
    return plots.save(fig, out_dir / "controls_heatmap.png")


def plot(cfg, ds, out_dir):
    """Draw the ``control`` figures (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.plot`)."""
    plt = plots.pyplot()
    out_dir = Path(out_dir)
    model, _ = model_of(cfg)
    return [_loss_history(plt, cfg, ds, out_dir), _w2_vs_depth(plt, cfg, ds, out_dir),
            _particles_by_depth(plt, cfg, ds, out_dir, model),
            _controls_heatmap(plt, cfg, ds, out_dir, model)]
