"""Kind ``gaussianity``: the summary (z-scores against the exact-Gaussian floor per layer)."""

from __future__ import annotations

import numpy as np

from .schema import KEY_METRICS


def select(ds, model, scale):
    """The Dataset at one model and scale (the values of those sweep axes) and the first seed."""
    sel = {}
    if "model" in ds.dims:
        sel["model"] = model
    if "scale" in ds.dims:
        sel["scale"] = scale
    if "seed" in ds.dims:
        sel["seed"] = ds["seed"].values[0]
    return ds.sel(sel)


def summarize(cfg, ds):
    """The ``gaussianity`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`)."""
    models = list(ds["model"].values) if "model" in ds.dims else [cfg["model"]]
    scales = list(ds["scale"].values) if "scale" in ds.dims else [cfg["scale"]]
    arch = cfg.get("architecture", "bert")
    out = {"encoder": {"bert": "a BERT-family checkpoint (default: the pretrained all-MiniLM-L6-v2); "
                               "'random' = the same architecture with BERT's random initialisation",
                       "modernbert": "ModernBERT-base's architecture with its published random "
                                     "initialisation (no pretrained checkpoint offline)",
                       "deit": "DeiT-tiny's architecture with timm's ViT random initialisation "
                               "(no pretrained checkpoint offline)"}[arch]
           + (f", {cfg['layers']} layers" if cfg.get("layers") else "")}
    for m in models:
        for s in scales:
            d = select(ds, m, s)
            entry = {}
            for name in KEY_METRICS:
                if name not in d:
                    continue
                v, fm, fs = (np.asarray(d[name + x].values, float) for x in ("", "_floor_mean", "_floor_std"))
                z = (v - fm) / np.where(fs > 0, fs, np.nan)
                entry[name] = {"value": v.round(5).tolist(), "floor_mean": fm.round(5).tolist(),
                               "zscore": np.round(z, 2).tolist()}
            # Layers whose sliced W2, skewness and kurtosis all sit within 3 floor deviations.
            zs = [np.asarray(entry[n]["zscore"]) for n in ("sw2", "skew", "kurt") if n in entry]
            if zs:
                ok = np.all(np.stack(zs) <= 3.0, axis=0)
                entry["gaussian_layers_z_le_3"] = [int(i) for i in np.flatnonzero(ok)]
            out[f"{m}, scale={s:g}"] = entry
    return out
