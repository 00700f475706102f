"""Kind ``concentration``: config fields, the Assumption 1 check, memory estimates, and the
spectral data (E, E(V)) of the weights."""

from __future__ import annotations

import math

import jax
import numpy as np

from ...config import ConfigError, Field, at_least, positive
from ...spectral import check_assumptions, projection, subspace_angle, top_eigenspace
from .. import sphere_common as sc


W2_METHODS = ("exact", "sinkhorn", "coupling")


SCHEMA = {
    **sc.SPHERE_FIELDS,
    "w2_methods": Field("list", ["exact", "coupling"], f"W2 methods, a subset of {list(W2_METHODS)}",
                        item="str"),
    "w2_every": Field("int", 1, "compute W2 (exact/sinkhorn) at every k-th saved time", check=at_least(1)),
    "exact_max_n": Field("int", 4096, "largest N for the O(N³) exact assignment", check=at_least(1)),
    "near_angle_deg": Field("float", 8.0, "angle (degrees) defining 'near' a subspace", check=positive),
    "force": Field("bool", False, "run even when Assumption 1 fails (the conjecture regime)"),
}


BATCH_AXES = ("beta", "seed")


def check(cfg):
    warns = sc.check_sphere(cfg)
    bad = [m for m in cfg["w2_methods"] if m not in W2_METHODS]
    if bad or not cfg["w2_methods"]:
        raise ConfigError(f"config field 'w2_methods': expected a non-empty subset of {list(W2_METHODS)}, "
                          f"got {cfg['w2_methods']}")
    ns = cfg["sweep"].get("n", [cfg["n"]])
    if "exact" in cfg["w2_methods"] and max(ns) > cfg["exact_max_n"]:
        raise ConfigError(f"config field 'w2_methods': 'exact' is O(N³) and N = {max(ns)} exceeds "
                          f"exact_max_n = {cfg['exact_max_n']}; use 'sinkhorn' or raise exact_max_n")
    for d in cfg["sweep"].get("d", [cfg["d"]]):
        Q, K, V = sc.build_weights(cfg["weights"], d)
        rep = check_assumptions(Q, K, V)
        if not rep.ok:
            msg = "Assumption 1 fails: " + "; ".join(rep.failures)
            if not cfg["force"]:
                raise ConfigError(f"config section 'weights': {msg} (set force: true to run anyway)")
            warns.append(msg + " — running anyway (force: true)")
        pi, bV = spectral_info({"weights": cfg["weights"], "d": d})
        ang = math.degrees(subspace_angle(np.asarray(pi.basis), bV))
        if 0 < ang < 2 * cfg["near_angle_deg"]:
            warns.append(f"E(VBᵀ) and E(V) are {ang:.2f}° apart, less than twice near_angle_deg = "
                         f"{cfg['near_angle_deg']}°: the two 'near' regions overlap")
    return warns


def estimate_bytes(pc):
    return sc.estimate_bytes(pc)


def output_bytes(pc):
    return sc.output_bytes(pc, per_frame_values=10)


def spectral_info(pc):
    """Π (:func:`jaxdyn.projection`, float64: its projector P_E and the basis of E, the top
    eigenspace of VBᵀ) and a basis of E(V), from float64 weights."""
    Q, K, V = sc.build_weights(pc["weights"], pc["d"])
    with jax.enable_x64(True):  # float64 weights stay float64 whatever the global mode
        pi = projection(Q, K, V, force=True)
        ev = top_eigenspace(V, symmetric=False)
        return pi, np.asarray(ev.basis)
