"""Kind ``control``: draw the clouds, optimise the weights, record what was reached."""

from __future__ import annotations

import time

import jax
import numpy as np

from .schema import MODEL_WEIGHTS, free_of, model_of, steps_of

#: the loss is replayed at this many times the steps a layer
REPLAY_FACTOR = 4


def _fibonacci(k):
    """Points of a Fibonacci lattice on S^2, k of them."""
    i = np.arange(k) + 0.5
    z = 1 - 2 * i / k
    phi = np.pi * (1 + 5 ** 0.5) * i
    r = np.sqrt(1 - z * z)
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)


def vmf_s2(rng, n, centres, kappa):
    """Draws of an equal mixture of von Mises–Fisher laws on S^2 (exact: inverse CDF of w = cos θ).

    Args:
      rng: a NumPy Generator.
      n: the number of points.
      centres: (k, 3) unit centres.
      kappa: the concentration.

    Returns:
      (n, 3) unit rows and (n,) the cluster labels.
    """
    lab = rng.integers(0, len(centres), n)
    mu = centres[lab]
    u = rng.random(n)
    w = 1 + np.log(u + (1 - u) * np.exp(-2 * kappa)) / kappa
    v = rng.standard_normal((n, 3))
    v -= np.sum(v * mu, axis=1, keepdims=True) * mu
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    x = w[:, None] * mu + np.sqrt(np.clip(1 - w * w, 0, None))[:, None] * v
    return x / np.linalg.norm(x, axis=1, keepdims=True), lab


def _target(rng, pc):
    """A draw of the point's target law, n_particles points."""
    n, tg = pc["n_particles"], pc["target"]
    k = tg["clusters"]
    if pc["problem"] == "gaussian_to_mixture":
        ang = 2 * np.pi * np.arange(k) / k
        centres = tg["separation"] * np.stack([np.cos(ang), np.sin(ang)], axis=1)
        return centres[rng.integers(0, k, n)] + tg["spread"] * rng.standard_normal((n, 2))
    centres = np.eye(3)[:k] if k <= 3 else np.concatenate([np.eye(3), _fibonacci(k)[3:]])
    return vmf_s2(rng, n, centres, tg["kappa"])[0]


def clouds(pc):
    """The point's initial and target clouds (float64, from its seed).

    Args:
      pc: a point config.

    Returns:
      ``(x0, y)``, each (n_particles, d).
    """
    rng = np.random.default_rng([pc["seed"], 0xC0])
    n = pc["n_particles"]
    if pc["problem"] == "gaussian_to_mixture":
        x0 = rng.standard_normal((n, 2))
    else:
        x0 = rng.standard_normal((n, 3))
        x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    return x0, _target(rng, pc)


def resampled_target(pc):
    """A second draw of the target law, independent of :func:`clouds`' (float64).

    ``W2(ν_N, ν'_N)`` of the two draws is the sampling floor: how far two samples of N points
    of the same law lie apart, the W2 a cloud pushed exactly onto ``ν_N`` has to ``ν'_N``.

    Args:
      pc: a point config.

    Returns:
      (n_particles, d).
    """
    return _target(np.random.default_rng([pc["seed"], 0xC1]), pc)


def run_points(pcs):
    """Compute a chunk of ``control`` points (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.run_points`)."""
    with jax.enable_x64(pcs[0]["dtype"] == "float64"):
        return _run_points(pcs)


def _options(pc):
    model, _ = model_of(pc)
    return dict(model=model, t1=pc["t1"], epsilon=pc["epsilon"], cost=pc["cost"],
                cost_weight=pc["cost_weight"], steps_per_layer=steps_of(pc),
                sinkhorn_threshold=pc["sinkhorn_threshold"])


def depth_ladder(n_layers, continuation=True):
    """The depths a point climbs: ``L/2^k, …, L/2, L`` (k as large as L allows), or ``[L]``."""
    out = [n_layers]
    while continuation and out[-1] % 2 == 0:
        out.append(out[-1] // 2)
    return out[::-1]


def _padded(a, size):
    """A history as float64 of length ``size`` (NaN after its end)."""
    a = np.asarray(a, np.float64)
    out = np.full(size, np.nan)
    out[:min(size, a.size)] = a[:size]
    return out


#: an L-BFGS iteration counts as this many Adam steps in the progress shown (its line search
#: evaluates the loss a few times)
LBFGS_WEIGHT = 3


def _budgets(pc, first):
    """A depth's (Adam steps, L-BFGS iterations): the first depth's, or a continuation's."""
    return (pc["adam_steps"] if first else pc["continuation_adam_steps"]), pc["lbfgs_steps"]


def _work(pc, first):
    """A depth's iterations, an L-BFGS iteration counted as ``LBFGS_WEIGHT`` Adam steps."""
    adam, lbfgs = _budgets(pc, first)
    return adam + LBFGS_WEIGHT * lbfgs


def _watcher(L, i, n, adam, lbfgs):
    """The optimiser's callback at depth ``L`` (the ``i``-th of ``n``): the progress shown.

    Moves the engine's bar within the chunk (:mod:`..progress`; the depths are its stages) and
    says the depth, the iteration and the loss; the engine adds the chunk's time left.

    Returns:
      ``watch(done, total, loss)``, the callback of :func:`jaxdyn.control.measure_control`.
    """
    from .. import progress

    progress.stage(f"depth{i}")
    scale = adam + LBFGS_WEIGHT * lbfgs

    def watch(done, total, loss):
        work = min(done, adam) + LBFGS_WEIGHT * max(done - adam, 0)
        progress.advance(work, max(scale, 1))
        progress.note(f"depth {L} ({i + 1}/{n}): iteration {done}/{total}, loss {loss:.4g}")

    return watch


def _optimise(pc, x0, y):
    """The point's optimisation: one depth, or the climb of :func:`depth_ladder`.

    The optimiser runs in jitted segments (:func:`jaxdyn.control.measure_control`): a signal
    stops the chunk between two of them, and each reports the progress.

    Returns:
      The :class:`~jaxdyn.control.MeasureControlResult` at the point's depth.
    """
    from .. import progress
    from ...control import MeasureControlOptions, measure_control, repeat_layers

    ladder = depth_ladder(pc["n_layers"], pc["continuation"])
    # a depth's share of the chunk: its iterations times the RK4 steps of one flow (L times
    # the steps a layer: 16 up to L = 8 by default, so the depths cost alike until then)
    progress.plan(**{f"depth{i}": L * steps_of(dict(pc, n_layers=L)) * _work(pc, i == 0)
                     for i, L in enumerate(ladder)})
    prev, prev_L = None, None
    for i, L in enumerate(ladder):
        opts = _options(dict(pc, n_layers=L))
        model, t1 = opts.pop("model"), opts.pop("t1")
        common = dict(free=free_of(pc), seed=pc["seed"], lbfgs_steps=pc["lbfgs_steps"],
                      gtol=pc["gtol"], callback=_watcher(L, i, len(ladder), *_budgets(pc, i == 0)),
                      **opts)
        if prev is None:
            o = MeasureControlOptions(init_scale=pc["init_scale"],
                                      epsilon_start=pc["epsilon_start"],
                                      adam_steps=pc["adam_steps"], adam_lr=pc["adam_lr"], **common)
        else:
            o = MeasureControlOptions(init=repeat_layers(prev, L // prev_L),
                                      epsilon_start=pc["epsilon"],
                                      adam_steps=pc["continuation_adam_steps"],
                                      adam_lr=pc["adam_lr"] / 5, **common)
        res = measure_control(x0, y, n_layers=L, model=model, t1=t1, options=o)
        prev, prev_L = {k: res.controls[k] for k in free_of(pc)}, L
        prev.update({k: v for k, v in res.controls.items() if k not in prev})
    return jax.block_until_ready(res)


def _run_points(pcs):
    from ... import status_code
    from ...control import measure_loss
    from ...distances import w2_exact

    rows = []
    for pc in pcs:
        dt = np.float64 if pc["dtype"] == "float64" else np.float32
        model, d = model_of(pc)
        x0, y = (a.astype(dt) for a in clouds(pc))
        L, Lmax = pc["n_layers"], pc["max_layers"]
        opts = _options(pc)
        t0 = time.perf_counter()
        res = _optimise(pc, x0, y)
        seconds = time.perf_counter() - t0
        size = 1 + pc["adam_steps"] + pc["lbfgs_steps"]
        fine = dict(opts, steps_per_layer=REPLAY_FACTOR * steps_of(pc))
        loss_fine = float(measure_loss(res.controls, x0, y, free=(), **fine))
        loss_same = float(measure_loss(res.controls, x0, y, free=(), **opts))
        xs = np.asarray(res.xs, np.float64)
        exact = pc["n_particles"] <= pc["exact_max"]
        w2_ex = float(w2_exact(xs[-1], y).value) if exact else np.nan
        w2_0 = float(w2_exact(x0, y).value) if exact else np.nan
        y2 = resampled_target(pc)
        w2_floor = float(w2_exact(y, y2).value) if exact else np.nan
        w2_indep = float(w2_exact(xs[-1], y2).value) if exact else np.nan
        depth_idx = np.round(np.linspace(0, L, pc["n_depths"])).astype(int)
        row = {
            "w2_exact": w2_ex, "w2_start": w2_0, "w2_sinkhorn": float(res.w2),
            "w2_floor": w2_floor, "w2_exact_resampled": w2_indep,
            "loss": float(res.loss), "divergence": float(res.divergence),
            "cost": float(res.cost), "divergence_same_steps": loss_same,
            "divergence_fine_steps": loss_fine, "status": int(res.status),
            "stop": int(res.stats["stop"]), "iterations": int(res.stats["iterations"]),
            "grad_norm": float(res.stats["grad_norm"]), "seconds": seconds,
            "finite": bool(np.isfinite(float(res.loss))
                           and int(res.status) != status_code("nonfinite")),
            "loss_history": _padded(res.loss_history, size),
            "w2_history": _padded(res.w2_history, size),
            "epsilon_history": _padded(res.epsilon_history, size),
            "depth_layer": depth_idx.astype(np.int64),
            "particles": xs[depth_idx], "target": y.astype(np.float64),
        }
        for name in MODEL_WEIGHTS[model]:
            v = np.asarray(res.controls[name], np.float64)
            pad = np.full((Lmax,) + v.shape[1:], np.nan)
            pad[:L] = v
            row[f"control_{name}"] = pad
        rows.append(row)
    dims = {"loss_history": ("iteration",), "w2_history": ("iteration",),
            "epsilon_history": ("iteration",), "depth_layer": ("depth",),
            "particles": ("depth", "particle", "component"),
            "target": ("particle", "component"),
            "control_Q": ("layer", "component", "component_b"),
            "control_K": ("layer", "component", "component_b"),
            "control_V": ("layer", "component", "component_b"),
            "control_A": ("layer", "component", "component_b"),
            "control_b": ("layer", "component"), "control_beta": ("layer",)}
    vars_ = {name: (dims.get(name, ()), np.asarray([r[name] for r in rows])) for name in rows[0]}
    p0 = pcs[0]
    coords = {"depth": np.linspace(0.0, 1.0, p0["n_depths"]),
              "layer": np.arange(p0["max_layers"])}
    return vars_, coords


def step_functions(pc):
    """The device computation of a point: the objective and its gradient at the random start.

    Args:
      pc: a point config.

    Returns:
      ``{"loss": StepFunction}``: :func:`jaxdyn.control.measure_loss` under
      ``jax.value_and_grad`` in the controls (what the optimiser evaluates).
    """
    from ...control import default_controls, measure_loss
    from ..kinds import StepFunction

    x64 = pc["dtype"] == "float64"
    model, d = model_of(pc)
    with jax.enable_x64(x64):
        dt = np.float64 if x64 else np.float32
        x0, y = (a.astype(dt) for a in clouds(pc))
        rng = np.random.default_rng(pc["seed"])
        ctrl = {k: np.asarray(v, dt) + (0.1 * rng.standard_normal(v.shape)).astype(dt)
                if k != "beta" else np.asarray(v, dt)
                for k, v in default_controls(model, d, pc["n_layers"], dt).items()}
    opts = _options(pc)

    def loss(c):
        return measure_loss(c, x0, y, free=tuple(c), **opts)

    return {"loss": StepFunction(jax.value_and_grad(loss), (ctrl,), x64)}
