"""Experiment kind ``gaussianity``: Paper B's measurement on a real pretrained encoder.

i.i.d. Gaussian token embeddings h0 = s·Z (batch × seq × hidden) go straight into layer 0 of a
BERT-family encoder (the pretrained all-MiniLM-L6-v2 by default), and after each layer the
pooled hidden-state cloud is compared with the Gaussian of the same mean and covariance:
sliced W2 (normalised by scale), skewness and excess kurtosis along random directions and
principal axes, a radial W2, the effective rank of the covariance, and the Bures distance
between consecutive layers — each beside its Monte-Carlo noise floor (the same statistic on
exact Gaussian samples of the same size and covariance). Controls: the same architecture with
random weights, and a deliberately non-Gaussian map (``model: nongaussian``).
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import numpy as np

from ..config import ConfigError, Field, at_least, positive

MODELS = ("pretrained", "random", "nongaussian")
KEY_METRICS = ("sw2", "skew", "kurt", "kurt_pc", "radial_w2", "erank", "bures_rel")

SCHEMA = {
    "model": Field("str", "pretrained", "encoder weights", choices=MODELS, sweepable=True),
    "model_path": Field("str", None, "folder with config.json + model.safetensors (default: the "
                        "installed all-MiniLM-L6-v2 package)"),
    "control_kind": Field("str", "cube", "non-Gaussian control map", choices=("cube", "relu", "split")),
    "scale": Field("float", 1.0, "input scale s: h0 = s·Z", check=positive, sweepable=True),
    "seed": Field("int", 0, "seed of inputs, random weights and directions", sweepable=True),
    "batch": Field("int", 64, "sequences", check=at_least(1)),
    "seq": Field("int", 128, "tokens per sequence", check=at_least(2)),
    "n_dirs": Field("int", 128, "random directions for sliced statistics", check=at_least(1)),
    "n_floor": Field("int", 8, "exact-Gaussian replicates for the noise floor", check=at_least(2)),
    "n_pc": Field("int", 8, "principal axes for skewness/kurtosis", check=at_least(1)),
}

BATCH_AXES = ()


def _path(cfg):
    from ..encoder._bert import find_minilm

    if cfg["model_path"]:
        p = Path(cfg["model_path"])
        if not (p / "config.json").exists():
            raise ConfigError(f"config field 'model_path': {p} holds no config.json")
        return p
    try:
        return find_minilm()
    except Exception as e:  # FileNotFoundError / ImportError with the install command
        raise ConfigError(f"config field 'model_path': no local model given and {e}") from None


@functools.lru_cache(maxsize=4)
def _load(path: str):
    from ..encoder._bert import load_bert

    return load_bert(path, embeddings=False)


def check(cfg):
    models = cfg["sweep"].get("model", [cfg["model"]])
    _path(cfg)  # the architecture is needed for every model kind
    return []


def estimate_bytes(pc):
    params, bcfg = _load(str(_path(pc)))
    n = pc["batch"] * pc["seq"]
    h = bcfg.hidden_size
    layers = bcfg.num_hidden_layers + 1
    param_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(params))
    return 4 * (layers * n * h * 3 + n * bcfg.intermediate_size + pc["batch"] * pc["seq"] ** 2 *
                bcfg.num_attention_heads) + 2 * param_bytes


def run_points(pcs):
    from ..encoder._bert import encode, random_like
    from ..encoder._gaussianity import gaussian_tokens, gaussianity_profile, nongaussian_stack

    rows = []
    for pc in pcs:
        params, bcfg = _load(str(_path(pc)))
        k_in, k_w, k_c, k_p = jax.random.split(jax.random.PRNGKey(pc["seed"]), 4)
        h0 = gaussian_tokens(k_in, pc["batch"], pc["seq"], bcfg.hidden_size, pc["scale"])
        if pc["model"] == "pretrained":
            hs = encode(params, bcfg, h0)
        elif pc["model"] == "random":
            hs = encode(random_like(params, k_w), bcfg, h0)
        else:
            hs = nongaussian_stack(h0, k_c, n_layers=bcfg.num_hidden_layers, kind=pc["control_kind"])
        prof = gaussianity_profile(hs, k_p, n_dirs=pc["n_dirs"], n_floor=pc["n_floor"], n_pc=pc["n_pc"])
        rows.append(prof)
    names = sorted(rows[0].values)
    vars_ = {}
    for name in names:
        dim = "step" if rows[0].values[name].shape[0] == len(hs) - 1 else "layer"
        for suffix, get in (("", lambda p: p.values[name]), ("_floor_mean", lambda p: p.floor_mean[name]),
                            ("_floor_std", lambda p: p.floor_std[name])):
            vars_[name + suffix] = ((dim,), np.stack([np.asarray(get(p)) for p in rows]))
    finite = np.array([all(np.all(np.isfinite(np.asarray(v))) for v in p.values.values()) for p in rows])
    vars_["finite"] = ((), finite)
    L = len(hs) - 1
    coords = {"layer": np.arange(L + 1), "step": np.arange(1, L + 1)}
    return vars_, coords


def _sel(ds, model, scale):
    sel = {}
    if "model" in ds.dims:
        sel["model"] = model
    if "scale" in ds.dims:
        sel["scale"] = scale
    if "seed" in ds.dims:
        sel["seed"] = ds["seed"].values[0]
    return ds.sel(sel)


def summarize(cfg, ds):
    models = list(ds["model"].values) if "model" in ds.dims else [cfg["model"]]
    scales = list(ds["scale"].values) if "scale" in ds.dims else [cfg["scale"]]
    out = {}
    for m in models:
        for s in scales:
            d = _sel(ds, m, s)
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


def plot(cfg, ds, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..plots import _save

    models = list(ds["model"].values) if "model" in ds.dims else [cfg["model"]]
    scales = list(ds["scale"].values) if "scale" in ds.dims else [cfg["scale"]]
    names = [n for n in KEY_METRICS if n in ds]
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.6))
    styles = ["-", "--", ":", "-."]
    colors = {"pretrained": "C0", "random": "C1", "nongaussian": "C3"}
    for ax, name in zip(np.atleast_1d(axes), names):
        dim = ds[name].dims[-1]
        x = ds[dim].values
        for si, s in enumerate(scales):
            for m in models:
                d = _sel(ds, m, s)
                ax.plot(x, d[name].values, styles[si % 4], color=colors.get(str(m), "k"), lw=1.4,
                        label=f"{m}, s={s:g}")
            d = _sel(ds, models[0], s)
            fm, fs = d[name + "_floor_mean"].values, d[name + "_floor_std"].values
            ax.fill_between(x, fm - 2 * fs, fm + 2 * fs, color="0.5", alpha=0.25 if si == 0 else 0.12,
                            lw=0)
        ax.set_title(name + (" (step l-1→l)" if dim == "step" else ""))
        ax.set_xlabel(dim)
        ax.grid(alpha=0.3)
        if name in ("kurt", "skew", "sw2", "kurt_pc", "radial_w2"):
            ax.set_yscale("symlog", linthresh=1e-2)
    np.atleast_1d(axes)[0].legend(fontsize=6)
    fig.suptitle(f"{cfg['name']}: distance from the moment-matched Gaussian per layer "
                 "(grey: exact-Gaussian noise floor ± 2 sd)")
    return [_save(fig, Path(out_dir) / "gaussianity.png")]
