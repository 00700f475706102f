"""Kind ``concentration``: config fields, the Assumption 1 check, memory estimates, spectral data.

The spectral data are E and E(V) of the weights.
"""

from __future__ import annotations

import math

import numpy as np

from ...config import ConfigError, Field, at_least, positive
from ...spectral_host import check_assumptions, subspace_angle, top_eigenspace
from .. import sphere_fields as sc
# a concentration point is a sphere integration: the sphere kind's process split and memory
# estimate serve it unchanged (its Dataset holds more values a frame: output_bytes below)
from ..sphere.schema import estimate_bytes, process_split  # noqa: F401


W2_METHODS = ("exact", "sinkhorn", "coupling")


SCHEMA = {
    **sc.SPHERE_FIELDS,
    "w2_methods": Field("list", ["exact", "coupling"], f"W2 methods, a subset of {list(W2_METHODS)}",
                        item="str"),
    "w2_every": Field("int", 1, "compute W2 (exact/sinkhorn) at every k-th saved time", check=at_least(1)),
    "exact_max_n": Field("int", 4096, "largest N for the O(N³) exact assignment", check=at_least(1)),
    "near_angle_deg": Field("float", 8.0, "angle (degrees) defining 'near' a subspace", check=positive),
    "force": Field("bool", False, "run even when Assumption 1 fails (the conjecture regime)"),
    "metastable_mass": Field("float", 0.1, "a metastable phase counts only where the mass within "
                             "near_angle_deg of E exceeded this fraction (else overtake times are "
                             "flagged)", check=positive),
}

# The regime conditions of docs/math.md §A.7–A.10 that the checker and the summary share.
MIN_FIT_POINTS = 4      # a fit against β (or log β) on fewer points is indicative only
SEPARATION = 2.0        # the phases separate only where β^{-1/2} < angle(E, E(V)) / SEPARATION


def softmax_width(beta):
    """β^{-1/2} (radians): the angular radius of the softmax cap of one query (§A.10)."""
    return float(beta) ** -0.5


def regime_warnings(betas, d, angle_rad, near_deg):
    """Warnings for a β list (config or run) about the regimes the fits assume.

    Too few β values for a fit, β where the softmax width β^{-1/2} is not well below the angle
    between E and E(V) (the metastable and terminal phases cannot separate), β where it exceeds
    near_angle_deg (little mass can count as near E even in a metastable phase). The
    N ≳ β^{(d-1)/2} warning is sphere_common's.

    Args:
      betas: the β values.
      d: the dimension.
      angle_rad: the angle between E and E(V).
      near_deg: ``near_angle_deg``.

    Returns:
      The warnings.
    """
    warns = []
    betas = sorted(set(float(b) for b in betas))
    if 2 <= len(betas) < MIN_FIT_POINTS:
        warns.append(f"only {len(betas)} β values: the fits against β (min_t W2, argmin_t W2, the "
                     f"overtake time) need at least {MIN_FIT_POINTS} to mean anything"
                     + (" (on 2 points R² = 1 by construction)" if len(betas) == 2 else ""))
    if angle_rad > 0:
        bad = [b for b in betas if softmax_width(b) >= angle_rad / SEPARATION]
        if bad:
            need = (SEPARATION / angle_rad) ** 2
            warns.append(
                f"at β ∈ {{{', '.join(f'{b:g}' for b in bad)}}} (d = {d}) the softmax width β^(-1/2) = "
                f"{math.degrees(softmax_width(bad[0])):.2f}°" + (f"…{math.degrees(softmax_width(bad[-1])):.2f}°"
                                                              if len(bad) > 1 else "")
                + f" is not well below the angle {math.degrees(angle_rad):.2f}° between E and E(V) "
                f"(needs β > {need:.0f}): the concentration on E and the drift to E(V) overlap there, so "
                f"the phases cannot separate and an overtake time mixes the two (docs/math.md §A.9)")
    near = math.radians(near_deg)
    wide = [b for b in betas if softmax_width(b) > near]
    if wide:
        warns.append(
            f"at β ∈ {{{', '.join(f'{b:g}' for b in wide)}}} the softmax width β^(-1/2) exceeds "
            f"near_angle_deg = {near_deg:g}° (needs β > {near ** -2:.0f}): the concentration is wider "
            f"than the 'near E' cap, so mass_E undercounts it and may never reach metastable_mass")
    return warns


BATCH_AXES = ("beta", "seed")


def check(cfg):
    """Cross-field checks of a ``concentration`` config (:meth:`~jaxdyn.experiments.ExperimentKind.check`)."""
    warns = sc.check_sphere(cfg)
    swept = [a for a in ("d", "n") if a in cfg["sweep"]]
    if swept:
        # the summary compares β at one problem: over a swept d (or N) it would average W2 and
        # the masses across problems and report the spectrum of the base d
        raise ConfigError(f"config field 'sweep.{swept[0]}': a concentration run compares β at "
                          f"one {swept[0]} (its summary reads W2 and the masses per β); run one "
                          f"config per {swept[0]} (e.g. --set {swept[0]}=...)")
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
        bE, bV = eigenspace_bases({"weights": cfg["weights"], "d": d})
        ang = math.degrees(subspace_angle(bE, bV))
        if 0 < ang < 2 * cfg["near_angle_deg"]:
            warns.append(f"E(VBᵀ) and E(V) are {ang:.2f}° apart, less than twice near_angle_deg = "
                         f"{cfg['near_angle_deg']}°: the two 'near' regions overlap")
        if cfg["normalization"] != "hardmax":
            warns += regime_warnings(cfg["sweep"].get("beta", [cfg["beta"]]), d,
                                     math.radians(ang), cfg["near_angle_deg"])
    return warns


def output_bytes(pc):
    """What one ``concentration`` grid point adds to the Dataset (:meth:`~jaxdyn.experiments.ExperimentKind.output_bytes`)."""
    return sc.output_bytes(pc, per_frame_values=10)


def eigenspace_bases(pc):
    """Bases of E and of E(V), float64 NumPy without JAX (the config check).

    E is the top eigenspace of the symmetric part of VBᵀ, as :func:`jaxdyn.projection` with
    ``force=True`` takes it.

    Args:
      pc: a (point) config with ``weights`` and ``d``.

    Returns:
      ``(basis of E, basis of E(V))``.
    """
    Q, K, V = sc.build_weights(pc["weights"], pc["d"])
    bE = top_eigenspace(V @ (Q.T @ K).T, symmetric=True).basis
    return bE, np.asarray(top_eigenspace(V, symmetric=False).basis)


def spectral_info(pc):
    """Π and a basis of E(V), from float64 weights.

    Args:
      pc: a (point) config with ``weights`` and ``d``.

    Returns:
      ``(Π, basis of E(V))``: Π is :func:`jaxdyn.projection` in float64 (its projector P_E and the
      basis of E, the top eigenspace of VBᵀ).
    """
    import jax

    from ...spectral import projection

    Q, K, V = sc.build_weights(pc["weights"], pc["d"])
    with jax.enable_x64(True):  # float64 weights stay float64 whatever the global mode
        pi = projection(Q, K, V, force=True)
        ev = top_eigenspace(V, symmetric=False)
        return pi, np.asarray(ev.basis)


def magnitude_basis(pc):
    """A basis of the eigenspace of V dominant in magnitude (Conjecture 1's second reading), float64.

    Args:
      pc: a (point) config with ``weights`` and ``d``.

    Returns:
      The basis (:func:`jaxdyn.spectral.top_eigenspace` with ``by="magnitude"``).
    """
    _, _, V = sc.build_weights(pc["weights"], pc["d"])
    return np.asarray(top_eigenspace(V, symmetric=False, by="magnitude").basis)
