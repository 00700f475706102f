"""Weight matrices (Q, K, V) for sphere experiments, built from a config section.

``weights: {ensemble: NAME, ...}`` with NAME one of :data:`ENSEMBLES`. Each builder takes
the section, the dimension d and a NumPy dtype and returns three (d, d) float64 NumPy arrays
(cast by the caller). Seeds are explicit (``weights.seed``), separate from the particle seed.
"""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np

from .config import ConfigError, Field

ENSEMBLES: Dict[str, Callable] = {}

# Fields a ``weights`` section may hold (each ensemble uses some of them).
WEIGHTS_SCHEMA = {
    "ensemble": Field("str", "identity", "name of a weight ensemble"),
    "seed": Field("int", 0, "seed of random ensembles"),
    "scale": Field("float", 1.0, "overall scale of random ensembles"),
    "sign": Field("float", 1.0, "sign for V = ±KᵀQ"),
    "Q": Field("matrix", None, "explicit Q (d×d list of rows)"),
    "K": Field("matrix", None, "explicit K"),
    "V": Field("matrix", None, "explicit V"),
    "mu": Field("list", None, "spectrum of M = VBᵀ (spectral ensemble), largest first", item="float"),
    "rotation": Field("float", 0.0, "angle (rad) of the rotation B (spectral ensemble)"),
    "plane": Field("list", [0, 1], "coordinate plane of the rotation B", item="int"),
    "extra": Field("section", {}, "ensemble-specific options"),
}


def register(name):
    def deco(fn):
        ENSEMBLES[name] = fn
        return fn

    return deco


@register("identity")
def _identity(spec, d):
    eye = np.eye(d)
    return eye, eye.copy(), eye.copy()


@register("gaussian")
def _gaussian(spec, d):
    """Entries i.i.d. N(0, scale²/d) (independent Q, K, V)."""
    rng = np.random.default_rng(spec["seed"])
    s = spec["scale"] / np.sqrt(d)
    return tuple(s * rng.normal(size=(d, d)) for _ in range(3))


@register("explicit")
def _explicit(spec, d):
    out = []
    for name in ("Q", "K", "V"):
        m = spec.get(name)
        if m is None:
            raise ConfigError(f"config field 'weights.{name}' is required for ensemble 'explicit'")
        m = np.asarray(m, float)
        if m.shape != (d, d):
            raise ConfigError(f"config field 'weights.{name}': expected a {d}×{d} matrix (d = {d}), "
                              f"got shape {m.shape}")
        out.append(m)
    return tuple(out)


def build_weights(spec: dict, d: int):
    """(Q, K, V) as float64 NumPy arrays from a validated ``weights`` section."""
    name = spec.get("ensemble", "identity")
    if name not in ENSEMBLES:
        raise ConfigError(f"config field 'weights.ensemble': unknown ensemble {name!r}; "
                          f"known: {sorted(ENSEMBLES)}")
    return ENSEMBLES[name](spec, d)
