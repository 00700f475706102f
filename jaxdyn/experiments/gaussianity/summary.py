"""Kind ``gaussianity``: the summary (z-scores against the exact-Gaussian floor per layer)."""

from __future__ import annotations

import numpy as np

from .schema import KEY_METRICS, MODELS


def seeds(ds, cfg=None) -> list:
    """The seeds of a Dataset (its ``seed`` axis, else the config's one seed)."""
    if "seed" in ds.dims:
        return [int(s) for s in ds["seed"].values]
    return [int(cfg["seed"]) if cfg is not None else 0]


def select(ds, model, scale, seed=None):
    """The Dataset at one model, scale and seed (the values of those sweep axes; default the first seed)."""
    sel = {}
    if "model" in ds.dims:
        sel["model"] = model
    if "scale" in ds.dims:
        sel["scale"] = scale
    if "seed" in ds.dims:
        sel["seed"] = ds["seed"].values[0] if seed is None else seed
    return ds.sel(sel)


#: a layer is within the floor when its sliced W2, skewness and kurtosis z-scores are all <= this
Z_GAUSSIAN = 3.0


def summarize(cfg, ds):
    """The ``gaussianity`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`).

    Returns:
      ``encoder``, ``seeds`` and per ``"model, scale=s"``: per metric the value, floor mean and
      z-score of every layer, one row a seed (in the order of ``seeds``), and per seed the
      layers within the floor (``gaussian_layers_z_le_3``).
    """
    models = list(ds["model"].values) if "model" in ds.dims else [cfg["model"]]
    scales = list(ds["scale"].values) if "scale" in ds.dims else [cfg["scale"]]
    seed_list = seeds(ds, cfg)
    arch = cfg.get("architecture", "bert")
    out = {"encoder": {"bert": "a BERT-family checkpoint (default: the pretrained all-MiniLM-L6-v2); "
                               "'random' = the same architecture with BERT's random initialisation",
                       "modernbert": "ModernBERT-base's architecture with its published random "
                                     "initialisation (no pretrained checkpoint offline)",
                       "deit": "DeiT-tiny's architecture with timm's ViT random initialisation "
                               "(no pretrained checkpoint offline)"}[arch]
           + (f", {cfg['layers']} layers" if cfg.get("layers") else ""),
           "seeds": seed_list}
    for m in models:
        for s in scales:
            entry = {}
            for name in KEY_METRICS:
                if name not in ds:
                    continue
                rows = {"value": [], "floor_mean": [], "zscore": []}
                for sd in seed_list:
                    d = select(ds, m, s, sd if "seed" in ds.dims else None)
                    v, fm, fs = (np.asarray(d[name + x].values, float)
                                 for x in ("", "_floor_mean", "_floor_std"))
                    z = (v - fm) / np.where(fs > 0, fs, np.nan)
                    rows["value"].append(v.round(5).tolist())
                    rows["floor_mean"].append(fm.round(5).tolist())
                    rows["zscore"].append(np.round(z, 2).tolist())
                entry[name] = rows
            # Layers whose sliced W2, skewness and kurtosis all sit within Z_GAUSSIAN floor deviations.
            zs = [np.asarray(entry[n]["zscore"]) for n in ("sw2", "skew", "kurt") if n in entry]
            if zs:
                ok = np.all(np.stack(zs) <= Z_GAUSSIAN, axis=0)  # (seed, layer)
                entry["gaussian_layers_z_le_3"] = [[int(i) for i in np.flatnonzero(row)] for row in ok]
            out[f"{m}, scale={s:g}"] = entry
    return out


# ---------------------------------------------------------------- the guide's numbers
# (renderers of docs/results/gaussianity/*.json, :mod:`jaxdyn.experiments.guide_numbers`)

#: the metrics' names in the guide
METRIC_NAMES = {"sw2": "sliced W2", "skew": "skewness", "kurt": "kurtosis",
                "kurt_pc": "kurtosis, principal axes", "erank": "effective rank"}


def _points(res) -> list:
    """(model, scale) of the recorded run's points, in grid order."""
    out = []
    for key in res["results"]:
        if ", scale=" in key:
            m, s = key.split(", scale=")
            out.append((m, float(s)))
    return out


def _scales(res, model) -> list:
    return [s for m, s in _points(res) if m == model]


def guide_array(res, model, scale, metric, field="zscore"):
    """One metric of one (model, scale): an array (seed, layer), NaN where none was recorded."""
    rows = res["results"][f"{model}, scale={scale:g}"][metric][field]
    return np.array([[np.nan if x is None else x for x in row] for row in rows], float)


def _cells(a, digits=2) -> list:
    """Per layer (column of ``a``), the values over the seeds as mean (range)."""
    from ..guide_numbers import spread

    return [spread([None if not np.isfinite(x) else float(x) for x in col], digits) for col in a.T]


def departures(res, model, scale, metrics=("sw2", "skew", "kurt")) -> list:
    """Per seed, the first layer at which any of ``metrics`` has z > :data:`Z_GAUSSIAN` (None: none)."""
    z = np.stack([guide_array(res, model, scale, m) for m in metrics])  # (metric, seed, layer)
    out = []
    for row in np.any(z > Z_GAUSSIAN, axis=0):
        hit = np.flatnonzero(row)
        out.append(int(hit[0]) if hit.size else None)
    return out


def departure_all(res, model, scale, metrics=("sw2", "skew", "kurt")):
    """The first layer from which every seed is above the floor at that and every later layer.

    Returns:
      The layer (None where the last layer of some seed is within the floor).
    """
    z = np.stack([guide_array(res, model, scale, m) for m in metrics])
    above = np.all(np.any(z > Z_GAUSSIAN, axis=0), axis=0)  # per layer: every seed above
    first = None
    for layer in range(above.size - 1, -1, -1):
        if not above[layer]:
            break
        first = layer
    return first


def guide_departure_all(model, metrics=("sw2", "skew", "kurt")):
    """Per input scale, :func:`departure_all` in words ("layer 2", "none")."""
    def render(res):
        return "; ".join(
            f"s = {s:g}: " + ("none" if (x := departure_all(res, model, s, metrics)) is None
                              else f"layer {x}") for s in _scales(res, model))
    return render


def _departure_words(layers) -> str:
    """Per-seed first layers as "layer 2 in 4 of 5 seeds, layer 3 in 1"."""
    n = len(layers)
    counts = {}
    for x in layers:
        counts[x] = counts.get(x, 0) + 1
    parts = []
    for i, (x, c) in enumerate(sorted(counts.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))):
        what = "none" if x is None else f"layer {x}"
        parts.append(f"{what} in {c} of {n} seeds" if i == 0 else f"{what} in {c}")
    return ", ".join(parts)


def guide_table(model, scale):
    """The per-layer table of one (model, scale).

    Returns:
      A renderer: per layer the z-scores of the sliced W2, skewness and kurtosis (random
      directions and principal axes) and the effective rank, each the mean (range) over the seeds.
    """
    def render(res):
        names = [m for m in METRIC_NAMES if m in res["results"][f"{model}, scale={scale:g}"]]
        cols = [_cells(guide_array(res, model, scale, m, "value" if m == "erank" else "zscore"),
                       3 if m == "erank" else 2) for m in names]
        head = [f"{METRIC_NAMES[m]}{'' if m == 'erank' else ' z'}" for m in names]
        lines = ["| layer | " + " | ".join(head) + " |", "|---" * (len(names) + 1) + "|"]
        for layer, row in enumerate(zip(*cols)):
            lines.append(f"| {layer} | " + " | ".join(row) + " |")
        return "\n".join(lines)
    return render


def guide_sw2_by_scale(model):
    """Per layer and input scale, the sliced W2 z-score of ``model``: mean (range) over the seeds."""
    def render(res):
        scales = _scales(res, model)
        cols = [_cells(guide_array(res, model, s, "sw2")) for s in scales]
        lines = ["| layer | " + " | ".join(f"s = {s:g}" for s in scales) + " |",
                 "|---" * (len(scales) + 1) + "|"]
        for layer, row in enumerate(zip(*cols)):
            lines.append(f"| {layer} | " + " | ".join(row) + " |")
        return "\n".join(lines)
    return render


def guide_departure(model, metrics=("sw2", "skew", "kurt")):
    """Per input scale, the first layer at which ``metrics`` leave the floor (z > 3), over the seeds."""
    def render(res):
        return "; ".join(f"s = {s:g}: {_departure_words(departures(res, model, s, metrics))}"
                         for s in _scales(res, model))
    return render


def guide_departure_at(model, scale, metrics=("sw2", "skew", "kurt")):
    """At one input scale, the first layer at which ``metrics`` leave the floor, over the seeds."""
    def render(res):
        return _departure_words(departures(res, model, scale, metrics))
    return render


def guide_z_at(model, scale, metric, layer):
    """The z-score of ``metric`` at ``layer`` (negative: counted from the last): mean (range)."""
    def render(res):
        return _cells(guide_array(res, model, scale, metric))[layer]
    return render


def guide_erank(model, scale, digits=3):
    """The effective rank at the first and the last layer (``digits`` significant): mean (range) over the seeds."""
    def render(res):
        cells = _cells(guide_array(res, model, scale, "erank", "value"), digits)
        return f"{cells[0]} → {cells[-1]}"
    return render


def guide_erank_by_scale(model):
    """Per input scale, the effective rank at the first and the last layer."""
    def render(res):
        return "; ".join(f"{guide_erank(model, s)(res)} at s = {s:g}" for s in _scales(res, model))
    return render


def guide_zmax(model, metric):
    """Per seed the largest |z| of ``metric`` over every layer and scale: mean (range)."""
    def render(res):
        from ..guide_numbers import spread

        a = np.concatenate([guide_array(res, model, s, metric) for s in _scales(res, model)], axis=1)
        return spread(np.nanmax(np.abs(a), axis=1).tolist(), 2)
    return render


def guide_zrange(model, metric):
    """The z-scores of ``metric`` over every layer, scale and seed: smallest to largest."""
    def render(res):
        from ..guide_numbers import num

        a = np.concatenate([guide_array(res, model, s, metric) for s in _scales(res, model)], axis=1)
        return f"{num(np.nanmin(a), 2)} to {num(np.nanmax(a), 2)}"
    return render


def guide_zmin_after_input(model, metric):
    """Per seed the smallest z of ``metric`` over the layers after the input and every scale."""
    def render(res):
        from ..guide_numbers import spread

        a = np.concatenate([guide_array(res, model, s, metric)[:, 1:] for s in _scales(res, model)],
                           axis=1)
        return spread(np.nanmin(a, axis=1).tolist(), 2)
    return render


def guide_input_zmax(model, metrics=("sw2", "skew", "kurt", "kurt_pc")):
    """The z-scores an exact Gaussian cloud reaches: those of the input (layer 0).

    Returns:
      A renderer: per seed the largest |z| of ``metrics`` at layer 0 over every scale, as the
      mean (range) over the seeds.
    """
    def render(res):
        from ..guide_numbers import spread

        a = np.stack([guide_array(res, model, s, m)[:, 0] for s in _scales(res, model)
                      for m in metrics], axis=1)  # (seed, scale × metric)
        return spread(np.nanmax(np.abs(a), axis=1).tolist(), 2)
    return render


def guide_within(model):
    """How many (seed, scale, layer) states have sliced W2, skewness and kurtosis z all <= 3."""
    def render(res):
        ok = n = 0
        for s in _scales(res, model):
            z = np.stack([guide_array(res, model, s, m) for m in ("sw2", "skew", "kurt")])
            ok += int(np.sum(np.all(z <= Z_GAUSSIAN, axis=0)))
            n += z[0].size
        return f"{ok} of {n}"
    return render


def guide_run(res) -> str:
    """The run's size and cost: seeds, grid points, tokens, CPU and wall seconds, the machine."""
    from ..guide_numbers import run_cost

    seed_list = res["results"]["seeds"]
    pts = len(_points(res))
    return (f"{len(seed_list)} seeds × {pts} grid point{'s' if pts > 1 else ''}; "
            f"{run_cost(res['meta'])}")


def _guide_renderers() -> dict:
    out = {"run": guide_run}
    for m in MODELS:
        out[f"departure_{m}"] = guide_departure(m)
        out[f"departure_pc_{m}"] = guide_departure(m, ("kurt_pc",))
        out[f"departure_all_{m}"] = guide_departure_all(m)
        out[f"departure_all_pc_{m}"] = guide_departure_all(m, ("kurt_pc",))
        out[f"sw2_by_scale_{m}"] = guide_sw2_by_scale(m)
        out[f"erank_{m}"] = guide_erank_by_scale(m)
        out[f"within_{m}"] = guide_within(m)
        out[f"input_zmax_{m}"] = guide_input_zmax(m)
        for metric in ("sw2", "skew", "kurt", "kurt_pc"):
            out[f"zmax_{m}_{metric}"] = guide_zmax(m, metric)
            out[f"zrange_{m}_{metric}"] = guide_zrange(m, metric)
            out[f"zmin_{m}_{metric}"] = guide_zmin_after_input(m, metric)
        for s in (0.5, 1.0, 2.0):
            tag = f"{m}_s{s:g}"
            out[f"table_{tag}"] = guide_table(m, s)
            out[f"erank_{tag}"] = guide_erank(m, s)
            out[f"erank_fine_{tag}"] = guide_erank(m, s, 5)
            out[f"departure_{tag}"] = guide_departure_at(m, s)
            out[f"departure_pc_{tag}"] = guide_departure_at(m, s, ("kurt_pc",))
            for metric in ("sw2", "skew", "kurt", "kurt_pc"):
                for layer in range(7):
                    out[f"z_{tag}_{metric}_layer{layer}"] = guide_z_at(m, s, metric, layer)
                out[f"z_{tag}_{metric}_last"] = guide_z_at(m, s, metric, -1)
    return out


GUIDE_RENDERERS = _guide_renderers()
