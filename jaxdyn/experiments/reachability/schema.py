"""Kind ``reachability``: config fields, cross-field checks, memory estimates."""

from __future__ import annotations

import numpy as np

from ...config import ConfigError, Field, at_least, nonnegative, positive


SCHEMA = {
    "d": Field("int", 2, "dimension of the tokens", check=at_least(1), sweepable=True),
    "mode": Field("str", "all", "control mode", choices=("all", "attention", "bounded", "energy"),
                  sweepable=True),
    "seed": Field("int", 0, "seed of the random target (and of a random init)", sweepable=True),
    "dtype": Field("str", "float64", "floating type (float64 advised: W2 < 1e-4 is W2² < 1e-8)",
                   choices=("float32", "float64")),
    "t1": Field("float", 1.0, "horizon", check=positive),
    "n_pieces": Field("int", 8, "pieces of the control grid on [0, t1]", check=at_least(1)),
    "control_kind": Field("str", "piecewise", "piecewise-constant or piecewise-linear controls",
                          choices=("piecewise", "linear")),
    "m0": Field("any", 1.0, "initial mean: a number c (c·e1), a list of d numbers, or null (0)"),
    "s0_scale": Field("float", 1.0, "initial covariance S0 = s0_scale · I", check=positive),
    "target": Field("section", {}, "random targets", schema={
        "mean_scale": Field("float", 1.0, "m1 ~ mean_scale · N(0, I)", check=nonnegative),
        "eig_min": Field("float", 0.25, "smallest eigenvalue range end of S1", check=positive),
        "eig_max": Field("float", 4.0, "largest eigenvalue range end of S1", check=positive),
    }),
    "bound": Field("float", 1.0, "mode bounded: ‖u(t)‖_F ≤ bound for each control", check=positive),
    "energy_weight": Field("float", 1e-3, "mode energy: initial energy weight λ", check=positive),
    "init": Field("str", "random", "start of the optimiser",
                  choices=("auto", "zero", "random", "certificate")),
    "init_scale": Field("float", 0.1, "std of a random init", check=nonnegative),
    "adam_steps": Field("int", 0, "Adam iterations before L-BFGS", check=at_least(0)),
    "adam_lr": Field("float", 0.02, "Adam learning rate", check=positive),
    "lbfgs_steps": Field("int", 500, "L-BFGS iterations (per energy stage)", check=at_least(0)),
    "tol": Field("float", 1e-4, "success threshold on the final W2", check=positive),
    "n_save": Field("int", 41, "saved times of N(m(t), Σ(t)) on [0, t1]", check=at_least(2)),
    "transfer": Field("section", {}, "transfer of the controls to particles and layers", schema={
        "modes": Field("list", ["all", "attention"], "modes whose results are transferred",
                       item="str"),
        "seeds": Field("list", [0], "target seeds whose results are transferred", item="int"),
        "n_particles": Field("list", [100, 300, 1000], "particle counts N", item="int"),
        "repeats": Field("int", 2, "independent initial clouds per N (averaged)", check=at_least(1)),
        "layers": Field("list", [8, 32, 128], "depths L of the discrete transformer", item="int"),
        "layer_n": Field("int", 1000, "N of the L-layer runs", check=at_least(2)),
        "steps_per_piece": Field("int", 16, "RK4 steps per control piece (particles)",
                                 check=at_least(1)),
        "exact_max": Field("int", 1000, "largest N for exact W2 (O(N³))", check=at_least(0)),
    }),
}


# Points are computed one by one (each optimisation is its own host loop).
BATCH_AXES = ()


def dtype_of(cfg):
    """The NumPy float type of a config's ``dtype``."""
    return np.float64 if cfg["dtype"] == "float64" else np.float32


def initial_mean(cfg, d):
    """The initial mean m0 of a config in dimension d.

    Args:
      cfg: a (point) config.
      d: the dimension.

    Returns:
      (d,) float64: ``m0 = c`` → c·e1, a list of d numbers, or null → 0.

    Raises:
      ConfigError: a list of another length, or another value.
    """
    v = cfg["m0"]
    if v is None:
        return np.zeros(d)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        out = np.zeros(d)
        out[0] = float(v)
        return out
    if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) for x in v):
        if len(v) != d:
            raise ConfigError(f"config field 'm0': a list must have d = {d} entries, got {len(v)}")
        return np.asarray(v, float)
    raise ConfigError(f"config field 'm0': expected a number, a list of d numbers or null, got {v!r}")


def _backend():
    import jax  # only for a large transfer N: the common check loads no JAX

    return jax.default_backend()


def check(cfg):
    """Cross-field checks of a ``reachability`` config (:meth:`~jaxdyn.experiments.ExperimentKind.check`)."""
    warns = []
    ds_ = cfg["sweep"].get("d", [cfg["d"]])
    for d in ds_:
        initial_mean(cfg, d)
    tg = cfg["target"]
    if not tg["eig_min"] <= tg["eig_max"]:
        raise ConfigError(f"config field 'target.eig_min': must be <= target.eig_max, got "
                          f"{tg['eig_min']} > {tg['eig_max']}")
    tr = cfg["transfer"]
    bad = [m for m in tr["modes"] if m not in SCHEMA["mode"].choices]
    if bad:
        raise ConfigError(f"config field 'transfer.modes': unknown modes {bad}; known: "
                          f"{list(SCHEMA['mode'].choices)}")
    if any(n < 2 for n in tr["n_particles"]):
        raise ConfigError(f"config field 'transfer.n_particles': every N must be >= 2, got "
                          f"{tr['n_particles']}")
    if any(L < 1 for L in tr["layers"]):
        raise ConfigError(f"config field 'transfer.layers': every L must be >= 1, got {tr['layers']}")
    if len(set(tr["n_particles"])) != len(tr["n_particles"]) or len(set(tr["layers"])) != len(tr["layers"]):
        raise ConfigError("config field 'transfer': n_particles and layers must be distinct values")
    big = max(list(tr["n_particles"]) + [tr["layer_n"]]) if tr["modes"] else 0
    if big > 4000 and _backend() == "cpu":
        warns.append(f"transfer: N = {big} particles with dense attention is slow on CPU "
                     "(O(N²) per step)")
    if cfg["dtype"] == "float32" and cfg["tol"] < 1e-3:
        warns.append(f"tol = {cfg['tol']:g} in float32: W2² = {cfg['tol'] ** 2:.0e} is near float32 "
                     "resolution; use dtype: float64")
    if cfg["control_kind"] == "linear" and cfg["init"] in ("auto", "certificate"):
        warns.append("the certificate is piecewise constant; on a linear grid it is sampled at the "
                     "nodes (an approximate start)")
    return warns


def process_split(cfg):
    """Several processes share the chunks' points: each computes its own on its own devices."""
    return "points"


def estimate_bytes(pc):
    """Memory of one ``reachability`` grid point (:meth:`~jaxdyn.experiments.ExperimentKind.estimate_bytes`)."""
    d = pc["d"]
    tr = pc["transfer"]
    n = max(list(tr["n_particles"]) + [tr["layer_n"]]) if tr["modes"] else 0
    # dense attention logits (N²) in a few RK4 stages, the saved moments, optimiser state.
    return int(8 * (6 * n * n + pc["n_save"] * d * d * 4 + 64 * pc["n_pieces"] * d * d) + 64 * 2**20)


def output_bytes(pc):
    """What one ``reachability`` grid point adds to the Dataset (:meth:`~jaxdyn.experiments.ExperimentKind.output_bytes`)."""
    d = pc["d"]
    iters = 1 + pc["adam_steps"] + 7 * pc["lbfgs_steps"]
    return int(8 * (2 * iters + pc["n_save"] * (d * d + 2 * d) + (pc["n_pieces"] + 1) * (3 * d * d + d)))


def transferred(pc):
    """Whether the point's controls are transferred to particles and layers (``transfer`` section)."""
    tr = pc["transfer"]
    return pc["mode"] in tr["modes"] and pc["seed"] in tr["seeds"]
