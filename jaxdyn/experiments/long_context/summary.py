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
                    "seeds": len(cnt), "first_counts": [int(v) for v in cnt],
                    "first_times": [float(v) if np.isfinite(v) else None for v in tt],
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
    return {"first_time_std": float(np.nanstd(tt)) if np.isfinite(tt).any() else None,
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
    minutes = secs / 60  # one decimal under 10 minutes
    took = (f"{secs:.0f} {unit}seconds" if secs < 60
            else f"{minutes:.{1 if minutes < 10 else 0}f} {unit}minutes")
    return f"{took} on a {meta['machine']['cores']}-core {meta['machine']['cpu']}"


# ---------------------------------------------------------------- the guide's phrases
# The numbers the guide's prose states, rendered from the same result files as its tables.

_SUP = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def _power(x, digits=2) -> str:
    """``x`` as m·10ᵉ, 10ᵉ where m is 1: 2.5e9 → "2.5·10⁹", 1e4 → "10⁴"."""
    m, e = f"{float(x):.{digits - 1}e}".split("e")
    m = m.rstrip("0").rstrip(".") if "." in m else m
    sup = str(int(e)).translate(_SUP)
    return f"10{sup}" if m == "1" else f"{m}·10{sup}"


def _and(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _rows(res):
    """The table's points in order of (d, n, c): ``[(keys, row), …]``."""
    table = res["results"]["table"]
    order = sorted(table, key=lambda p: tuple(float(v) for v in _key(p).values()))
    return [(_key(p), table[p]) for p in order]


def _config(res) -> dict:
    from ...config import parse_yaml

    return parse_yaml(res["meta"].get("config") or "{}", "the result file's config") or {}


def _seeds(res, row) -> int:
    """The seeds a point's mean is over (an older result file: its config's sweep)."""
    if "seeds" in row:
        return int(row["seeds"])
    seeds = (_config(res).get("sweep") or {}).get("seed")
    return len(seeds) if isinstance(seeds, list) else 1


def _seed_words(k) -> str:
    return "one seed" if k == 1 else f"{k} seeds"


def _n(n) -> str:
    """The size n as the guide writes it: 10ᵉ for a power of ten, else the integer."""
    n = int(n)
    e = round(math.log10(n))
    return f"10{str(e).translate(_SUP)}" if 10 ** e == n else str(n)


def _ns(rows) -> str:
    return "n = " + _and(_n(k["n"]) for k, _ in rows)


def _pct(x, digits=2, sign=True) -> str:
    """A fraction as a percentage (``sign``: "+" before a positive one)."""
    from ..guide_numbers import num

    s = num(100 * x, digits)
    return f"+{s}" if sign and x > 0 else s


def _mode(k) -> str:
    return "k*" if int(k["d"]) == 2 else "N₁"


def _same_seeds(res, rows) -> str:
    ks = {_seeds(res, r) for _, r in rows}
    return _seed_words(ks.pop()) if len(ks) == 1 else "the seeds"


def phrase_count_ratio(res) -> str:
    """The first count over its prediction at each n, with the seeds' spread.

    Returns:
      The mean over the seeds (their range where the file holds every seed's count) and the
      seeds' standard deviation in clusters.
    """
    from ..guide_numbers import num

    rows = _rows(res)
    parts, sds = [], []
    for _, row in rows:
        pred = row["first_count_predicted"]
        text = num(row["first_count_mean"] / pred)
        per = row.get("first_counts") or []
        if len(per) > 1:
            text += f" ({num(min(per) / pred)}–{num(max(per) / pred)})"
        parts.append(text)
        sds.append(num(row["first_count_std"], 2))
    k = rows[0][0]
    out = f"{_and(parts)} of {_mode(k)} at {_ns(rows)}"
    n_seeds = {_seeds(res, r) for _, r in rows}
    if n_seeds == {1}:
        return out + " (one seed)"
    return (out + f" (the mean over {_same_seeds(res, rows)}; their standard deviation "
            f"{_and(sds)} clusters)")


def phrase_count_deviation(res) -> str:
    """count: all — the first count's departure from N₁ in %, mean (range) over the seeds."""
    parts, sds, preds = [], [], []
    rows = _rows(res)
    for k, row in rows:
        pred = row["first_count_predicted"]
        dev = [c / pred - 1 for c in row["first_counts"]]
        text = f"{_pct(sum(dev) / len(dev))} %"
        if len(dev) > 1:
            text = f"{_pct(sum(dev) / len(dev))} % ({_pct(min(dev))} to {_pct(max(dev))} %)"
        parts.append(f"{text} at n = {_n(k['n'])}")
        sds.append(f"{row['first_count_std']:.1f}")
        preds.append(f"{pred:.0f}")
    if {_seeds(res, r) for _, r in rows} == {1}:
        return f"{_and(parts)} (one seed; N₁ = {_and(preds)})"
    return (f"{_and(parts)} (mean (range) over {_same_seeds(res, rows)}; the seeds' standard "
            f"deviation {_and(sds)} clusters of N₁ = {_and(preds)})")


def phrase_below(res) -> str:
    """S¹: at how many points the mean first count lies below k*, and by how much.

    Returns:
      The count of points below, the gap in % of k* and in standard deviations of the seeds.
    """
    from ..guide_numbers import num

    rows = _rows(res)
    gap = [(r["first_count_predicted"] - r["first_count_mean"], r) for _, r in rows]
    below = [(g, r) for g, r in gap if g > 0]
    pct = [g / r["first_count_predicted"] for g, r in gap]
    sds = [g / r["first_count_std"] for g, r in below if r["first_count_std"] > 0]
    where = (f"at every one of the {len(rows)} points" if len(below) == len(rows)
             else f"at {len(below)} of the {len(rows)} points")
    text = (f"below {_mode(rows[0][0])} {where}, by {_pct(min(pct), sign=False)} to "
            f"{_pct(max(pct), sign=False)} %")
    if sds:
        text += (f" ({num(min(sds), 2)} to {num(max(sds), 2)} standard deviations of the "
                 f"{_same_seeds(res, rows)})")
    return text


def phrase_below_percent(res) -> str:
    """S¹: the range of (k* − mean first count) / k* over the points, in %."""
    pct = [1 - r["first_count_mean"] / r["first_count_predicted"] for _, r in _rows(res)]
    return f"{_pct(min(pct), sign=False)} to {_pct(max(pct), sign=False)} %"


def _scaled_times(row):
    return [None if t is None else t * row["growth_rate_star"]
            for t in (row.get("first_times") or [row["first_time_mean"]])]


def phrase_time_range(res) -> str:
    """λ* × the mean first time: its range over the points."""
    from ..guide_numbers import num

    rows = _rows(res)
    v = [r["first_time_mean"] * r["growth_rate_star"] for _, r in rows
         if r["first_time_mean"] is not None]
    return (f"{num(min(v), 2)} to {num(max(v), 2)} × 1/λ* (the mean over "
            f"{_same_seeds(res, rows)} at each of the {len(rows)} points)")


def phrase_time_ratio(res) -> str:
    """λ* × the first time at each n.

    Returns:
      The mean over the seeds (their range where the file holds every seed's time).
    """
    from ..guide_numbers import num

    rows = _rows(res)
    parts = []
    for _, row in rows:
        t = row["first_time_mean"]
        text = num(None if t is None else t * row["growth_rate_star"], 2)
        per = [x for x in _scaled_times(row) if x is not None]
        if len(per) > 1 and min(per) != max(per):
            text += f" ({num(min(per), 2)}–{num(max(per), 2)})"
        parts.append(text)
    ks = {_seeds(res, r) for _, r in rows}
    how = "one seed" if ks == {1} else f"the mean over {_same_seeds(res, rows)}"
    return f"{_and(parts)} × 1/λ* at {_ns(rows)} ({how})"


def phrase_first_time(res) -> str:
    """count: all — the first time and λ* × it: one value where every seed and n has the same."""
    from ..guide_numbers import num

    rows = _rows(res)
    times = {t for _, r in rows for t in r["first_times"]}
    scaled = {num(x) for _, r in rows for x in _scaled_times(r) if x is not None}
    ks = {_seeds(res, r) for _, r in rows}
    if len(times) == 1 and None not in times and len(scaled) == 1:
        who = ("one seed" if ks == {1} else
               f"each of the {_same_seeds(res, rows)}" + (" at each n" if len(rows) > 1 else ""))
        return f"t = {num(times.pop(), 2)} (λ* t = {scaled.pop()}) at {_ns(rows)} ({who})"
    parts = []
    for k, r in rows:
        per = [x for x in r["first_times"] if x is not None]
        parts.append(f"t = {num(sum(per) / len(per), 2)} ({num(min(per), 2)}–{num(max(per), 2)}; "
                     f"λ* t = {num(sum(per) / len(per) * r['growth_rate_star'])}) at "
                     f"n = {_n(k['n'])}")
    return _and(parts) + f" (mean (range) over {_same_seeds(res, rows)})"


def phrase_peak(res) -> str:
    """count: all — how far the peak count (mean over the seeds) lies above N₁, in %."""
    rows = _rows(res)
    parts = [_pct(r["peak_count_mean"] / r["first_count_predicted"] - 1, sign=False) + " %"
             for _, r in rows]
    ks = {_seeds(res, r) for _, r in rows}
    how = "one seed" if ks == {1} else f"the mean peak of {_same_seeds(res, rows)}"
    return f"{_and(parts)} above N₁ at {_ns(rows)} ({how})"


def phrase_cells(res) -> str:
    """S¹: the histogram's cells per k* at each n (its config's ``cells_per_mode``)."""
    from ..guide_numbers import num
    from .schema import SCHEMA, histogram_cells

    per_mode = _config(res).get("cells_per_mode", SCHEMA["cells_per_mode"].default)
    rows = _rows(res)
    cells = [num(histogram_cells(per_mode, r["mode_star"]) / r["mode_star"]) for _, r in rows]
    return f"{_and(cells)} cells per k* at {_ns(rows)}"


def phrase_float32(res) -> str:
    """The largest β of the file and how far float32's rounding would move its logits (β ε)."""
    k, row = max(_rows(res), key=lambda kr: kr[1]["beta"])
    moved = row["beta"] * float(np.finfo(np.float32).eps)
    return (f"{_power(row['beta'])} at n = {_n(k['n'])}, where float32's rounding would move "
            f"the logits by β ε ≈ {float(f'{moved:.1g}'):g}")


def phrase_ratio_by_mode(res) -> str:
    """The mean first count over its prediction at each l* (k*), with n where several n share it."""
    from ..guide_numbers import num

    by_mode = {}
    for k, r in _rows(res):
        by_mode.setdefault(r["mode_star"], []).append(
            (int(k["n"]), num(r["first_count_mean"] / r["first_count_predicted"])))
    name = "k*" if int(_rows(res)[0][0]["d"]) == 2 else "l*"
    parts = []
    for mode, vals in sorted(by_mode.items()):
        if len(vals) == 1:
            parts.append(f"{vals[0][1]} at {name} = {mode}")
        else:
            parts.append(_and(f"{v} (n = {n})" for n, v in sorted(vals)) + f" at {name} = {mode}")
    return _and(parts)


def phrase_largest_departure(res) -> str:
    """collapse: the point whose median largest weight departs most from the limit's median.

    Returns:
      The relative departure, the point, both medians and the point's β.
    """
    from ..guide_numbers import num

    def rel(row):
        return abs(row["max_weight_median"] / row["limit_max_weight_median"] - 1)

    point, row = max(res["results"]["table"].items(), key=lambda kv: rel(kv[1]))
    k = _key(point)
    d, n, c = int(k["d"]), int(k["n"]), float(k["c"])
    beta = c * n ** (2 / (d - 1))
    dev = row["max_weight_median"] / row["limit_max_weight_median"] - 1
    return (f"{_pct(dev)} % at d = {d}, c = {c:g}, n = {_n(n)} (median "
            f"{num(row['max_weight_median'])} against the limit's "
            f"{num(row['limit_max_weight_median'])}), where β = "
            f"{_power(beta) if beta >= 1e4 else num(beta, 2)}")


def phrase_dt_check(res) -> str:
    """The result of :mod:`.dt_check`: at how many frames a finer step gives the same count.

    Returns:
      Per sphere, the frames whose cluster counts agree, and the first that does not.
    """
    def g(x):  # a step or a frame's time, as the config states it
        return f"{float(x):.4g}"

    parts, fine_dt, coarse_dt, t_end = [], set(), set(), set()
    for name, r in res["results"].items():
        c, f = r["coarse"], r["fine"]
        fine_dt.add(f["dt"])
        coarse_dt.add(c["dt"])
        t_end.add(c["times"][-1])
        text = f"{r['frames_equal']} of the {r['frames']} frames on {name}"
        bad = [i for i, (a, b) in enumerate(zip(c["counts"], f["counts"])) if a != b]
        if bad:
            i = bad[0]
            text += (f" (the first that differs at t = {g(c['times'][i])}: "
                     f"{f['counts'][i]} clusters against {c['counts'][i]})")
        parts.append(text)
    return (f"a run at dt = {_and(g(x) for x in sorted(fine_dt))} gives the same counts as "
            f"dt = {_and(g(x) for x in sorted(coarse_dt))} at "
            f"{_and(parts)} up to t = {_and(g(x) for x in sorted(t_end))}")


#: the renderers of a long_context result file (jaxdyn.experiments.guide_numbers)
GUIDE_RENDERERS = {"collapse": guide_collapse, "phase": guide_phase,
                   "dynamics": guide_dynamics, "dynamics_all": guide_dynamics_all,
                   "run": guide_run, "count_ratio": phrase_count_ratio,
                   "count_deviation": phrase_count_deviation, "below": phrase_below,
                   "below_percent": phrase_below_percent, "time_range": phrase_time_range,
                   "time_ratio": phrase_time_ratio, "first_time": phrase_first_time,
                   "peak": phrase_peak, "cells": phrase_cells, "float32": phrase_float32,
                   "ratio_by_mode": phrase_ratio_by_mode,
                   "largest_departure": phrase_largest_departure, "dt_check": phrase_dt_check}
