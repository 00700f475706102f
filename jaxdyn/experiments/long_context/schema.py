"""Kind ``long_context``: config fields, checks (the regimes a size can resolve), estimates.

No JAX: ``jaxdyn config`` checks a config without it.
"""

from __future__ import annotations

import math

import numpy as np

from ...config import ConfigError, Field, at_least, positive
from ...long_context_host import cap_constant, first_cluster_count, resolve_beta

STUDIES = ("collapse", "phase", "dynamics")
#: count: all — the fewest particles a counted cluster may need: the radius graph (r = h/3) of a
#: uniform cloud on S² has a handful of components of 9 points at n = 10⁶ and none of 10
#: (docs/math.md §I.4); smaller clusters would count the uniform cloud's components
GRAPH_MIN_SIZE = 9


def _beta_form(v):
    """A field check: ``beta`` a number or a ``{scale, gamma|c}`` mapping (resolve_beta's rules)."""
    try:
        resolve_beta(v, 2, 3)
    except ValueError as e:
        return str(e)
    return None


def _unit_interval(v):
    return None if 0 <= v < 1 else "must lie in [0, 1)"


SCHEMA = {
    "study": Field("str", "collapse", "what the run measures", choices=STUDIES),
    "beta": Field("any", {"scale": "power", "c": 1.0}, "β: a number, {scale: log, gamma: γ} "
                  "(γ log n) or {scale: power, c: c} (c n^(2/(d-1)))", check=_beta_form),
    "c": Field("float", 0.0, "β = c n^(2/(d-1)): when > 0 (or swept) it replaces beta's factor "
               "(beta.scale must be power)", check=lambda v: None if v >= 0 else "must be >= 0",
               sweepable=True),
    "gamma": Field("float", 0.0, "β = γ log n: when > 0 (or swept) it replaces beta's factor "
                   "(beta.scale must be log)", check=lambda v: None if v >= 0 else "must be >= 0",
                   sweepable=True),
    "n": Field("int", 1000, "tokens (keys, particles) n", check=at_least(2), sweepable=True),
    "d": Field("int", 3, "dimension of R^d ⊃ S^(d-1)", check=at_least(2), sweepable=True),
    "rho": Field("float", 0.5, "phase: the tokens' pairwise inner product ρ", check=_unit_interval,
                 sweepable=True),
    "seed": Field("int", 0, "seed of the keys / tokens / particles", sweepable=True),
    "queries": Field("int", 256, "collapse: queries per point", check=at_least(1)),
    "limit_samples": Field("int", 400, "collapse: draws of the Poisson limit law per (c, d)",
                           check=at_least(10)),
    "dtype": Field("str", "float64", "floating type", choices=("float32", "float64")),
    "kernel": Field("str", "auto", "attention kernel (phase, dynamics): dense, blocked, local, "
                    "auto", choices=("dense", "blocked", "local", "auto")),
    "t1": Field("float", 20.0, "dynamics: final time", check=positive),
    "dt": Field("float", 0.05, "dynamics: step (projected RK4)", check=positive),
    "save_every": Field("int", 4, "dynamics: steps between saved frames", check=at_least(1)),
    "cells_per_mode": Field("int", 8, "dynamics on S¹: histogram cells per unit of k* (M = "
                            "the power of 2 >= this k*, at least 64)", check=at_least(2)),
    "min_mass": Field("float", 0.25, "dynamics: a cluster holds at least this fraction of the "
                      "mass n/k* expected of one first cluster (S¹), or of the subsample (S²: "
                      "times 1/k*); count: all, of n / the predicted first count", check=positive),
    "count": Field("str", "subsample", "dynamics: the cluster count: subsample (S¹: histogram; "
                   "S²: the δ-graph of the first `subsample` particles) or all (the radius graph "
                   "of all n particles, r = graph_radius · mean spacing, clusters of at least "
                   "min_mass · n / the predicted first count particles)", choices=("subsample", "all")),
    "subsample": Field("int", 1024, "dynamics on S² (count: subsample): particles whose δ-graph "
                       "is counted (jaxdyn.clusters)", check=at_least(16)),
    "delta": Field("float", 2e-3, "dynamics on S² (count: subsample): the δ of the cluster graph "
                   "⟨x_i, x_j⟩ > 1 − δ", check=positive),
    "graph_radius": Field("float", 1 / 3, "dynamics (count: all): the graph's chord radius in units "
                          "of the mean spacing (|S^(d-1)|/n)^(1/(d-1))", check=positive),
    "formed_fraction": Field("float", 0.5, "dynamics (count: all): the clusters have formed when "
                             "they hold this fraction of the particles",
                             check=lambda v: None if 0 < v <= 1 else "must lie in (0, 1]"),
}

BATCH_AXES = ("seed", "c", "gamma", "rho")


def _swept(cfg, name):
    return cfg["sweep"].get(name, [cfg[name]])


def point_beta(pc):
    """The point's β as the config states it (the swept c or γ replacing the mapping's factor)."""
    beta = pc["beta"]
    if isinstance(beta, dict):
        key = "c" if beta.get("scale") == "power" else "gamma"
        if pc[key] > 0:
            beta = {"scale": beta["scale"], key: pc[key]}
    return beta


def resolved_beta(pc):
    """The point's resolved β (:func:`jaxdyn.long_context.resolve_beta`)."""
    return resolve_beta(point_beta(pc), pc["n"], pc["d"])


def _points(cfg):
    """Every (n, d, c-or-γ) combination of the config, as point-like dicts."""
    out = []
    for n in _swept(cfg, "n"):
        for d in _swept(cfg, "d"):
            for c in _swept(cfg, "c"):
                for g in _swept(cfg, "gamma"):
                    out.append({**cfg, "n": n, "d": d, "c": c, "gamma": g})
    return out


def _check_scale(cfg):
    beta = cfg["beta"]
    problem = _beta_form(beta)
    if problem:  # an "any" field is not checked by the config loader: here, before compute
        raise ConfigError(f"config field 'beta': {problem}")
    scale = beta.get("scale") if isinstance(beta, dict) else None
    for key, want in (("c", "power"), ("gamma", "log")):
        if (key in cfg["sweep"] or cfg[key] > 0) and scale != want:
            raise ConfigError(f"config field '{key}': it sets the factor of beta = {{scale: {want}}}; "
                              f"beta is {beta!r}")
        if key in cfg["sweep"] and any(v <= 0 for v in cfg["sweep"][key]):
            raise ConfigError(f"config field 'sweep.{key}': every value must be > 0")


def check(cfg):
    """Cross-field checks of a ``long_context`` config; warnings where a size cannot resolve a regime."""
    _check_scale(cfg)
    study, warns = cfg["study"], []
    ds = _swept(cfg, "d")
    if study == "dynamics" and any(d not in (2, 3) for d in ds):
        raise ConfigError(f"config field 'd': the dynamics study runs on S¹ (d = 2) or S² "
                          f"(d = 3), got {ds}")
    if study == "phase" and any(d < 3 for d in ds):
        raise ConfigError(f"config field 'd': nearly equiangular tokens need d >= 3, got {ds}")
    eps = float(np.finfo(np.float64 if cfg["dtype"] == "float64" else np.float32).eps)
    for p in _points(cfg):
        beta = resolved_beta(p)
        n, d = p["n"], p["d"]
        where = f"n = {n}, d = {d}, β = {beta:.4g}"
        if study == "dynamics" and beta * eps > 0.01:
            # rounding a particle's coordinates by ε moves its logits β⟨x_i, x_j⟩ by ≈ β ε
            warns.append(f"{where}: rounding the particles to {cfg['dtype']} moves their logits "
                         f"β⟨x_i, x_j⟩ by ≈ β ε = {beta * eps:.2g}, over 1%: use float64")
        if study == "collapse":
            # the nearest key's distance² |q − y|² ≈ 2(1/(κ_d n))^{2/(d−1)}: below the dtype's
            # resolution the top weights are rounding
            near = 2 * (1 / (cap_constant(d) * n)) ** (2 / (d - 1))
            if near < 100 * eps:
                warns.append(f"{where}: the nearest keys lie at |q − y|² ≈ {near:.2g}, under 100 ε "
                             f"of {cfg['dtype']}: the critical regime is not resolved (use float64 "
                             f"or a smaller n)")
        if study in ("collapse", "dynamics"):
            if beta < 3:
                warns.append(f"{where}: β < 3, so the weights are not local on the sphere: the "
                             f"scaling law (keys near the query) does not describe this size yet")
        if study == "phase":
            spread = beta * (1 - p["rho"]) * math.sqrt(2 * math.log(n) / (d - 1))
            if spread > 1:
                warns.append(f"{where}, ρ = {p['rho']}: the tokens' inner products spread the "
                             f"largest logits by ≈ β(1 − ρ)√(2 log n/(d − 1)) = {spread:.2g} > 1: "
                             f"not nearly equiangular; the transition shifts and smears at this d")
        if study == "dynamics" and d == 3 and cfg["count"] == "subsample":
            # l* ≈ √(2β) (docs/math.md §I.4); the δ-graph counts a subsample's components
            count = first_cluster_count(3, max(1, round(math.sqrt(2 * beta))))
            m = min(n, p["subsample"])
            if m < 4 * count:
                warns.append(f"{where}: about {count:.0f} first clusters are predicted (l* ≈ √(2β)"
                             f" = {math.sqrt(2 * beta):.3g}) and the count reads {m} particles "
                             f"(subsample = {p['subsample']}): fewer than 4 a cluster, so the "
                             f"count is not resolved (count: all counts every particle)")
        if study == "dynamics" and cfg["count"] == "all":
            # the radius graph of all particles: a cluster of the predicted mass n/count needs
            # min_size ≥ GRAPH_MIN_SIZE particles to stand above a uniform cloud's components
            count = first_cluster_count(d, max(1, round(math.sqrt(2 * beta))))  # k*, l* ≈ √(2β)
            size = max(2, math.ceil(p["min_mass"] * n / count))
            if size < GRAPH_MIN_SIZE:
                warns.append(f"{where}: about {count:.0f} first clusters of {n / count:.3g} "
                             f"particles are predicted; a counted cluster needs min_mass · "
                             f"{n / count:.3g} = {size} particles, under {GRAPH_MIN_SIZE}: "
                             f"components of the uniform cloud reach that size, so the count is "
                             f"not resolved (lower c)")
        if study == "dynamics" and d == 2 and beta > 1e9:
            warns.append(f"{where}: on S¹ the most unstable mode k* ≈ √(2β) = "
                         f"{math.sqrt(2 * beta):.3g} needs as many histogram cells")
    return list(dict.fromkeys(warns))


def process_split(cfg):
    """Several processes share the points: each computes its own on its own devices."""
    return "points"


def histogram_cells(cells_per_mode, k_star) -> int:
    """The histogram's cells on S¹: the power of 2 at or above ``cells_per_mode`` × k*, at least 64."""
    return max(64, 1 << math.ceil(math.log2(cells_per_mode * k_star)))


def frames(pc):
    """Saved frames of a dynamics point."""
    return int(round(pc["t1"] / pc["dt"])) // pc["save_every"] + 1


def estimate_bytes(pc):
    """Memory of one grid point (keys or particles, blocked kernel working set, frames)."""
    item = 8 if pc["dtype"] == "float64" else 4
    n, d = pc["n"], pc["d"]
    work = 256 * 2048 * (d + 4) * item
    if pc["study"] == "dynamics":
        return 12 * n * d * item + frames(pc) * n * d * item + work + pc["subsample"] ** 2 * item
    return 6 * n * d * item + work


def output_bytes(pc):
    """What one grid point adds to the Dataset."""
    if pc["study"] == "collapse":
        return 8 * 4 * pc["queries"] + 64
    if pc["study"] == "dynamics":
        return 8 * 3 * frames(pc) + 64
    return 64
