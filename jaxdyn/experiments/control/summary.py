"""Kind ``control``: W2 reached against depth, statuses, the replay at a finer step."""

from __future__ import annotations

import math

import numpy as np


def iter_points(ds):
    """Yield (labels, selection) for every grid point (the sweep axes of ``w2_sinkhorn``)."""
    dims = list(ds["w2_sinkhorn"].dims)
    for idx in np.ndindex(*[ds.sizes[d] for d in dims]):
        sel = dict(zip(dims, idx))
        yield {d: ds[d].values[i].item() for d, i in sel.items()}, sel


def layers_of(cfg, labels):
    """The point's L (its sweep label, else the config's)."""
    return int(labels.get("n_layers", cfg["n_layers"]))


def _f(x):
    x = float(x)
    return x if math.isfinite(x) else None


def depth_table(cfg, ds):
    """Rows ``{n_layers, w2_exact, w2_sinkhorn, ...}`` averaged over the seeds, by L."""
    by = {}
    for labels, sel in iter_points(ds):
        by.setdefault(layers_of(cfg, labels), []).append(sel)
    rows = []
    for L in sorted(by):
        sels = by[L]

        def mean(name):
            v = np.array([float(ds[name].isel(s)) for s in sels])
            return _f(np.nanmean(v)) if np.any(np.isfinite(v)) else None

        fine = np.array([float(ds["divergence_fine_steps"].isel(s)) for s in sels])
        same = np.array([float(ds["divergence_same_steps"].isel(s)) for s in sels])
        rows.append({"n_layers": L, "points": len(sels), "w2_exact": mean("w2_exact"),
                     "w2_start": mean("w2_start"), "w2_sinkhorn": mean("w2_sinkhorn"),
                     "iterations": mean("iterations"), "seconds": mean("seconds"),
                     "replay_abs_change": _f(np.nanmax(np.abs(fine - same))),
                     "statuses": [int(ds["status"].isel(s)) for s in sels]})
    return rows


def depth_rate(rows, key="w2_exact"):
    """The slope of log W2 against log L (least squares), or None."""
    pts = [(r["n_layers"], r[key]) for r in rows if r[key] and r[key] > 0]
    if len(pts) < 2:
        return None
    L, w = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(L, w, 1)[0])


def summarize(cfg, ds):
    """The ``control`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`)."""
    from ... import STATUS_NAMES

    rows = depth_table(cfg, ds)
    for r in rows:
        r["statuses"] = [STATUS_NAMES[c] for c in r["statuses"]]
    key = "w2_exact" if any(r["w2_exact"] for r in rows) else "w2_sinkhorn"
    return {"problem": cfg["problem"], "by_depth": rows, "w2_measure": key,
            "log_log_slope_w2_vs_layers": depth_rate(rows, key),
            "falls_with_depth": bool(all(a[key] is not None and b[key] is not None
                                         and b[key] <= a[key] for a, b in zip(rows, rows[1:])))}
