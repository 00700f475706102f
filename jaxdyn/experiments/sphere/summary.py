"""Kind ``sphere``: the summary (time to one cluster per β)."""

from __future__ import annotations

import itertools

import numpy as np


def per_beta(ds, var):
    """Reduce over every sweep axis but β (mean over seeds etc.)."""
    da = ds[var]
    other = [d for d in da.dims if d in ds.coords and d not in ("beta", "t", "t_snapshot",
                                                                  "particle", "component")]
    return da.mean(other) if other else da


def energy_steps(energy, rel_tol=1e-12) -> dict:
    """How E_β moves between consecutive saved frames, over every system.

    Args:
      energy: the ``energy`` variable (a ``t`` axis and any sweep axes).
      rel_tol: a step counts as a decrease when it is below ``-rel_tol * |E|`` (rounding).

    Returns:
      The number of steps, of decreases beyond rounding, and the largest relative decrease.
    """
    e = energy.transpose(..., "t").values.astype(np.float64)
    e = e.reshape(-1, e.shape[-1])
    step = np.diff(e, axis=-1)
    scale = np.maximum(np.abs(e[:, :-1]), np.finfo(np.float64).tiny)
    finite = np.isfinite(step)
    rel = np.where(finite, step / scale, 0.0)
    return {"steps": int(finite.sum()), "decreases": int(np.sum(rel < -rel_tol)),
            "largest_relative_decrease": float(max(0.0, -rel.min())) if rel.size else 0.0,
            "systems": int(e.shape[0]), "rel_tol": rel_tol}


def summarize(cfg, ds):
    """The ``sphere`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`)."""
    ip = per_beta(ds, "mean_inner_product")
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
    if "pair_fraction" in ds:
        pf, cc, gr = (per_beta(ds, v) for v in ("pair_fraction", "cluster_count", "gram_rank"))
        agree = per_beta(ds.assign(_agree=(ds["cluster_count"] == ds["gram_rank"]).astype(float)),
                         "_agree")
        for i, b in enumerate(betas):
            def row(da):
                return da.isel(beta=i).values if "beta" in da.dims else da.values

            out[f"beta={b:g}"].update({
                "final_pair_fraction": float(row(pf)[-1]),
                "final_mean_cluster_count": float(row(cc)[-1]),
                "final_mean_gram_rank": float(row(gr)[-1]),
                "fraction_of_saved_frames_count_equals_gram_rank": float(np.mean(row(agree))),
            })
    res = {"per_beta": out}
    if "energy" in ds and "t" in ds["energy"].dims and ds["energy"].sizes["t"] > 1:
        res["energy_steps"] = energy_steps(ds["energy"])
    axes = [a for a in ("heads", "mask", "positions", "attention") if a in ds.dims]
    if "cluster_count" in ds and axes:  # attention variants: per combination and β
        t = ds["t"].values
        var = {}
        for i, b in enumerate(betas):
            da = ds["cluster_count"].isel(beta=i) if "beta" in ds.dims else ds["cluster_count"]
            for combo in itertools.product(*(list(ds[a].values) for a in axes)):
                sel = da.sel(dict(zip(axes, combo)))
                rest = [d for d in sel.dims if d != "t"]
                row = (sel.mean(rest) if rest else sel).values
                key = f"beta={b:g}, " + ", ".join(f"{a}={v}" for a, v in zip(axes, combo))
                few = np.flatnonzero(row <= 2)
                var[key] = {
                    "final_mean_cluster_count": float(row[-1]),
                    "mean_cluster_count_at": {f"t={t[j]:g}": float(row[j])
                                              for j in np.linspace(0, len(t) - 1, 5).astype(int)},
                    "time_to_at_most_2_clusters": float(t[few[0]]) if few.size else None,
                }
                if "seed" in sel.dims:  # every seed's count at every saved time
                    other = [d for d in sel.dims if d not in ("seed", "t")]
                    per = (sel.mean(other) if other else sel).transpose("seed", "t")
                    var[key]["cluster_count_per_seed"] = {
                        "seed": [int(s) for s in sel["seed"].values],
                        "t": [float(x) for x in t],
                        "count": [[float(c) for c in r] for r in per.values],
                    }
        res["per_variant"] = var
        if "energy" in ds:
            res["energy_definition"] = ("(1/H) sum_h E_beta(B_h), B_h = Q_h^T K_h of each "
                                        "head (masks and positions not included)")
    return res


# ---------------------------------------------------------------- the guides' numbers
# (renderers of docs/results/sphere/*.json, :mod:`jaxdyn.experiments.guide_numbers`)



def _per_beta(res) -> list:
    """(β, results) per β of a recorded run, in β order."""
    rows = [(float(k.split("=", 1)[1]), v) for k, v in res["results"]["per_beta"].items()]
    return sorted(rows, key=lambda r: r[0])


def _sweep_size(res, axis) -> int | None:
    """The length of a sweep axis in the recorded config (None where it is not swept)."""
    from ...config import parse_yaml

    v = (parse_yaml(res["meta"]["config"], "config.yaml").get("sweep") or {}).get(axis)
    if v is None:
        return None
    if isinstance(v, dict) and "range" in v:
        return len(range(*v["range"]))
    if isinstance(v, dict) and "linspace" in v:
        return int(v["linspace"][2])
    return len(v)


def guide_run(res) -> str:
    """The run's cost: wall seconds, CPU seconds and peak memory where measured, the machine."""
    from ..guide_numbers import run_cost

    return run_cost(res["meta"])


def _mib(b) -> str:
    return f"{b / 2 ** 20:.0f} MiB"


def _seconds(x) -> str:
    return "—" if x is None else f"{x:.0f} s" if x >= 10 else f"{x:.1f} s"


def guide_engine_run(res) -> str:
    """A recorded run as the engine saw it: chunks, wall and compile seconds, memory estimate and peak.

    Reads the ``meta`` of ``guide_numbers.record``: ``n_chunks``, ``wall_seconds``,
    ``compile_seconds``, ``cpu_seconds``, ``estimated_process_bytes`` (the engine's estimate for the
    process at the start) and ``measured_peak_rss_bytes`` (from its ``summary.json``).

    Returns:
      "on 2 CPU cores (model): 24 chunks in 74 s of wall time for the whole run (8.1 s compiling,
      60 CPU-s); the engine estimated ≤ 781 MiB for the process at start and measured a peak of
      435 MiB".
    """
    from ..guide_numbers import machine_words

    m = res["meta"]
    cpu = f", {m['cpu_seconds']:.0f} CPU-s" if m.get("cpu_seconds") is not None else ""
    return (f"on {machine_words(m)}: {m['n_chunks']} chunks in {_seconds(m['wall_seconds'])} of wall "
            f"time for the whole run ({_seconds(m.get('compile_seconds'))} compiling{cpu}); the engine "
            f"estimated ≤ {_mib(m['estimated_process_bytes'])} for the process at start and measured "
            f"a peak of {_mib(m['measured_peak_rss_bytes'])}")


def guide_cluster_table(res) -> str:
    """The per-β table of a cluster-statistics run.

    Returns:
      Per β at the last saved time: pair fraction, mean cluster count and Gram rank (means over
      the seeds), the fraction of frames whose count equals the rank, and the time the
      seed-mean inner product first reaches 0.99.
    """
    from ..guide_numbers import num

    lines = ["| β | t at mean inner product ≥ 0.99 | pair fraction | cluster count | Gram rank "
             "| frames with count = rank |", "|---|---|---|---|---|---|"]
    for b, r in _per_beta(res):
        t = r["time_to_mean_inner_product_0.99"]
        lines.append(f"| {num(b)} | {'—' if t is None else f'{t:g}'} | "
                     f"{num(r['final_pair_fraction'])} | {num(r['final_mean_cluster_count'])} | "
                     f"{num(r['final_mean_gram_rank'])} | "
                     f"{100 * r['fraction_of_saved_frames_count_equals_gram_rank']:.0f} % |")
    return "\n".join(lines)


def guide_one_cluster(res) -> str:
    """The β whose seed-mean inner product reaches 0.99, and when."""
    from ..guide_numbers import num

    hit = [(b, r["time_to_mean_inner_product_0.99"]) for b, r in _per_beta(res)
           if r["time_to_mean_inner_product_0.99"] is not None]
    if not hit:
        return "for no β"
    ts = [t for _, t in hit]
    return (f"by t = {min(ts):g}–{max(ts):g} for β ≤ {num(max(b for b, _ in hit))} "
            f"({len(hit)} of {len(_per_beta(res))} β)")


def guide_pair_fraction(res) -> str:
    """The final pair fraction of the smallest β that stays off one cluster's 0.99 and of the largest."""
    from ..guide_numbers import num

    rows = _per_beta(res)
    a, b = _first_split(rows), rows[-1]
    return (f"from {num(a[1]['final_pair_fraction'], 2)} (β = {num(a[0])}) to "
            f"{num(b[1]['final_pair_fraction'], 2)} (β = {num(b[0])})")


def guide_cluster_count(res) -> str:
    """The final mean cluster count over the same two β as :func:`guide_pair_fraction`."""
    from ..guide_numbers import num

    rows = _per_beta(res)
    a, b = _first_split(rows), rows[-1]
    return f"from {num(a[1]['final_mean_cluster_count'])} to {num(b[1]['final_mean_cluster_count'])}"


def _first_split(rows):
    """The smallest β whose seed-mean inner product never reaches 0.99 (the last β if all do)."""
    return next((row for row in rows if row[1]["time_to_mean_inner_product_0.99"] is None), rows[-1])


def guide_rank_agreement(res) -> str:
    """Where the component count and the Gram rank agree at the last saved time.

    The rank is at least the number of components on every system (the thresholded Gram matrix
    is block diagonal over the components, each block nonzero), so equal means over the seeds
    are agreement on every system.

    Returns:
      "agree on every system", or at how many β they do.
    """
    rows = _per_beta(res)
    gap = [r["final_mean_gram_rank"] - r["final_mean_cluster_count"] for _, r in rows]
    same = sum(abs(g) <= 1e-9 * max(1.0, r["final_mean_gram_rank"])
               for g, (_, r) in zip(gap, rows))
    if same == len(rows):
        return "agree on every system"
    return f"agree on every system at {same} of {len(rows)} β"


def guide_frames_agreement(res) -> str:
    """The fraction of all system × saved-frame pairs whose count equals the rank."""
    rows = _per_beta(res)
    f = sum(r["fraction_of_saved_frames_count_equals_gram_rank"] for _, r in rows) / len(rows)
    return f"{100 * f:.0f} %"


def guide_systems(res) -> str:
    """The systems of the run: β × seeds."""
    nb, ns = len(_per_beta(res)), _sweep_size(res, "seed")
    return f"{nb} β × {ns} seeds" if ns else f"{nb} β"


# ---- attention variants (``per_variant``): every seed's cluster count against depth

VARIANT_TIMES = (5.0, 10.0, 20.0)  # the depths of the variants table


def _label(key) -> dict:
    """The coordinates of a ``per_variant`` key ("beta=1, heads=4, mask=causal")."""
    out = {}
    for part in key.split(", "):
        k, _, v = part.partition("=")
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = v
    return out


def variant_rows(res) -> list:
    """(coordinates, per-seed counts) of every variant, by β, heads, then full before causal.

    Returns:
      A list of ``(coords, t, counts)``: ``t`` the saved times, ``counts`` one list per seed.
    """
    rows = []
    for key, v in res["results"]["per_variant"].items():
        ps = v["cluster_count_per_seed"]
        rows.append((_label(key), ps["t"], ps["count"]))
    order = {"none": 0, "causal": 1}
    return sorted(rows, key=lambda r: (r[0]["beta"], r[0].get("heads", 1),
                                        order.get(r[0].get("mask", "none"), 2)))


def _count(x) -> str:
    """A cluster count or its mean: an integer as one, else three significant digits."""
    x = float(x)
    return f"{x:.0f}" if x == round(x) else f"{x:.3g}"


def count_spread(values) -> str:
    """Counts over the seeds as "mean (min–max)" ("n" alone where every seed has n)."""
    lo, hi = min(values), max(values)
    if lo == hi:
        return _count(lo)
    return f"{_count(sum(values) / len(values))} ({_count(lo)}–{_count(hi)})"


def count_at(t, counts, when) -> list:
    """Every seed's count at the saved time ``when``."""
    j = min(range(len(t)), key=lambda i: abs(t[i] - when))
    return [c[j] for c in counts]


def first_time(t, counts, at_most) -> list:
    """Every seed's first saved time with at most ``at_most`` clusters (None: never)."""
    return [next((tt for tt, c in zip(t, row) if c <= at_most), None) for row in counts]


def time_spread(times) -> str:
    """First times over the seeds: "median (min–max) [k of n]" of the k seeds that get there."""
    v = sorted(x for x in times if x is not None)
    n = len(times)
    if not v:
        return f"never [0 of {n}]"
    k = len(v)
    med = v[k // 2] if k % 2 else 0.5 * (v[k // 2 - 1] + v[k // 2])
    text = f"{med:g}" if v[0] == v[-1] else f"{med:g} ({v[0]:g}–{v[-1]:g})"
    return f"{text} [{k} of {n}]"


def guide_variants_table(res) -> str:
    """Cluster count against depth per β, heads and mask, over the seeds.

    Returns:
      One row per variant: the count at t = 5, 10, 20 (mean (range) over the seeds) and the
      first saved t with ≤ 2 and ≤ 1 clusters (median (range) of the seeds that get there,
      [how many of the seeds]).
    """
    head = ["β", "heads", "mask"] + [f"clusters at t = {w:g}" for w in VARIANT_TIMES] + [
        "first t with ≤ 2 clusters", "first t with 1 cluster"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c, t, counts in variant_rows(res):
        cells = [f"{c['beta']:g}", f"{c.get('heads', 1):g}",
                 {"none": "full"}.get(c.get("mask", "none"), c.get("mask"))]
        cells += [count_spread(count_at(t, counts, w)) for w in VARIANT_TIMES]
        cells += [time_spread(first_time(t, counts, m)) for m in (2, 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def guide_variant_seeds(res) -> str:
    """The seeds of a variants run: "5 seeds (0–4)"."""
    seeds = variant_rows(res)[0][2]
    ids = next(iter(res["results"]["per_variant"].values()))["cluster_count_per_seed"]["seed"]
    if ids == list(range(ids[0], ids[0] + len(ids))) and len(ids) > 2:
        return f"{len(seeds)} seeds ({ids[0]}–{ids[-1]})"
    return f"{len(seeds)} seeds ({', '.join(str(i) for i in ids)})"


def _heads_words(h) -> str:
    return f"{h:g} head" + ("" if h == 1 else "s")


def variant_phrase(beta, mask, cell):
    """A renderer: ``cell(t, counts)`` of every head count at ``beta`` and ``mask``, joined.

    Returns:
      A function of the result: "cell (1 head), cell (4 heads), …".
    """
    def render(res):
        parts = [f"{cell(t, counts)} ({_heads_words(c.get('heads', 1))})"
                 for c, t, counts in variant_rows(res)
                 if c["beta"] == beta and c.get("mask", "none") == mask]
        if not parts:
            raise KeyError(f"no variant with β = {beta:g}, mask {mask}")
        return ", ".join(parts)
    return render


def variant_all_reach(beta, at_most):
    """A renderer: how many runs at ``beta`` (every variant and seed) get to ``at_most`` clusters.

    Returns:
      A function of the result: "every one of the n runs, by t = a–b" or "k of the n runs".
    """
    def render(res):
        times = [x for c, t, counts in variant_rows(res) if c["beta"] == beta
                 for x in first_time(t, counts, at_most)]
        hit = [x for x in times if x is not None]
        if len(hit) == len(times):
            return f"every one of the {len(times)} runs, at t = {min(hit):g}–{max(hit):g}"
        return f"{len(hit)} of the {len(times)} runs"
    return render


def _at(when):
    return lambda t, counts: count_spread(count_at(t, counts, when))


def _first(at_most):
    return lambda t, counts: time_spread(first_time(t, counts, at_most))


def guide_energy_steps(res) -> str:
    """Whether E_β decreased between saved frames: counts over every system and frame."""
    e = res["results"]["energy_steps"]
    if e["decreases"] == 0:
        return (f"never decreases between saved frames, on any of the {e['systems']} systems "
                f"({e['steps']} steps; none below −{e['rel_tol']:g} |E_β|, the rounding)")
    return (f"decreases between saved frames in {e['decreases']} of {e['steps']} steps over "
            f"{e['systems']} systems (largest relative decrease {e['largest_relative_decrease']:.2g})")


GUIDE_RENDERERS = {
    "run": guide_run, "variants_table": guide_variants_table, "seeds": guide_variant_seeds,
    "beta1_two": variant_all_reach(1.0, 2),
    "beta1_one_causal": variant_phrase(1.0, "causal", _first(1)),
    "beta1_one_full": variant_phrase(1.0, "none", _first(1)),
    "beta9_two_full": variant_phrase(9.0, "none", _first(2)),
    "beta9_two_causal": variant_phrase(9.0, "causal", _first(2)),
    "beta9_one": variant_all_reach(9.0, 1),
    "beta9_one_causal": variant_phrase(9.0, "causal", _first(1)),
    "beta9_t5_full": variant_phrase(9.0, "none", _at(5.0)),
    "beta9_t5_causal": variant_phrase(9.0, "causal", _at(5.0)),
    "beta9_t20_full": variant_phrase(9.0, "none", _at(20.0)),
    "beta9_t20_causal": variant_phrase(9.0, "causal", _at(20.0)), "table": guide_cluster_table, "one_cluster": guide_one_cluster,
    "pair_fraction": guide_pair_fraction, "cluster_count": guide_cluster_count,
    "rank_agreement": guide_rank_agreement, "frames_agreement": guide_frames_agreement,
    "systems": guide_systems, "engine_run": guide_engine_run, "energy_steps": guide_energy_steps,
}
