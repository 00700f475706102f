"""Experiment kind ``sphere``: attention dynamics on S^{d-1} across a β sweep.

Records, per grid point (β, seed, …): the mean pairwise inner product
``(1/(N(N−1))) Σ_{i≠j} ⟨x_i, x_j⟩ = (N|x̄|² − 1)/(N − 1)`` against t (1 when all particles
form one cluster); snapshots of the particles at a few times; and a per-point ``finite`` status.
Figures: particles on the sphere at those times for one β; mean inner product against t.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np

from .. import plots
from ..config import Field
from . import sphere_common as sc

SCHEMA = {
    **sc.SPHERE_FIELDS,
    "snapshots": Field("list", [0.0, 1.0, 3.0, 10.0], "times of particle snapshots (clipped to t1)",
                       item="float"),
    "figure_beta": Field("float", None, "β of the snapshot figure (default: the middle of the sweep)"),
}

BATCH_AXES = ("beta", "seed")


def check(cfg):
    return sc.check_sphere(cfg)


def estimate_bytes(pc):
    return sc.estimate_bytes(pc)


def output_bytes(pc):
    return sc.output_bytes(pc, per_frame_values=1, snapshots=len(pc["snapshots"]))


def _snapshot_index(pc):
    ts = sc.save_times(pc)
    want = [min(max(s, 0.0), ts[-1]) for s in pc["snapshots"]]
    return sorted({int(np.argmin(np.abs(ts - s))) for s in want})


def _frames(model, xs):
    """Per saved frame: the mean pairwise inner product (N|x̄|² − 1)/(N − 1), and the cloud.
    Module-level so that chunks share its compiled program."""
    n = xs.shape[1]
    xbar = jnp.mean(xs, axis=1)
    return ((n * jnp.sum(xbar * xbar, axis=-1) - 1.0) / max(n - 1, 1), xs)


def run_points(pcs):
    p0 = pcs[0]
    snap = np.asarray(_snapshot_index(p0))

    (ip, xs), finite = sc.integrate_chunk(pcs, _frames)
    ts = sc.save_times(p0)
    vars_ = {
        "mean_inner_product": (("t",), ip),
        "x_snapshot": (("t_snapshot", "particle", "component"), xs[:, snap]),
        "finite": ((), finite),
    }
    coords = {"t": ts, "t_snapshot": ts[snap]}
    return vars_, coords


def _per_beta(ds, var):
    """Reduce over every sweep axis but β (mean over seeds etc.)."""
    da = ds[var]
    other = [d for d in da.dims if d in ds.coords and d not in ("beta", "t", "t_snapshot",
                                                                  "particle", "component")]
    return da.mean(other) if other else da


def summarize(cfg, ds):
    ip = _per_beta(ds, "mean_inner_product")
    out = {}
    betas = ds["beta"].values if "beta" in ds.dims else [cfg["beta"]]
    t = ds["t"].values
    for i, b in enumerate(betas):
        row = ip.isel(beta=i).values if "beta" in ip.dims else ip.values
        above = np.flatnonzero(row >= 0.99)
        out[f"beta={b:g}"] = {
            "final_mean_inner_product": float(row[-1]),
            "time_to_mean_inner_product_0.99": float(t[above[0]]) if above.size else None,
        }
    return {"per_beta": out}


def plot(cfg, ds, out_dir):
    out_dir = Path(out_dir)
    figs = []
    betas = list(ds["beta"].values) if "beta" in ds.dims else [cfg["beta"]]
    fb = cfg["figure_beta"] if cfg["figure_beta"] is not None else betas[len(betas) // 2]
    bi = int(np.argmin(np.abs(np.asarray(betas) - fb)))
    sel = {d: 0 for d in ds["x_snapshot"].dims if d in ds.coords and d not in
           ("beta", "t_snapshot", "particle", "component")}
    if "beta" in ds["x_snapshot"].dims:
        sel["beta"] = bi
    xs = ds["x_snapshot"].isel(sel).values
    figs.append(plots.sphere_snapshots(xs, ds["t_snapshot"].values, out_dir / "particles.png",
                                       title=f"{cfg['name']}: particles at β = {betas[bi]:.3g}"))
    ip = _per_beta(ds, "mean_inner_product")
    curves = {f"β = {b:.3g}": (ip.isel(beta=i).values if "beta" in ip.dims else ip.values)
              for i, b in enumerate(betas)}
    figs.append(plots.curves(ds["t"].values, curves, out_dir / "mean_inner_product.png",
                             xlabel="t (depth)", ylabel="mean pairwise ⟨x_i, x_j⟩",
                             title=f"{cfg['name']}: clustering against time"))
    return figs
