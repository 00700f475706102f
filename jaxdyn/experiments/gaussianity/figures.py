"""Kind ``gaussianity``: the per-layer figure.

Each metric per layer, one line per (model, scale): the mean over the seeds, shaded between
the seeds' smallest and largest values where there are several; grey, the exact-Gaussian noise
floor (mean ± 2 sd, averaged over the seeds).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import plots
from .schema import KEY_METRICS
from .summary import seeds, select


def plot(cfg, ds, out_dir):
    """Draw the ``gaussianity`` figures (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.plot`)."""
    plt = plots.pyplot()
    models = list(ds["model"].values) if "model" in ds.dims else [cfg["model"]]
    scales = list(ds["scale"].values) if "scale" in ds.dims else [cfg["scale"]]
    names = [n for n in KEY_METRICS if n in ds]
    seed_list = seeds(ds, cfg) if "seed" in ds.dims else [None]
    rows, cols = plots.grid_shape(len(names), max_cols=4)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.2 * rows + 0.6), squeeze=False,
                             layout="constrained")
    spare = list(axes.flat[len(names):])
    axes = list(axes.flat[:len(names)])
    styles = ["-", "--", ":", "-."]
    colors = {"pretrained": "C0", "random": "C1", "nongaussian": "C3"}
    for ax, name in zip(np.atleast_1d(axes), names):
        dim = ds[name].dims[-1]
        x = ds[dim].values
        for si, s in enumerate(scales):
            for m in models:
                runs = np.stack([select(ds, m, s, sd)[name].values for sd in seed_list])
                c = colors.get(str(m), "k")
                ax.plot(x, runs.mean(0), styles[si % 4], color=c, lw=1.4, label=f"{m}, s={s:g}")
                if len(seed_list) > 1:
                    ax.fill_between(x, runs.min(0), runs.max(0), color=c, alpha=0.15, lw=0)
            floor = [select(ds, models[0], s, sd) for sd in seed_list]
            fm = np.mean([d[name + "_floor_mean"].values for d in floor], axis=0)
            fs = np.mean([d[name + "_floor_std"].values for d in floor], axis=0)
            ax.fill_between(x, fm - 2 * fs, fm + 2 * fs, color="0.5", alpha=0.25 if si == 0 else 0.12,
                            lw=0)
        ax.set_title(name + (" (step l-1→l)" if dim == "step" else ""))
        ax.set_xlabel(dim)
        ax.grid(alpha=0.3)
        if name in ("kurt", "skew", "sw2", "kurt_pc", "radial_w2"):
            # log where every drawn value is positive (its minor ticks get labels on a short
            # range); symlog keeps zeros and negatives
            vals = np.concatenate([np.ravel(line.get_ydata()) for line in ax.get_lines()] or [[0.0]])
            if np.all(np.isfinite(vals) & (vals > 0)):
                ax.set_yscale("log")
            else:
                ax.set_yscale("symlog", linthresh=1e-2)
    from matplotlib.patches import Patch

    handles, labels = axes[0].get_legend_handles_labels()
    handles.append(Patch(color="0.5", alpha=0.25, lw=0))
    labels.append("exact-Gaussian noise floor ± 2 sd")
    if spare:  # the legend in the first spare cell, off the data
        spare[0].set_axis_off()
        spare[0].legend(handles, labels, fontsize=7, loc="center")
        for ax in spare[1:]:
            ax.remove()
    else:
        plots.legend_outside(axes[-1], handles=handles, labels=labels)
    over = f"; mean and range over {len(seed_list)} seeds" if len(seed_list) > 1 else ""
    fig.suptitle(f"{cfg['name']}: distance from the moment-matched Gaussian per layer "
                 f"(grey: exact-Gaussian noise floor ± 2 sd{over})")
    return [plots.save(fig, Path(out_dir) / "gaussianity.png")]
