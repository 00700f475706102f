"""Local (block-sparse) attention: the field at large N and β, against the dense blocked kernel and KeOps.

Particles uniform on S² (d = 3), Q = K = V = I, float32 (``--dtype float64``: everything in
float64). The local kernel (``kernel="local"``, ``jaxdyn.kernels.local_interaction``) computes
only the (query, key) blocks whose softmax mass can exceed ``tol`` relative to the row's kept
mass; ``stats.visited`` is the fraction of the N² pairs it computed. Its crude expectation: a
key at angle θ from the query weighs exp(-β(1 - cos θ)) against the query itself, so with
β(1 - cos θ) = log(N / tol) the keys outside that cap carry at most ``tol`` of the row's mass,
and the cap holds a fraction (1 - cos θ)/2 = log(N / tol) / (2β) of S² (``expected_visited``).

Cases (``--cases``, each also alone; every (case, N) runs in its own child process, so that
its peak RSS is its own):

* ``field``: one field evaluation (``SphereAttention(..., kernel="local")``), β = N, at
  ``--field-ns`` (10⁶, 10⁷): first call (compile) apart, wall and CPU time, peak RSS
  (``resource`` ru_maxrss of the child after the timed calls, and VmHWM reset before them);
  visited fraction beside ``expected_visited``; ``stats`` (``mass``, ``bound``, ``overflow``);
  ``ordering``: the curve ordering alone (rebuilt inside every call), and its share.
* ``steps``: ``--steps`` (100) projected-Euler steps (``simulate(method="euler")``) at
  ``--steps-n`` (10⁶), β = N; the kernel rebuilds its ordering inside every evaluation.
  Compilation (``lower().compile()``) apart, then one timed run; visited at the start and end.
* ``beta100``: β = 100, N = ``--beta100-n`` (10⁵): local against blocked (interleaved).
* ``auto``: β = 1 at ``--auto-ns`` (10⁵, 3·10⁴): ``kernel="auto"`` against ``"blocked"``
  (interleaved, 11 rounds); target: auto / blocked ≤ 1.10.
* ``scan``: local against blocked over ``--scan-betas`` × ``--scan-ns``: visited fraction and
  both times; the crossover (local / blocked = 1, interpolated in log β) and its visited
  fraction per N; figure ``local<tag>.png``: visited fraction against β per N
  (``--figure-copy PATH`` writes a copy, e.g. docs/figures/local_visited_fraction.png).
* ``keops``: β = N at ``--keops-ns`` (10⁵, 10⁶): jaxdyn local, KeOps block-sparse and the
  dense blocked kernel, interleaved (``--keops-with`` picks which). KeOps: ``LazyTensor``
  ``sumsoftmaxweight`` with ``ranges`` from ``grid_cluster``, ``cluster_ranges_centroids``,
  ``sort_clusters`` and ``from_matrix`` (or, above ``--from-matrix-max`` clusters, the same
  6-tuple built from the kept pairs: ``from_matrix`` allocates C × C index grids); a cluster
  pair is kept when its centroids lie within r_k + r_l + δ (r: cluster radii), δ the chord of
  the cap above, so every pair closer than δ is computed and the skipped mass is at most
  ``tol`` of the kept one (the query is its own key). The voxel side is probed over
  ``--keops-voxels`` (multiples of δ), the fastest kept. KeOps's time includes clustering,
  sorting and the ranges (as jaxdyn's ordering inside each call); ``keops_reduce`` is the
  reduction alone; torch runs on one thread there (its OpenMP runtime beside KeOps's, both
  at all cores, stalled KeOps calls for seconds on 2 cores). A blocked evaluation predicted above ``--blocked-cap-s`` runs on a query
  subsample and is scaled to N (``extrapolated``).

Accuracy (every case with a local kernel, and KeOps): the relative error ‖m_i - ref_i‖/‖ref_i‖
of the attention average m over ``--accuracy-queries`` (200) random queries, ref in NumPy
float64 against all keys; beside it the same library's dense result on those rows (the float32
floor of that kernel: at β = N the logits' rounding alone moves the weights) and the difference
between the two (for KeOps the same arithmetic, so the truncation alone; for jaxdyn local
against blocked also their different rounding).

Output: benchmarks/runs/local<tag>.json and .png (``python -m benchmarks run local``:
benchmarks/runs/local/<machine>-<stamp>.json).

    python benchmarks/bench_local.py --tiny
    python benchmarks/bench_local.py --cases field --field-ns 1000000,10000000
    python benchmarks/bench_local.py --cases steps
    python benchmarks/bench_local.py --cases beta100
    python benchmarks/bench_local.py --cases auto
    python benchmarks/bench_local.py --cases scan --figure-copy docs/figures/local_visited_fraction.png
    python benchmarks/bench_local.py --cases keops --keops-ns 100000,1000000
    python benchmarks/bench_local.py --cases keops --keops-ns 100000 --keops-with keops
    python benchmarks/bench_local.py --replot benchmarks/results/local/<kind>.json \\
        --figure-copy docs/figures/local_visited_fraction.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from common import (
    add_common_args,
    fmt_s,
    hwm_bytes,
    interleaved,
    machine_info,
    peak_rss_bytes,
    plt,
    reset_peak_rss,
    rss_bytes,
    save_figure,
    setup,
    time_call,
    write_json,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CASES = ("field", "steps", "beta100", "auto", "scan", "keops")
AUTO_TARGET = 1.10  # auto / blocked, wall and CPU

P = argparse.ArgumentParser(description=__doc__.split("\n")[0])
P.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
P.add_argument("--tol", type=float, default=1e-6)
P.add_argument("--dtype", choices=("float32", "float64"), default="float32")
P.add_argument("--seed", type=int, default=0)
P.add_argument("--field-ns", default="1000000,10000000")
P.add_argument("--steps-n", type=int, default=1_000_000)
P.add_argument("--steps", type=int, default=100)
P.add_argument("--dt", type=float, default=0.01)
P.add_argument("--beta100-n", type=int, default=100_000)
P.add_argument("--auto-ns", default="100000,30000")
P.add_argument("--scan-betas", default="1,3,10,30,100,300,1000")
P.add_argument("--scan-ns", default="30000,100000")
P.add_argument("--keops-ns", default="100000,1000000")
P.add_argument("--keops-with", default="local,keops,blocked",
               help="implementations of the keops case: local, keops, blocked")
P.add_argument("--keops-voxels", default="1,2",
               help="voxel sides of KeOps's grid clusters, in units of the cutoff δ")
P.add_argument("--keops-fresh-cache", action="store_true",
               help="KeOps builds in an empty temporary folder: its first call compiles")
P.add_argument("--from-matrix-max", type=int, default=2048,
               help="most clusters for which the ranges come from pykeops' from_matrix")
P.add_argument("--blocked-cap-s", type=float, default=300.0,
               help="a blocked evaluation predicted above this runs on a query subsample")
P.add_argument("--accuracy-queries", type=int, default=200)
P.add_argument("--budget", type=float, default=120.0,
               help="seconds of timed repetitions per timing (at least one)")
P.add_argument("--figure-copy", default=None,
               help="also write the visited-fraction figure to this path")
P.add_argument("--replot", default=None, metavar="JSON",
               help="draw the figure from a results file (this script's JSON, or a recorded one) "
                    "and exit")
P.add_argument("--worker-timeout", type=float, default=None, help="seconds per child process")
P.add_argument("--worker", default=None, help=argparse.SUPPRESS)
add_common_args(P)

TINY = {"field_ns": "2000,4000", "steps_n": 2000, "steps": 5, "beta100_n": 2000,
        "auto_ns": "2000,1000", "scan_betas": "1,10,100", "scan_ns": "1000,2000",
        "keops_ns": "2000,4000", "accuracy_queries": 50, "budget": 5.0}


def _ints(s):
    return [int(float(v)) for v in str(s).split(",") if v.strip()]


def _floats(s):
    return [float(v) for v in str(s).split(",") if v.strip()]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ the maths


def expected_visited(n, beta, tol):
    """Fraction of S² in the cap β(1 - cos θ) = log(N / tol): (1 - cos θ)/2, at most 1."""
    return min(1.0, math.log(n / tol) / (2.0 * beta))


def cutoff_chord(n, beta, tol):
    """Chord δ of that cap: |x - y|² = 2(1 - cos θ) = 2 log(N / tol) / β."""
    return math.sqrt(min(4.0, 2.0 * math.log(n / tol) / beta))


def points(n, seed, dtype):
    import numpy as np

    x = np.random.default_rng(seed).standard_normal((n, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(dtype)


def sample_rows(n, k, seed):
    import numpy as np

    return np.sort(np.random.default_rng(seed + 7).choice(n, size=min(k, n), replace=False))


def reference(x, rows, beta):
    """m_i = Σ_j softmax_j(β x_iᵀ x_j) x_j for the rows, NumPy float64 against all keys, in
    chunks of rows (memory O(N))."""
    import numpy as np

    y = np.asarray(x, np.float64)
    q = y[rows]
    chunk = max(1, 2**22 // len(y))
    out = np.empty_like(q)
    for a in range(0, len(q), chunk):
        logits = beta * (q[a:a + chunk] @ y.T)
        logits -= logits.max(axis=1, keepdims=True)
        np.exp(logits, out=logits)
        out[a:a + chunk] = (logits @ y) / logits.sum(axis=1, keepdims=True)
    return out


def rel_err(out_rows, ref):
    import numpy as np

    e = np.linalg.norm(np.asarray(out_rows, np.float64) - ref, axis=1) / np.linalg.norm(ref, axis=1)
    return {"max": float(e.max()), "median": float(np.median(e))}


# ------------------------------------------------------------------------------ jaxdyn


def field_fn(kernel, beta, tol, dtype):
    """The jitted field x ↦ model(0, x) of SphereAttention(I, I, I, β, kernel)."""
    import jax
    import jax.numpy as jnp

    import jaxdyn

    eye = jnp.eye(3, dtype=dtype)
    kw = {"tol": tol} if kernel in ("local", "auto") else {}
    model = jaxdyn.SphereAttention(eye, eye, eye, beta, kernel=kernel, **kw)
    return jax.jit(lambda x: model(0.0, x)), model


def interaction_fn(kernel, beta, tol, dtype):
    """The jitted attention average x ↦ interaction(x, x, I, β, kernel)."""
    import jax
    import jax.numpy as jnp

    import jaxdyn

    eye = jnp.eye(3, dtype=dtype)
    kw = {"tol": tol} if kernel in ("local", "auto") else {}
    return jax.jit(lambda x: jaxdyn.interaction(x, x, eye, beta, kernel=kernel, **kw))


def local_stats(x, beta, tol):
    """One call of local_interaction with its stats: (m as NumPy, stats as plain values, s).
    Scalar stats are kept as they are, array ones as their max and median (``mass``: each
    row's skipped / kept softmax mass bound; ``bound``: its bound on |m - m_dense|)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxdyn.kernels import local_interaction

    eye = jnp.eye(3, dtype=x.dtype)
    t0 = time.perf_counter()
    try:
        out, st = local_interaction(x, x, eye, beta, tol=tol, with_stats=True)
    except TypeError as e:  # a version that always returns its stats
        if "with_stats" not in str(e):
            raise
        out, st = local_interaction(x, x, eye, beta, tol=tol)
    out = np.asarray(jax.block_until_ready(out))
    took = time.perf_counter() - t0
    rec = {}
    for k in getattr(st, "_fields", None) or ("visited", "mass", "bound", "overflow"):
        if not hasattr(st, k):
            continue
        v = np.asarray(getattr(st, k))
        if v.size == 1:
            rec[k] = v.item()
        elif v.size:
            rec.update({f"{k}_max": v.max().item(), f"{k}_median": float(np.median(v))})
    rec["visited"] = float(rec["visited"])
    rec["overflow"] = bool(rec.get("overflow", False))
    rec["certified_le_tol"] = rec.get("mass_max", rec.get("bound_max", math.inf)) <= tol
    return out, rec, took


def blocked_rows(x, rows, beta):
    """The dense blocked kernel on the given query rows against all keys (NumPy out)."""
    import jax.numpy as jnp
    import numpy as np

    import jaxdyn

    eye = jnp.eye(3, dtype=x.dtype)
    return np.asarray(jaxdyn.interaction(x[rows], x, eye, beta, kernel="blocked"))


def accuracy(m_local, x, rows, beta, ref=None):
    """Errors of the local result on ``rows``: against float64, and against blocked float32."""
    import numpy as np

    ref = reference(np.asarray(x), rows, beta) if ref is None else ref
    dense = blocked_rows(x, rows, beta)
    return {"queries": len(rows), "local_vs_f64": rel_err(m_local[rows], ref),
            "blocked_vs_f64": rel_err(dense, ref),
            "local_vs_blocked": rel_err(m_local[rows], dense.astype(np.float64))}


def visited_record(n, beta, tol, st):
    """The visited fraction beside the cap; ``answered_dense``: the blocked kernel answered
    (an overflow, or lists too long to pay), so every pair was computed whatever ``visited``
    (the lists' fraction) says."""
    exp = expected_visited(n, beta, tol)
    return {"expected_visited": exp, "visited": st["visited"],
            "visited_over_expected": st["visited"] / exp if exp else None,
            "answered_dense": bool(st.get("dense") or st.get("overflow"))}


def _jnp_points(n, seed, dtype):
    import jax

    return jax.device_put(points(n, seed, dtype))


def work_field(spec):
    n, tol, dtype = spec["n"], spec["tol"], spec["dtype"]
    beta = float(n)
    x = _jnp_points(n, spec["seed"], dtype)
    fn, _ = field_fn("local", beta, tol, dtype)
    rec = {"case": "field", "n": n, "beta": beta, "tol": tol, "dtype": dtype}
    base = rss_bytes()
    can_reset = reset_peak_rss()
    big = n > 10**6
    stats, _ = time_call(fn, x, reps=spec["reps"] or (2 if big else 3), warmup=0 if big else 1,
                         max_seconds=spec["budget"])
    rec["time"] = stats
    rec["rss_before_bytes"] = base
    if can_reset:
        rec["rss_peak_delta_bytes"] = max(0, hwm_bytes() - base)
    rec["peak_rss_bytes"] = peak_rss_bytes()
    rec["rss_method"] = ("peak_rss_bytes: ru_maxrss of this child (interpreter, JAX, the points, "
                         "compilation and the evaluations); rss_peak_delta_bytes: VmHWM reset "
                         "before the first call, minus the RSS then")
    log(f"field N={n}: {fmt_s(stats['median_s'])} (first {fmt_s(stats['compile_s'])}), "
        f"CPU {fmt_s(stats['cpu_median_s'])}, peak RSS {rec['peak_rss_bytes'] / 2**20:.0f} MiB")
    # the ordering the kernel rebuilds in every call (one sort along the curve), timed alone
    import jax

    from jaxdyn.kernels import spatial_order

    order = jax.jit(lambda p: spatial_order(p)[0].perm)
    ordering, _ = time_call(order, x, reps=3, warmup=1, max_seconds=spec["budget"])
    rec["ordering"] = ordering
    rec["ordering_share"] = ordering["median_s"] / stats["median_s"]
    log(f"field N={n}: ordering {fmt_s(ordering['median_s'])} "
        f"({rec['ordering_share']:.1%} of the field)")
    m, st, took = local_stats(x, beta, tol)
    rec.update(visited_record(n, beta, tol, st), stats=st, stats_call_s=took)
    rows = sample_rows(n, spec["accuracy_queries"], spec["seed"])
    rec["accuracy"] = accuracy(m, x, rows, beta)
    log(f"field N={n}: visited {st['visited']:.3g} (expected {rec['expected_visited']:.3g}), "
        f"rel. error vs f64 {rec['accuracy']['local_vs_f64']['max']:.2e}")
    return rec


def work_steps(spec):
    import jax
    import numpy as np

    import jaxdyn

    n, tol, dtype, steps, dt = spec["n"], spec["tol"], spec["dtype"], spec["steps"], spec["dt"]
    beta = float(n)
    x0 = _jnp_points(n, spec["seed"], dtype)
    _, model = field_fn("local", beta, tol, dtype)

    def run(x):
        traj = jaxdyn.simulate(model, x, t1=steps * dt, dt=dt, method="euler", save_every=steps)
        return traj.xs[-1], traj.stats["num_steps"]

    rec = {"case": "steps", "n": n, "beta": beta, "tol": tol, "dtype": dtype, "steps": steps,
           "dt": dt, "method": "euler"}
    t0 = time.perf_counter()
    compiled = jax.jit(run).lower(x0).compile()
    rec["compile_s"] = time.perf_counter() - t0
    base = rss_bytes()
    can_reset = reset_peak_rss()
    c0 = sum(os.times()[:2])
    t0 = time.perf_counter()
    x1, k = jax.block_until_ready(compiled(x0))
    rec["wall_s"] = time.perf_counter() - t0
    rec["cpu_s"] = sum(os.times()[:2]) - c0
    rec["num_steps"] = int(k)
    rec["per_step_s"] = rec["wall_s"] / max(1, int(k))
    if can_reset:
        rec["rss_peak_delta_bytes"] = max(0, hwm_bytes() - base)
    rec["peak_rss_bytes"] = peak_rss_bytes()
    x1n = np.asarray(x1)
    rec["final_finite"] = bool(np.isfinite(x1n).all())
    rec["final_max_norm_error"] = float(np.abs(np.linalg.norm(x1n, axis=1) - 1).max())
    log(f"steps N={n}: {int(k)} steps in {fmt_s(rec['wall_s'])} (compile {fmt_s(rec['compile_s'])})")
    for when, x in (("start", x0), ("end", x1)):
        _, st, _ = local_stats(x, beta, tol)
        rec[f"visited_{when}"] = st["visited"]
        rec[f"overflow_{when}"] = st["overflow"]
    rec["expected_visited"] = expected_visited(n, beta, tol)
    return rec


def _versus(spec, kernels, beta, n, reps=3):
    """Fields of ``kernels`` at (n, β), interleaved (``reps`` rounds unless ``--reps``);
    stats and accuracy of the local kernel."""
    tol, dtype = spec["tol"], spec["dtype"]
    x = _jnp_points(n, spec["seed"], dtype)
    fns = {k: field_fn(k, beta, tol, dtype)[0] for k in kernels}
    res = interleaved({k: {"fn": (lambda f=f: f(x))} for k, f in fns.items()},
                      reps=spec["reps"] or reps, log=log)
    rec = {"n": n, "beta": beta, "tol": tol, "dtype": dtype, "impl": {}}
    for k, r in res.items():
        r.pop("out", None)
        rec["impl"][k] = r
    base = res[kernels[-1]]
    for k in kernels[:-1]:
        r = res[k]
        rec[f"{k}_over_{kernels[-1]}"] = r["median_s"] / base["median_s"]
        if r.get("cpu_median_s") and base.get("cpu_median_s"):
            rec[f"{k}_over_{kernels[-1]}_cpu"] = r["cpu_median_s"] / base["cpu_median_s"]
    if "local" in kernels:
        m, st, _ = local_stats(x, beta, tol)
        rec.update(visited_record(n, beta, tol, st), stats=st)
        rows = sample_rows(n, spec["accuracy_queries"], spec["seed"])
        rec["accuracy"] = accuracy(m, x, rows, beta)
    return rec


def work_beta100(spec):
    rec = _versus(spec, ["local", "blocked"], 100.0, spec["n"])
    rec["case"] = "beta100"
    log(f"beta100 N={spec['n']}: local / blocked = {rec['local_over_blocked']:.3f}, "
        f"visited {rec['visited']:.3g} (expected {rec['expected_visited']:.3g})")
    return rec


def work_auto(spec):
    # At β = 1 "auto" decides at run time (the early check) and then runs the blocked kernel;
    # 11 rounds, because a ratio of two 0.4 s medians over 3 rounds moves by ±15 % here.
    rec = _versus(spec, ["auto", "blocked"], 1.0, spec["n"], reps=11)
    rec["case"] = "auto"
    worst = max(v for v in (rec["auto_over_blocked"], rec.get("auto_over_blocked_cpu")) if v)
    rec["target"] = AUTO_TARGET
    rec["target_met"] = worst <= AUTO_TARGET
    log(f"auto N={spec['n']}: auto / blocked = {rec['auto_over_blocked']:.3f} "
        f"(CPU {rec.get('auto_over_blocked_cpu') or float('nan'):.3f}); target ≤ {AUTO_TARGET}")
    return rec


def work_scan(spec):
    rows = []
    for beta in spec["betas"]:
        rec = _versus(spec, ["local", "blocked"], beta, spec["n"])
        log(f"scan N={spec['n']} β={beta:g}: local / blocked = {rec['local_over_blocked']:.3f}, "
            f"visited {rec['visited']:.3g} (expected {rec['expected_visited']:.3g})")
        rows.append(rec)
    return {"case": "scan", "n": spec["n"], "rows": rows}


# ------------------------------------------------------------------------------ KeOps


def ranges_from_pairs(ranges, rows, cols, c):
    """The 6-tuple of ``pykeops.torch.cluster.from_matrix(ranges, ranges, keep)`` for the
    kept cluster pairs (rows[k], cols[k]), without the C × C matrices."""
    import numpy as np
    import torch

    order = np.lexsort((cols, rows))  # row-major, as keep's nonzeros
    redranges_j = ranges[torch.from_numpy(cols[order])]
    slices_i = torch.from_numpy(np.cumsum(np.bincount(rows, minlength=c))).to(torch.int64)
    order = np.lexsort((rows, cols))  # column-major
    redranges_i = ranges[torch.from_numpy(rows[order])]
    slices_j = torch.from_numpy(np.cumsum(np.bincount(cols, minlength=c))).to(torch.int64)
    return (ranges, slices_i, redranges_j, ranges, slices_j, redranges_i)


def keops_prepare(x, beta, delta, voxel, from_matrix_max):
    """Clusters, sorted points and ranges of the block-sparse reduction: the cluster pairs
    whose centroids lie within r_k + r_l + δ (r: cluster radii), so every pair closer than δ
    is computed. Returns (sorted x, permutation, ranges, details)."""
    import numpy as np
    import torch
    from pykeops.torch.cluster import cluster_ranges_centroids, from_matrix, grid_cluster, \
        sort_clusters
    from scipy.spatial import cKDTree

    n = x.shape[0]
    labels = grid_cluster(x, voxel)
    ranges, centroids, _ = cluster_ranges_centroids(x, labels)
    (xs, perm), lab = sort_clusters((x, torch.arange(n)), labels)
    lab = lab.long()
    c = centroids.shape[0]
    radius = torch.zeros(c, dtype=x.dtype).scatter_reduce(
        0, lab, (xs - centroids[lab]).norm(dim=1), "amax", include_self=True)
    cen = centroids.double().numpy()
    rad = radius.double().numpy()
    slack = 1e-6 * delta  # the radii and distances are rounded
    pairs = cKDTree(cen).query_pairs(2 * rad.max() + delta + slack, output_type="ndarray")
    diag = np.arange(c)
    rows = np.concatenate([pairs[:, 0], pairs[:, 1], diag])
    cols = np.concatenate([pairs[:, 1], pairs[:, 0], diag])
    ok = np.linalg.norm(cen[rows] - cen[cols], axis=1) <= rad[rows] + rad[cols] + delta + slack
    rows, cols = rows[ok], cols[ok]
    if c <= from_matrix_max:
        keep = torch.zeros((c, c), dtype=torch.bool)
        keep[torch.from_numpy(rows), torch.from_numpy(cols)] = True
        rng = from_matrix(ranges, ranges, keep)
        how = "from_matrix"
    else:  # from_matrix's C x C index grids would not fit
        rng = ranges_from_pairs(ranges, rows, cols, c)
        how = "kept pairs (from_matrix's layout)"
    sizes = (ranges[:, 1] - ranges[:, 0]).double().numpy()
    details = {"clusters": int(c), "kept_cluster_pairs": int(len(rows)), "ranges_built_with": how,
               "points_per_cluster_median": float(np.median(sizes)),
               "visited": float(np.sum(sizes[rows] * sizes[cols]) / float(n) ** 2)}
    return xs, perm, rng, details


def keops_reduce(xs, rng, beta):
    """Σ_j softmax_j(β x_iᵀ x_j) x_j over the ranges (KeOps, rows in the sorted order)."""
    from pykeops.torch import LazyTensor

    xi, xj = LazyTensor(xs[:, None, :]), LazyTensor(xs[None, :, :])
    return (beta * (xi | xj)).sumsoftmaxweight(xj, axis=1, ranges=rng)


def keops_block_sparse(x, beta, delta, voxel, from_matrix_max, details=None):
    """The whole block-sparse evaluation: prepare, reduce, back to x's order. With
    ``details`` (a dict), fills in the clusters, the visited fraction and the part times."""
    import torch

    t0 = time.perf_counter()
    xs, perm, rng, det = keops_prepare(x, beta, delta, voxel, from_matrix_max)
    t1 = time.perf_counter()
    ms = keops_reduce(xs, rng, beta)
    t2 = time.perf_counter()
    out = torch.empty_like(ms)
    out[perm] = ms
    if details is not None:
        details.update(det, prepare_s=t1 - t0, reduce_s=t2 - t1)
    return out


def keops_dense_rows(x, rows, beta):
    """KeOps without ranges on the given query rows against all keys (the dense float floor)."""
    from pykeops.torch import LazyTensor

    q = x[rows]
    return (beta * (LazyTensor(q[:, None, :]) | LazyTensor(x[None, :, :]))).sumsoftmaxweight(
        LazyTensor(x[None, :, :]), axis=1)


def keops_self_check(x_small, beta):
    """The kept-pairs 6-tuple equals from_matrix's on a random symmetric mask; KeOps with every
    cluster pair kept equals its reduction without ranges."""
    import numpy as np
    import torch
    from pykeops.torch.cluster import from_matrix

    rng = np.random.default_rng(3)
    c = 7
    ranges = torch.from_numpy(np.stack([np.arange(c) * 3, np.arange(c) * 3 + 3], 1)).long()
    keep = torch.from_numpy(rng.random((c, c)) < 0.4)
    keep |= keep.clone().T
    r, s = np.nonzero(keep.numpy())
    same = all(torch.equal(u.long(), v.long()) for u, v in
               zip(from_matrix(ranges, ranges, keep), ranges_from_pairs(ranges, r, s, c)))
    det = {}
    full = keops_block_sparse(x_small, beta, 2.0, 0.5, 0, det)  # δ = 2: every pair kept
    dense = keops_dense_rows(x_small, torch.arange(len(x_small)), beta)
    return {"ranges_from_pairs_equals_from_matrix": bool(same),
            "all_pairs_kept_visited": det["visited"],
            "all_pairs_kept_vs_dense_max_abs": float((full - dense).abs().max())}


def work_keops(spec):
    import jax

    n, tol, dtype = spec["n"], spec["tol"], spec["dtype"]
    beta = float(n)
    delta = cutoff_chord(n, beta, tol)
    x_np = points(n, spec["seed"], dtype)
    rows = sample_rows(n, spec["accuracy_queries"], spec["seed"])
    ref = reference(x_np, rows, beta)
    rec = {"case": "keops", "n": n, "beta": beta, "tol": tol, "dtype": dtype, "cutoff_chord": delta,
           "expected_visited": expected_visited(n, beta, tol), "impl": {}}
    impls = {}
    which = spec["with"]
    x = jax.device_put(x_np) if {"local", "blocked"} & set(which) else None
    if "local" in which:
        f = interaction_fn("local", beta, tol, dtype)
        impls["jaxdyn_local"] = {"fn": (lambda f=f: f(x))}
        m, st, _ = local_stats(x, beta, tol)
        rec["jaxdyn_local"] = {**visited_record(n, beta, tol, st), "stats": st,
                               "accuracy": accuracy(m, x, rows, beta, ref=ref)}
        del m
    if "keops" in which:
        kr = rec["keops"] = {}
        try:
            kr.update(keops_setup(spec, x_np, rows, ref, beta, delta, impls))
        except Exception as e:  # not installed, no compiler, build failure: recorded, not fatal
            kr["skipped"] = f"{type(e).__name__}: {e}"[:1000]
            log(f"keops N={n}: skipped ({kr['skipped'][:200]})")
    if "blocked" in which:
        f = interaction_fn("blocked", beta, tol, dtype)
        q = min(n, 4096)
        stats, _ = time_call(jax.jit(lambda a, b: _blocked_q(a, b, beta)), x[:q], x, reps=1,
                             warmup=0)
        pred = stats["median_s"] * n / q
        rec["blocked_subsample"] = {"queries": q, **stats, "predicted_full_s": pred}
        if pred <= spec["blocked_cap_s"]:
            impls["blocked"] = {"fn": (lambda f=f: f(x))}
        else:
            rec["impl"]["blocked"] = {
                "extrapolated": True, "median_s": pred,
                "cpu_median_s": stats["cpu_median_s"] * n / q,
                "note": f"predicted {pred:.3g} s > --blocked-cap-s: the time of {q} queries "
                        f"against all {n} keys, × N / {q} (the kernel's cost is linear in the "
                        "queries)"}
            log(f"keops N={n}: blocked extrapolated from {q} queries: {fmt_s(pred)}")
    if impls:
        res = interleaved(impls, reps=spec["reps"] or 3, log=log)
        for k, r in res.items():
            r.pop("out", None)
            rec["impl"][k] = r
    base = rec["impl"].get("jaxdyn_local")
    if base:
        for k, r in rec["impl"].items():
            if k != "jaxdyn_local":
                rec[f"{k}_over_jaxdyn_local"] = r["median_s"] / base["median_s"]
    log(f"keops N={n}: " + ", ".join(f"{k} {fmt_s(r['median_s'])}" for k, r in rec["impl"].items()))
    return rec


def _blocked_q(q, x, beta):
    import jax.numpy as jnp

    import jaxdyn

    return jaxdyn.interaction(q, x, jnp.eye(3, dtype=x.dtype), beta, kernel="blocked")


def keops_setup(spec, x_np, rows, ref, beta, delta, impls):
    """KeOps: versions, first call (code generation), the voxel probe, accuracy; adds the
    timed callables to ``impls``."""
    import importlib.metadata

    import torch

    import pykeops

    # torch's own OpenMP runtime (clustering, sorting) beside KeOps's (the system libgomp):
    # with both at all cores, their waiting threads stalled KeOps calls for seconds on 2
    # cores; the preparation is O(N) and runs on one thread
    torch.set_num_threads(1)
    if spec.get("keops_fresh_cache"):  # the first call then generates and compiles everything
        import tempfile

        pykeops.set_build_folder(tempfile.mkdtemp(prefix="keops_bench_"))
    out = {"pykeops": pykeops.__version__, "torch": torch.__version__,
           "keopscore": importlib.metadata.version("keopscore"),
           "torch_threads": torch.get_num_threads(), "keops_threads": "OpenMP default",
           "build_folder": pykeops.get_build_folder()}
    try:
        out["compiler"] = subprocess.run(["c++", "--version"], capture_output=True, text=True,
                                         timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        out["compiler"] = None
    n = len(x_np)
    before = sum(len(f) for _, _, f in os.walk(out["build_folder"]))
    xt = torch.from_numpy(x_np)
    small = xt[:512].contiguous()
    t0 = time.perf_counter()
    keops_block_sparse(small, beta, max(delta, 0.5), 0.5, spec["from_matrix_max"])
    keops_dense_rows(small, torch.arange(8), beta)
    out["first_call_s"] = time.perf_counter() - t0
    out["build_files_added"] = sum(len(f) for _, _, f in os.walk(out["build_folder"])) - before
    out["first_call_note"] = ("the block-sparse and dense formulas on 512 points: code generation "
                              "and compilation where files were added, else loaded from KeOps's "
                              "cache (--keops-fresh-cache: an empty one)")
    out["self_check"] = keops_self_check(small, beta)
    probe = []
    for f in spec["voxels"]:
        voxel = f * delta
        if 2.0 / voxel >= 1023:  # grid_cluster packs 10 bits a coordinate
            probe.append({"voxel_over_delta": f, "skipped": "over 1023 cells a side"})
            continue
        det = {}
        keops_block_sparse(xt, beta, delta, voxel, spec["from_matrix_max"])  # warm
        t0 = time.perf_counter()
        keops_block_sparse(xt, beta, delta, voxel, spec["from_matrix_max"], det)
        probe.append({"voxel_over_delta": f, "voxel": voxel, "wall_s": time.perf_counter() - t0,
                      **det})
        log(f"keops N={n} voxel {f:g}δ: {fmt_s(probe[-1]['wall_s'])} ({det['clusters']} clusters,"
            f" visited {det['visited']:.3g}, prepare {fmt_s(det['prepare_s'])})")
    out["voxel_probe"] = probe
    ok = [p for p in probe if "wall_s" in p]
    if not ok:
        raise RuntimeError("no voxel size could run")
    best = min(ok, key=lambda p: p["wall_s"])
    out["voxel_over_delta"] = best["voxel_over_delta"]
    out["visited"] = best["visited"]
    voxel, fmm = best["voxel"], spec["from_matrix_max"]
    m = keops_block_sparse(xt, beta, delta, voxel, fmm).double().numpy()
    dense = keops_dense_rows(xt, torch.from_numpy(rows), beta).double().numpy()
    out["accuracy"] = {"queries": len(rows), "keops_vs_f64": rel_err(m[rows], ref),
                       "keops_dense_vs_f64": rel_err(dense, ref),
                       "keops_vs_keops_dense": rel_err(m[rows], dense)}
    # the reduction alone: clusters, sorted points and ranges built once
    xs, _, rng, _ = keops_prepare(xt, beta, delta, voxel, fmm)
    cpu = lambda r: r  # noqa: E731  (CPU tensors: the call has returned)
    impls["keops"] = {"fn": (lambda: keops_block_sparse(xt, beta, delta, voxel, fmm)), "sync": cpu}
    impls["keops_reduce"] = {"fn": (lambda: keops_reduce(xs, rng, beta)), "sync": cpu}
    return out


# ------------------------------------------------------------------------------ the driver


WORK = {"field": work_field, "steps": work_steps, "beta100": work_beta100, "auto": work_auto,
        "scan": work_scan, "keops": work_keops}


def worker(args):
    spec = json.loads(args.worker)
    if spec["dtype"] == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)
    rec = WORK[spec["case"]](spec)
    print(json.dumps(rec, default=_plain), flush=True)


def _plain(o):
    try:
        return o.item()
    except AttributeError:
        return str(o)


def run_child(spec, timeout=None):
    """Run one (case, N) in a child process; its progress (stderr) is shown as it comes."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
    tail = deque(maxlen=40)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def pump():
        for line in p.stderr:
            tail.append(line)
            sys.stderr.write(line)

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    timer = threading.Timer(timeout, p.kill) if timeout else None
    if timer:
        timer.start()
    t0 = time.perf_counter()
    out = p.stdout.read()
    p.wait()
    th.join(10)
    if timer:
        timer.cancel()
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        why = f"child exited {p.returncode}" + (f" (killed after --worker-timeout {timeout} s)"
                                                  if timeout and p.returncode == -9 else "")
        return {**spec, "error": why, "stderr_tail": "".join(tail)[-3000:]}
    rec = json.loads(lines[-1])
    rec["child_wall_s"] = time.perf_counter() - t0
    return rec


def crossovers(rows):
    """Per N, over the β at which the local lists ran (not answered by the blocked kernel):
    the β above which local beats blocked at every such β (local / blocked = 1 interpolated in
    log β) and the visited fraction there (interpolated in log)."""
    out = []
    by_n = {}
    for r in rows:
        if "local_over_blocked" in r:
            by_n.setdefault(r["n"], []).append(r)
    for n, rs in sorted(by_n.items()):
        dense = sorted(r["beta"] for r in rs if r.get("answered_dense"))
        rs = sorted((r for r in rs if not r.get("answered_dense")), key=lambda r: r["beta"])
        found = {"n": n, "beta": None, "visited": None, "dense_at_betas": dense}
        # the last β at which local is not faster; local is faster at every β above it
        slow = [i for i, r in enumerate(rs) if r["local_over_blocked"] >= 1]
        if slow and slow[-1] + 1 < len(rs):
            a, b = rs[slow[-1]], rs[slow[-1] + 1]
            ra, rb = a["local_over_blocked"], b["local_over_blocked"]
            s = math.log(ra) / (math.log(ra) - math.log(rb))
            lb = math.log(a["beta"]) + s * (math.log(b["beta"]) - math.log(a["beta"]))
            lv = math.log(a["visited"]) + s * (math.log(b["visited"]) - math.log(a["visited"]))
            found.update(beta=math.exp(lb), visited=math.exp(lv),
                         between_betas=[a["beta"], b["beta"]])
        elif rs:
            ratios = [r["local_over_blocked"] for r in rs]
            vis = [r["visited"] for r in rs]
            found["note"] = (f"no crossover where the lists ran (β = {rs[0]['beta']:g} to "
                             f"{rs[-1]['beta']:g}, visited {min(vis):.3g} to {max(vis):.3g}): "
                             f"local / blocked from {min(ratios):.3g} to {max(ratios):.3g}")
        else:
            found["note"] = "the blocked kernel answered at every β"
        if dense and not found.get("beta"):
            found["note"] += ("; the blocked kernel answered at β = "
                              + ", ".join(f"{b:g}" for b in dense))
        out.append(found)
    return out


def figure(cases, tol, tag, copy=None):
    """Visited fraction against β per N (the crude bound dashed, crossovers marked) and, at
    β = N, against N (the field and KeOps cases' runs)."""
    pyplot = plt()
    fig, (ax, ax2) = pyplot.subplots(1, 2, figsize=(11.0, 4.4))
    scan = cases.get("scan") or {}
    rows = [r for r in scan.get("rows", []) if "visited" in r]
    ns = sorted({r["n"] for r in rows})
    for k, n in enumerate(ns):
        rs = sorted((r for r in rows if r["n"] == n), key=lambda r: r["beta"])
        betas = [r["beta"] for r in rs]
        color = f"C{k}"
        ax.loglog(betas, [r["visited"] for r in rs], "-", color=color)
        lists = [r for r in rs if not r.get("answered_dense")]
        dense = [r for r in rs if r.get("answered_dense")]
        ax.loglog([r["beta"] for r in lists], [r["visited"] for r in lists], "o", color=color,
                  label=f"N = {n:,}: visited by the lists")
        if dense:
            ax.loglog([r["beta"] for r in dense], [r["visited"] for r in dense], "o", mfc="none",
                      color=color, label=f"N = {n:,}: lists' fraction, blocked kernel answered")
        fine = [betas[0] * (betas[-1] / betas[0]) ** (i / 60) for i in range(61)]
        ax.loglog(fine, [expected_visited(n, b, tol) for b in fine], "--", color=color, lw=1,
                  label=f"N = {n:,}: cap log(N/tol)/(2β)")
    for c in scan.get("crossover", []):
        if c.get("beta"):
            k = ns.index(c["n"])
            ax.plot([c["beta"]], [c["visited"]], "X", ms=11, color=f"C{k}", mec="k",
                    label=f"N = {c['n']:,}: local = blocked ({c['visited']:.2g})")
    ax.set_xlabel("β")
    ax.set_ylabel("visited fraction of the N² pairs (stats.visited)")
    ax.set_title(f"β sweep, uniform points on S², tol = {tol:g}")
    ax.grid(True, which="both", alpha=0.3)
    if rows:
        ax.legend(fontsize=7)
    else:
        ax.set_visible(False)
    # β = N: the field case's sizes and the KeOps case's (jaxdyn local's lists)
    at_n = {r["n"]: r["jaxdyn_local"]["visited"] for r in (cases.get("keops") or {}).get("rows", [])
            if (r.get("jaxdyn_local") or {}).get("visited") is not None}
    at_n.update({r["n"]: r["visited"] for r in (cases.get("field") or {}).get("rows", [])
                 if r.get("visited") is not None})
    if at_n:
        big = sorted(at_n)
        ax2.loglog(big, [at_n[n] for n in big], "o-", color="C3",
                   label="visited by the lists (leaves of 64)")
        fine = [big[0] * (big[-1] / big[0]) ** (i / 60) for i in range(61)] if len(big) > 1 \
            else big
        ax2.loglog(fine, [expected_visited(n, float(n), tol) for n in fine], "--", color="C3",
                   lw=1, label="cap log(N/tol)/(2N)")
        ax2.loglog(fine, [64.0 * 12 / n for n in fine], ":", color="k", lw=1,
                   label="12 key leaves of 64 a query")
        ax2.set_xlabel("N (β = N)")
        ax2.set_ylabel("visited fraction of the N² pairs")
        ax2.set_title("β = N (the critical scale on S²)")
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend(fontsize=7)
    else:
        ax2.set_visible(False)
    fig.tight_layout()
    save_figure(fig, f"local{tag}")
    if copy:
        Path(copy).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(copy, dpi=110, bbox_inches="tight")
        print(f"wrote {copy}")
    pyplot.close(fig)


def main():
    args = setup(P)
    if args.worker:
        return worker(args)
    if args.replot:
        rec = json.loads(Path(args.replot).read_text())
        rec = rec.get("result", rec)
        figure(rec["cases"], rec["workload"]["tol"], args.tag, args.figure_copy)
        return 0
    if args.tiny:
        for k, v in TINY.items():
            if getattr(args, k) == P.get_default(k):
                setattr(args, k, v)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        raise SystemExit(f"unknown case(s) {bad}; choose from {', '.join(CASES)}")
    common = {"tol": args.tol, "dtype": args.dtype, "seed": args.seed, "reps": args.reps,
              "budget": args.budget, "accuracy_queries": args.accuracy_queries}
    data = {"workload": {k: getattr(args, k) for k in (
        "cases", "tol", "dtype", "seed", "field_ns", "steps_n", "steps", "dt", "beta100_n",
        "auto_ns", "scan_betas", "scan_ns", "keops_ns", "keops_with", "keops_voxels",
        "from_matrix_max", "keops_fresh_cache", "blocked_cap_s", "accuracy_queries", "budget",
        "tiny")},
        "auto_target": AUTO_TARGET, "cases": {}, "machine": machine_info()}
    name = f"local{args.tag}"

    def child(spec):
        log(f"--- {spec['case']} N={spec['n']}")
        rec = run_child({**common, **spec}, args.worker_timeout)
        if "error" in rec:
            log(f"{spec['case']} N={spec['n']}: {rec['error']}")
        return rec

    for case in cases:
        if case == "field":
            data["cases"]["field"] = {"rows": []}
            for n in _ints(args.field_ns):
                data["cases"]["field"]["rows"].append(child({"case": "field", "n": n}))
                write_json(name, data)
        elif case == "steps":
            data["cases"]["steps"] = child({"case": "steps", "n": args.steps_n,
                                            "steps": args.steps, "dt": args.dt})
        elif case == "beta100":
            data["cases"]["beta100"] = child({"case": "beta100", "n": args.beta100_n})
        elif case == "auto":
            data["cases"]["auto"] = {"rows": [], "target": AUTO_TARGET}
            for n in _ints(args.auto_ns):
                data["cases"]["auto"]["rows"].append(child({"case": "auto", "n": n}))
                write_json(name, data)
        elif case == "scan":
            rows = []
            for n in _ints(args.scan_ns):
                r = child({"case": "scan", "n": n, "betas": _floats(args.scan_betas)})
                rows += r.get("rows", [r])
                data["cases"]["scan"] = {"rows": rows}
                write_json(name, data)
            scan = data["cases"]["scan"]
            scan["crossover"] = crossovers(rows)
            for c in scan["crossover"]:
                log(f"scan crossover N={c['n']}: " + (
                    f"β ≈ {c['beta']:.3g}, visited ≈ {c['visited']:.3g}" if c.get("beta")
                    else c["note"]))
            write_json(name, data)
        elif case == "keops":
            data["cases"]["keops"] = {"rows": []}
            for n in _ints(args.keops_ns):
                data["cases"]["keops"]["rows"].append(child({
                    "case": "keops", "n": n, "with": args.keops_with.split(","),
                    "voxels": _floats(args.keops_voxels), "blocked_cap_s": args.blocked_cap_s,
                    "from_matrix_max": args.from_matrix_max,
                    "keops_fresh_cache": args.keops_fresh_cache}))
                write_json(name, data)
        if case in ("steps", "beta100"):
            write_json(name, data)
    if not args.no_plot and any(k in data["cases"] for k in ("scan", "field", "keops")):
        figure(data["cases"], args.tol, args.tag, args.figure_copy)


if __name__ == "__main__":
    main()
