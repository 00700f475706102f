"""Kind ``long_context``: the summary (per study, the measurement beside the prediction)."""

from __future__ import annotations

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
                out[f"d={d},n={n},c={c:g}"] = {
                    "beta": float(select(ds["beta_resolved"], **idx).values.ravel()[0]),
                    "first_count_mean": float(np.mean(cnt)), "first_count_std": float(np.std(cnt)),
                    "first_time_mean": float(np.nanmean(tt)) if np.isfinite(tt).any() else None,
                    "mode_star": k,
                    "first_count_predicted": first_cluster_count(d, k),
                    "growth_rate_star": rate, "time_scale": 1.0 / rate,
                }
    return out


def summarize(cfg, ds):
    """The ``long_context`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`)."""
    study = cfg["study"]
    table = {"collapse": collapse_table, "phase": phase_table, "dynamics": dynamics_table}[study]
    return {"study": study, "table": table(cfg, ds)}


def _fmt(v):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def markdown_table(summary: dict) -> str:
    """A run's ``summary.json`` results as a Markdown table (one row per key of its table).

    Args:
      summary: the parsed ``summary.json`` of a ``long_context`` run.

    Returns:
      The table, with the run's name, points and compute seconds in a caption line.
    """
    table = summary["results"]["table"]
    cols = list(next(iter(table.values())))
    lines = [f"Run `{summary['name']}`: {summary['n_points']} points, "
             f"{summary['compute_seconds']:.1f} s of compute (`summary.json`).", "",
             "| point | " + " | ".join(c.replace("_", " ") for c in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for key, row in table.items():
        lines.append(f"| {key} | " + " | ".join(_fmt(row[c]) for c in cols) + " |")
    return "\n".join(lines)


def fill_guide(guide, run_dirs) -> None:
    """Fill a guide's generated blocks with the tables of runs.

    Each ``<!-- BEGIN GENERATED NAME -->`` … ``<!-- END GENERATED NAME -->`` block of ``guide``
    gets the table of the run named NAME among ``run_dirs``.

    Args:
      guide: the Markdown file.
      run_dirs: run folders (each with its ``summary.json``).
    """
    import json
    import re
    from pathlib import Path

    text = Path(guide).read_text()
    for d in run_dirs:
        s = json.loads((Path(d) / "summary.json").read_text())
        name = s["name"]
        text = re.sub(rf"(<!-- BEGIN GENERATED {name} -->\n).*?(<!-- END GENERATED {name} -->)",
                      lambda m: m.group(1) + markdown_table(s) + "\n" + m.group(2), text,
                      flags=re.S)
    Path(guide).write_text(text)


if __name__ == "__main__":  # python -m jaxdyn.experiments.long_context.summary GUIDE RUN_DIR...
    import sys

    fill_guide(sys.argv[1], sys.argv[2:])
