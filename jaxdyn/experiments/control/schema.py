"""Kind ``control``: config fields, cross-field checks, memory estimates."""

from __future__ import annotations

from ...config import ConfigError, Field, at_least, nonnegative, positive

PROBLEMS = ("gaussian_to_mixture", "sphere_clusters")
WEIGHTS = ("Q", "K", "V", "A", "b", "beta")
#: the model and the dimension of each problem
PROBLEM_MODEL = {"gaussian_to_mixture": ("euclidean", 2), "sphere_clusters": ("sphere", 3)}
#: the weights of each model
MODEL_WEIGHTS = {"euclidean": ("Q", "K", "V", "A", "b"), "sphere": ("Q", "K", "V", "beta")}

SCHEMA = {
    "problem": Field("str", "gaussian_to_mixture", "initial and target clouds",
                     choices=PROBLEMS),
    "n_layers": Field("int", 4, "layers L (pieces of the controls)", check=at_least(1),
                      sweepable=True),
    "seed": Field("int", 0, "seed of the clouds and of the random start", sweepable=True),
    "max_layers": Field("int", 16, "length of the saved layer axis (>= every n_layers)",
                        check=at_least(1)),
    "n_particles": Field("int", 256, "points N of each cloud", check=at_least(2),
                         sweepable=True),
    "dtype": Field("str", "float64", "floating type", choices=("float32", "float64")),
    "t1": Field("float", 1.0, "horizon T", check=positive),
    "free": Field("list", [], "optimised weights (empty: all of the model's)", item="str"),
    "init_scale": Field("float", 0.1, "std of the random start", check=nonnegative),
    "epsilon": Field("float", 0.01, "final entropic ε (squared distance units)", check=positive),
    "epsilon_start": Field("float", 0.1, "ε at the start (annealed to epsilon)", check=positive),
    "cost": Field("str", "none", "control cost", choices=("none", "jump", "energy")),
    "cost_weight": Field("float", 0.0, "weight λ of the control cost", check=nonnegative),
    "continuation": Field("bool", True, "climb the depth: L/2^k, ..., L/2, L, each depth "
                          "started from the last one's optimum (its layers repeated)"),
    "continuation_adam_steps": Field("int", 30, "Adam iterations of a continued depth "
                                     "(at epsilon, learning rate adam_lr / 5)",
                                     check=at_least(0)),
    "adam_steps": Field("int", 150, "Adam iterations", check=at_least(0)),
    "adam_lr": Field("float", 0.05, "Adam's initial learning rate", check=positive),
    "lbfgs_steps": Field("int", 100, "L-BFGS iterations at most", check=at_least(0)),
    "gtol": Field("float", 1e-6, "stationarity tolerance on the gradient norm", check=positive),
    "steps_per_layer": Field("int", 0, "RK4 steps a layer (0: max(2, 16 // n_layers))",
                             check=at_least(0)),
    # the gradient's relative error is of the order of the threshold, far below what the
    # optimiser's steps resolve; a tighter one multiplies the Sinkhorn iterations at small ε
    "sinkhorn_threshold": Field("float", 1e-4, "Sinkhorn's marginal tolerance (L1) of every "
                                "solve of the optimisation", check=positive),
    "exact_max": Field("int", 2048, "largest N for the exact W2 (O(N³))", check=at_least(0)),
    "n_depths": Field("int", 5, "depths at which the cloud is saved (evenly in [0, T])",
                      check=at_least(2)),
    "target": Field("section", {}, "the target clouds", schema={
        "clusters": Field("int", 2, "number of clusters", check=at_least(1)),
        "separation": Field("float", 2.0, "radius of the cluster centres (R^2)", check=positive),
        "spread": Field("float", 0.3, "std of each cluster (R^2)", check=positive),
        "kappa": Field("float", 20.0, "von Mises–Fisher concentration (S^2)", check=positive),
    }),
}

# Points run one by one (each optimisation is one compiled loop of its own L and N): a sweep
# over n_layers, n_particles and seed is a sweep over chunks, each saved when done (resumable).
BATCH_AXES = ()


def model_of(cfg):
    """``(model, d)`` of a config's problem."""
    return PROBLEM_MODEL[cfg["problem"]]


def free_of(cfg):
    """The optimised weights of a config (all of the model's when ``free`` is empty)."""
    model, _ = model_of(cfg)
    return tuple(cfg["free"]) or MODEL_WEIGHTS[model]


def steps_of(cfg):
    """RK4 steps a layer of a (point) config."""
    return cfg["steps_per_layer"] or max(2, 16 // cfg["n_layers"])


def check(cfg):
    """Cross-field checks of a ``control`` config (:meth:`~jaxdyn.experiments.ExperimentKind.check`)."""
    model, _ = model_of(cfg)
    bad = [w for w in cfg["free"] if w not in MODEL_WEIGHTS[model]]
    if bad:
        raise ConfigError(f"config field 'free': {bad} are not weights of the {model} model of "
                          f"problem {cfg['problem']!r}; known: {list(MODEL_WEIGHTS[model])}")
    layers = cfg["sweep"].get("n_layers", [cfg["n_layers"]])
    if max(layers) > cfg["max_layers"]:
        raise ConfigError(f"config field 'max_layers': must be >= every n_layers "
                          f"({max(layers)}), got {cfg['max_layers']}")
    if cfg["epsilon_start"] < cfg["epsilon"]:
        raise ConfigError("config field 'epsilon_start': must be >= epsilon")
    warns = []
    big = max(cfg["sweep"].get("n_particles", [cfg["n_particles"]]))
    if big > cfg["exact_max"]:
        warns.append(f"n_particles = {big} > exact_max: the exact W2 is skipped there "
                     "(the Sinkhorn W2 is recorded)")
    if cfg["problem"] == "sphere_clusters" and cfg["target"]["clusters"] > 12:
        warns.append("more than 12 clusters on S^2 overlap at the default kappa")
    return warns


def process_split(cfg):
    """Several processes share the points: each computes its own on its own devices."""
    return "points"


def estimate_bytes(pc):
    """Memory of one ``control`` grid point (:meth:`~jaxdyn.experiments.ExperimentKind.estimate_bytes`)."""
    n, (_, d) = pc["n_particles"], model_of(pc)
    item = 8 if pc["dtype"] == "float64" else 4
    L, s = pc["n_layers"], steps_of(pc)
    states = n * d * item * (L + 1) * (s + 2) * 8  # checkpoints, RK4 stages, a few copies
    sinkhorn = 3 * n * n * item if n * n <= 2**24 else 3 * 1024 * 512 * item
    tiles = 4 * 1024 * 512 * item
    return int(states + sinkhorn + tiles + 64 * 2**20)


def output_bytes(pc):
    """What one ``control`` grid point adds to the Dataset (:meth:`~jaxdyn.experiments.ExperimentKind.output_bytes`)."""
    n, (_, d) = pc["n_particles"], model_of(pc)
    iters = 1 + pc["adam_steps"] + pc["lbfgs_steps"]
    return int(8 * (3 * iters + (pc["n_depths"] + 2) * n * d
                    + pc["max_layers"] * (4 * d * d + d + 1) + 16))
