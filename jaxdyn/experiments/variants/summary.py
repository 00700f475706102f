"""Kind ``variants``: the summary (time to a single cluster per point, final radius)."""

from __future__ import annotations

import numpy as np


def _label(ds, idx):
    return ",".join(f"{a}={ds[a].values[i]}" for a, i in idx.items())


def points(ds):
    """(label, index dict) for every grid point, in grid order."""
    axes = [a for a in ds["mean_inner_product"].dims if a != "t"]
    out = []
    for flat in np.ndindex(*[ds.sizes[a] for a in axes]):
        idx = dict(zip(axes, flat))
        out.append((_label(ds, idx) if axes else "run", idx))
    return out


def time_to_single_cluster(t, ip, threshold):
    """First saved time with mean inner product >= threshold (None if never)."""
    above = np.flatnonzero(np.asarray(ip) >= threshold)
    return round(float(t[above[0]]), 9) if above.size else None


def summarize(cfg, ds):
    """The ``variants`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`)."""
    t = ds["t"].values
    thr = cfg["single_cluster_ip"]
    out = {}
    for label, idx in points(ds):
        ip = ds["mean_inner_product"].isel(idx).values
        rad = ds["mean_radius"].isel(idx).values
        out[label] = {
            "final_mean_inner_product": float(ip[-1]),
            f"time_to_single_cluster (ip >= {thr:g})": time_to_single_cluster(t, ip, thr),
            "final_mean_radius": float(rad[-1]),
        }
    res = {"per_point": out}
    table = sigma_table(cfg, ds)
    if table is not None:
        res["per_beta_sigma"] = table
    return res


def sigma_table(cfg, ds):
    """Per (β, σ): the fraction of the other points reaching a single cluster by t1, and the median time.

    The other points are the seeds etc.; a point that never reaches it counts as t1 + ∞, so the
    median is None when half or more never reach it.

    Args:
      cfg: the resolved config.
      ds: the merged Dataset.

    Returns:
      The table.
    """
    if "sigma" not in ds.dims:
        return None
    t = ds["t"].values
    thr = cfg["single_cluster_ip"]
    ip = ds["mean_inner_product"]
    if "beta" not in ip.dims:
        ip = ip.expand_dims(beta=[cfg["beta"]])
    other = [d for d in ip.dims if d not in ("beta", "sigma", "t")]
    stacked = ip.stack(member=other) if other else ip.expand_dims(member=[0])
    out = {}
    for bi, b in enumerate(ip["beta"].values):
        for si, s in enumerate(ip["sigma"].values):
            rows = stacked.isel(beta=bi, sigma=si).transpose("member", "t").values
            times = [time_to_single_cluster(t, r, thr) for r in rows]
            hit = sorted(v for v in times if v is not None)
            tt = np.array([np.inf if v is None else v for v in times])
            med = float(np.median(tt))
            out[f"beta={b:g},sigma={s:g}"] = {
                "fraction_reaching_single_cluster": len(hit) / len(times),
                "median_time_to_single_cluster": med if np.isfinite(med) else None,
            }
    return out


# ---------------------------------------------------------------- the guides' numbers
# (renderers of docs/results/variants/*.json, :mod:`jaxdyn.experiments.guide_numbers`)



def _coord(v):
    try:
        return float(v)
    except ValueError:
        return v


def guide_points(res) -> list:
    """The grid points of a recorded run: (coordinates, results) per point, in grid order."""
    out = []
    for label, r in res["results"]["per_point"].items():
        coords = {} if label == "run" else dict(p.split("=", 1) for p in label.split(","))
        out.append(({k: _coord(v) for k, v in coords.items()}, r))
    return out


def _time_key(r) -> str:
    return next(k for k in r if k.startswith("time_to_single_cluster"))


def _select(res, **where) -> list:
    """The results of the points whose coordinates match ``where`` (all seeds)."""
    return [r for c, r in guide_points(res) if all(c.get(k) == v for k, v in where.items())]


def _times(res, **where) -> list:
    return [r[_time_key(r)] for r in _select(res, **where)]


def _threshold(res) -> str:
    r = guide_points(res)[0][1]
    return _time_key(r).split(">=")[1].strip(" )")


def _seed_count(res) -> int:
    return len({c.get("seed") for c, _ in guide_points(res)})


def guide_time_cell(times) -> str:
    """The times to a single cluster of one point's seeds (None: never).

    Returns:
      The mean (range) over the seeds that reach it, with how many do ("never [0 of n]" where
      none does).
    """
    from ..guide_numbers import num

    n = len(times)
    hit = [t for t in times if t is not None]
    if not hit:
        return f"never [0 of {n}]"
    text = num(sum(hit) / len(hit), 2) if len(hit) > 1 else f"{hit[0]:g}"
    if len(hit) > 1:  # the times are saved times: the range as they are
        text += f" ({min(hit):g}–{max(hit):g})"
    return text + f" [{len(hit)} of {n}]"


def guide_run(res) -> str:
    """The run's cost: its seeds, CPU seconds where measured, wall seconds, the machine."""
    from ..guide_numbers import run_cost

    return f"{_seed_count(res)} seeds; {run_cost(res['meta'])}"


def guide_sigma_table(res) -> str:
    """The σ × β table of the times to a single cluster (mean (range) over the seeds reaching it)."""
    pts = guide_points(res)
    betas = sorted({c["beta"] for c, _ in pts})
    sigmas = sorted({c["sigma"] for c, _ in pts})
    lines = ["| σ | " + " | ".join(f"{s:g}" for s in sigmas) + " |",
             "|---" * (len(sigmas) + 1) + "|"]
    for b in betas:
        lines.append(f"| β = {b:g} | "
                     + " | ".join(guide_time_cell(_times(res, beta=b, sigma=s)) for s in sigmas)
                     + " |")
    return "\n".join(lines)


def guide_threshold(res) -> str:
    """The mean inner product that counts as a single cluster."""
    return _threshold(res)


#: the placements' names in the guides
NORM_NAMES = {"postln": "post-LN", "periln": "peri-LN", "ngpt": "nGPT", "preln": "pre-LN"}


def guide_norm_times(beta):
    """Per placement at ``beta``: the time to a single cluster over the seeds."""
    def render(res):
        norms = [c["norm"] for c, _ in guide_points(res) if c.get("beta") == beta]
        order = [m for m in NORM_NAMES if m in norms] + sorted(set(norms) - set(NORM_NAMES))
        return ", ".join(f"{guide_time_cell(_times(res, beta=beta, norm=m))} "
                         f"({NORM_NAMES.get(m, m)})" for m in order)
    return render


def guide_norm_radius(beta, norms=("preln", "periln")):
    """The final mean radius of the placements in R^d at ``beta``, over the seeds."""
    def render(res):
        from ..guide_numbers import spread

        return " and ".join(
            f"{spread([r['final_mean_radius'] for r in _select(res, beta=beta, norm=m)])} "
            f"({NORM_NAMES.get(m, m)})" for m in norms)
    return render


def guide_final_ip_range(**where):
    """The final mean inner products of the points matching ``where`` (all seeds).

    Returns:
      A renderer: their range, and how many reached a single cluster.
    """
    def render(res):
        from ..guide_numbers import num

        sel = _select(res, **where)
        ip = [r["final_mean_inner_product"] for r in sel]
        hit = sum(r[_time_key(r)] is not None for r in sel)
        return (f"{num(min(ip), 2)}–{num(max(ip), 2)} over {len(sel)} runs, "
                f"{hit} of which reach {_threshold(res)}")
    return render


def guide_heads_all(res) -> str:
    """All heads together: per β the time to a single cluster and the final mean inner product."""
    from ..guide_numbers import spread

    betas = sorted({c["beta"] for c, _ in guide_points(res)})
    parts = []
    for b in betas:
        sel = _select(res, beta=b, head=-1.0)
        parts.append(f"{_threshold(res)} reached at t = {guide_time_cell(_times(res, beta=b, head=-1.0))} "
                     f"for β = {b:g} (final mean inner product "
                     f"{spread([r['final_mean_inner_product'] for r in sel])})")
    return "; ".join(parts)


def guide_heads_single(res) -> str:
    """The single heads alone: which, and the range of their final mean inner products."""
    from ..guide_numbers import num

    heads = sorted({int(c["head"]) for c, _ in guide_points(res) if c["head"] >= 0})
    ip = [r["final_mean_inner_product"] for c, r in guide_points(res) if c["head"] >= 0]
    return (f"heads {', '.join(str(h) for h in heads)}: mean inner product "
            f"{num(min(ip), 2)}–{num(max(ip), 2)} at t = {_t1(res):g} over every β and seed")


def _t1(res) -> float:
    import re

    m = re.search(r"^t1:\s*([\d.eE+-]+)", res["meta"]["config"], re.M)
    return float(m.group(1)) if m else float("nan")


def guide_cell(beta, sigma):
    """One cell of :func:`guide_sigma_table`: the times at (β, σ) over the seeds."""
    def render(res):
        return guide_time_cell(_times(res, beta=beta, sigma=sigma))
    return render


GUIDE_RENDERERS = {
    **{f"cell_beta{b:g}_sigma{s:g}": guide_cell(b, s) for b in (1.0, 4.0, 9.0)
       for s in (0.0, 0.1, 0.2, 0.3, 0.4)},
    "run": guide_run, "sigma_table": guide_sigma_table, "threshold": guide_threshold,
    "norm_times_beta1": guide_norm_times(1.0), "norm_radius_beta1": guide_norm_radius(1.0),
    "final_ip_beta4": guide_final_ip_range(beta=4.0),
    "heads_all": guide_heads_all, "heads_single": guide_heads_single,
}
