"""The config of the sphere experiment kinds (``sphere``, ``concentration``, ``variants``).

Their common fields, the ``weights`` section built into (Q, K, V), the cross-field checks (the
resolution check N ≳ β^{(d−1)/2}) and the memory estimates — importing no JAX at module level,
so that ``jaxdyn config`` checks a config without loading it (the estimates load it when
called). The choices of the library's models (masks, attentions, kernels) come from
:mod:`jaxdyn.choices`, the JAX-free module the library itself imports them from.
:mod:`.sphere_common` re-exports everything here beside the models and clouds of a chunk.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

from .. import weights as weight_ensembles
from ..choices import ATTENTIONS, KERNELS, MASKS, NORMALIZATIONS  # the library's (no JAX)
from ..config import ConfigError, Field, at_least, nonnegative, open_unit, positive


def x64_enabled() -> bool:
    """JAX's x64 mode without loading JAX.

    Returns:
      Its flag once JAX is imported, else the ``JAX_ENABLE_X64`` variable JAX will read when it
      loads.
    """
    if "jax" in sys.modules:
        return bool(sys.modules["jax"].config.jax_enable_x64)
    return os.environ.get("JAX_ENABLE_X64", "").strip().lower() in ("1", "true", "yes", "on", "t", "y")


def check_dtype(cfg):
    """A float64 config needs x64 mode (a config error otherwise)."""
    if cfg["dtype"] == "float64" and not x64_enabled():
        raise ConfigError("config field 'dtype': float64 needs JAX's x64 mode; set the environment "
                          "variable JAX_ENABLE_X64=1 (the CLI does this for float64 configs)")


# Fields a ``weights`` section may hold (each ensemble uses some of them).
WEIGHTS_SCHEMA = {
    "ensemble": Field("str", "identity", "name of a weight ensemble"),
    "seed": Field("int", 0, "seed of random ensembles"),
    "scale": Field("float", 1.0, "overall scale of random ensembles", check=positive),
    "sign": Field("float", 1.0, "sign for V = ±KᵀQ"),
    "Q": Field("matrix", None, "explicit Q (d×d list of rows)"),
    "K": Field("matrix", None, "explicit K"),
    "V": Field("matrix", None, "explicit V"),
    "mu": Field("list", None, "spectrum of M = VBᵀ (spectral ensemble), largest first", item="float"),
    "rotation": Field("float", None, "angle (rad) of the rotation B (spectral ensemble)"),
    "eigenspace_angle_deg": Field("float", None, "spectral ensemble: rotate B so that E(VBᵀ) and "
                                  "E(V) are this many degrees apart"),
    "plane": Field("list", None, "eigenvector pair (i, j) of the rotation B (spectral ensemble; "
                   "default: largest and smallest eigenvalue)", item="int"),
    "random_basis": Field("bool", False, "spectral ensemble: Haar-random eigenvectors from seed"),
    "extra": Field("section", {}, "ensemble-specific options"),
}

_WEIGHTS: dict = {}  # (section, d) -> (Q, K, V): a run asks several times


def build_weights(spec, d):
    """(Q, K, V) of a validated ``weights`` section, float64 NumPy, built without JAX.

    Remembered per section and d (callers get copies): the check, the models and the summary of
    one run build the same weights (the spectral ensemble's angle search costs about a second).

    Args:
      spec: the ``weights`` section.
      d: the dimension.

    Returns:
      (Q, K, V).

    Raises:
      ConfigError: a bad section (the weight builder's message).
    """
    import json

    key = (json.dumps(spec, sort_keys=True, default=repr), int(d))
    if key not in _WEIGHTS:
        try:
            qkv = weight_ensembles.build_weights(spec, d)
        except weight_ensembles.WeightsError as e:
            raise ConfigError(str(e)) from None
        if len(_WEIGHTS) >= 32:
            _WEIGHTS.pop(next(iter(_WEIGHTS)))
        _WEIGHTS[key] = qkv
    return tuple(a.copy() if isinstance(a, np.ndarray) else a for a in _WEIGHTS[key])


INIT_SCHEMA = {
    "dist": Field("str", "uniform", "initial law", choices=("uniform", "vmf", "mixture")),
    "kappa": Field("float", 4.0, "vMF concentration", check=positive),
    "weight": Field("float", 0.5, "vMF weight of the mixture, in [0, 1)",
                    check=lambda v: None if 0 <= v < 1 else "must be in [0, 1)"),
    "mu": Field("list", None, "mean direction (d numbers)", item="float"),
}

SPHERE_FIELDS = {
    "d": Field("int", 3, "ambient dimension (particles on S^(d-1)), >= 2", check=at_least(2),
               sweepable=True),
    "n": Field("int", 1024, "number of particles N >= 1", check=at_least(1), sweepable=True),
    "beta": Field("float", 1.0, "inverse temperature β > 0", check=positive, sweepable=True),
    "seed": Field("int", 0, "seed of the initial particles", sweepable=True),
    # t1 and dt are not sweepable: the saved times would differ between grid points, and the
    # merged dataset, its summaries and figures have one time axis (a sweep over t1 would put
    # frame indices where times belong)
    "t1": Field("float", 10.0, "final time > 0 (not sweepable: one time axis per run)",
                check=positive),
    "dt": Field("float", 0.05, "time step > 0 (not sweepable: one time axis per run)",
                check=positive),
    "method": Field("str", "rk4", "integrator", choices=("euler", "rk4", "exp_euler",
                                                                   "euler_renormalise")),
    "save_every": Field("int", 5, "steps between saved states, >= 1", check=at_least(1)),
    "dtype": Field("str", "float32", "floating type", choices=("float32", "float64")),
    "kernel": Field("str", "auto", "attention kernel", choices=KERNELS),
    "normalization": Field("str", "softmax", "attention weights", choices=NORMALIZATIONS),
    "k_block": Field("int", None, "key block of the blocked kernel (default: tuned per platform)",
                     check=at_least(1)),
    "q_block": Field("int", None, "query block of the blocked kernel (default: tuned per platform)",
                     check=at_least(1)),
    "tol": Field("float", 1e-6, "the local kernel's certified error bound, relative to the "
                 "largest |x_j| (kernel local, or auto where it takes the local kernel)",
                 check=open_unit),
    "weights": Field("section", {}, "Q, K, V ensemble", schema=WEIGHTS_SCHEMA),
    "init": Field("section", {}, "initial distribution", schema=INIT_SCHEMA),
    "ensemble": Field("bool", True, "integrate chunks of small systems (N <= 48, softmax or "
                      "unnormalised, fixed step) with simulate_ensemble; false: vmap(simulate)"),
}


# ---- attention variants: heads, masks, positions, attention weights -------------------
# Fields of the sphere kind (not of concentration); a point with their defaults runs the
# plain SphereAttention exactly as before, any other value a MultiHeadAttention.
POSITIONS = ("none", "alibi", "rope")
VARIANT_FIELDS = {
    "heads": Field("int", 1, "attention heads H >= 1, V_h = V/H (so H identical heads = one head)",
                   check=at_least(1), sweepable=True),
    "heads_spread": Field("float", 0.0, "per-head weights Q_h = Q + s G_h/sqrt(d), K_h = K + s "
                          "G'_h/sqrt(d), G i.i.d. N(0, 1) seeded by (weights.seed, h); 0: "
                          "identical heads", check=nonnegative),
    "mask": Field("str", "none", "attention mask: none | causal (particle i attends to j <= i; "
                  "the particle index is the position)", choices=MASKS, sweepable=True),
    "positions": Field("str", "none", "positions: none | alibi (logit bias -m_h |i - j|) | rope "
                       "(rotary embedding of Q x_i, K x_j)", choices=POSITIONS, sweepable=True),
    "alibi_slope": Field("float", 0.1, "ALiBi: the slope of head h is alibi_slope * 2^(-8h/H)",
                         check=nonnegative),
    "rope_base": Field("float", 10000.0, "RoPE: frequencies rope_base^(-2c/d)", check=positive),
    "attention": Field("str", "softmax", "attention weights: softmax | l2 (logits -β|Qx_i - "
                       "Kx_j|^2) | sinkhorn (doubly stochastic)", choices=ATTENTIONS,
                       sweepable=True),
    "sinkhorn_iters": Field("int", 5, "Sinkhorn sweeps a field evaluation (attention: sinkhorn)",
                            check=at_least(1)),
}
VARIANT_DEFAULTS = {"heads": 1, "heads_spread": 0.0, "mask": "none", "positions": "none",
                     "attention": "softmax"}


def is_variant(pc) -> bool:
    """Whether a point needs :class:`~jaxdyn.MultiHeadAttention` (any variant field set)."""
    return any(pc.get(k, v) != v for k, v in VARIANT_DEFAULTS.items())


def check_variants(cfg):
    """Cross-field checks of the attention-variant fields (config errors)."""
    pts = [dict(cfg, **{k: v}) for k, vals in cfg["sweep"].items() if k in VARIANT_DEFAULTS
           for v in vals] + [cfg]
    if any(is_variant(p) for p in pts) and cfg["normalization"] != "softmax":
        raise ConfigError("config field 'normalization': the attention variants (heads, mask, "
                          "positions, attention) take normalization: softmax")
    masks = set(cfg["sweep"].get("mask", [cfg["mask"]]))
    if "causal" in masks and "sinkhorn" in cfg["sweep"].get("attention", [cfg["attention"]]):
        raise ConfigError("config fields 'mask'/'attention': Sinkhorn attention takes no causal "
                          "mask (a lower-triangular doubly stochastic matrix is the identity)")


def check_sphere(cfg) -> list:
    """Cross-field checks (config errors) and warnings common to sphere kinds."""
    warns = []
    d = cfg["d"]
    ds_ = cfg["sweep"].get("d", [d])
    mu = cfg["init"].get("mu")
    bad = [dd for dd in ds_ if mu is not None and len(mu) != dd]
    if bad:  # name the d that does not fit (under a sweep over d the base d may fit)
        where = f"d = {bad[0]}" + (" in sweep.d" if "d" in cfg["sweep"] else "")
        raise ConfigError(f"config field 'init.mu': expected {bad[0]} numbers ({where}), got "
                          f"{len(mu)}")
    if mu is not None and not math.fsum(v * v for v in mu) > 0:
        raise ConfigError(f"config field 'init.mu': the mean direction must be a non-zero vector "
                          f"(it is normalised), got {mu}")
    for dd in ds_:
        build_weights(cfg["weights"], dd)  # raises on bad shapes
    betas = cfg["sweep"].get("beta", [cfg["beta"]])
    ns = cfg["sweep"].get("n", [cfg["n"]])
    if cfg["normalization"] != "hardmax":
        for dd in ds_:
            need = required_particles(max(betas), dd)
            if min(ns) < need:
                warns.append(
                    f"N = {min(ns)} is too small to resolve β = {max(betas):g} on S^{dd - 1}: the "
                    f"particle system follows the mean-field equation only while "
                    f"N ≳ β^((d-1)/2) ≈ {need} (docs/math.md §A.10); results at the largest β reflect the "
                    f"empirical measure, not ρ^β")
    steps = cfg["t1"] / cfg["dt"]
    if steps > 2e6:
        raise ConfigError(f"config fields 't1'/'dt': {steps:.3g} steps is unreasonable; raise dt")
    return warns


def required_particles(beta: float, d: int) -> int:
    """N ≳ β^{(d−1)/2}: the particle count that resolves angles of order β^{-1/2}."""
    return int(math.ceil(beta ** ((d - 1) / 2)))


def save_times(pc):
    """The saved times of a point (:func:`segments.save_times`; loads JAX).

    Args:
      pc: a point config.

    Returns:
      The times (S,).
    """
    from . import segments

    return segments.save_times(pc["t1"], pc["dt"], pc["save_every"])


def output_bytes(pc, per_frame_values: int = 8, snapshots: int = 0) -> int:
    """Bytes one grid point adds to the merged Dataset (float64 on the host)."""
    frames = len(save_times(pc))
    return 8 * (frames * per_frame_values + snapshots * pc["n"] * pc["d"])


def estimate_bytes(pc, extra_per_frame: int = 0) -> int:
    """Memory of one grid point: saved trajectory + integrator stages + kernel working set."""
    item = 8 if pc["dtype"] == "float64" else 4
    n, d = pc["n"], pc["d"]
    frames = len(save_times(pc))
    import jax

    from ..kernels import DEFAULT_BLOCKS, resolve_kernel

    dkb, dqb = DEFAULT_BLOCKS["gpu" if jax.default_backend() == "gpu" else "cpu"]
    kb = min(pc["k_block"] or dkb, n)
    qb = min(pc["q_block"] or dqb, n)
    dense = resolve_kernel(pc["kernel"], n) == "dense"
    work = (n * n if dense else qb * kb) * item * 3 * pc.get("heads", 1)
    return frames * (n * d * item + extra_per_frame) + 12 * n * d * item + work
