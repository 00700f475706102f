"""Kind ``reachability``: optimise the controls, verify them, transfer them to particles and layers.

:func:`jaxdyn.control.reach` optimises; an independent tight solve verifies; the controls then
drive N particles and an L-layer transformer.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from .schema import dtype_of, initial_mean, transferred


def run_points(pcs):
    """Compute a chunk of ``reachability`` points (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.run_points`)."""
    # float64 runs inside jax.enable_x64(True), whatever the process-wide setting.
    with jax.enable_x64(pcs[0]["dtype"] == "float64"):
        return _run_points(pcs)


def _run_points(pcs):
    p0 = pcs[0]
    ts = np.linspace(0.0, p0["t1"], p0["n_save"])
    tr0 = p0["transfer"]
    rows = []
    for pc in pcs:
        res, row = _reach_point(pc, ts)
        nN, nL = len(tr0["n_particles"]), len(tr0["layers"])
        pw = {k: np.full(nN, np.nan) for k in ("bures", "bures_exact_start", "exact", "floor", "initial")}
        # the smallest and largest over the repeated draws of each mean in pw
        spread = {k: (np.full(nN, np.nan), np.full(nN, np.nan)) for k in pw}
        lw = {k: np.full(nL, np.nan) for k in ("bures", "exact", "gap")}
        row["layer_limit_w2_bures"] = np.nan
        if transferred(pc) and row["finite"]:
            row["layer_limit_w2_bures"] = _transfer(pc, res.controls, pw, spread, lw)
        for k, v in pw.items():
            row[f"particle_w2_{k}"] = v
            row[f"particle_w2_{k}_min"], row[f"particle_w2_{k}_max"] = spread[k]
        for k, v in lw.items():
            row[f"layer_w2_{k}"] = v
        rows.append(row)
    return _dataset(rows, ts, tr0)


def _reach_point(pc, ts):
    """Optimise one point's controls and verify them: the reach result and the row's scalars."""
    import jax.numpy as jnp

    from ... import status_code
    from ...control import controlled_moments, mode_options, reach

    dt = dtype_of(pc)
    m0, S0, m1, S1 = _problem(pc)
    opts = mode_options(pc["mode"], bound=pc["bound"], energy_weight=pc["energy_weight"])
    res = reach(m0, S0, m1, S1, t1=pc["t1"], n_pieces=pc["n_pieces"], kind=pc["control_kind"],
                init=pc["init"], init_scale=pc["init_scale"], seed=pc["seed"],
                adam_steps=pc["adam_steps"], adam_lr=pc["adam_lr"],
                lbfgs_steps=pc["lbfgs_steps"], tol=pc["tol"], **opts)
    sol = controlled_moments(res.controls, m0, S0, t1=pc["t1"], saveat=jnp.asarray(ts, dt))
    cov_t = np.asarray(sol.cov, np.float64)
    eig_t = np.linalg.eigvalsh(np.nan_to_num(cov_t))[:, ::-1]
    eig_t[~np.all(np.isfinite(cov_t), axis=(1, 2))] = np.nan
    cert = res.certificate
    row = {
        "w2": res.w2, "w2_mean": res.w2_mean, "w2_cov": res.w2_cov,
        "w2_optimizer": res.w2_optimizer, "energy": res.energy, "reached": res.converged,
        "iterations": res.iterations, "evaluations": res.evaluations,
        "rejected": res.rejected, "seconds": res.seconds, "rank": res.rank,
        "energy_weight_final": res.energy_weight_final,
        "certificate_w2": np.nan if cert is None or cert.w2 is None else cert.w2,
        "certificate_energy": np.nan if cert is None else cert.energy,
        "finite": bool(math.isfinite(res.w2)
                       and int(sol.status) == status_code("successful")),
        "loss_history": res.loss_history, "w2_history": res.w2_history,
        "mean_t": np.asarray(sol.mean, np.float64), "cov_t": cov_t, "eig_t": eig_t,
        "target_mean": np.asarray(m1, np.float64), "target_cov": np.asarray(S1, np.float64),
        "initial_mean": np.asarray(m0, np.float64),
    }
    for k in ("A", "B", "V", "b"):
        row[f"control_{k}"] = np.asarray(res.controls[k].values, np.float64)
    return res, row


def _transfer(pc, controls, pw, spread, lw):
    """Run the controls on N particles and on L layers, filling pw, spread and lw in place.

    Returns:
      The Bures W2 of the continuous-time cloud (the L → ∞ limit of the layers) to the target.
    """
    from ...control import (ControlledEuclideanAttention, cloud_w2_to_gaussian, gaussian_cloud,
                            transfer_particles, transformer_layers)

    dt, d, tr = dtype_of(pc), pc["d"], pc["transfer"]
    m0, S0, m1, S1 = _problem(pc)
    model = ControlledEuclideanAttention.from_controls(controls)
    for i, N in enumerate(tr["n_particles"]):
        acc = {k: [] for k in pw}
        for r in range(tr["repeats"]):
            x0 = gaussian_cloud([pc["seed"], N, r], N, m0, S0, dtype=dt)
            xs = transfer_particles(model, x0, t1=pc["t1"], steps_per_piece=tr["steps_per_piece"])
            w = cloud_w2_to_gaussian(np.asarray(xs[-1]), m1, S1, seed=r, exact_max=tr["exact_max"])
            w0 = cloud_w2_to_gaussian(x0, m0, S0, exact=False)
            for k in ("bures", "exact", "floor"):
                acc[k].append(w[k])
            acc["initial"].append(w0["bures"])
            if N > d:  # same draw with exact initial moments
                x0e = gaussian_cloud([pc["seed"], N, r], N, m0, S0, exact_moments=True, dtype=dt)
                xe = transfer_particles(model, x0e, t1=pc["t1"], steps_per_piece=tr["steps_per_piece"])
                acc["bures_exact_start"].append(
                    cloud_w2_to_gaussian(np.asarray(xe[-1]), m1, S1, exact=False)["bures"])
        for k in pw:
            pw[k][i] = float(np.mean(acc[k])) if acc[k] else np.nan
            spread[k][0][i] = float(np.min(acc[k])) if acc[k] else np.nan
            spread[k][1][i] = float(np.max(acc[k])) if acc[k] else np.nan
    x0 = gaussian_cloud([pc["seed"], tr["layer_n"], 991], tr["layer_n"], m0, S0,
                        exact_moments=tr["layer_n"] > d, dtype=dt)
    # the continuous-time cloud from the same x0: the L → ∞ limit of the layers
    xc = np.asarray(transfer_particles(model, x0, t1=pc["t1"], steps_per_piece=tr["steps_per_piece"])[-1])
    for j, L in enumerate(tr["layers"]):
        x = np.asarray(transformer_layers(model, x0, t1=pc["t1"], n_layers=L))
        w = cloud_w2_to_gaussian(x, m1, S1, seed=0, exact_max=tr["exact_max"])
        lw["bures"][j], lw["exact"][j] = w["bures"], w["exact"]
        lw["gap"][j] = float(np.sqrt(np.mean(np.sum((x - xc) ** 2, axis=-1))))
    return cloud_w2_to_gaussian(xc, m1, S1, exact=False)["bures"]


def _dataset(rows, ts, tr0):
    """The chunk's variables (name → (dims, array)) and coordinates from its rows."""
    dims = {
        "loss_history": ("iteration",), "w2_history": ("iteration",),
        "mean_t": ("t", "component"), "cov_t": ("t", "component", "component_b"),
        "eig_t": ("t", "component"), "target_mean": ("component",),
        "target_cov": ("component", "component_b"), "initial_mean": ("component",),
        "control_A": ("node", "component", "component_b"),
        "control_B": ("node", "component", "component_b"),
        "control_V": ("node", "component", "component_b"), "control_b": ("node", "component"),
    }
    for k in ("bures", "bures_exact_start", "exact", "floor", "initial"):
        for tail in ("", "_min", "_max"):
            dims[f"particle_w2_{k}{tail}"] = ("n_particles",)
    for k in ("bures", "exact", "gap"):
        dims[f"layer_w2_{k}"] = ("layers",)
    vars_ = {}
    for name in rows[0]:
        vals = [r[name] for r in rows]
        dim = dims.get(name, ())
        if dim and dim[0] == "iteration":
            n = max(len(v) for v in vals)
            arr = np.full((len(vals), n), np.nan)
            for i, v in enumerate(vals):
                arr[i, :len(v)] = v
        else:
            arr = np.asarray(vals)
        vars_[name] = (dim, arr)
    coords = {"t": ts, "n_particles": np.asarray(tr0["n_particles"]),
              "layers": np.asarray(tr0["layers"])}
    return vars_, coords


def _problem(pc):
    """The point's target (m1, S1) and start (m0, S0), in its dtype."""
    from ...control import random_target

    dt = dtype_of(pc)
    tg = pc["target"]
    m1, S1 = random_target(pc["seed"], pc["d"], mean_scale=tg["mean_scale"],
                           eig_range=(tg["eig_min"], tg["eig_max"]), dtype=dt)
    m0 = initial_mean(pc, pc["d"]).astype(dt)
    S0 = (pc["s0_scale"] * np.eye(pc["d"])).astype(dt)
    return m0, S0, np.asarray(m1, dt), np.asarray(S1, dt)


def step_functions(pc):
    """The device computations of a point, at controls drawn small and at random.

    Args:
      pc: a point config.

    Returns:
      ``"loss"`` (the objective W2²(N(m(t1), Σ(t1)), N(m1, S1)) of the controlled moment flow
      and its gradient with respect to the control values: what the optimiser evaluates),
      ``"verify"`` (the tight reference solve of the controls, :func:`controlled_moments`),
      ``"transfer"`` (the particles under the controls, :func:`transfer_particles`) and
      ``"layers"`` (the L-layer transformer, :func:`transformer_layers`).
    """
    import jax.numpy as jnp

    from ...control import (CONTROL_NAMES, ControlledEuclideanAttention, controlled_moments,
                            gaussian_cloud, transfer_particles, transformer_layers)
    from ...distances import bures_w2_squared
    from ...gaussian import Control
    from ..kinds import StepFunction

    x64 = pc["dtype"] == "float64"
    t1, d, kind = pc["t1"], pc["d"], pc["control_kind"]
    n = pc["n_pieces"] + (1 if kind == "linear" else 0)
    tr = pc["transfer"]
    with jax.enable_x64(x64):
        dt = dtype_of(pc)
        m0, S0, m1, S1 = _problem(pc)
        rng = np.random.default_rng(pc["seed"])
        values = {k: (0.1 * rng.standard_normal((n, d) if k == "b" else (n, d, d))).astype(dt)
                  for k in CONTROL_NAMES}
        x0 = np.asarray(gaussian_cloud([pc["seed"], 0, 0], 8, m0, S0, dtype=dt))

    def controls(vals):
        return {k: Control(v, t1, kind) for k, v in vals.items()}

    def verify(vals):
        return controlled_moments(controls(vals), m0, S0, t1=t1,
                                  saveat=jnp.linspace(0.0, t1, pc["n_save"], dtype=dt))

    def w2_squared(vals):
        sol = controlled_moments(controls(vals), m0, S0, t1=t1, saveat=jnp.asarray([t1], dt))
        return bures_w2_squared(sol.mean[-1], sol.cov[-1], m1, S1)

    def transfer(vals, x):
        model = ControlledEuclideanAttention.from_controls(controls(vals))
        return transfer_particles(model, x, t1=t1, steps_per_piece=tr["steps_per_piece"])

    def layers(vals, x):
        model = ControlledEuclideanAttention.from_controls(controls(vals))
        return transformer_layers(model, x, t1=t1, n_layers=min(tr["layers"] or [1]))

    return {"loss": StepFunction(jax.value_and_grad(w2_squared), (values,), x64),
            "verify": StepFunction(verify, (values,), x64),
            "transfer": StepFunction(transfer, (values, x0), x64),
            "layers": StepFunction(layers, (values, x0), x64)}
