"""Kind ``gaussian``: config fields, parameters, cross-field checks, saved times, memory estimates.

The parameters (A, B, V, b, m0, S0) are checked against d.
"""

from __future__ import annotations

import numpy as np

from ...choices import KERNELS  # the library's (no JAX)
from ...config import ConfigError, Field, at_least, positive
from .. import sphere_fields


def _grid_check(v):
    if (len(v) != 3 or not v[0] < v[1] or int(v[2]) != v[2] or v[2] < 2):
        return "expected [min, max, num] with min < max and an integer num >= 2"
    return None


PHASE_SCHEMA = {
    # defaults as floats: a resolved config must hash the same after a YAML round trip (resume)
    "a": Field("list", [-2.0, 2.0, 41.0], "A = a I over [min, max, num]", item="float",
               check=_grid_check),
    "c": Field("list", [-2.0, 2.0, 41.0], "B = c I over [min, max, num]", item="float",
               check=_grid_check),
    "v": Field("float", 1.0, "V = v I (v != 0)", check=lambda x: None if x != 0 else "must be != 0"),
}


SCHEMA = {
    "study": Field("str", "trajectory", "what to compute", choices=("trajectory", "phase_diagram")),
    "d": Field("int", 2, "dimension of the tokens", check=at_least(1)),
    "dtype": Field("str", "float64", "floating type", choices=("float32", "float64")),
    "A": Field("matrix", None, "feed-forward matrix A (d×d; default 0)"),
    "B": Field("matrix", None, "attention bilinear form B (d×d; default I)"),
    "V": Field("matrix", None, "value matrix V (d×d; default I)"),
    "b": Field("list", None, "bias b (d numbers; default 0)", item="float"),
    "m0": Field("list", None, "initial mean (d numbers; default 0)", item="float"),
    "S0": Field("matrix", None, "initial covariance (d×d symmetric PSD; default I)"),
    "t1": Field("float", 1.0, "final time", check=positive),
    "dt": Field("float", 0.01, "particle time step (RK4)", check=positive),
    "save_every": Field("int", 5, "particle steps between saved times", check=at_least(1)),
    "method": Field("str", "rk4", "particle integrator", choices=("rk4", "euler")),
    "kernel": Field("str", "auto", "attention kernel", choices=KERNELS),
    "n": Field("int", 2000, "number of particles N", check=at_least(2), sweepable=True),
    "seed": Field("int", 0, "seed of the initial particles", sweepable=True),
    "activation": Field("str", "identity", "σ in A σ(x)", choices=("identity", "relu"),
                        sweepable=True),
    "rtol": Field("float", None, "closure rtol (default 1e-10; 1e-6 for a float32 phase diagram; "
                  "the trajectory closure is solved in float64)", check=positive),
    "atol": Field("float", None, "closure atol (default 1e-12; 1e-8 for a float32 phase diagram)",
                  check=positive),
    "blowup_threshold": Field("float", 1e6, "closure stops at ‖Σ‖ ≥ threshold·max(‖S0‖, 1)",
                              check=positive),
    "error_time": Field("float", None, "time of the error-against-N measurement (default t1, or "
                        "T*/2 when the closure blows up before t1)", check=positive),
    "parting_threshold": Field("float", 0.25, "particles and closure part at |tr Ŝ/tr Σ − 1| > this",
                               check=lambda x: None if 0 < x < 1 else "must be in (0, 1)"),
    "snapshots": Field("list", [0.0, 0.25, 0.5, 1.0], "times of particle snapshots (clipped to t1)",
                       item="float"),
    "snapshot_particles": Field("int", 1000, "particles kept per snapshot (the first ones)",
                                check=at_least(1)),
    "n_directions": Field("int", 16, "projections for skewness/kurtosis", check=at_least(1)),
    "phase": Field("section", {}, "phase_diagram grid (A = aI, B = cI, V = vI)", schema=PHASE_SCHEMA),
}


BATCH_AXES = ("seed",)


def dtype_of(cfg):
    """The NumPy float type of a config's ``dtype``."""
    return np.float64 if cfg["dtype"] == "float64" else np.float32


def _mat(cfg, key, d, default):
    v = cfg[key]
    if v is None:
        return default(d)
    a = np.asarray(v, np.float64)
    if a.shape != (d, d):
        raise ConfigError(f"config field '{key}': expected a {d}×{d} matrix (d = {d}), got "
                          f"{a.shape[0]}×{a.shape[1]}")
    return a


def _vec(cfg, key, d):
    v = cfg[key]
    if v is None:
        return np.zeros(d)
    if len(v) != d:
        raise ConfigError(f"config field '{key}': expected {d} numbers (d = {d}), got {len(v)}")
    return np.asarray(v, np.float64)


def parameters(cfg):
    """``dict(A, B, V, b, m0, S0)`` as float64 NumPy arrays, checked against d (ConfigError)."""
    d = cfg["d"]
    p = {"A": _mat(cfg, "A", d, lambda d: np.zeros((d, d))),
         "B": _mat(cfg, "B", d, np.eye), "V": _mat(cfg, "V", d, np.eye),
         "b": _vec(cfg, "b", d), "m0": _vec(cfg, "m0", d),
         "S0": _mat(cfg, "S0", d, np.eye)}
    S0 = p["S0"]
    tol = 100 * d * np.finfo(np.float64).eps * max(1.0, np.abs(S0).max())
    asym = np.abs(S0 - S0.T).max()
    if asym > tol:
        raise ConfigError(f"config field 'S0': must be symmetric, max |S0 − S0ᵀ| = {asym:.3g}")
    lmin = np.linalg.eigvalsh(S0)[0]
    if lmin < -tol:
        raise ConfigError(f"config field 'S0': must be positive semi-definite, min eigenvalue "
                          f"= {lmin:.3g}")
    p["S0"] = 0.5 * (S0 + S0.T)
    return p


def tolerances(cfg):
    """The closure's (rtol, atol): the config's, else tight in float64 (the trajectory closure is float64)."""
    # the trajectory study's closure is always solved in float64 (the reference)
    f64 = cfg["dtype"] == "float64" or cfg["study"] == "trajectory"
    rtol = cfg["rtol"] if cfg["rtol"] is not None else (1e-10 if f64 else 1e-6)
    atol = cfg["atol"] if cfg["atol"] is not None else (1e-12 if f64 else 1e-8)
    return float(rtol), float(atol)


def check(cfg):
    """Cross-field checks of a ``gaussian`` config (:meth:`~jaxdyn.experiments.ExperimentKind.check`)."""
    warns = []
    p = parameters(cfg)
    sweep = cfg["sweep"]
    if cfg["study"] == "phase_diagram":
        extra = [k for k in ("n", "seed", "activation") if k in sweep]
        if extra:
            raise ConfigError(f"config field 'sweep': study phase_diagram computes its grid from "
                              f"'phase'; it cannot sweep {extra}")
        ph = cfg["phase"]
        npts = int(ph["a"][2]) * int(ph["c"][2])
        if npts > 200_000:
            raise ConfigError(f"config field 'phase': {npts} grid points is too many (at most 200000)")
        if cfg["A"] is not None or cfg["B"] is not None or cfg["V"] is not None:
            warns.append("study phase_diagram sets A = aI, B = cI, V = vI from 'phase'; the "
                         "fields A, B, V are ignored")
        return warns
    steps = cfg["t1"] / cfg["dt"]
    if steps > 1e6:
        raise ConfigError(f"config fields 't1'/'dt': {steps:.3g} steps is unreasonable; raise dt")
    if cfg["error_time"] is not None and cfg["error_time"] > cfg["t1"]:
        raise ConfigError(f"config field 'error_time': must be <= t1 = {cfg['t1']}, got "
                          f"{cfg['error_time']}")
    if any(s < 0 for s in cfg["snapshots"]):
        raise ConfigError(f"config field 'snapshots': times must be >= 0, got {cfg['snapshots']}")
    acts = sweep.get("activation", [cfg["activation"]])
    if "relu" in acts and not np.any(p["A"]):
        warns.append("activation relu with A = 0: the ReLU model equals the identity model")
    seeds = sweep.get("seed", [cfg["seed"]])
    if len(seeds) < 2:
        warns.append("a single seed: no seed-to-seed standard errors in the summary")
    ns = sweep.get("n", [cfg["n"]])
    if max(ns) > 20000 and _backend() == "cpu":
        warns.append(f"N = {max(ns)} particles: O(N²) attention per step is slow on CPU")
    return warns


def _backend():
    import jax  # only for a large N: the common check loads no JAX

    return jax.default_backend()


def save_times(pc):
    """The particles' saved times of a point (:func:`..sphere_fields.save_times`)."""
    return sphere_fields.save_times(pc)


def snapshot_index(pc):
    """Indices of the saved times nearest the ``snapshots`` times (clipped to [0, t1])."""
    ts = save_times(pc)
    want = [min(max(s, 0.0), ts[-1]) for s in pc["snapshots"]]
    return np.asarray(sorted({int(np.argmin(np.abs(ts - s))) for s in want}))


def process_split(cfg):
    """Trajectories: systems sharded over every process's devices; phase diagrams: points dealt out."""
    return "devices" if cfg["study"] == "trajectory" else "points"


def estimate_bytes(pc):
    """Memory of one ``gaussian`` grid point (:meth:`~jaxdyn.experiments.ExperimentKind.estimate_bytes`)."""
    item = 8 if pc["dtype"] == "float64" else 4
    d = pc["d"]
    if pc["study"] == "phase_diagram":
        npts = int(pc["phase"]["a"][2]) * int(pc["phase"]["c"][2])
        return int(npts * 8 * (40 * (d * d + d) + 64))
    n = pc["n"]
    frames = len(save_times(pc))
    from ...kernels import DEFAULT_BLOCKS, resolve_kernel
    from ..segments import MAX_STEPS_PER_CALL

    dkb, dqb = DEFAULT_BLOCKS["gpu" if _backend() == "gpu" else "cpu"]
    dense = resolve_kernel(pc["kernel"], n) == "dense"
    work = (n * n if dense else min(dkb, n) * min(dqb, n)) * item * 3
    saved = min(MAX_STEPS_PER_CALL // pc["save_every"] + 1, frames) * n * d * item
    return int(16 * n * d * item + work + saved + frames * 8 * (2 * d * d + 2 * d + 8))


def output_bytes(pc):
    """What one ``gaussian`` grid point adds to the Dataset (:meth:`~jaxdyn.experiments.ExperimentKind.output_bytes`)."""
    if pc["study"] == "phase_diagram":
        return int(8 * 8 * int(pc["phase"]["a"][2]) * int(pc["phase"]["c"][2]))
    d = pc["d"]
    frames = len(save_times(pc))
    snaps = len(snapshot_index(pc)) * min(pc["snapshot_particles"], pc["n"]) * d
    return int(8 * (frames * (2 * d * d + 2 * d + 8) + snaps))
