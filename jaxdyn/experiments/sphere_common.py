"""Pieces shared by the sphere experiment kinds (``sphere``, ``concentration``): the common
config fields, building a batch of models and initial clouds for a chunk of grid points, and
the resolution check N ≳ β^{(d−1)/2}."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..config import ConfigError, Field, at_least, nonnegative, positive
from ..kernels import DEFAULT_BLOCKS, MASKS, resolve_kernel
from ..models import ATTENTIONS, MultiHeadAttention, SphereAttention
from ..simulation import ENSEMBLE_METHODS, FASTER_MAX_PARTICLES
from ..sphere import sample_initial
from .. import weights as weight_ensembles
from . import segments
from .segments import MAX_STEPS_PER_CALL

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
    "rotation": Field("float", None, "angle (rad) of the rotation B (spectral ensemble)"),
    "eigenspace_angle_deg": Field("float", None, "spectral ensemble: rotate B so that E(VBᵀ) and "
                                  "E(V) are this many degrees apart"),
    "plane": Field("list", None, "eigenvector pair (i, j) of the rotation B (spectral ensemble; "
                   "default: largest and smallest eigenvalue)", item="int"),
    "random_basis": Field("bool", False, "spectral ensemble: Haar-random eigenvectors from seed"),
    "extra": Field("section", {}, "ensemble-specific options"),
}

_WEIGHTS: dict = {}  # (section, d, float64 mode) -> (Q, K, V): a run asks several times


def build_weights(spec, d):
    """(Q, K, V) of a validated ``weights`` section; a bad section is a :class:`ConfigError`.
    Remembered per section, d and x64 mode (callers get copies): the check, the models and
    the summary of one run build the same weights (the spectral ensemble's angle search
    costs about a second)."""
    import json

    key = (json.dumps(spec, sort_keys=True, default=repr), int(d),
           str(jax.dtypes.canonicalize_dtype(np.float64)))
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
    "t1": Field("float", 10.0, "final time > 0", check=positive, sweepable=True),
    "dt": Field("float", 0.05, "time step > 0", check=positive, sweepable=True),
    "method": Field("str", "rk4", "integrator", choices=("euler", "rk4", "exp_euler",
                                                                   "euler_renormalise")),
    "save_every": Field("int", 5, "steps between saved states, >= 1", check=at_least(1)),
    "dtype": Field("str", "float32", "floating type", choices=("float32", "float64")),
    "kernel": Field("str", "auto", "attention kernel", choices=("auto", "dense", "blocked")),
    "normalization": Field("str", "softmax", "attention weights",
                           choices=("softmax", "unnormalized", "hardmax")),
    "k_block": Field("int", None, "key block of the blocked kernel (default: tuned per platform)",
                     check=at_least(1)),
    "q_block": Field("int", None, "query block of the blocked kernel (default: tuned per platform)",
                     check=at_least(1)),
    "weights": Field("section", {}, "Q, K, V ensemble", schema=WEIGHTS_SCHEMA),
    "init": Field("section", {}, "initial distribution", schema=INIT_SCHEMA),
    "ensemble": Field("bool", True, "integrate chunks of small systems (N <= 48, softmax or "
                      "unnormalised, fixed step) with simulate_ensemble; false: vmap(simulate)"),
}


# ---- attention variants (issue 15: heads, masks, positions, attention weights) ----------
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
_VARIANT_DEFAULTS = {"heads": 1, "heads_spread": 0.0, "mask": "none", "positions": "none",
                     "attention": "softmax"}


def is_variant(pc) -> bool:
    """Whether a point needs :class:`~jaxdyn.MultiHeadAttention` (any variant field set)."""
    return any(pc.get(k, v) != v for k, v in _VARIANT_DEFAULTS.items())


def check_variants(cfg):
    """Cross-field checks of the attention-variant fields (config errors)."""
    pts = [dict(cfg, **{k: v}) for k, vals in cfg["sweep"].items() if k in _VARIANT_DEFAULTS
           for v in vals] + [cfg]
    if any(is_variant(p) for p in pts) and cfg["normalization"] != "softmax":
        raise ConfigError("config field 'normalization': the attention variants (heads, mask, "
                          "positions, attention) take normalization: softmax")
    masks = set(cfg["sweep"].get("mask", [cfg["mask"]]))
    if "causal" in masks and "sinkhorn" in cfg["sweep"].get("attention", [cfg["attention"]]):
        raise ConfigError("config fields 'mask'/'attention': Sinkhorn attention takes no causal "
                          "mask (a lower-triangular doubly stochastic matrix is the identity)")


def variant_model(pc, Q, K, V):
    """The :class:`~jaxdyn.MultiHeadAttention` of a point from its (Q, K, V) (module doc of
    the fields above)."""
    H, d = pc["heads"], pc["d"]
    dtype = Q.dtype
    Qs, Ks = [], []
    for h in range(H):
        if pc["heads_spread"] > 0:
            g = np.random.default_rng([int(pc["weights"].get("seed", 0)), h]).normal(size=(2, d, d))
            g = jnp.asarray(g * pc["heads_spread"] / math.sqrt(d), dtype)
            Qs.append(Q + g[0])
            Ks.append(K + g[1])
        else:
            Qs.append(Q)
            Ks.append(K)
    alibi = None
    if pc["positions"] == "alibi":
        alibi = jnp.asarray([pc["alibi_slope"] * 2.0 ** (-8.0 * h / H) for h in range(H)], dtype)
    return MultiHeadAttention(
        jnp.stack(Qs), jnp.stack(Ks), jnp.broadcast_to(V / H, (H, d, d)), pc["beta"],
        mask=pc["mask"], alibi=alibi, rope=True if pc["positions"] == "rope" else None,
        rope_base=pc["rope_base"], attention=pc["attention"],
        sinkhorn_iters=pc["sinkhorn_iters"], kernel=pc["kernel"], k_block=pc["k_block"],
        q_block=pc["q_block"])


def np_dtype(cfg):
    if cfg["dtype"] == "float64" and not jax.config.jax_enable_x64:
        raise ConfigError("config field 'dtype': float64 needs JAX's x64 mode; set the environment "
                          "variable JAX_ENABLE_X64=1 (the CLI does this for float64 configs)")
    return np.float64 if cfg["dtype"] == "float64" else np.float32


def check_sphere(cfg) -> list:
    """Cross-field checks (config errors) and warnings common to sphere kinds."""
    warns = []
    d = cfg["d"]
    ds_ = cfg["sweep"].get("d", [d])
    mu = cfg["init"].get("mu")
    if mu is not None and any(len(mu) != dd for dd in ds_):
        raise ConfigError(f"config field 'init.mu': expected {d} numbers (d = {d}), got {len(mu)}")
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


def weights_for(pc):
    dtype = np_dtype(pc)
    Q, K, V = build_weights(pc["weights"], pc["d"])
    return tuple(jnp.asarray(m, dtype) for m in (Q, K, V))


def energy_forms(pc):
    """The bilinear forms B_h = Q_hᵀK_h (H, d, d) of a point's heads, for the ``energy``
    statistic E = (1/H) Σ_h E_β(B_h) (each head weighted by its value share V_h = V/H, so H
    identical heads report the one head's E_β; masks and positions are not part of it: it is
    a statistic of the cloud). A plain point: QᵀK, H = 1."""
    Q, K, V = weights_for(pc)
    if not is_variant(pc):
        return jnp.matmul(Q.T, K, precision=jax.lax.Precision.HIGHEST)[None]
    m = variant_model(pc, Q, K, V)
    return jnp.einsum("hpd,hpe->hde", m.Q, m.K, precision=jax.lax.Precision.HIGHEST)


def models_for(pcs):
    """Stacked SphereAttention models (one per point) for a chunk sharing static fields:
    the chunk's weights broadcast, β per point (one model built, not one per point)."""
    import equinox as eqx

    Q, K, V = weights_for(pcs[0])
    p0 = pcs[0]
    if is_variant(p0):
        m = variant_model(p0, Q, K, V)
    else:
        m = SphereAttention(Q, K, V, p0["beta"], kernel=p0["kernel"],
                            normalization=p0["normalization"], k_block=p0["k_block"],
                            q_block=p0["q_block"])
    P = len(pcs)
    stacked = jax.tree.map(lambda a: jnp.broadcast_to(a, (P,) + a.shape) if eqx.is_array(a) else a, m)
    betas = jnp.asarray(np.array([p["beta"] for p in pcs]), m.beta.dtype)
    return eqx.tree_at(lambda t: t.beta, stacked, betas)


@functools.lru_cache(maxsize=32)
def _sampler(n, d, dist, dtype, kw):
    """A jitted sampler of one cloud per key, cached so that chunks share one program."""
    kw = dict(kw)
    if kw.get("mu") is not None:
        kw["mu"] = jnp.asarray(kw["mu"], dtype)
    return jax.jit(jax.vmap(lambda k: sample_initial(k, n, d, dist, dtype, **kw)))


def initial_clouds(pcs):
    """(P, N, d) initial particles, one cloud per point, from its key PRNGKey(seed)."""
    p0 = pcs[0]
    dtype = np_dtype(p0)
    init = dict(p0["init"])
    dist = init.pop("dist")
    kw = {}
    if dist in ("vmf", "mixture"):
        kw["kappa"] = init["kappa"]
        if init.get("mu") is not None:
            kw["mu"] = tuple(float(v) for v in init["mu"])
    if dist == "mixture":
        kw["weight"] = init["weight"]
    keys = np.stack([np.asarray(jax.random.PRNGKey(p["seed"])) for p in pcs])
    return _sampler(p0["n"], p0["d"], dist, dtype, tuple(sorted(kw.items())))(keys)


def save_times(pc):
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
    dkb, dqb = DEFAULT_BLOCKS["gpu" if jax.default_backend() == "gpu" else "cpu"]
    kb = min(pc["k_block"] or dkb, n)
    qb = min(pc["q_block"] or dqb, n)
    dense = resolve_kernel(pc["kernel"], n) == "dense"
    work = (n * n if dense else qb * kb) * item * 3 * pc.get("heads", 1)
    return frames * (n * d * item + extra_per_frame) + 12 * n * d * item + work


def uses_ensemble(pc) -> bool:
    """Whether a chunk integrates with :func:`jaxdyn.simulate_ensemble` (systems on the
    vector lanes): softmax or unnormalised weights, N <= ``FASTER_MAX_PARTICLES`` (48, where
    it was measured faster than vmap(simulate)), a fixed-step method, and not switched off
    with ``ensemble: false``."""
    return (bool(pc.get("ensemble", True)) and not is_variant(pc)
            and pc["normalization"] in ("softmax", "unnormalized")
            and pc["n"] <= FASTER_MAX_PARTICLES and pc["method"] in ENSEMBLE_METHODS)


def integrate_chunk(pcs, frame_fn, extra=(), consts=(), max_steps_per_call: int = MAX_STEPS_PER_CALL):
    """Integrate a chunk of sphere points (sharing every static field) with
    :func:`segments.integrate_segments`: the chunk's stacked models (:func:`models_for`), its
    initial clouds (:func:`initial_clouds`), ``simulate_ensemble`` when :func:`uses_ensemble`.

    ``frame_fn(model, xs, *extra, *consts)``: ``extra`` are arrays with a leading point axis
    (per-system data such as Π(x0)); ``consts`` are arrays shared by all systems (broadcast
    to every system, not closed over, so that chunks share the compiled programs).

    Returns (outputs, finite): outputs a tuple of NumPy arrays (P, S_total, ...) over all
    saved times (``save_times``), finite a (P,) bool array.
    """
    p0 = pcs[0]
    P = len(pcs)
    extra = tuple(extra) + tuple(jnp.broadcast_to(jnp.asarray(c), (P,) + jnp.shape(c)) for c in consts)
    return segments.integrate_segments(
        models_for(pcs), initial_clouds(pcs), frame_fn, extra, t1=p0["t1"], dt=p0["dt"],
        save_every=p0["save_every"], method=p0["method"], ensemble=uses_ensemble(p0),
        max_steps_per_call=max_steps_per_call)
