"""Kind ``long_context``: compute a chunk of points (module doc of the kind)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ... import clusters, long_context, pde
from ...kernels import weight_statistics
from ...models import SphereAttention
from ...simulation import simulate
from ...long_context_host import first_cluster_count
from ...sphere import sample_sphere
from .schema import frames, histogram_cells, resolved_beta


def _dtype(pc):
    return np.float64 if pc["dtype"] == "float64" else np.float32


def _keys(pc, which):
    """PRNG key of a point's draw ``which`` (0: keys/tokens/particles, 1: queries)."""
    return jax.random.fold_in(jax.random.PRNGKey(pc["seed"]), which)


def collapse_point(pc):
    """Per-query weight statistics of ``queries`` queries against n uniform keys on S^{d−1}."""
    dt = _dtype(pc)
    y = sample_sphere(_keys(pc, 0), pc["n"], pc["d"], dtype=dt)
    x = sample_sphere(_keys(pc, 1), pc["queries"], pc["d"], dtype=dt)
    st = weight_statistics(x, y, beta=resolved_beta(pc), logits="distance", q_block=64,
                           k_block=min(8192, pc["n"]))
    return {"max_weight": (("query",), np.asarray(st.max_weight, np.float64)),
            "entropy": (("query",), np.asarray(st.entropy, np.float64)),
            "effective_keys": (("query",), np.asarray(st.effective_keys, np.float64)),
            "top_rank": (("query",), np.asarray(st.top_rank, np.int64)),
            "finite": ((), bool(np.all(np.isfinite(np.asarray(st.entropy)))))}


def phase_point(pc):
    """λ of one layer on nearly equiangular tokens, and the exactly equiangular closed form."""
    beta = resolved_beta(pc)
    x = long_context.nearly_equiangular_tokens(_keys(pc, 0), pc["n"], pc["d"], pc["rho"],
                                               dtype=_dtype(pc))
    kernel = "blocked" if pc["kernel"] == "auto" else pc["kernel"]
    lam, _ = long_context.layer_angle_ratio(x, beta, kernel=kernel)
    exact = long_context.equiangular_angle_ratio(pc["n"], beta, pc["rho"])
    return {"angle_ratio": ((), float(lam)), "angle_ratio_equiangular": ((), float(exact)),
            "mean_inner_product": ((), float(long_context.mean_inner_product(x))),
            "finite": ((), bool(np.isfinite(float(lam))))}


def predicted_mode(beta, d):
    """The most unstable mode of the uniform density (k* on S¹, l* on S²) and its growth rate.

    Returns:
      ``(mode, rate)``: k* or l* (int) and λ* (float).
    """
    if d == 2:
        k = pde.most_unstable_mode(beta)
        return k, float(pde.linear_rates(beta, [k])[0])
    ls = np.arange(1, int(10 + 4 * math.sqrt(2 * beta)) + 1)
    rates = pde.sphere_rates(beta, ls)
    i = int(np.argmax(rates))
    return int(ls[i]), float(rates[i])


def graph_min_size(pc, k_star):
    """The fewest particles of a counted cluster (count: all): min_mass · n / the predicted count."""
    return max(2, math.ceil(pc["min_mass"] * pc["n"] / first_cluster_count(pc["d"], k_star)))


def _counts(pc, xs, k_star):
    """Cluster counts of the saved frames and the fraction of the particles they hold.

    count: subsample — S¹: histogram, S²: δ-graph of a subsample; count: all — the radius
    graph of all particles (:func:`jaxdyn.long_context.graph_cluster_counts`), 0 until the
    counted clusters hold ``formed_fraction`` of the particles.

    Returns:
      ``(counts, fractions)`` per frame (the fraction NaN where the histogram reads none).
    """
    if pc["count"] == "all":
        r = long_context.cluster_graph_radius(pc["n"], pc["d"], pc["graph_radius"])
        counts, frac = long_context.graph_cluster_counts(np.asarray(xs), r,
                                                         graph_min_size(pc, k_star))
        return np.where(frac >= pc["formed_fraction"], counts, 0), frac
    if pc["d"] == 2:
        cells = histogram_cells(pc["cells_per_mode"], k_star)
        counts = np.asarray(long_context.circle_cluster_counts(
            xs, cells, min_mass=pc["min_mass"] / k_star))
        return counts, np.full(counts.shape, np.nan)  # the histogram reads no fraction
    sub = xs[:, :pc["subsample"]]
    masses = np.asarray(clusters.cluster_masses(sub, pc["delta"]))
    big = masses >= 2.0 / sub.shape[1]  # components of two particles or more
    held = np.sum(np.where(big, masses, 0.0), axis=1)
    formed = held >= 1 - pc["min_mass"] / max(k_star, 1)
    return np.where(formed, np.sum(big, axis=1), 0), held


def dynamics_point(pc):
    """Particles under the attention dynamics at β(n): mean inner product and cluster counts."""
    beta = resolved_beta(pc)
    k_star, rate = predicted_mode(beta, pc["d"])
    x0 = sample_sphere(_keys(pc, 0), pc["n"], pc["d"], dtype=_dtype(pc))
    d = pc["d"]
    eye = jnp.eye(d, dtype=x0.dtype)
    model = SphereAttention(eye, eye, eye, beta, kernel=pc["kernel"])
    tr = simulate(model, x0, t1=pc["t1"], dt=pc["dt"], save_every=pc["save_every"], method="rk4")
    xs = tr.xs[:frames(pc)]
    counts, held = _counts(pc, xs, k_star)
    ip = np.asarray(long_context.mean_inner_product(xs), np.float64)
    ts = np.asarray(tr.ts[:frames(pc)], np.float64)
    hit = np.flatnonzero(counts > 0)
    return {"mean_inner_product": (("t",), ip), "cluster_count": (("t",), counts.astype(np.int64)),
            "clustered_fraction": (("t",), np.asarray(held, np.float64)),
            "first_count": ((), int(counts[hit[0]]) if hit.size else 0),
            "first_time": ((), float(ts[hit[0]]) if hit.size else float("nan")),
            "mode_star": ((), k_star), "rate_star": ((), rate),
            "finite": ((), bool(tr.ok))}, ts


def run_points(pcs):
    """Compute a chunk of ``long_context`` points (:meth:`~jaxdyn.experiments.ExperimentKind.run_points`)."""
    study, rows, coords = pcs[0]["study"], [], {}
    with jax.enable_x64(pcs[0]["dtype"] == "float64"):
        for pc in pcs:
            if study == "dynamics":
                row, ts = dynamics_point(pc)
                coords["t"] = ts
            else:
                row = collapse_point(pc) if study == "collapse" else phase_point(pc)
            row["beta_resolved"] = ((), float(resolved_beta(pc)))
            rows.append(row)
    if study == "collapse":
        coords["query"] = np.arange(pcs[0]["queries"])
    out = {}
    for name, (dims, _) in rows[0].items():
        out[name] = (dims, np.stack([np.asarray(r[name][1]) for r in rows]))
    return out, coords


def step_functions(pc):
    """The device computation of a point (its whole computation, jitted by the kernels)."""
    from ..kinds import StepFunction

    x64 = pc["dtype"] == "float64"
    with jax.enable_x64(x64):
        beta = resolved_beta(pc)
        if pc["study"] == "collapse":
            y = sample_sphere(_keys(pc, 0), min(pc["n"], 4096), pc["d"], dtype=_dtype(pc))
            fn = lambda x, y, b: weight_statistics(x, y, beta=b, logits="distance")  # noqa: E731
            return {"weights": StepFunction(fn, (y[:64], y, jnp.asarray(beta, y.dtype)), x64)}
        x = sample_sphere(_keys(pc, 0), min(pc["n"], 2048), max(pc["d"], 3), dtype=_dtype(pc))
        fn = lambda x, b: long_context.layer_angle_ratio(x, b, kernel="blocked")[0]  # noqa: E731
        return {"layer": StepFunction(fn, (x, jnp.asarray(beta, x.dtype)), x64)}
