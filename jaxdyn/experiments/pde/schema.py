"""Kind ``pde``: config fields, checks and memory estimates."""

from __future__ import annotations

from ...choices import KERNELS  # the library's (no JAX)
from ...config import ConfigError, Field, all_positive, at_least, nonnegative, positive
from ..sphere_fields import x64_enabled

MODES = ("clusters", "particles", "s2")

PARTICLE_FIELDS = {
    "n": Field("list", [100, 1000], "particle counts N", item="int", check=all_positive),
    "repeats": Field("list", [4], "seeds per N (one value for all, or one per N)", item="int",
                     check=all_positive),
    "dt": Field("float", 0.1, "particle step (projected RK4)", check=positive),
    "times": Field("list", [0.0, 2.0, 4.0], "times at which W1(particles, ρ) is measured", item="float"),
    "kernel": Field("str", "auto", "attention kernel of the particle field (fourier: "
                    "jaxdyn.pde.CircleAttention, O(N K), equal to dense to rounding)",
                    choices=(*KERNELS, "fourier")),
    "dtype": Field("str", "float32", "particle floating type", choices=("float32", "float64")),
    "kde_bandwidth": Field("float", 0.03, "bandwidth of the figure's kernel density", check=positive),
    "timing_m": Field("int", 4096, "grid size M of the timed density step", check=at_least(8)),
    "cluster_n": Field("int", 0, "clusters: N particles run from the solver's start, their first "
                       "clusters against the solver's and k* (0: no particle runs)", check=nonnegative),
    "starts": Field("list", ["quantile"], "clusters: particle starts (quantile: θ_j = F⁻¹((j+½)/N) of the "
                    "solver's ρ0, which keeps its ε-perturbation; iid: samples of ρ0, whose O(N^{-1/2}) "
                    "noise in every mode outweighs ε)", item="str"),
    "seeds": Field("list", [], "clusters: the sweep's seeds at which particles run (empty: all)", item="int"),
    "t_extra": Field("float", 5.0, "clusters: particles run to the solver's first-cluster time plus this",
                     check=nonnegative),
    "mode_threshold": Field("float", 0.1, "clusters: the dominant mode is read when the largest "
                            "|∫ e^{ikθ} dμ| (k = 1..growth_k) first reaches this", check=positive),
}

SCHEMA = {
    "mode": Field("str", "clusters", "what the run measures", choices=MODES),
    "beta": Field("float", 5.0, "inverse temperature β", check=positive, sweepable=True),
    "sigma": Field("float", 0.0, "noise σ (the equation gets (σ²/2)Δρ)", check=nonnegative, sweepable=True),
    "seed": Field("int", 0, "seed of the perturbation (clusters) or of the particles", sweepable=True),
    "m": Field("int", 512, "grid cells M on S¹", check=at_least(8)),
    "t1": Field("float", 100.0, "final time", check=positive),
    "n_save": Field("int", 401, "saved times (evenly spaced on [0, t1])", check=at_least(2)),
    "cfl": Field("float", 0.9, "step as a fraction of the positivity step", check=positive),
    "normalization": Field("str", "softmax", "attention normalisation", choices=("softmax", "unnormalized")),
    "diffusion": Field("str", "fd", "noise discretisation", choices=("fd", "spectral")),
    "dtype": Field("str", "float64", "floating type", choices=("float32", "float64")),
    "eps": Field("float", 1.0e-8, "clusters: amplitude ε of the perturbation", check=positive),
    "init_k": Field("int", 3, "particles: ρ0 = (1 + a cos kθ)/(2π), the mode k", check=at_least(1)),
    "init_amp": Field("float", 0.5, "particles: the amplitude a (|a| < 1)"),
    "growth_k": Field("int", 12, "modes k = 1..K whose linear growth rates are measured", check=at_least(1)),
    "particles": Field("section", {}, "particle runs (mode: particles)", schema=PARTICLE_FIELDS),
    "n_lat": Field("int", 24, "s2: latitude cells (n_lon = 2 n_lat)", check=at_least(4)),
    "s2_kappa": Field("float", 3.0, "s2: ρ0 ∝ e^{κ(⟨x,e1⟩−1)} + e^{κ(⟨x,(0,1,1)/√2⟩−1)}, the κ",
                      check=positive),
    "figure_betas": Field("list", [], "β values shown in the space–time figure (default: all)", item="float"),
}

BATCH_AXES = ()


def check(cfg):
    """Cross-field checks of a ``pde`` config (:meth:`~jaxdyn.experiments.ExperimentKind.check`)."""
    if cfg["dtype"] == "float64" and not x64_enabled():
        raise ConfigError("config field 'dtype': float64 needs JAX's x64 mode; set JAX_ENABLE_X64=1 "
                          "(the CLI does this for float64 configs)")
    if abs(cfg["init_amp"]) >= 1:
        raise ConfigError(f"config field 'init_amp': must satisfy |a| < 1 (ρ0 ≥ 0), got {cfg['init_amp']}")
    p = cfg["particles"]
    if len(p["repeats"]) not in (1, len(p["n"])):
        raise ConfigError(f"config field 'particles.repeats': one value or one per N ({len(p['n'])}), "
                          f"got {p['repeats']}")
    if cfg["mode"] in ("particles", "s2") and any(not 0 <= t <= cfg["t1"] for t in p["times"]):
        raise ConfigError(f"config field 'particles.times': every time must lie in [0, t1 = {cfg['t1']}]")
    bad = [s for s in p["starts"] if s not in ("quantile", "iid")]
    if bad or not p["starts"]:
        raise ConfigError(f"config field 'particles.starts': each must be 'quantile' or 'iid', got {p['starts']}")
    if (cfg["mode"] == "clusters" and p["cluster_n"] and "quantile" in p["starts"] and p["dtype"] == "float32"
            and cfg["eps"] < 1e-5):
        raise ConfigError(f"config field 'particles.dtype': float32 rounding (6e-8) hides the perturbation "
                          f"ε = {cfg['eps']:g} of the quantile start; use float64")
    _check_against_sweep(cfg)
    if cfg["cfl"] > 1:
        raise ConfigError(f"config field 'cfl': must be <= 1, got {cfg['cfl']:g} (the step is this "
                          "fraction of the positivity step; above 1 the density can turn negative)")
    if cfg["mode"] != "s2" and cfg["growth_k"] > cfg["m"] // 2:
        raise ConfigError(f"config field 'growth_k': at most M/2 = {cfg['m'] // 2} for m = {cfg['m']} "
                          f"cells (the grid's highest mode), got {cfg['growth_k']}")
    if cfg["mode"] == "clusters" and cfg["eps"] > (top := max_eps(cfg["m"])):
        raise ConfigError(f"config field 'eps': at most {top:.3g} for m = {cfg['m']}, got "
                          f"{cfg['eps']:g} (ρ0 = (1 + ε · a sum of M/4 cosines)/2π must stay >= 0 "
                          "whatever their phases)")
    warns = []
    if cfg["mode"] == "s2" and max(p["n"]) > 3000:
        warns.append(f"s2: N = {max(p['n'])}: W2 by exact assignment costs O(N³) a pair")
    big = max(p["n"]) if cfg["mode"] == "particles" else p["cluster_n"] if cfg["mode"] == "clusters" else 0
    if big > 30000 and p["kernel"] != "fourier":
        warns.append(f"N = {big}: each particle step costs O(N²) kernel evaluations "
                     "(blocked kernel); on a few CPU cores this takes hours")
    return warns


def max_eps(m: int) -> float:
    """The largest ε for which the clusters start (``pde.perturbed_uniform``) is >= 0 for any phases.

    Its perturbation Σ_{k ≤ M/4} sinc(k/M) cos(kθ + φ_k)/√(M/4) is at least minus the sum of
    its amplitudes.

    Args:
      m: the grid cells M.

    Returns:
      1 / Σ_k sinc(k/M)/√(M/4).
    """
    import math

    import numpy as np

    k_max = max(m // 4, 1)
    amp = 0.0
    for lo in range(1, k_max + 1, 1 << 20):  # NumPy in chunks: M up to 1e8 and more in a blink
        x = np.pi * np.arange(lo, min(lo + (1 << 20), k_max + 1), dtype=np.float64) / m
        amp += float(np.sum(np.abs(np.sin(x) / x)))
    return math.sqrt(k_max) / amp


def _swept(cfg, name):
    """The values field ``name`` takes in the run: its sweep's, else its own."""
    return list(cfg.get("sweep", {}).get(name) or [cfg[name]])


def _check_against_sweep(cfg):
    """Fields that name values of the sweep name values it has."""
    betas = _swept(cfg, "beta")
    lost = [b for b in cfg["figure_betas"] if not any(abs(b - v) < 1e-9 for v in betas)]
    if lost:
        raise ConfigError(f"config field 'figure_betas': {lost} not among the run's β values "
                          f"{betas}")
    seeds, p = _swept(cfg, "seed"), cfg["particles"]
    if cfg["mode"] == "clusters" and p["cluster_n"]:
        lost = [s for s in p["seeds"] if s not in seeds]
        if lost:
            raise ConfigError(f"config field 'particles.seeds': {lost} not among the run's seeds "
                              f"{seeds} (the particles run at the listed seeds of the sweep)")


def process_split(cfg):
    """Several processes share the chunks' points: each computes its own on its own devices."""
    return "points"


def estimate_bytes(pc):
    """Memory of one ``pde`` grid point (:meth:`~jaxdyn.experiments.ExperimentKind.estimate_bytes`)."""
    item = 8 if pc["dtype"] == "float64" else 4
    m = pc["m"] if pc["mode"] != "s2" else 2 * pc["n_lat"] ** 2
    est = item * (pc["n_save"] * m + 40 * m)
    if pc["mode"] == "s2":  # the longitude-FFT kernel (n_lat² n_lon complex) and W2's N×N costs
        n = max(pc["particles"]["n"])
        return est + 16 * 8 * pc["n_lat"] ** 2 * 2 * pc["n_lat"] + 8 * 4 * n * n
    if pc["mode"] in ("particles", "clusters"):
        n = max(pc["particles"]["n"]) if pc["mode"] == "particles" else pc["particles"]["cluster_n"]
        # clusters: the saved clouds, up to n_save frames of (N, 2)
        est += 16 * n * pc["n_save"] if pc["mode"] == "clusters" else 0
        est += 8 * 256 * n if pc["particles"]["kernel"] == "fourier" else 4 * (min(n, 1024) * n + 16 * n)
    return est


def output_bytes(pc):
    """What one ``pde`` grid point adds to the Dataset (:meth:`~jaxdyn.experiments.ExperimentKind.output_bytes`)."""
    m = pc["m"] if pc["mode"] != "s2" else 2 * pc["n_lat"] ** 2
    return 8 * ((pc["n_save"] + 8) * m + 4 * m + 64)
