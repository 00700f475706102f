"""Kind ``long_context``: the summary (per study, the measurement beside the prediction)."""

from __future__ import annotations

import math

import numpy as np

from ...long_context_host import critical_gamma, first_cluster_count, poisson_limit_weights


def axis_values(ds, name, cfg):
    """The values of a swept field, or its one configured value."""
    return ds[name].values if name in ds.dims else np.array([cfg[name]])


def select(da, **idx):
    """``da.isel`` on the dims it has (a field not swept has no dim)."""
    return da.isel({k: v for k, v in idx.items() if k in da.dims})


def factor_values(cfg, ds, key):
    """The swept factor (c or γ) values, or the single one of beta."""
    if key in ds.dims:
        return ds[key].values
    v = cfg[key] if cfg[key] > 0 else cfg["beta"][key]
    return np.array([v])


def collapse_table(cfg, ds):
    """Per (d, n, c): the largest weight's and entropy's median over queries and seeds, beside the limit's."""
    out = {}
    for di, d in enumerate(axis_values(ds, "d", cfg)):
        for ci, c in enumerate(factor_values(cfg, ds, "c")):
            lw, lh = poisson_limit_weights(float(c), int(d), samples=cfg["limit_samples"], k=1)
            for ni, n in enumerate(axis_values(ds, "n", cfg)):
                mw = select(ds["max_weight"], d=di, c=ci, n=ni).values.ravel()
                h = select(ds["entropy"], d=di, c=ci, n=ni).values.ravel()
                rank = select(ds["top_rank"], d=di, c=ci, n=ni).values.ravel()
                out[f"d={d},n={n},c={c:g}"] = {
                    "max_weight_median": float(np.median(mw)),
                    "max_weight_quartiles": [float(np.quantile(mw, q)) for q in (0.25, 0.75)],
                    "entropy_median": float(np.median(h)),
                    "limit_max_weight_median": float(np.median(lw[:, 0])),
                    "limit_entropy_median": float(np.median(lh)),
                    "top_key_is_nearest": float(np.mean(rank == 0)),
                }
    return out


def phase_table(cfg, ds):
    """Per (n, ρ): the γ where λ (mean over seeds) crosses 1/2 and the width of 0.1 < λ < 0.9."""
    out = {}
    gam = factor_values(cfg, ds, "gamma")
    for ni, n in enumerate(axis_values(ds, "n", cfg)):
        for ri, rho in enumerate(axis_values(ds, "rho", cfg)):
            lam = select(ds["angle_ratio"], n=ni, rho=ri)
            lam = lam.mean("seed").values if "seed" in lam.dims else lam.values
            out[f"n={n},rho={rho:g}"] = {"gamma_c": float(critical_gamma(rho)),
                                         "gamma_half": _crossing(gam, lam, 0.5),
                                         "width_10_90": _width(gam, lam)}
    return out


def _crossing(x, y, level):
    """The first x where y crosses ``level`` upwards (linear interpolation), None if never."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    for i in range(len(x) - 1):
        if y[i] < level <= y[i + 1]:
            return float(x[i] + (level - y[i]) * (x[i + 1] - x[i]) / (y[i + 1] - y[i]))
    return None


def _width(x, y):
    lo, hi = _crossing(x, y, 0.1), _crossing(x, y, 0.9)
    return None if lo is None or hi is None else hi - lo


def dynamics_table(cfg, ds):
    """Per (d, n, c): the first clusters (count, time) over seeds beside k* (or l*) and 1/λ*."""
    out = {}
    for di, d in enumerate(axis_values(ds, "d", cfg)):
        for ni, n in enumerate(axis_values(ds, "n", cfg)):
            for ci, c in enumerate(factor_values(cfg, ds, "c")):
                idx = {"d": di, "n": ni, "c": ci}
                cnt = select(ds["first_count"], **idx).values.ravel()
                tt = select(ds["first_time"], **idx).values.ravel()
                k = int(select(ds["mode_star"], **idx).values.ravel()[0])
                rate = float(select(ds["rate_star"], **idx).values.ravel()[0])
                row = {
                    "beta": float(select(ds["beta_resolved"], **idx).values.ravel()[0]),
                    "first_count_mean": float(np.mean(cnt)), "first_count_std": float(np.std(cnt)),
                    "first_time_mean": float(np.nanmean(tt)) if np.isfinite(tt).any() else None,
                    "mode_star": k,
                    "first_count_predicted": first_cluster_count(d, k),
                    "growth_rate_star": rate, "time_scale": 1.0 / rate,
                }
                if "clustered_fraction" in ds and cfg["count"] == "all":
                    row.update(_graph_count_row(ds, idx, cnt, tt))
                out[f"d={d},n={n},c={c:g}"] = row
    return out


def _graph_count_row(ds, idx, cnt, tt):
    """count: all — per seed the first count and time, the fraction held then, the peak count."""
    held = select(ds["clustered_fraction"], **idx).values.reshape(len(cnt), -1)
    counts = select(ds["cluster_count"], **idx).values.reshape(len(cnt), -1)
    first = [int(np.flatnonzero(c > 0)[0]) if np.any(c > 0) else None for c in counts]
    return {"seeds": len(cnt), "first_counts": [int(v) for v in cnt],
            "first_times": [float(v) if np.isfinite(v) else None for v in tt],
            "first_time_std": float(np.nanstd(tt)) if np.isfinite(tt).any() else None,
            "first_held": [None if i is None else float(h[i]) for h, i in zip(held, first)],
            "peak_count_mean": float(np.mean(counts.max(axis=1)))}


def summarize(cfg, ds):
    """The ``long_context`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`)."""
    study = cfg["study"]
    table = {"collapse": collapse_table, "phase": phase_table, "dynamics": dynamics_table}[study]
    return {"study": study, "table": table(cfg, ds)}


# ---------------------------------------------------------------- the guide's tables
# Renderers of a recorded long_context result file (jaxdyn.experiments.guide_numbers): each
# takes the file's dict and returns Markdown.


def _key(point: str) -> dict:
    """``"d=2,n=1000,c=0.01"`` as ``{"d": "2", "n": "1000", "c": "0.01"}``."""
    return dict(kv.split("=") for kv in point.split(","))


def _sci(n) -> str:
    e = math.log10(float(n))
    return f"10^{round(e)}" if abs(e - round(e)) < 1e-9 else f"{float(n):g}"


def guide_collapse(res) -> str:
    """Per (d, c): the median largest weight at each n beside the limit law's median."""
    from ..guide_numbers import num

    table = res["results"]["table"]
    rows, ns = {}, []
    for point, row in table.items():
        k = _key(point)
        rows.setdefault((int(k["d"]), float(k["c"])), {})[int(k["n"])] = row
        ns.append(int(k["n"]))
    ns = sorted(set(ns))
    out = ["| d | c | limit (n → ∞) | " + " | ".join(f"n = {_sci(n)}" for n in ns)
           + " | top key nearest |", "|---" * (len(ns) + 4) + "|"]
    for (d, c), by_n in sorted(rows.items()):
        first = next(iter(by_n.values()))
        near = min(r["top_key_is_nearest"] for r in by_n.values())
        out.append(f"| {d} | {num(c)} | {num(first['limit_max_weight_median'])} | "
                   + " | ".join(num(by_n[n]["max_weight_median"]) if n in by_n else "—"
                                for n in ns) + f" | {num(near)} |")
    return "\n".join(out)


def _closed_form_half(n: int, rho: float) -> float:
    """The γ at which the exactly equiangular closed form of λ crosses ½ (SciPy's Brent)."""
    from scipy.optimize import brentq

    from ...long_context_host import equiangular_angle_ratio

    f = lambda g: equiangular_angle_ratio(n, g * math.log(n), rho) - 0.5  # noqa: E731
    return float(brentq(f, 1e-3 / (1 - rho), 10.0 / (1 - rho), xtol=1e-10))


def guide_phase(res) -> str:
    """Per (ρ, n): γ_c, the γ where λ crosses ½ (measured and closed form), the width."""
    from ..guide_numbers import num

    out = ["| ρ | n | γ_c = 1/(1 − ρ) | γ at λ = ½ | ratio to γ_c | exactly equiangular: ratio "
           "| width of 0.1 < λ < 0.9 (in γ) |", "|---" * 7 + "|"]
    table = res["results"]["table"]
    for point, row in sorted(table.items(), key=lambda kv: (float(_key(kv[0])["rho"]),
                                                             int(_key(kv[0])["n"]))):
        k = _key(point)
        half, gc = row["gamma_half"], row["gamma_c"]
        exact = _closed_form_half(int(k["n"]), float(k["rho"])) / gc
        out.append(f"| {k['rho']} | {_sci(k['n'])} | {num(gc)} | {num(half)} | "
                   f"{num(None if half is None else half / gc)} | {num(exact)} | "
                   f"{num(row['width_10_90'])} |")
    return "\n".join(out)


def _count(x) -> str:
    """A cluster count: every digit from 10⁴ on (3 significant digits below, as ``num``)."""
    from ..guide_numbers import num

    return f"{x:.0f}" if abs(x) >= 1e4 else num(x)


def guide_dynamics(res) -> str:
    """Per (n, c): β, the fastest mode, the predicted and measured first counts, their time."""
    from ..guide_numbers import num

    table = res["results"]["table"]
    out = ["| d | n | c | β | k* or l* | predicted first count | measured (mean ± sd over seeds) "
           "| first time | 1/λ* |", "|---" * 9 + "|"]
    order = sorted(table, key=lambda p: (int(_key(p)["d"]), int(_key(p)["n"]),
                                         float(_key(p)["c"])))
    for point in order:
        row, k = table[point], _key(point)
        out.append(f"| {k['d']} | {k['n']} | {k['c']} | {num(row['beta'])} | {row['mode_star']} | "
                   f"{_count(row['first_count_predicted'])} | {_count(row['first_count_mean'])} ± "
                   f"{num(row['first_count_std'], 2)} | {num(row['first_time_mean'])} | "
                   f"{num(row['time_scale'])} |")
    return "\n".join(out)


def guide_dynamics_all(res) -> str:
    """count: all — per n: the predicted and measured first counts, their time against 1/λ*."""
    from ..guide_numbers import num

    table = res["results"]["table"]
    out = ["| n | c | β | l* | seeds | predicted first count | measured first count (mean ± sd) "
           "| measured / predicted | fraction held then | peak count | first time (mean ± sd) "
           "| λ* × first time |", "|---" * 12 + "|"]
    order = sorted(table, key=lambda p: (int(_key(p)["n"]), float(_key(p)["c"])))
    for point in order:
        row, k = table[point], _key(point)
        held = [h for h in row["first_held"] if h is not None]
        t = row["first_time_mean"]
        one = row["seeds"] == 1  # no spread to show
        spread = lambda v: "" if one else f" ± {num(v, 2)}"  # noqa: E731
        out.append(f"| {_sci(k['n'])} | {k['c']} | {num(row['beta'])} | {row['mode_star']} | "
                   f"{row['seeds']} | {row['first_count_predicted']:.0f} | "
                   f"{row['first_count_mean']:.0f}{spread(row['first_count_std'])} | "
                   f"{num(row['first_count_mean'] / row['first_count_predicted'])} | "
                   f"{num(float(np.mean(held)) if held else None)} | "
                   f"{row['peak_count_mean']:.0f} | {num(t)}{spread(row['first_time_std'])} | "
                   f"{num(None if t is None else t * row['growth_rate_star'])} |")
    return "\n".join(out)


def guide_run(res) -> str:
    """The run's CPU time and machine, in words."""
    meta = res["meta"]
    secs, unit = ((meta["cpu_seconds"], "CPU-") if meta.get("cpu_seconds") is not None
                  else (meta["wall_seconds"], "wall "))  # record() measures no CPU time
    took = f"{secs / 60:.0f} {unit}minutes" if secs >= 60 else f"{secs:.0f} {unit}seconds"
    return f"{took} on a {meta['machine']['cores']}-core {meta['machine']['cpu']}"


#: the renderers of a long_context result file (jaxdyn.experiments.guide_numbers)
GUIDE_RENDERERS = {"collapse": guide_collapse, "phase": guide_phase,
                   "dynamics": guide_dynamics, "dynamics_all": guide_dynamics_all,
                   "run": guide_run}
