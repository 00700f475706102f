"""Kind ``variants``: config fields, cross-field checks and memory estimates."""

from __future__ import annotations

import math

from ...choices import PLACEMENTS, SDE_METHODS  # the library's (no JAX)
from ...config import ConfigError, Field, at_least, nonnegative, positive
from .. import sphere_fields as sc

DEPTH_SCHEMA = {
    "source": Field("str", "constant", "where each layer's weights come from: constant (the "
                    "weights section, one layer), redraw (a fresh draw of the weights ensemble "
                    "every period), minilm (the 6 trained layers of all-MiniLM-L6-v2, d = 384)",
                    choices=("constant", "redraw", "minilm")),
    "period": Field("float", 1.0, "time each layer acts (redraw, minilm)", check=positive),
    "heads": Field("int", 1, "heads a layer (constant, redraw: independent draws, V_h scaled "
                   "by 1/H as simuformer sums heads)", check=at_least(1)),
    "biases": Field("bool", False, "minilm: keep the query-bias logit term and the value/output "
                    "bias drift (docs/math.md §H.2); default: the pure bilinear heads"),
}

SCHEMA = {
    **sc.SPHERE_FIELDS,
    "norm": Field("str", "postln", "LayerNorm placement", choices=PLACEMENTS, sweepable=True),
    "alpha": Field("float", 0.2, "nGPT step size α", check=positive),
    "sigma": Field("float", 0.0, "noise level σ >= 0", check=nonnegative, sweepable=True),
    "noise_method": Field("str", "geodesic_em", "SDE scheme when σ > 0", choices=SDE_METHODS),
    "depth": Field("section", {}, "per-layer weights", schema=DEPTH_SCHEMA),
    "head": Field("int", -1, "-1: all heads; h >= 0: only head h of every layer",
                  check=at_least(-1), sweepable=True),
    "init_tokens": Field("bool", False, "depth.source minilm: start from MiniLM's embeddings of "
                         "n random token ids (normalised) instead of the init section"),
    "single_cluster_ip": Field("float", 0.9, "a single cluster: mean pairwise inner product "
                               "above this", check=lambda v: None if 0 < v < 1 else
                               "must be in (0, 1)"),
}

BATCH_AXES = ("beta", "seed", "sigma")


def n_layers(pc) -> int:
    """The number of distinct layers of a point (1 for constant weights, 6 for MiniLM)."""
    src = pc["depth"]["source"]
    if src == "constant":
        return 1
    if src == "minilm":
        return 6
    return max(1, math.ceil(pc["t1"] / pc["depth"]["period"] - 1e-9))


def segment_steps(pc):
    """Steps per layer segment (the whole run for constant weights)."""
    if pc["depth"]["source"] == "constant":
        return None
    r = pc["depth"]["period"] / pc["dt"]
    return int(round(r))


def check(cfg):
    """Cross-field checks of a ``variants`` config (:meth:`~jaxdyn.experiments.ExperimentKind.check`)."""
    warns = [w for w in sc.check_sphere(cfg) if "too small to resolve" not in w]
    depth = cfg["depth"]
    ds = cfg["sweep"].get("d", [cfg["d"]])
    if depth["source"] == "minilm" and any(d != 384 for d in ds):
        raise ConfigError("config field 'd': depth.source minilm drives particles in R^384 "
                          f"(MiniLM's hidden size); set d: 384, got {ds}")
    if depth["source"] != "constant":
        r = depth["period"] / cfg["dt"]
        if abs(r - round(r)) > 1e-9 * max(1.0, r) or cfg["save_every"] < 1 or round(r) % cfg["save_every"]:
            raise ConfigError("config fields 'depth.period'/'dt'/'save_every': a layer must be a "
                              f"whole number of saved steps (period/dt = {r:g}, save_every = "
                              f"{cfg['save_every']})")
    if depth["source"] == "minilm":
        from ...encoder_host import find_minilm

        try:  # before the run, not at its first chunk
            find_minilm()
        except (FileNotFoundError, ImportError) as e:
            raise ConfigError(f"config field 'depth.source': minilm needs the pretrained weights: "
                              f"{' '.join(str(e).split())}") from None
    if cfg["init_tokens"] and depth["source"] != "minilm":
        raise ConfigError("config field 'init_tokens': needs depth.source minilm")
    heads = cfg["sweep"].get("head", [cfg["head"]])
    nh = 12 if depth["source"] == "minilm" else depth["heads"]
    if any(h >= nh for h in heads):
        raise ConfigError(f"config field 'head': the layers have {nh} heads, got {heads}")
    if cfg["method"] == "euler_renormalise":
        raise ConfigError("config field 'method': euler_renormalise is not available for the "
                          "variants kind (pre-/peri-LN states are not on the sphere)")
    return warns


def process_split(cfg):
    """Several processes share the chunks' points: each computes its own on its own devices."""
    return "points"


def estimate_bytes(pc):
    """Memory of one ``variants`` grid point (:meth:`~jaxdyn.experiments.ExperimentKind.estimate_bytes`)."""
    item = 8 if pc["dtype"] == "float64" else 4
    n, d = pc["n"], pc["d"]
    frames = len(sc.save_times(pc))
    heads = 12 if pc["depth"]["source"] == "minilm" else pc["depth"]["heads"]
    # points run one after another, one layer's model at a time (MiniLM's 6 layers, 50 MB in
    # float32, are loaded once per process, not per point)
    weights = heads * 3 * d * d * item
    return frames * n * d * item + 12 * n * d * item + 3 * heads * n * n * item + weights


def output_bytes(pc):
    """What one ``variants`` grid point adds to the Dataset (:meth:`~jaxdyn.experiments.ExperimentKind.output_bytes`)."""
    return sc.output_bytes(pc, per_frame_values=2, snapshots=1)
