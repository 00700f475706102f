"""Kind ``gaussianity``: config fields, the model check, memory estimates, the encoder weights.

The weights of a local checkpoint are loaded once per process.
"""

from __future__ import annotations

import functools
from pathlib import Path

from ...config import ConfigError, Field, at_least, positive


MODELS = ("pretrained", "random", "nongaussian")


KEY_METRICS = ("sw2", "skew", "kurt", "kurt_pc", "radial_w2", "erank", "bures_rel")


ARCHITECTURES = ("bert", "modernbert", "deit")


SCHEMA = {
    "architecture": Field("str", "bert", "encoder: 'bert' (a local BERT-family checkpoint, default "
                          "all-MiniLM-L6-v2) or Paper B's own 'modernbert' (ModernBERT-base) and "
                          "'deit' (DeiT-tiny), which have no offline checkpoint: random weights only",
                          choices=ARCHITECTURES),
    "layers": Field("int", None, "number of layers of modernbert/deit (default: the published 22 / 12)",
                    check=at_least(1)),
    "model": Field("str", "pretrained", "encoder weights", choices=MODELS, sweepable=True),
    "model_path": Field("str", None, "folder with config.json + model.safetensors (default: the "
                        "installed all-MiniLM-L6-v2 package)"),
    "control_kind": Field("str", "cube", "non-Gaussian control map", choices=("cube", "relu", "split")),
    "scale": Field("float", 1.0, "input scale s: h0 = s·Z", check=positive, sweepable=True),
    "seed": Field("int", 0, "seed of inputs, random weights and directions", sweepable=True),
    "batch": Field("int", 64, "sequences", check=at_least(1)),
    "seq": Field("int", 128, "tokens per sequence", check=at_least(2)),
    "n_dirs": Field("int", 128, "random directions for sliced statistics", check=at_least(1)),
    "n_floor": Field("int", 8, "exact-Gaussian replicates for the noise floor (>= 3)", check=at_least(3)),
    "n_pc": Field("int", 8, "principal axes for skewness/kurtosis", check=at_least(1)),
}


BATCH_AXES = ()


def model_path(cfg):
    """The checkpoint folder of a ``bert`` config: ``model_path``, else the installed MiniLM.

    Args:
      cfg: a (point) config.

    Returns:
      The folder.

    Raises:
      ConfigError: ``model_path`` holds no ``config.json``, or no checkpoint is installed.
    """
    from ...encoder_host import find_minilm

    if cfg["model_path"]:
        p = Path(cfg["model_path"])
        if not (p / "config.json").exists():
            raise ConfigError(f"config field 'model_path': {p} holds no config.json")
        return p
    try:
        return find_minilm()
    except Exception as e:  # FileNotFoundError / ImportError with the install command
        raise ConfigError(f"config field 'model_path': no local model given and "
                          f"{' '.join(str(e).split())}") from None


@functools.lru_cache(maxsize=4)
def load_model(path: str):
    """The (params, config) of the checkpoint at ``path``, without embeddings (cached)."""
    from ...encoder import load_bert

    return load_bert(path, embeddings=False)


def arch_config(cfg):
    """The ModernBertConfig / DeitConfig of a 'modernbert' / 'deit' config.

    Args:
      cfg: a (point) config.

    Returns:
      The published sizes, ``layers`` overriding the depth.
    """
    from ...encoder import DeitConfig, ModernBertConfig

    cls = ModernBertConfig if cfg["architecture"] == "modernbert" else DeitConfig
    return cls() if cfg["layers"] is None else cls(num_hidden_layers=cfg["layers"])


def check(cfg):
    """Cross-field checks of a ``gaussianity`` config (:meth:`~jaxdyn.experiments.ExperimentKind.check`)."""
    models = cfg["sweep"].get("model", [cfg["model"]])
    if cfg["architecture"] != "bert":
        if "pretrained" in models:
            raise ConfigError(f"config field 'model': architecture '{cfg['architecture']}' has no offline "
                              "pretrained checkpoint here (no package ships one); use model: random "
                              "(its published initialisation) or nongaussian — the pretrained "
                              "comparison is all-MiniLM-L6-v2's (architecture: bert)")
        if cfg["model_path"]:
            raise ConfigError(f"config field 'model_path': architecture '{cfg['architecture']}' loads no "
                              "checkpoint; remove model_path")
        return []
    if cfg["layers"] is not None:
        raise ConfigError("config field 'layers': only for architecture modernbert or deit")
    model_path(cfg)  # the architecture is needed for every model kind
    return []


def process_split(cfg):
    """Several processes share the chunks' points: each computes its own on its own devices."""
    return "points"


def estimate_bytes(pc):
    """Memory of one ``gaussianity`` grid point (:meth:`~jaxdyn.experiments.ExperimentKind.estimate_bytes`)."""
    if pc["architecture"] != "bert":
        a = arch_config(pc)
        n = pc["batch"] * pc["seq"]
        L, h, f = a.num_hidden_layers, a.hidden_size, a.intermediate_size
        params = L * (4 * h * h + 3 * h * f)
        return 4 * ((L + 1) * n * h * 3 + n * (3 * h + 2 * f) + pc["batch"] * pc["seq"] ** 2 *
                    a.num_attention_heads * 2) + 8 * params
    params, bcfg = load_model(str(model_path(pc)))
    n = pc["batch"] * pc["seq"]
    h = bcfg.hidden_size
    layers = bcfg.num_hidden_layers + 1
    import jax

    param_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(params))
    return 4 * (layers * n * h * 3 + n * bcfg.intermediate_size + pc["batch"] * pc["seq"] ** 2 *
                bcfg.num_attention_heads) + 2 * param_bytes


def output_bytes(pc):
    """What one ``gaussianity`` point adds to the Dataset: each metric's profile, floor mean and spread per layer."""
    return 8 * 3 * 32 * 64
