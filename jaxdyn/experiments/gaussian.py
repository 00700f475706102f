r"""Experiment kind ``gaussian``: particles against the Gaussian closure, and phase diagrams (Paper B).

**study: trajectory.** For each grid point (``n``, ``seed``, ``activation``) N particles are
drawn from ``N(m0, S0)`` and run under :class:`jaxdyn.EuclideanAttention`,

    ẋ_i = A σ(x_i) + b + V Σ_j w_ij x_j,   w_ij ∝ exp(x_jᵀ B x_i),   σ = identity or ReLU,

with fixed-step RK4 (``dt``). At the saved times it records the particles' empirical mean
``m̂ = (1/N) Σ x_i`` and covariance ``Ŝ = (1/N) Σ (x_i − m̂)(x_i − m̂)ᵀ``, the largest radius
``max_i |x_i|``, and how non-Gaussian the cloud is (the largest |skewness| and |excess
kurtosis| of its projections on ``n_directions`` fixed directions); beside them, the
Gaussian closure of the *identity* model (MATH.md §B),

    m' = (A + V) m + V Σ B m + b,   Σ' = A Σ + Σ Aᵀ + V Σ B Σ + Σ Bᵀ Σ Vᵀ,

solved in float64 with :func:`jaxdyn._gaussian.solve_moments` (Dopri8, blow-up event; the
reference, whatever the particles' ``dtype``), its closed form
``Σ(t) = P(t)⁻¹`` when ``V = v I`` (``P' = −PA − AᵀP − v(B + Bᵀ)``, see
:mod:`jaxdyn._gaussian_closed`), and the Bures–Wasserstein distance between
``N(m̂(t), Ŝ(t))`` and the closure ``N(m(t), Σ(t))``.

What it shows: (1) the error against N (log–log, slope ≈ −1/2: Monte-Carlo error of the
empirical measure); (2) near a blow-up of the closure, the time at which particles and
closure part ways: the first saved time with ``|tr Ŝ / tr Σ − 1| > parting_threshold``
(the particle system cannot blow up in finite time: each attention output is a convex
average of the particles, so ``R(t) = max_i |x_i(t)|`` obeys
``R' ≤ (‖A‖ + ‖V‖) R + |b|``); (3) with ``activation: relu``, how far the ReLU particles'
empirical moments move from the identity closure (Bures distance against t, beside the
identity particles at the same N — the Monte-Carlo floor — and the first-order prediction
``t·(ṁ_relu − ṁ, Σ̇_relu − Σ̇)`` from the exact initial rates of the ReLU field on
``N(m0, S0)``, :func:`relu_initial_rates`), and how non-Gaussian the ReLU cloud becomes
(skewness/kurtosis against the identity cloud's floor).

**study: phase_diagram.** ``A = a I``, ``B = c I``, ``V = v I`` over an (a, c) grid,
solved in one batch by :func:`jaxdyn._gaussian_batch.solve_moments_batch`. Each eigenvalue
σ of Σ follows ``σ' = 2aσ + 2vcσ²``, so the blow-up time is
``T*(a, c) = scalar_blowup_time(λmax(S0), a, v c)`` and the boundaries are drawn from it:
blow-up before t1 where ``T* = t1``; blow-up ever iff ``vc > 0`` and ``vcλmax > −a``.
Colour: the numerical blow-up time, and ``tr Σ(t1)`` where there is none.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..gaussian._solve import MomentStatus
from ..config import ConfigError, Field, at_least, positive

# ---------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------


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
    "kernel": Field("str", "auto", "attention kernel", choices=("auto", "dense", "blocked")),
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

MAX_STEPS_PER_CALL = 250


def _dtype(cfg):
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


def _tols(cfg):
    # the trajectory study's closure is always solved in float64 (the reference)
    f64 = cfg["dtype"] == "float64" or cfg["study"] == "trajectory"
    rtol = cfg["rtol"] if cfg["rtol"] is not None else (1e-10 if f64 else 1e-6)
    atol = cfg["atol"] if cfg["atol"] is not None else (1e-12 if f64 else 1e-8)
    return float(rtol), float(atol)


def scalar_v(V):
    """v if ``V = v I`` exactly (the closed-form case), else None."""
    V = np.asarray(V, np.float64)
    v = float(V[0, 0])
    return v if np.array_equal(V, v * np.eye(V.shape[0])) else None


def check(cfg):
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
    if max(ns) > 20000 and jax.default_backend() == "cpu":
        warns.append(f"N = {max(ns)} particles: O(N²) attention per step is slow on CPU")
    return warns


def _save_times(pc):
    from ..simulation._simulate import _plan, save_indices

    _, _, dt, n = _plan(0.0, pc["t1"], pc["dt"])
    return np.asarray(save_indices(n, pc["save_every"])) * dt


def _snapshot_index(pc):
    ts = _save_times(pc)
    want = [min(max(s, 0.0), ts[-1]) for s in pc["snapshots"]]
    return np.asarray(sorted({int(np.argmin(np.abs(ts - s))) for s in want}))


def estimate_bytes(pc):
    item = 8 if pc["dtype"] == "float64" else 4
    d = pc["d"]
    if pc["study"] == "phase_diagram":
        npts = int(pc["phase"]["a"][2]) * int(pc["phase"]["c"][2])
        return int(npts * 8 * (40 * (d * d + d) + 64))
    from ..kernels._attention import DEFAULT_BLOCKS, resolve_kernel

    n = pc["n"]
    frames = len(_save_times(pc))
    dkb, dqb = DEFAULT_BLOCKS["gpu" if jax.default_backend() == "gpu" else "cpu"]
    dense = resolve_kernel(pc["kernel"], n) == "dense"
    work = (n * n if dense else min(dkb, n) * min(dqb, n)) * item * 3
    saved = min(MAX_STEPS_PER_CALL // pc["save_every"] + 1, frames) * n * d * item
    return int(16 * n * d * item + work + saved + frames * 8 * (2 * d * d + 2 * d + 8))


def output_bytes(pc):
    if pc["study"] == "phase_diagram":
        return int(8 * 8 * int(pc["phase"]["a"][2]) * int(pc["phase"]["c"][2]))
    d = pc["d"]
    frames = len(_save_times(pc))
    snaps = len(_snapshot_index(pc)) * min(pc["snapshot_particles"], pc["n"]) * d
    return int(8 * (frames * (2 * d * d + 2 * d + 8) + snaps))


# ---------------------------------------------------------------------------------------
# Building blocks (also used by the tests)
# ---------------------------------------------------------------------------------------


def psd_sqrt(S):
    """Symmetric square root of a PSD matrix (eigh; valid when singular). NumPy float64."""
    w, U = np.linalg.eigh(0.5 * (np.asarray(S, np.float64) + np.asarray(S, np.float64).T))
    return (U * np.sqrt(np.clip(w, 0.0, None))) @ U.T


def gaussian_cloud(key, n: int, m0, S0, dtype=jnp.float64):
    """(n, d) i.i.d. samples of N(m0, S0): ``m0 + z S0^{1/2}``, z standard normal (jax.random)."""
    m0 = np.asarray(m0, np.float64)
    R = jnp.asarray(psd_sqrt(S0), dtype)
    z = jax.random.normal(key, (n, m0.shape[0]), dtype)
    return jnp.asarray(m0, dtype) + z @ R


def directions(d: int, k: int, dtype=jnp.float64):
    """(d, k) unit directions: evenly spaced angles on [0, π) in d = 2, (1,) in d = 1,
    fixed Gaussian draws (key 0) normalised otherwise."""
    if d == 1:
        return jnp.ones((1, 1), dtype)
    if d == 2:
        th = np.pi * np.arange(k) / k
        return jnp.asarray(np.stack([np.cos(th), np.sin(th)]), dtype)
    g = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (d, k), jnp.float64))
    return jnp.asarray(g / np.linalg.norm(g, axis=0, keepdims=True), dtype)


def cloud_stats(xs, dirs):
    """Per-frame statistics of clouds ``xs`` (S, N, d): mean (S, d), covariance (S, d, d)
    with 1/N normalisation, max radius (S,), and the largest |skewness| and |excess
    kurtosis| (S,) of the projections on the columns of ``dirs`` (d, K)."""
    n = xs.shape[-2]
    m = jnp.mean(xs, axis=-2)
    xc = xs - m[..., None, :]
    C = jnp.einsum("snk,snl->skl", xc, xc, precision=jax.lax.Precision.HIGHEST) / n
    r = jnp.sqrt(jnp.max(jnp.sum(xs * xs, axis=-1), axis=-1))
    p = jnp.einsum("snk,kj->snj", xc, dirs, precision=jax.lax.Precision.HIGHEST)
    var = jnp.mean(p * p, axis=-2)
    sd = jnp.sqrt(jnp.where(var > 0, var, 1.0))
    z = p / sd[..., None, :]
    g1 = jnp.where(var > 0, jnp.mean(z ** 3, axis=-2), 0.0)
    g2 = jnp.where(var > 0, jnp.mean(z ** 4, axis=-2) - 3.0, 0.0)
    return m, C, r, jnp.max(jnp.abs(g1), axis=-1), jnp.max(jnp.abs(g2), axis=-1)


def make_model(p, activation="identity", dtype=jnp.float64, kernel="auto"):
    from ..models._fields import EuclideanAttention

    return EuclideanAttention(*(jnp.asarray(p[k], dtype) for k in ("A", "B", "V")),
                              jnp.asarray(p["b"], dtype), activation=activation, kernel=kernel)


def run_particles(model, x0s, *, t1, dt, save_every, method="rk4", n_directions=16,
                  snapshot_index=(), snapshot_particles=0):
    """Integrate a batch of clouds ``x0s`` (P, N, d) under one particle model and return
    per-frame statistics at the saved times (``save_every`` steps of ``dt``) without keeping
    the trajectories: a dict of NumPy arrays with leading axes (P, S) — ``mean``, ``cov``,
    ``radius``, ``skew``, ``kurt`` (see :func:`cloud_stats`), ``snapshots`` (P, len
    snapshot_index, snapshot_particles, d) — plus ``ts`` (S,) and ``finite`` (P,).

    The batch is split across devices (:func:`jaxdyn._sharding.sharded_vmap`); the run is cut
    into calls of at most ``MAX_STEPS_PER_CALL`` steps (the model is autonomous).
    """
    from ..simulation._sharding import sharded_vmap
    from ..simulation._simulate import _plan, save_indices, simulate

    _, _, dt, n_steps = _plan(0.0, t1, dt)
    idx = list(save_indices(n_steps, save_every))
    per = max(1, MAX_STEPS_PER_CALL // save_every)
    bounds = idx[::per]
    if bounds[-1] != idx[-1]:
        bounds.append(idx[-1])
    dtype = x0s.dtype
    d = x0s.shape[-1]
    dirs = directions(d, n_directions, dtype)
    ns = int(min(snapshot_particles, x0s.shape[1]))

    def stats(xs):
        return cloud_stats(xs, dirs) + (xs[:, :ns],)

    parts = []
    finite = np.ones(x0s.shape[0], bool)
    cache = {}
    x = x0s
    for a, b in zip(bounds[:-1], bounds[1:]):
        steps = b - a
        if steps not in cache:
            def seg(xx, steps=steps):
                tr = simulate(model, xx, t1=steps * dt, dt=dt, save_every=save_every, method=method)
                return tr.xs[-1], stats(tr.xs), tr.finite  # frames include the segment's start

            cache[steps] = sharded_vmap(seg)
        x, out, fin = cache[steps](x)
        out = jax.tree.map(np.asarray, out)
        parts.append(out if not parts else [o[:, 1:] for o in out])
        finite &= np.asarray(fin, bool)
    cat = [np.concatenate([p[i] for p in parts], axis=1) for i in range(6)]
    snap = np.asarray(snapshot_index, int)
    out = dict(mean=cat[0], cov=cat[1], radius=cat[2], skew=cat[3], kurt=cat[4],
               snapshots=cat[5][:, snap] if snap.size else cat[5][:, :0],
               ts=np.asarray(idx) * dt, finite=finite)
    return out


_MEMO: dict = {}


def _memo(key, fn):
    """Per-process memo of closure solves: the chunks of one run share them."""
    if key not in _MEMO:
        if len(_MEMO) > 32:
            _MEMO.clear()
        _MEMO[key] = fn()
    return _MEMO[key]


def _key(p, ts, *extra):
    return (tuple((k, np.asarray(p[k], np.float64).tobytes()) for k in sorted(p)),
            np.asarray(ts, np.float64).tobytes()) + extra


def closure(p, ts, *, dtype=np.float64, rtol=1e-10, atol=1e-12, blowup_threshold=1e6):
    """The identity model's Gaussian closure at times ``ts``: ``(mean (S, d), cov (S, d, d),
    status, blowup_time)`` (NaN at and after a blow-up), via :func:`solve_moments`."""
    from ..gaussian._solve import solve_moments

    def solve():
        c = lambda k: jnp.asarray(p[k], dtype)  # noqa: E731
        sol = solve_moments(c("m0"), c("S0"), A=c("A"), B=c("B"), V=c("V"), b=c("b"),
                            t1=float(ts[-1]), saveat=jnp.asarray(ts, dtype), rtol=rtol, atol=atol,
                            blowup_threshold=blowup_threshold)
        return (np.asarray(sol.mean, np.float64), np.asarray(sol.cov, np.float64),
                int(sol.status), float(sol.blowup_time))

    return _memo(_key(p, ts, np.dtype(dtype).name, rtol, atol, blowup_threshold, "closure"), solve)


_BLOCK = 64


@jax.jit
def _precision_block(ts, P0, A, B, v):
    from ..gaussian._closed import vi_precision

    P = jax.vmap(lambda t: vi_precision(t, P0, A, B, v))(ts)
    return P, jnp.linalg.eigvalsh(P)[..., 0]


def _precision_lmin(ts, P0, A, B, v):
    """``(P(t), λmin P(t))`` over ts for V = vI (Van Loan closed form, ``vi_precision``),
    evaluated in blocks of a fixed size (one compilation)."""
    ts = np.asarray(ts, np.float64)
    n = ts.size
    pad = np.concatenate([ts, np.full((-n) % _BLOCK, ts[-1])])
    outs = [_precision_block(jnp.asarray(pad[i:i + _BLOCK]), P0, A, B, v)
            for i in range(0, pad.size, _BLOCK)]
    P = np.concatenate([np.asarray(o[0]) for o in outs])[:n]
    lm = np.concatenate([np.asarray(o[1]) for o in outs])[:n]
    return P, lm


def _first_zero(P0, A, B, v, t_max, n_grid=511, n_sub=_BLOCK, rounds=12):
    """First zero of λmin P(t) on (0, t_max]: grid scan, then repeated sub-grids (one compiled
    shape each), to float64 resolution; inf if λmin stays > 0."""
    ts = np.linspace(0.0, t_max, n_grid + 1)
    _, lm = _precision_lmin(ts, P0, A, B, v)
    hit = np.flatnonzero(lm <= 0)
    if not hit.size:
        return math.inf
    lo, hi = float(ts[hit[0] - 1]), float(ts[hit[0]])
    for _ in range(rounds):
        sub = np.linspace(lo, hi, n_sub)
        _, lm = _precision_lmin(sub, P0, A, B, v)
        k = int(np.flatnonzero(lm <= 0)[0])
        lo, hi = float(sub[k - 1]), float(sub[k])
        if hi - lo <= 4 * np.finfo(np.float64).eps * hi:
            break
    return 0.5 * (lo + hi)


def closed_form(p, ts):
    """Closed form of the closure's covariance when ``V = v I`` (MATH.md §B):
    ``Σ(t) = P(t)⁻¹``, ``P' = −PA − AᵀP − v(B + Bᵀ)``, for invertible S0; T* is
    ``vi_blowup_time`` (A = 0) or the first zero of ``λmin P(t)`` on [0, ts[-1]]. Returns
    ``(cov (S, d, d) NaN from the blow-up on, T*)`` or ``(None, None)`` when there is no
    closed form. float64."""
    from ..gaussian._closed import vi_blowup_time

    v = scalar_v(p["V"])
    S0 = p["S0"]
    if v is None or np.linalg.eigvalsh(S0)[0] <= 1e-12 * max(1.0, np.abs(S0).max()):
        return None, None

    def compute():
        A, B = (np.asarray(p[k], np.float64) for k in ("A", "B"))
        with jax.enable_x64(True):
            args = (jnp.asarray(np.linalg.inv(S0)), jnp.asarray(A), jnp.asarray(B),
                    jnp.asarray(v, jnp.float64))
            Ps, _ = _precision_lmin(ts, *args)
            if not np.any(A):
                Tstar = float(vi_blowup_time(jnp.asarray(S0), jnp.asarray(B), v))
            else:
                Tstar = _first_zero(*args, float(ts[-1]))
        cov = np.full(Ps.shape, np.nan)
        ok = np.asarray(ts) < Tstar
        cov[ok] = np.linalg.inv(Ps[ok])
        return 0.5 * (cov + np.swapaxes(cov, -1, -2)), Tstar

    return _memo(_key(p, ts, "closed_form"), compute)


def lyapunov_limit(p):
    """The attracting equilibrium ``Σ* = P*⁻¹``, ``AᵀP* + P*A = −v(B + Bᵀ)``, when ``V = v I``,
    spec(A) ⊂ {Re > 0} and ``v(B + Bᵀ) ≺ 0`` (MATH.md §B); else None."""
    from ..gaussian._closed import lyapunov_equilibrium

    v = scalar_v(p["V"])
    A, B = p["A"], p["B"]
    if v is None or np.linalg.eigvals(A).real.min() <= 0 or np.linalg.eigvalsh(v * (B + B.T))[-1] >= 0:
        return None
    with jax.enable_x64(True):
        S, _ = lyapunov_equilibrium(jnp.asarray(A), jnp.asarray(B), v)
    return np.asarray(S, np.float64)


def relu_initial_rates(p):
    r"""Exact initial rates of the *mean-field* moments under the ReLU field on N(m0, S0):

        ṁ = A E[relu(x)] + b + (V + V Σ0 B) m0,   E[relu(x_l)] = μ Φ(μ/s) + s φ(μ/s),
        Σ̇ = A D Σ0 + Σ0 D Aᵀ + V Σ0 B Σ0 + Σ0 Bᵀ Σ0 Vᵀ,   D = diag(P(x_l > 0)) = diag(Φ(μ/s)),

    (μ = m0_l, s² = Σ0_ll; Stein's lemma ``Cov(x, g(x)) = Σ E[∇g]ᵀ``; the attention part is
    that of the identity closure since the tilted mean of a Gaussian is ``m + ΣBx``).
    Returns ``(ṁ, Σ̇)`` (float64)."""
    from scipy.stats import norm

    A, B, V, b, m, S = (p[k] for k in ("A", "B", "V", "b", "m0", "S0"))
    s = np.sqrt(np.clip(np.diag(S), 0.0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(s > 0, m / np.where(s > 0, s, 1.0), np.sign(m) * np.inf)
    Phi = norm.cdf(u)
    Phi = np.where((s == 0) & (m == 0), 0.5, Phi)
    er = np.where(s > 0, m * Phi + s * norm.pdf(np.where(np.isfinite(u), u, 0.0)), np.maximum(m, 0))
    D = np.diag(Phi)
    dm = A @ er + b + (V + V @ S @ B) @ m
    G = A @ D @ S + V @ S @ B @ S
    return dm, G + G.T


def tilt_index(S, B):
    r"""``s = ‖Σ^{1/2} B Σ^{1/2}‖₂`` per frame (S: (..., d, d)); NaN where Σ is not finite.

    Derived here (a heuristic, checked numerically in ``tests/test_gaussian_particles.py``):
    each particle's attention output is a self-normalised importance-sampling average over
    the keys with weights ``exp(yᵀBx)``. On ``N(m, Σ)`` the influence of one key y on the
    particle average is ``ψ(y) ∝ exp(½ ỹᵀ K(I + KᵀK)⁻¹Kᵀ ỹ)`` (whitened ỹ, ``K = Σ^{1/2}BΣ^{1/2}``),
    whose tail index is ``α = (1 + s²)/s²``. For s < 1 it has finite variance and the
    moments converge at the Monte-Carlo rate N^{-1/2}; for s > 1 its sum fluctuates like
    N^{1/α}, so the error decays only like ``N^{-1/(1+s²)}``. The predicted exponent of the
    moment error at time t is ``−min(1/2, 1/(1 + max_{τ≤t} s(τ)²))``.
    """
    S = np.asarray(S, np.float64)
    B = np.asarray(B, np.float64)
    ok = np.all(np.isfinite(S), axis=(-2, -1))
    Sf = np.where(ok[..., None, None], S, np.eye(S.shape[-1]))
    w, U = np.linalg.eigh(0.5 * (Sf + np.swapaxes(Sf, -1, -2)))
    R = (U * np.sqrt(np.clip(w, 0.0, None))[..., None, :]) @ np.swapaxes(U, -1, -2)
    s = np.linalg.norm(R @ B @ R, ord=2, axis=(-2, -1))
    return np.where(ok, s, np.nan)


def predicted_exponent(tilt):
    """``−min(1/2, 1/(1 + max_{τ≤t} s(τ)²))`` along a tilt-index curve (NaN once s is NaN)."""
    smax = np.maximum.accumulate(np.where(np.isfinite(tilt), tilt, np.inf))
    out = -np.minimum(0.5, 1.0 / (1.0 + smax ** 2))
    return np.where(np.isfinite(tilt), out, np.nan)


def bures(m0, S0, m1, S1):
    """Bures–Wasserstein distance, float64, broadcast over leading axes; NaN where an input is."""
    from ..distances import bures_w2

    bad = ~(np.all(np.isfinite(S0), axis=(-2, -1)) & np.all(np.isfinite(S1), axis=(-2, -1))
            & np.all(np.isfinite(m0), axis=-1) & np.all(np.isfinite(m1), axis=-1))
    f = lambda a: np.nan_to_num(np.asarray(a, np.float64))  # noqa: E731
    with jax.enable_x64(True):
        w = np.asarray(bures_w2(f(m0), f(S0), f(m1), f(S1)), np.float64)
    return np.where(bad, np.nan, w)


def parting_time(ts, tr_particles, tr_closure, threshold):
    """First saved time with ``|tr_particles/tr_closure − 1| > threshold``, or where the
    closure is no longer finite (blown up) while the particles are; NaN if never."""
    ts = np.asarray(ts)
    tp, tc = np.asarray(tr_particles, np.float64), np.asarray(tr_closure, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        off = np.abs(tp / tc - 1.0) > threshold
    off |= ~np.isfinite(tc) & np.isfinite(tp)
    hit = np.flatnonzero(off)
    return float(ts[hit[0]]) if hit.size else float("nan")


# ---------------------------------------------------------------------------------------
# Compute
# ---------------------------------------------------------------------------------------


def run_points(pcs):
    if pcs[0]["study"] == "phase_diagram":
        with jax.enable_x64(pcs[0]["dtype"] == "float64"):
            return _run_phase(pcs)
    # x64 on for the float64 closure (the reference); the particles run in cfg["dtype"]
    with jax.enable_x64(True):
        return _run_trajectory(pcs)


def _grid(spec):
    return np.linspace(float(spec[0]), float(spec[1]), int(spec[2]))


def phase_theory(S0, a, c, v, t1):
    """Closed-form blow-up time ``T*(a, c)`` and ``tr Σ(t1)`` (inf at/after a blow-up) for
    ``A = aI, B = cI, V = vI`` on the meshgrid of a × c (float64)."""
    from ..gaussian._closed import scalar_blowup_time, scalar_variance

    aa, cc = np.meshgrid(a, c, indexing="ij")
    sig = np.linalg.eigvalsh(np.asarray(S0, np.float64))
    with jax.enable_x64(True):
        T = np.asarray(scalar_blowup_time(sig[-1], aa, v * cc), np.float64)
        tr = sum(np.asarray(scalar_variance(float(t1), s, aa, v * cc), np.float64)
                 for s in sig if s > 0)
    return T, np.where(T > t1, tr, np.inf)


def _run_phase(pcs):
    from ..gaussian._batch import solve_moments_batch

    rows = []
    for pc in pcs:
        dt = _dtype(pc)
        p = parameters(pc)
        d = pc["d"]
        ph = pc["phase"]
        a, c = _grid(ph["a"]), _grid(ph["c"])
        aa, cc = np.meshgrid(a, c, indexing="ij")
        eye = np.eye(d)
        A = (aa.reshape(-1, 1, 1) * eye).astype(dt)
        B = (cc.reshape(-1, 1, 1) * eye).astype(dt)
        V = np.broadcast_to(ph["v"] * eye, A.shape).astype(dt)
        rtol, atol = _tols(pc)
        sol = solve_moments_batch(p["m0"].astype(dt), p["S0"].astype(dt), A=A, B=B, V=V,
                                  b=p["b"].astype(dt), t1=pc["t1"], rtol=rtol, atol=atol,
                                  blowup_threshold=pc["blowup_threshold"])
        shp = aa.shape
        status = np.asarray(sol.status).reshape(shp)
        tr = np.trace(np.asarray(sol.cov, np.float64), axis1=-2, axis2=-1).reshape(shp)
        Tth, trth = phase_theory(p["S0"], a, c, ph["v"], pc["t1"])
        rows.append({
            "blowup_time": np.asarray(sol.blowup_time, np.float64).reshape(shp),
            "trace_final": tr, "t_final": np.asarray(sol.t_final, np.float64).reshape(shp),
            "status": status, "num_steps": np.asarray(sol.num_steps).reshape(shp),
            "theory_blowup_time": Tth, "theory_trace": trth,
            "stiff": np.asarray(sol.stiff).reshape(shp),
            "finite": bool(np.all(status != MomentStatus.NONFINITE)),
        })
    dims = {k: ("a", "c") for k in rows[0] if k != "finite"}
    dims["finite"] = ()
    vars_ = {k: (dims[k], np.stack([np.asarray(r[k]) for r in rows])) for k in rows[0]}
    return vars_, {"a": a, "c": c}


def _run_trajectory(pcs):
    p0 = pcs[0]
    dt = _dtype(p0)
    p = parameters(p0)
    d = p0["d"]
    rtol, atol = _tols(p0)
    ts = _save_times(p0)
    snap = _snapshot_index(p0)
    model = make_model(p, p0["activation"], dt, p0["kernel"])
    x0s = jnp.stack([gaussian_cloud(jax.random.PRNGKey(pc["seed"]), p0["n"], p["m0"], p["S0"], dt)
                     for pc in pcs])
    res = run_particles(model, x0s, t1=p0["t1"], dt=p0["dt"], save_every=p0["save_every"],
                        method=p0["method"], n_directions=p0["n_directions"], snapshot_index=snap,
                        snapshot_particles=p0["snapshot_particles"])
    mc, Cc, status, tstar = closure(p, ts, dtype=np.float64, rtol=rtol, atol=atol,
                                    blowup_threshold=p0["blowup_threshold"])
    Ccf, Tcf = closed_form(p, ts)
    P = len(pcs)
    rep = lambda a: np.broadcast_to(a, (P,) + np.shape(a)).copy()  # noqa: E731
    mean_p = np.asarray(res["mean"], np.float64)
    cov_p = np.asarray(res["cov"], np.float64)
    vars_ = {
        "mean_particles": (("t", "component"), mean_p),
        "cov_particles": (("t", "component", "component_b"), cov_p),
        "trace_particles": (("t",), np.trace(cov_p, axis1=-2, axis2=-1)),
        "radius": (("t",), np.asarray(res["radius"], np.float64)),
        "skew": (("t",), np.asarray(res["skew"], np.float64)),
        "kurt": (("t",), np.asarray(res["kurt"], np.float64)),
        "mean_closure": (("t", "component"), rep(mc)),
        "cov_closure": (("t", "component", "component_b"), rep(Cc)),
        "trace_closure": (("t",), rep(np.trace(Cc, axis1=-2, axis2=-1))),
        "trace_closed_form": (("t",), rep(np.trace(Ccf, axis1=-2, axis2=-1) if Ccf is not None
                                          else np.full(ts.shape, np.nan))),
        "bures": (("t",), bures(mean_p, cov_p, mc[None], Cc[None])),
        "tilt_closure": (("t",), rep(tilt_index(Cc, p["B"]))),
        "x_snapshot": (("t_snapshot", "particle", "component"),
                       np.asarray(res["snapshots"], np.float64)),
        "closure_status": ((), np.full(P, status, np.int32)),
        "closure_blowup_time": ((), np.full(P, tstar)),
        "theory_blowup_time": ((), np.full(P, np.nan if Tcf is None else Tcf)),
        "finite": ((), np.asarray(res["finite"], bool)),
    }
    return vars_, {"t": ts, "t_snapshot": ts[snap]}


# ---------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------


def _status_name(code):
    from ..gaussian._solve import status_name

    try:
        return status_name(int(code))
    except ValueError:
        return str(int(code))


def _f(x):
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _axis_values(cfg, ds, name):
    return [v.item() if hasattr(v, "item") else v for v in ds[name].values] if name in ds.dims \
        else [cfg[name]]


def _select(ds, var, **sel):
    da = ds[var]
    return da.sel({k: v for k, v in sel.items() if k in da.dims})


def _error_time(cfg, ds):
    if cfg["error_time"] is not None:
        return float(cfg["error_time"])
    T = float(np.nanmin(ds["closure_blowup_time"].values))
    return 0.5 * T if T < cfg["t1"] else float(cfg["t1"])


def _t_index(ds, t):
    return int(np.argmin(np.abs(ds["t"].values - t)))


def fit_slope(ns, errs):
    """Least-squares slope of log err against log N (NaN with fewer than 2 usable points)."""
    ns, errs = np.asarray(ns, float), np.asarray(errs, float)
    ok = np.isfinite(errs) & (errs > 0)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(ns[ok]), np.log(errs[ok]), 1)[0])


def _rms_errors(cfg, ds, act):
    """(ns, errs (len ns, T)): RMS over seeds of the Bures error against the closure."""
    ns = _axis_values(cfg, ds, "n")
    errs = []
    for n in ns:
        w = np.asarray(_select(ds, "bures", activation=act, n=n).values).reshape(-1, ds.sizes["t"])
        with np.errstate(invalid="ignore"):
            errs.append(np.sqrt(np.nanmean(np.square(w), axis=0)))
    return np.asarray(ns), np.asarray(errs)


def _error_table(cfg, ds):
    """{activation: (ns, rms Bures error over seeds at the error time)}."""
    ti = _t_index(ds, _error_time(cfg, ds))
    out = {}
    for act in _axis_values(cfg, ds, "activation"):
        ns, errs = _rms_errors(cfg, ds, act)
        out[act] = (ns, errs[:, ti])
    return out


def _slopes_over_time(cfg, ds, act="identity"):
    """(ts, fitted log–log slope of the RMS error against N at each saved time t > 0)."""
    ns, errs = _rms_errors(cfg, ds, act)
    ts = ds["t"].values
    sl = np.array([fit_slope(ns, errs[:, i]) if ts[i] > 0 else np.nan for i in range(ts.size)])
    return ts, sl


def _main_activation(cfg, ds):
    acts = _axis_values(cfg, ds, "activation")
    return "identity" if "identity" in acts else acts[0]


def _tilt(ds):
    return np.asarray(ds["tilt_closure"].values).reshape(-1, ds.sizes["t"])[0]


def zscores(cfg, ds, act, n, t):
    """Deviations of the particles' moments (mean entries, upper covariance entries) from the
    closure at time t, per seed, in units of the seed-to-seed standard deviation (needs ≥ 2
    seeds): returns (z (seeds, k), labels)."""
    ti = _t_index(ds, t)
    mp = _select(ds, "mean_particles", activation=act, n=n).isel(t=ti).values
    Cp = _select(ds, "cov_particles", activation=act, n=n).isel(t=ti).values
    mc = _select(ds, "mean_closure", activation=act, n=n).isel(t=ti).values
    Cc = _select(ds, "cov_closure", activation=act, n=n).isel(t=ti).values
    if mp.ndim == 1:
        return None, None
    d = mp.shape[-1]
    iu = np.triu_indices(d)
    vals = np.concatenate([mp, Cp[:, iu[0], iu[1]]], axis=1)
    ref = np.concatenate([mc.reshape(-1, d)[0], Cc.reshape(-1, d, d)[0][iu]])
    sd = vals.std(axis=0, ddof=1)
    labels = [f"m[{i}]" for i in range(d)] + [f"S[{i},{j}]" for i, j in zip(*iu)]
    return (vals - ref) / sd, labels


def summarize(cfg, ds):
    if cfg["study"] == "phase_diagram":
        return _summarize_phase(cfg, ds)
    out = {}
    st = int(np.asarray(ds["closure_status"].values).reshape(-1)[0])
    T = float(np.asarray(ds["closure_blowup_time"].values).reshape(-1)[0])
    Tth = float(np.asarray(ds["theory_blowup_time"].values).reshape(-1)[0])
    out["closure"] = {"status": _status_name(st),
                      "blowup_time": _f(T), "closed_form_blowup_time": _f(Tth),
                      "blowup_time_relative_error": _f(abs(T - Tth) / Tth)
                      if math.isfinite(T) and math.isfinite(Tth) else None}
    tc = np.asarray(ds["trace_closure"].values).reshape(-1, ds.sizes["t"])[0]
    tf = np.asarray(ds["trace_closed_form"].values).reshape(-1, ds.sizes["t"])[0]
    ok = np.isfinite(tc) & np.isfinite(tf)
    if ok.any():
        out["closure"]["trace_vs_closed_form_max_relative_error"] = _f(
            np.max(np.abs(tc[ok] - tf[ok]) / np.abs(tf[ok])))
    te = _error_time(cfg, ds)
    table = _error_table(cfg, ds)
    err = {}
    for act, (ns, errs) in table.items():
        err[act] = {"n": [int(n) for n in ns], "rms_bures_to_closure": [_f(e) for e in errs],
                    "fitted_loglog_slope": _f(fit_slope(ns, errs))}
    tilt = _tilt(ds)
    pred = predicted_exponent(tilt)
    ti = _t_index(ds, te)
    over = []
    if "identity" in _axis_values(cfg, ds, "activation") and len(_axis_values(cfg, ds, "n")) >= 2:
        ts_, sl = _slopes_over_time(cfg, ds)
        for i in sorted({_t_index(ds, t) for t in np.linspace(0, ts_[-1], 9)[1:]}):
            over.append({"t": float(ts_[i]), "fitted_slope": _f(sl[i]), "tilt_index": _f(tilt[i]),
                         "predicted_exponent": _f(pred[i])})
    above = np.flatnonzero(np.nan_to_num(tilt, nan=np.inf) >= 1.0)
    out["error_vs_n"] = {"time": te, "per_activation": err,
                         "tilt_index_at_time": _f(tilt[ti]),
                         "predicted_exponent_at_time": _f(pred[ti]),
                         "identity_slope_over_time": over,
                         "note": "RMS over seeds of the Bures W2 between N(m̂, Ŝ) of the particles "
                                 "and the identity closure N(m, Σ). Expected slope for the identity "
                                 "model: -min(1/2, 1/(1 + s²)), s = max over [0, t] of the tilt index "
                                 "‖Σ^½ B Σ^½‖₂ of the closure (derived here; -1/2 while s < 1)"}
    out["tilt_index"] = {"initial": _f(tilt[0]),
                         "first_time_at_least_1": float(ds["t"].values[above[0]]) if above.size else None}
    seeds = _axis_values(cfg, ds, "seed")
    if len(seeds) >= 2 and "seed" in ds.dims:
        zs = {}
        for act in _axis_values(cfg, ds, "activation"):
            nmax = max(_axis_values(cfg, ds, "n"))
            z, labels = zscores(cfg, ds, act, nmax, te)
            if z is not None:
                mz = np.abs(z.mean(axis=0)) * math.sqrt(z.shape[0])
                zs[act] = {"n": int(nmax), "seeds": int(z.shape[0]),
                           "bias_in_standard_errors": dict(zip(labels, [_f(x) for x in mz]))}
        out["seed_mean_vs_closure"] = {
            "time": te, "per_activation": zs,
            "note": "|mean over seeds of (particle moment - closure)| / (seed sd / sqrt(seeds)): "
                    "a bias test; values above ~3 mean the closure is not the particles' limit"}
    if math.isfinite(T) and T < cfg["t1"]:
        part = {}
        act0 = _main_activation(cfg, ds)
        ts = ds["t"].values
        for n in _axis_values(cfg, ds, "n"):
            tp = np.asarray(_select(ds, "trace_particles", activation=act0, n=n).values)
            tcl = np.asarray(_select(ds, "trace_closure", activation=act0, n=n).values)
            tp = tp.reshape(-1, ts.size)
            tcl = tcl.reshape(-1, ts.size)
            times = [parting_time(ts, a, c, cfg["parting_threshold"]) for a, c in zip(tp, tcl)]
            rad = np.asarray(_select(ds, "radius", activation=act0, n=n).values).reshape(-1, ts.size)
            part[str(int(n))] = {"parting_time_mean": _f(np.nanmean(times)),
                                 "parting_time_per_seed": [_f(x) for x in times],
                                 "trace_ratio_at_blowup_detection": _f(np.nanmean(
                                     tp[:, np.searchsorted(ts, T) - 1] / tcl[:, np.searchsorted(ts, T) - 1])),
                                 "max_radius_at_t1": _f(np.nanmax(rad[:, -1]))}
        out["parting"] = {"threshold": cfg["parting_threshold"], "closure_blowup_time": _f(T),
                          "activation": act0, "per_n": part,
                          "note": "first saved time with |tr Ŝ/tr Σ - 1| > threshold; the particles "
                                  "stay finite past T*"}
    acts = _axis_values(cfg, ds, "activation")
    if "relu" in acts:
        out["relu"] = _relu_summary(cfg, ds)
    fin = np.asarray(ds["finite"].values)
    out["finite_points"] = int(fin.sum())
    out["points"] = int(fin.size)
    return out


def relu_first_order(cfg, ds):
    """Bures W2 between the identity closure and its first-order ReLU perturbation,
    ``N(m(t) + t Δṁ, Σ(t) + t ΔΣ̇)``, Δ = ReLU initial rates − identity initial rates."""
    from ..gaussian._solve import moment_rhs

    p = parameters(cfg)
    dm_r, dS_r = relu_initial_rates(p)
    with jax.enable_x64(True):
        dm_i, dS_i = (np.asarray(x) for x in moment_rhs(*(jnp.asarray(p[k]) for k in
                                                         ("m0", "S0", "A", "B", "V", "b"))))
    ts = ds["t"].values
    mc = np.asarray(ds["mean_closure"].values).reshape(-1, ts.size, cfg["d"])[0]
    Cc = np.asarray(ds["cov_closure"].values).reshape(-1, ts.size, cfg["d"], cfg["d"])[0]
    S1 = Cc + ts[:, None, None] * (dS_r - dS_i)
    w = bures(mc + ts[:, None] * (dm_r - dm_i), S1, mc, Cc)
    with np.errstate(invalid="ignore"):
        psd = np.all(np.linalg.eigvalsh(np.nan_to_num(S1)) >= 0, axis=-1)
    # a first-order statement: kept on the first quarter of [0, t1] while Σ + tΔΣ̇ is PSD
    w = np.where(psd & (ts <= 0.25 * ts[-1]), w, np.nan)
    return w, (dm_r - dm_i, dS_r - dS_i)


def _relu_summary(cfg, ds):
    ts = ds["t"].values
    nmax = max(_axis_values(cfg, ds, "n"))
    pred, (ddm, ddS) = relu_first_order(cfg, ds)
    out = {"n": int(nmax), "initial_rate_difference_mean": [_f(x) for x in ddm],
           "initial_rate_difference_cov_frobenius": _f(np.linalg.norm(ddS))}
    picks = sorted({_t_index(ds, t) for t in np.linspace(0, ts[-1], 5)} | {1, 2})
    rows = []
    for i in picks:
        row = {"t": float(ts[i]), "first_order_prediction": _f(pred[i])}
        for act in ("relu", "identity"):
            if act not in _axis_values(cfg, ds, "activation"):
                continue
            w = np.asarray(_select(ds, "bures", activation=act, n=nmax).isel(t=i).values)
            sk = np.asarray(_select(ds, "skew", activation=act, n=nmax).isel(t=i).values)
            ku = np.asarray(_select(ds, "kurt", activation=act, n=nmax).isel(t=i).values)
            row[f"{act}_bures_to_identity_closure"] = _f(np.nanmean(w))
            row[f"{act}_max_abs_skewness"] = _f(np.nanmean(sk))
            row[f"{act}_max_abs_excess_kurtosis"] = _f(np.nanmean(ku))
        rows.append(row)
    out["over_time"] = rows
    out["note"] = ("bures_to_identity_closure: Bures W2 between the cloud's empirical moments and the "
                   "identity closure (the identity cloud gives the Monte-Carlo floor); skewness and "
                   "excess kurtosis: the largest |value| over the projections (mean over seeds); "
                   "first_order_prediction: W2 between the closure and the closure moved by t times the "
                   "difference of the exact initial rates (ReLU minus identity, Stein's lemma); a "
                   "short-time statement, given on the first quarter of [0, t1]")
    return out


def _grid_spec(g):
    return [float(g[0]), float(g[1]), int(g[2])]


def _summarize_phase(cfg, ds):
    st = np.asarray(ds["status"].values).reshape(-1).astype(int)
    T = np.asarray(ds["blowup_time"].values).reshape(-1)
    Tth = np.asarray(ds["theory_blowup_time"].values).reshape(-1)
    t1 = cfg["t1"]
    blow = st == MomentStatus.BLOWUP
    both = blow & np.isfinite(Tth)
    rel = np.abs(T[both] - Tth[both]) / Tth[both]
    pred = Tth < t1
    agree = blow == pred
    # disagreements: how close to the boundary T* = t1 they are
    dis = np.flatnonzero(~agree)
    tr = np.asarray(ds["trace_final"].values).reshape(-1)
    trth = np.asarray(ds["theory_trace"].values).reshape(-1)
    okt = (st == MomentStatus.OK) & np.isfinite(trth)
    trel = np.abs(tr[okt] - trth[okt]) / np.abs(trth[okt])
    counts = {_status_name(k): int(np.sum(st == k)) for k in np.unique(st)}
    return {
        "grid": {"a": _grid_spec(cfg["phase"]["a"]), "c": _grid_spec(cfg["phase"]["c"]),
                 "v": cfg["phase"]["v"],
                 "points": int(st.size)},
        "status_counts": counts,
        "stiff_members": int(np.sum(np.asarray(ds["stiff"].values))),
        "blowup_classification_agreement": _f(np.mean(agree)),
        "disagreements": int(dis.size),
        "disagreements_theory_blowup_time_minus_t1": [_f(Tth[i] - t1) for i in dis[:20]],
        "blowup_time_max_relative_error": _f(rel.max()) if rel.size else None,
        "blowup_time_median_relative_error": _f(np.median(rel)) if rel.size else None,
        "trace_t1_max_relative_error": _f(trel.max()) if trel.size else None,
        "note": "theory: each eigenvalue of Σ follows σ' = 2aσ + 2vcσ²; T* = scalar_blowup_time("
                "λmax(S0), a, vc); blow-up before t1 iff T* < t1",
    }


# ---------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path):
    from .. import plots

    return plots._save(fig, path)


def _ellipse(ax, m, S, **kw):
    w, u = np.linalg.eigh(0.5 * (S + S.T))
    th = np.linspace(0, 2 * np.pi, 100)
    pts = m[:, None] + 2.0 * (u * np.sqrt(np.maximum(w, 0))) @ np.stack([np.cos(th), np.sin(th)])
    ax.plot(pts[0], pts[1], **kw)


def _n_ticks(ax, ns):
    from matplotlib.ticker import NullFormatter

    ax.set_xticks(list(ns))
    ax.set_xticklabels([str(int(n)) for n in ns])
    ax.xaxis.set_minor_formatter(NullFormatter())


def plot(cfg, ds, out_dir):
    import warnings

    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return _plot(cfg, ds, out_dir)


def _plot(cfg, ds, out_dir):
    out_dir = Path(out_dir)
    if cfg["study"] == "phase_diagram":
        return [_plot_phase(cfg, ds, out_dir)]
    figs = [_plot_ellipses(cfg, ds, out_dir), _plot_trace(cfg, ds, out_dir)]
    if len(_axis_values(cfg, ds, "n")) >= 2:
        figs.append(_plot_error(cfg, ds, out_dir))
    T = float(np.asarray(ds["closure_blowup_time"].values).reshape(-1)[0])
    if math.isfinite(T) and T < cfg["t1"]:
        figs.append(_plot_parting(cfg, ds, out_dir, T))
    if "relu" in _axis_values(cfg, ds, "activation"):
        figs.append(_plot_relu(cfg, ds, out_dir))
    return figs


def _first(ds, var, **sel):
    da = _select(ds, var, **sel)
    return da.isel({k: 0 for k in da.dims if k in ("seed", "n", "activation")})


def _plot_ellipses(cfg, ds, out_dir):
    plt = _plt()
    ns = _axis_values(cfg, ds, "n")
    acts = _axis_values(cfg, ds, "activation")
    act = "identity" if "identity" in acts else acts[0]
    nmax = max(ns)
    ts = ds["t"].values
    tsn = ds["t_snapshot"].values
    xs = _first(ds, "x_snapshot", activation=act, n=nmax).values
    mp = _first(ds, "mean_particles", activation=act, n=nmax).values
    Cp = _first(ds, "cov_particles", activation=act, n=nmax).values
    mc = _first(ds, "mean_closure", activation=act, n=nmax).values
    Cc = _first(ds, "cov_closure", activation=act, n=nmax).values
    k = len(tsn)
    fig, axes = plt.subplots(1, k, figsize=(3.6 * k, 3.6), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for j, (ax, t) in enumerate(zip(axes[0], tsn)):
        i = _t_index(ds, t)
        x = xs[j]
        ax.plot(x[:, 0], x[:, 1] if x.shape[1] > 1 else np.zeros(len(x)), ".", ms=1.5,
                color="0.6", alpha=0.6, label=f"particles ({x.shape[0]} of {int(nmax)})")
        if np.all(np.isfinite(Cc[i])) and cfg["d"] >= 2:
            _ellipse(ax, mc[i][:2], Cc[i][:2, :2], color=cmap(t / ts[-1]), lw=2.0, label="closure 2σ")
        elif cfg["d"] >= 2:
            ax.text(0.5, 0.92, "closure blown up", transform=ax.transAxes, ha="center", color="r")
        if cfg["d"] >= 2:
            _ellipse(ax, mp[i][:2], Cp[i][:2, :2], color="k", ls="--", lw=1.0, label="particles 2σ")
        ax.set_title(f"t = {t:.3g}", fontsize=9)
        ax.set_aspect("equal", adjustable="datalim")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6, loc="lower left")
    fig.suptitle(f"{cfg['name']}: covariance ellipses, closure (colour) vs {act} particles "
                 f"(N = {int(nmax)}, first seed)" + ("; first 2 coordinates" if cfg["d"] > 2 else ""),
                 fontsize=10)
    return _save(fig, out_dir / "ellipses.png")


def _plot_trace(cfg, ds, out_dir):
    plt = _plt()
    ts = ds["t"].values
    fig, ax = plt.subplots(figsize=(6.6, 4.3))
    tc = np.asarray(ds["trace_closure"].values).reshape(-1, ts.size)[0]
    tf = np.asarray(ds["trace_closed_form"].values).reshape(-1, ts.size)[0]
    ax.plot(ts, tc, "k-", lw=2.2, label="closure (Dopri8)")
    if np.any(np.isfinite(tf)):
        ax.plot(ts, tf, color="orange", ls="--", lw=1.4, label="closed form Σ = P⁻¹ (V = vI)")
    ns = _axis_values(cfg, ds, "n")
    cm = plt.get_cmap("viridis")(np.linspace(0.1, 0.85, len(ns)))
    for act, ls in (("identity", "-"), ("relu", ":")):
        if act not in _axis_values(cfg, ds, "activation"):
            continue
        for n, c in zip(ns, cm):
            tp = np.asarray(_select(ds, "trace_particles", activation=act, n=n).values).reshape(-1, ts.size)
            ax.plot(ts, np.nanmean(tp, axis=0), color=c, ls=ls, lw=1.1,
                    label=f"{act} particles N = {int(n)}" + (" (mean over seeds)" if tp.shape[0] > 1 else ""))
    T = float(np.asarray(ds["closure_blowup_time"].values).reshape(-1)[0])
    if math.isfinite(T):
        ax.axvline(T, color="r", ls=":", lw=1.0, label=f"closure T* = {T:.4g}")
        ax.set_yscale("log")
    eq = lyapunov_limit(parameters(cfg))
    if eq is not None:
        ax.axhline(np.trace(eq), color="0.4", ls="-.", lw=1.0, label="tr Σ* (Lyapunov equilibrium)")
    ax.set_xlabel("t")
    ax.set_ylabel("tr Σ(t)")
    ax.set_title(f"{cfg['name']}: tr Σ against t", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    return _save(fig, out_dir / "trace.png")


def _plot_error(cfg, ds, out_dir):
    plt = _plt()
    table = _error_table(cfg, ds)
    te = _error_time(cfg, ds)
    fig, (ax, a2) = plt.subplots(1, 2, figsize=(11.5, 4.2), constrained_layout=True)
    for (act, (ns, errs)), c in zip(table.items(), ("C0", "C3")):
        s = fit_slope(ns, errs)
        ax.plot(ns, errs, "o-", color=c, label=f"{act} particles (fit slope {s:.3f})")
        if act == "identity":
            ok = np.isfinite(errs) & (errs > 0)
            if ok.any():
                j = np.flatnonzero(ok)[0]
                ax.plot(ns, errs[j] * np.sqrt(ns[j] / ns), "k--", lw=1.0, label="reference N^(-1/2)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _n_ticks(ax, next(iter(table.values()))[0])
    ax.set_xlabel("N (particles)")
    ax.set_ylabel(f"RMS over seeds of Bures W2 to the closure at t = {te:.3g}")
    ax.set_title("error against N", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    tilt = _tilt(ds)
    if "identity" in table:
        ts, sl = _slopes_over_time(cfg, ds)
        a2.plot(ts, sl, "o-", ms=3, color="C0", label="fitted slope (identity particles)")
    a2.plot(ds["t"].values, predicted_exponent(tilt), "k--", lw=1.2,
            label="predicted: −min(1/2, 1/(1 + max s²))")
    a2.axvline(te, color="0.5", ls=":", lw=1.0)
    a2.set_xlabel("t")
    a2.set_ylabel("log–log slope of the error against N")
    a2.set_ylim(-0.8, 0.1)
    a2.grid(alpha=0.3)
    a3 = a2.twinx()
    a3.plot(ds["t"].values, tilt, color="C2", lw=1.0, label="tilt index s = ‖Σ^½BΣ^½‖₂")
    a3.axhline(1.0, color="C2", ls=":", lw=0.8)
    a3.set_ylabel("tilt index s(t) of the closure", color="C2")
    a3.set_yscale("log")
    h1, l1 = a2.get_legend_handles_labels()
    h2, l2 = a3.get_legend_handles_labels()
    a2.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower left")
    a2.set_title("convergence rate over time", fontsize=9)
    fig.suptitle(f"{cfg['name']}: particles vs Gaussian closure", fontsize=10)
    return _save(fig, out_dir / "error_vs_n.png")


def _plot_parting(cfg, ds, out_dir, T):
    plt = _plt()
    ts = ds["t"].values
    ns = _axis_values(cfg, ds, "n")
    cm = plt.get_cmap("viridis")(np.linspace(0.1, 0.85, len(ns)))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    thr = cfg["parting_threshold"]
    act0 = _main_activation(cfg, ds)
    means = []
    for n, c in zip(ns, cm):
        tp = np.asarray(_select(ds, "trace_particles", activation=act0, n=n).values).reshape(-1, ts.size)
        tcl = np.asarray(_select(ds, "trace_closure", activation=act0, n=n).values).reshape(-1, ts.size)
        with np.errstate(invalid="ignore", divide="ignore"):
            a1.plot(ts, np.nanmean(tp / tcl, axis=0), color=c, lw=1.3, label=f"N = {int(n)}")
        pt = [parting_time(ts, a, b, thr) for a, b in zip(tp, tcl)]
        means.append(pt)
    a1.axhline(1 - thr, color="k", ls="--", lw=0.8, label=f"1 − {thr:g}")
    a1.axvline(T, color="r", ls=":", label=f"closure T* = {T:.4g}")
    a1.set_xlabel("t")
    a1.set_ylabel("tr Ŝ(t) / tr Σ(t)  (particles / closure)")
    a1.set_ylim(-0.05, 1.3)
    a1.grid(alpha=0.3)
    a1.legend(fontsize=7)
    for n, pt in zip(ns, means):
        a2.plot([n] * len(pt), pt, "o", color="C0", alpha=0.5, ms=4)
    a2.plot(ns, [np.nanmean(p) for p in means], "s-", color="C0", label="parting time (mean over seeds)")
    a2.axhline(T, color="r", ls=":", label="closure T*")
    a2.set_xscale("log")
    _n_ticks(a2, ns)
    a2.set_xlabel("N (particles)")
    a2.set_ylabel(f"first t with |tr Ŝ/tr Σ − 1| > {thr:g}")
    a2.grid(alpha=0.3)
    a2.legend(fontsize=7)
    fig.suptitle(f"{cfg['name']}: particles and closure part ways before the blow-up", fontsize=10)
    return _save(fig, out_dir / "parting.png")


def _plot_relu(cfg, ds, out_dir):
    plt = _plt()
    ts = ds["t"].values
    ns = _axis_values(cfg, ds, "n")
    cm = plt.get_cmap("viridis")(np.linspace(0.1, 0.85, len(ns)))
    pred, _ = relu_first_order(cfg, ds)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    acts = _axis_values(cfg, ds, "activation")
    for n, c in zip(ns, cm):
        for act, ls in (("relu", "-"), ("identity", ":")):
            if act not in acts:
                continue
            w = np.asarray(_select(ds, "bures", activation=act, n=n).values).reshape(-1, ts.size)
            a1.plot(ts, np.nanmean(w, axis=0), color=c, ls=ls, lw=1.3,
                    label=f"{act}, N = {int(n)}")
    a1.plot(ts, pred, "k--", lw=1.2, label="first order in t (exact initial ReLU rates)")
    a1.set_yscale("log")
    a1.set_xlabel("t")
    a1.set_ylabel("Bures W2(N(m̂, Ŝ), identity closure)")
    a1.set_title("moments: ReLU cloud vs the identity closure", fontsize=9)
    a1.grid(alpha=0.3)
    a1.legend(fontsize=6, ncol=2)
    nmax = max(ns)
    for act, ls in (("relu", "-"), ("identity", ":")):
        if act not in acts:
            continue
        sk = np.asarray(_select(ds, "skew", activation=act, n=nmax).values).reshape(-1, ts.size)
        ku = np.asarray(_select(ds, "kurt", activation=act, n=nmax).values).reshape(-1, ts.size)
        a2.plot(ts, np.nanmean(sk, axis=0), color="C0", ls=ls, label=f"{act}: max |skewness|")
        a2.plot(ts, np.nanmean(ku, axis=0), color="C1", ls=ls, label=f"{act}: max |excess kurtosis|")
    a2.set_xlabel("t")
    a2.set_ylabel(f"over {cfg['n_directions']} projections (N = {int(nmax)})")
    a2.set_title("how non-Gaussian the cloud is (identity: sampling floor)", fontsize=9)
    a2.grid(alpha=0.3)
    a2.legend(fontsize=7)
    fig.suptitle(f"{cfg['name']}: ReLU feed-forward against the Gaussian closure", fontsize=10)
    return _save(fig, out_dir / "relu.png")


def _plot_phase(cfg, ds, out_dir):
    plt = _plt()
    from matplotlib.colors import LogNorm

    a, c = ds["a"].values, ds["c"].values
    sel = {k: 0 for k in ds["status"].dims if k not in ("a", "c")}
    st = ds["status"].isel(sel).values.astype(int)
    T = ds["blowup_time"].isel(sel).values
    tr = ds["trace_final"].isel(sel).values
    Tth = ds["theory_blowup_time"].isel(sel).values
    t1 = cfg["t1"]
    v = cfg["phase"]["v"]
    lam = float(np.linalg.eigvalsh(parameters(cfg)["S0"])[-1])
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), constrained_layout=True)
    ext = [c[0], c[-1], a[0], a[-1]]
    im = axes[0].imshow(np.where(st == MomentStatus.BLOWUP, T, np.nan), origin="lower", extent=ext,
                        aspect="auto", cmap="magma_r", vmin=0, vmax=t1)
    fig.colorbar(im, ax=axes[0], label="numerical blow-up time T*")
    trp = np.where((st != MomentStatus.BLOWUP) & np.isfinite(tr) & (tr > 0), tr, np.nan)
    im2 = axes[1].imshow(trp, origin="lower", extent=ext, aspect="auto", cmap="viridis",
                         norm=LogNorm(vmin=max(np.nanmin(trp), 1e-8), vmax=np.nanmax(trp))
                         if np.any(np.isfinite(trp)) else None)
    fig.colorbar(im2, ax=axes[1], label=f"tr Σ(t1 = {t1:g}) (no blow-up)")
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where((st == MomentStatus.BLOWUP) & np.isfinite(Tth), np.abs(T - Tth) / Tth, np.nan)
        im3 = axes[2].imshow(np.log10(np.maximum(rel, 1e-17)), origin="lower", extent=ext,
                             aspect="auto", cmap="cividis")
    fig.colorbar(im3, ax=axes[2], label="log10 |T*_num − T*_theory| / T*_theory")
    cc = np.linspace(c[0], c[-1], 400)
    for ax in axes:
        # blow-up ever: v c > 0 and v c λmax > -a  → boundary a = -v c λmax for v c > 0, and c = 0
        pos = v * cc > 0
        ax.plot(cc[pos], -v * cc[pos] * lam, color="C0", ls="--", lw=1.2)
        ax.axvline(0.0, color="C0", ls="--", lw=1.0)
        CS = ax.contour(c, a, np.where(np.isfinite(Tth), Tth, 1e9), levels=[t1], colors="r",
                        linewidths=1.5)
        ax.set_xlabel("c   (B = c I)")
        ax.set_ylabel("a   (A = a I)")
        ax.set_xlim(c[0], c[-1])
        ax.set_ylim(a[0], a[-1])
    axes[0].plot([], [], "r-", label=f"theory: T* = t1 = {t1:g}")
    axes[0].plot([], [], color="C0", ls="--", label="theory: blow-up ever (vcλmax + a = 0, c = 0)")
    axes[0].legend(fontsize=7, loc="lower left")
    axes[0].set_title("blow-up time (white: none before t1)", fontsize=9)
    axes[1].set_title("covariance size where there is no blow-up", fontsize=9)
    axes[2].set_title("numerical vs closed-form blow-up time", fontsize=9)
    fig.suptitle(f"{cfg['name']}: phase diagram of the moment ODE, V = {v:g} I, λmax(S0) = {lam:.3g}",
                 fontsize=10)
    return _save(fig, out_dir / "phase_diagram.png")
