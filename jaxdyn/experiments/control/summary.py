"""Kind ``control``: W2 reached against depth (by N), the sampling floor, statuses, the replay."""

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


def particles_of(cfg, labels):
    """The point's N (its sweep label, else the config's)."""
    return int(labels.get("n_particles", cfg["n_particles"]))


def _f(x):
    x = float(x)
    return x if math.isfinite(x) else None


def depth_table(cfg, ds):
    """Rows ``{n_particles, n_layers, w2_exact, w2_floor, ...}`` averaged over the seeds, by (N, L)."""
    by = {}
    for labels, sel in iter_points(ds):
        by.setdefault((particles_of(cfg, labels), layers_of(cfg, labels)), []).append(sel)
    rows = []
    for (n, L) in sorted(by):
        sels = by[(n, L)]

        def mean(name):
            if name not in ds:
                return None
            v = np.array([float(ds[name].isel(s)) for s in sels])
            return _f(np.nanmean(v)) if np.any(np.isfinite(v)) else None

        fine = np.array([float(ds["divergence_fine_steps"].isel(s)) for s in sels])
        same = np.array([float(ds["divergence_same_steps"].isel(s)) for s in sels])
        rows.append({"n_particles": n, "n_layers": L, "points": len(sels),
                     "w2_exact": mean("w2_exact"), "w2_start": mean("w2_start"),
                     "w2_sinkhorn": mean("w2_sinkhorn"), "w2_floor": mean("w2_floor"),
                     "w2_exact_resampled": mean("w2_exact_resampled"),
                     "iterations": mean("iterations"), "seconds": mean("seconds"),
                     "replay_abs_change": (_f(np.nanmax(np.abs(fine - same)))
                                           if np.any(np.isfinite(fine - same)) else None),
                     "statuses": [int(ds["status"].isel(s)) for s in sels],
                     "stops": [int(ds["stop"].isel(s)) for s in sels]})
    return rows


def depth_rate(rows, key="w2_exact"):
    """The slope of log W2 against log L (least squares over every L with a value), or None."""
    pts = [(r["n_layers"], r[key]) for r in rows if r[key] and r[key] > 0]
    if len(pts) < 2:
        return None
    L, w = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(L, w, 1)[0])


def _falls(rows, key):
    return bool(all(a[key] is not None and b[key] is not None and b[key] <= a[key]
                    for a, b in zip(rows, rows[1:])))


def summarize(cfg, ds):
    """The ``control`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`).

    Args:
      cfg: the resolved config.
      ds: the merged Dataset.

    Returns:
      ``by_depth``: a row a (N, L), seeds averaged, with the statuses and why each optimisation
      stopped; ``by_particles``: for each N, the log–log slope of W2 against L, whether W2
      falls with L, and the sampling floor ``W2(ν_N, ν'_N)``; ``log_log_slope_w2_vs_layers``
      and ``falls_with_depth`` (the largest N; every N); ``not_converged`` and ``nonfinite``:
      the grid points with that status, with the optimiser's reason.
    """
    from ... import STATUS_NAMES
    from ...control._measure import STOP_TEXT

    rows = depth_table(cfg, ds)
    for r in rows:
        r["statuses"] = [STATUS_NAMES[c] for c in r["statuses"]]
    key = "w2_exact" if any(r["w2_exact"] for r in rows) else "w2_sinkhorn"
    by_n = {}
    for r in rows:
        by_n.setdefault(r["n_particles"], []).append(r)
    per_n = []
    for n, rs in sorted(by_n.items()):
        floors = [r["w2_floor"] for r in rs if r["w2_floor"] is not None]
        per_n.append({"n_particles": n, "log_log_slope_w2_vs_layers": depth_rate(rs, key),
                      "falls_with_depth": _falls(rs, key),
                      "w2_floor": float(np.mean(floors)) if floors else None})
    flagged = {"not_converged": [], "nonfinite": []}
    for labels, sel in iter_points(ds):
        name = STATUS_NAMES[int(ds["status"].isel(sel))]
        if name in flagged:
            stop = int(ds["stop"].isel(sel))
            flagged[name].append({**labels, "stop": STOP_TEXT.get(stop, "unknown")})
    deepest = per_n[-1] if per_n else {}
    return {"problem": cfg["problem"], "by_depth": rows, "w2_measure": key,
            "by_particles": per_n,
            "log_log_slope_w2_vs_layers": deepest.get("log_log_slope_w2_vs_layers"),
            "falls_with_depth": bool(per_n and all(p["falls_with_depth"] for p in per_n)),
            **flagged}


def guide_run(res) -> str:
    """A recorded run in words: its grid (depths, N, seeds), the points' statuses, its cost.

    No W2 is stated: the shipped configs run one seed a point, and W2 moves with the seed.

    Returns:
      "L = 1, 2 at N = 128, 1 seed a point: 2 points, 2 `not_converged` (reason); cost".
    """
    from ..guide_numbers import run_cost

    r = res["results"]
    rows = r["by_depth"]
    depths = sorted({row["n_layers"] for row in rows})
    sizes = sorted({row["n_particles"] for row in rows})
    seeds = max((row["points"] for row in rows), default=0)
    statuses = [s for row in rows for s in row["statuses"]]
    counts = ", ".join(f"{statuses.count(s)} `{s}`" for s in sorted(set(statuses)))
    reasons = sorted({p["stop"] for p in r.get("not_converged", []) + r.get("nonfinite", [])})
    why = f" ({'; '.join(reasons)})" if reasons else ""
    return (f"L = {', '.join(map(str, depths))} at N = {', '.join(map(str, sizes))}, "
            f"{seeds} seed{'s' if seeds != 1 else ''} a point: {len(statuses)} points, "
            f"{counts}{why}; {run_cost(res['meta'])}")


GUIDE_RENDERERS = {"run": guide_run}
