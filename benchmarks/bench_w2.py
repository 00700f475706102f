"""Benchmark: Sinkhorn W2 (jaxdyn.w2_sinkhorn, default ε rule) against exact assignment.

For each case and N it runs, in the same process:

- ``jaxdyn``: :func:`jaxdyn.distances.w2_sinkhorn` with its DEFAULT ε (ε-scaling to
  0.005 · W2^2) and default geometry (dense up to 2^24 cost entries, i.e. N = 4096; the
  multiscale block-sparse solver beyond: rows record ``geometry`` and ``kernel_density``).
  The first call (compilation + run) is timed separately; then the median of ``--repeat``
  warm calls; above N = 20 000 a single call (compilation included, ``single_call``).
- ``exact`` (baseline, reference): scipy ``linear_sum_assignment`` on the squared cost,
  for N <= ``--exact-max`` (O(N^3)).
- ``ott_default`` (baseline): ott-jax's ``sinkdiv`` with its default ε (5 % of the cost's
  standard deviation), dense, jitted, for N <= ``--ott-max``: the bias that motivated the
  rule. (The GPU record ``results/w2/gpu-nvidia-h200.json`` times this baseline unjitted: its
  ``ott_default_s`` includes tracing and compilation on every call; only its errors count.)

Cases (float32 by default; x on S^2, y on S^2 except in ``affine``):

- ``concentration``: clusters near ±e1 (x = normalise(±e1 + 0.05 ξ)) against a noisy copy
  (y = normalise(x + 0.05 ξ')), the regime of W2(ρ_t, Π#ρ0) late in a run (W2 ≈ 0.07).
- ``spread``: two independent uniform samples.
- ``affine``: the ``concentration`` clusters x against ``y = A x + b`` with A symmetric
  positive definite (``diag(1, 1.5, 0.7)``, ``b = 0.02 e2``). ``y`` is the gradient of a
  convex function of ``x``, so the identity pairing is optimal at every N and
  ``W2 = (mean_i |(A - I) x_i + b|^2)^{1/2}`` exactly (W2 ≈ 0.03): a reference at sizes
  where the assignment solver is out of reach. (A pure translation would be no test: the
  debiased divergence of a translate equals |τ|^2 at every ε. The affine case is nearly as
  kind to the debiasing, measured errors ~1e-6 against 5e-4 for ``concentration``: it
  checks convergence and numerics at large N, not the ε bias.)

- ``gaussian_affine``: x ~ N(m, S) in R^3 (anisotropic, rotated axes) against
  ``y = A x + b`` with A symmetric positive definite: the identity pairing is optimal, and
  ``W2^2 = mean_i |y_i - x_i|^2`` equals the Bures closed form between the clouds' empirical
  Gaussians (both recorded, :func:`gaussian_closed_form`; W2 ≈ 0.65).

Reference per row: ``exact`` (scipy assignment) where ``N <= --exact-max``; for ``affine``
and ``gaussian_affine`` also the closed form at every N (``reference="closed form"``).

``--compare`` (default sizes 10^4, 3·10^4, 10^5) measures on ``gaussian_affine``, in one
process, every method's W2 against the closed form and its wall and CPU seconds (all threads
of the process): first calls apart (compilation, KeOps builds), then ``--repeat`` warm calls
per method in interleaved rounds (``--repeat-large`` above 20 000 points). Methods, each
with its accuracy parameter set by ``--...`` options (tuned for ``|error| <= 1e-3``):

- ``jaxdyn``: ``w2_sinkhorn`` as it comes (multiscale solver above 4096 points);
  ``jaxdyn_tuned`` the same with ``--jaxdyn-rel-eps``.
- ``geomloss``: GeomLoss ``SamplesLoss("sinkhorn", p=2, blur, scaling, debias=True)`` on
  KeOps (``--geomloss-backend multiscale``): its debiased divergence uses the cost
  ``|x - y|^2 / 2`` at ``ε = blur^2``, so ``W2 ≈ sqrt(2 S)``: the same estimator as
  jaxdyn's (the debiased S_ε of the cost |x - y|^2 at ε = 2 blur^2), fixed ε ladder
  (``scaling``: one iteration per ε level), float32.
- ``ott``: plain ott-jax ``sinkdiv`` (dense point cloud, fixed ``--ott-eps``, jitted),
  for N <= ``--ott-max``.
- ``pot_emd``: POT's exact ``ot.emd2`` on the dense float64 cost (N <= ``--pot-emd-max``);
  ``pot_sinkhorn``: POT's ``empirical_sinkhorn_divergence`` (log domain, primal costs;
  N <= ``--pot-sinkhorn-max``).

The baselines are not dependencies of jaxdyn: ``pip install geomloss pykeops pot`` (KeOps
compiles its kernels with the system C++ compiler on first use and caches them).

Writes ``<outdir>/<name>.json`` and ``.png`` (``--outdir``, default ``benchmarks/runs/``;
``--name``, default ``w2_sinkhorn``). ``--quick`` runs small sizes only. Larger N for a case are skipped once the
case has used ``--budget-s`` seconds.

    python benchmarks/bench_w2.py --quick
    python benchmarks/bench_w2.py --sizes 1000 2000 5000 10000 --exact-max 5000
    python benchmarks/bench_w2.py --compare --jaxdyn-rel-eps 0.02 --geomloss-blur 0.01
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import resource
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from common import RESULTS, machine_info  # noqa: E402
from jaxdyn.distances import (  # noqa: E402
    default_batch_size,
    default_multiscale,
    w2_coupling,
    w2_exact,
    w2_sinkhorn,
)

#: above this N a W2 takes minutes: one call (compilation included) instead of
#: first call + ``--repeat`` warm calls.
SINGLE_CALL_ABOVE = 20000


def _unit(a):
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


AFFINE_A = np.diag([1.0, 1.5, 0.7])
AFFINE_B = np.array([0.0, 0.02, 0.0])


def affine_w2(x):
    """Closed-form W2 of the ``affine`` case: the identity pairing is optimal."""
    x = np.asarray(x, np.float64)
    return float(np.sqrt(np.mean(np.sum((x @ (AFFINE_A - np.eye(3)).T + AFFINE_B) ** 2, axis=1))))


def make_case(name: str, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    if name == "concentration":
        s = np.where(rng.random(n) < 0.5, 1.0, -1.0)
        centers = np.zeros((n, 3))
        centers[:, 0] = s
        x = _unit(centers + 0.05 * rng.standard_normal((n, 3)))
        y = _unit(x + 0.05 * rng.standard_normal((n, 3)))
    elif name == "spread":
        x = _unit(rng.standard_normal((n, 3)))
        y = _unit(rng.standard_normal((n, 3)))
    elif name == "affine":
        x, _ = make_case("concentration", n, seed)
        y = x @ AFFINE_A.T + AFFINE_B
    elif name == "gaussian_affine":
        x = GAUSS_M + rng.standard_normal((n, 3)) @ np.linalg.cholesky(GAUSS_S).T
        y = x @ GAUSS_A.T + GAUSS_B
    else:
        raise ValueError(f"unknown case {name!r}")
    return x, y


def _cpu_s():
    """CPU seconds of this process, all threads (user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timeit(fn, repeat):
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


@jax.jit
def _ott_default_jit(x, y):
    from ott.tools import sinkhorn_divergence as sd

    div, out = sd.sinkdiv(x, y)  # ott's default ε: 5 % of the cost's standard deviation
    return div, out.geoms[0].epsilon, jnp.all(jnp.stack(out.converged))


def ott_default(x, y):
    div, eps, conv = _ott_default_jit(x, y)
    return float(div), float(eps), bool(conv)


def run(args, save):
    dtype = np.float64 if args.dtype == "float64" else np.float32
    if dtype == np.float64:
        jax.config.update("jax_enable_x64", True)
    rows = []
    case_budget = {}
    for item in args.case_budget:
        name, _, sec = item.partition("=")
        if name not in args.cases or not sec:
            raise SystemExit(f"--case-budget {item!r}: expected CASE=SECONDS with CASE in {args.cases}")
        case_budget[name] = float(sec)
    for case in args.cases:
        spent = 0.0
        hist = []  # (n, seconds for this N, iterations)
        for n in args.sizes:
            # predicted cost of this N: runs x last warm time x (N ratio)^2 x iteration growth
            pred = 0.0
            budget = case_budget.get(case, args.budget_s)
            multiscale = default_multiscale(n, n, 3)
            if hist:
                n1, t1, i1 = hist[-1]
                growth = max(1.0, i1 / hist[-2][2]) if len(hist) > 1 and hist[-2][2] else 1.0
                runs = 1 + (args.repeat if n <= SINGLE_CALL_ABOVE else 0)
                # dense/online passes cost N^2; the multiscale solver's measured growth on
                # these clouds is about N^1.5 (sparser kernels as N grows)
                pred = runs * t1 * (n / n1) ** (1.5 if multiscale else 2.0) * growth
            if spent + pred > budget:
                print(f"[{case}] skip N={n}: predicted {pred:.0f}s exceeds the case budget "
                      f"({spent:.0f}s of {budget:.0f}s used)", flush=True)
                rows.append(dict(case=case, n=n, skipped=True, predicted_s=pred))
                save(rows)
                continue
            t_case = time.perf_counter()
            x, y = make_case(case, n, seed=args.seed)
            xj, yj = jnp.asarray(x, dtype), jnp.asarray(y, dtype)
            row = dict(case=case, n=n, dtype=args.dtype, skipped=False)

            t0, c0 = time.perf_counter(), _cpu_s()
            res = w2_sinkhorn(xj, yj)
            row["jaxdyn_first_call_s"] = time.perf_counter() - t0
            row["jaxdyn_first_call_cpu_s"] = _cpu_s() - c0
            row["loadavg_after"] = list(os.getloadavg())
            if n <= SINGLE_CALL_ABOVE:
                med, times, res = _timeit(lambda: w2_sinkhorn(xj, yj), args.repeat)
            else:  # minutes per call: the one call is the figure (compilation included)
                med, times = row["jaxdyn_first_call_s"], [row["jaxdyn_first_call_s"]]
                row["single_call"] = True
            # the result's fields are numpy arrays: plain floats for the JSON file
            row.update(
                jaxdyn_s=med, jaxdyn_times_s=times, jaxdyn_w2=float(res.value),
                epsilon=float(res.epsilon), converged=bool(res.converged),
                n_iters=int(res.num_steps), epsilons=[float(e) for e in np.asarray(res.stats["epsilons"])],
                epsilon_floored=bool(res.stats["epsilon_floored"]), geometry=res.geometry,
                kernel_density=float(res.stats["kernel_density"]),
                batch_size=(None if multiscale else default_batch_size(n, n) or "dense"),
            )
            if case in ("affine", "gaussian_affine"):
                row["closed_form_w2"] = affine_w2(x) if case == "affine" else gaussian_closed_form(x, y)[0]
                row["closed_form_rel_err"] = float(res.value) / row["closed_form_w2"] - 1.0
            row["coupling_upper_bound"] = float(w2_coupling(xj, yj))

            if n <= args.exact_max:
                t0 = time.perf_counter()
                ex = float(w2_exact(x.astype(dtype), y.astype(dtype)).value)
                row["exact_s"] = time.perf_counter() - t0
                row["exact_w2"] = ex
                row["rel_err"] = float(res.value) / ex - 1.0
                row["speedup_vs_exact"] = row["exact_s"] / med
            if n <= args.ott_max:
                t0 = time.perf_counter()
                div, eps, conv = ott_default(xj, yj)
                row["ott_default_first_call_s"] = time.perf_counter() - t0
                med_o, _, (div, eps, conv) = _timeit(lambda: ott_default(xj, yj), args.repeat)
                row.update(ott_default_s=med_o, ott_default_w2=float(np.sqrt(max(div, 0.0))),
                           ott_default_epsilon=eps, ott_default_converged=conv)
                if "exact_w2" in row:
                    row["ott_default_rel_err"] = row["ott_default_w2"] / row["exact_w2"] - 1.0
            took = time.perf_counter() - t_case
            spent += took
            hist.append((n, med, int(res.num_steps)))  # warm time of one W2
            rows.append(row)
            save(rows)
            msg = (f"[{case}] N={n}: sinkhorn {med:.3f}s (first {row['jaxdyn_first_call_s']:.2f}s, "
                   f"{row['jaxdyn_first_call_cpu_s']:.1f} CPU-s, load {row['loadavg_after'][0]:.1f}) "
                   f"W2={res.value:.5f} eps={res.epsilon:.2e} conv={res.converged} it={int(res.num_steps)} "
                   f"{res.geometry} density={float(res.stats['kernel_density']):.3f}")
            if "closed_form_w2" in row:
                msg += f" | closed form W2={row['closed_form_w2']:.5f} rel_err={row['closed_form_rel_err']:+.2e}"
            if "exact_w2" in row:
                msg += f" | exact {row['exact_s']:.2f}s W2={row['exact_w2']:.5f} rel_err={row['rel_err']:+.3%}"
            if "ott_default_w2" in row:
                msg += f" | ott default eps={row['ott_default_epsilon']:.2e}"
                if "ott_default_rel_err" in row:
                    msg += f" rel_err={row['ott_default_rel_err']:+.2%}"
            print(msg, flush=True)
    return rows


# --------------------------------------------------------------------------------------
# --compare: jaxdyn against GeomLoss, ott-jax and POT at equal accuracy (gaussian_affine)
# --------------------------------------------------------------------------------------

#: the ``gaussian_affine`` case: X ~ N(GAUSS_M, GAUSS_S) in R^3, Y = GAUSS_A X + GAUSS_B with
#: GAUSS_A symmetric positive definite (rotated axes, so nothing is aligned with the grid).
_ROT = np.linalg.qr(np.array([[1.0, 0.3, -0.2], [0.4, 1.0, 0.1], [-0.3, 0.2, 1.0]]))[0]
GAUSS_M = np.array([0.5, 0.0, -0.5])
GAUSS_S = _ROT @ np.diag([1.0, 0.36, 0.09]) @ _ROT.T
GAUSS_A = _ROT.T @ np.diag([1.3, 0.9, 0.7]) @ _ROT
GAUSS_B = np.array([0.3, -0.2, 0.1])


def _sqrtm_psd(s):
    w, v = np.linalg.eigh(s)
    return (v * np.sqrt(np.maximum(w, 0.0))) @ v.T


def gaussian_closed_form(x, y):
    """The closed-form W2 of the ``gaussian_affine`` pair, two ways (float64).

    ``y = A x + b`` with A symmetric positive definite is the gradient of a convex map of x,
    so the identity pairing is optimal: ``W2^2 = mean_i |y_i - x_i|^2`` exactly; this equals
    the Bures formula ``|m_x - m_y|^2 + tr(S_x + S_y - 2 (S_y^½ S_x S_y^½)^½)`` between the
    clouds' empirical Gaussians (the affine map is also their OT map).

    Returns:
        (pairing value, Bures value): they agree to rounding; the first is the reference.
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    pair = float(np.sqrt(np.mean(np.sum((y - x) ** 2, axis=1))))
    mx, my = x.mean(0), y.mean(0)
    sx, sy = np.cov(x.T, bias=True), np.cov(y.T, bias=True)
    ry = _sqrtm_psd(sy)
    b2 = float(np.sum((mx - my) ** 2) + np.trace(sx + sy - 2.0 * _sqrtm_psd(ry @ sx @ ry)))
    return pair, float(np.sqrt(max(b2, 0.0)))


def _geomloss_fn(x, y, blur, scaling, backend):
    """GeomLoss's debiased Sinkhorn divergence (KeOps) as a W2 estimate.

    ``SamplesLoss("sinkhorn", p=2)`` uses the cost ``|x - y|^2 / 2`` and ``ε = blur^2``: its
    debiased S_ε is half the debiased divergence of the cost ``|x - y|^2`` at ``ε' = 2 blur^2``
    (the quantity jaxdyn reports), so ``W2 ≈ sqrt(2 · max(S, 0))``.

    Returns:
        A function of no argument: one solve, the estimate and the divergence.
    """
    import torch
    from geomloss import SamplesLoss

    xt = torch.from_numpy(np.ascontiguousarray(x, np.float32))
    yt = torch.from_numpy(np.ascontiguousarray(y, np.float32))
    loss = SamplesLoss("sinkhorn", p=2, blur=blur, scaling=scaling, debias=True, backend=backend)

    def fn():
        with torch.no_grad():
            s = float(loss(xt, yt))
        return {"w2": math.sqrt(max(2.0 * s, 0.0)), "divergence": 2.0 * s}

    return fn


@functools.partial(jax.jit, static_argnames=("max_iterations",))
def _ott_sinkdiv(x, y, eps, max_iterations):
    from ott.tools import sinkhorn_divergence as sd

    div, out = sd.sinkdiv(x, y, epsilon=eps,
                          solve_kwargs={"max_iterations": max_iterations, "threshold": 1e-3})
    return div, jnp.all(jnp.stack(out.converged)), jnp.stack(out.n_iters)


def _ott_fn(xj, yj, eps, max_iterations):
    """Plain ott-jax: ``sinkdiv`` (dense point cloud, |x - y|^2) at a fixed ε, jitted."""
    e = jnp.asarray(eps, xj.dtype)

    def fn():
        div, conv, its = _ott_sinkdiv(xj, yj, e, max_iterations)
        div = float(div)
        return {"w2": math.sqrt(max(div, 0.0)), "divergence": div, "converged": bool(conv),
                "epsilon": float(eps), "n_iters": [int(i) for i in np.asarray(its)]}

    return fn


def _pot_emd_fn(x, y):
    """POT's exact network simplex (``ot.emd2``) on the dense float64 cost."""
    import ot

    n = x.shape[0]
    a = np.full(n, 1.0 / n)

    def fn():
        cost = ot.dist(np.asarray(x, np.float64), np.asarray(y, np.float64))  # |x - y|^2
        w = float(ot.emd2(a, a, cost, numItermax=100_000_000))
        return {"w2": math.sqrt(max(w, 0.0)), "divergence": w}

    return fn


def _pot_sinkhorn_fn(x, y, reg, max_iterations):
    """POT's debiased Sinkhorn (``ot.bregman.empirical_sinkhorn_divergence``, log domain).

    POT's divergence is made of primal costs ``<P_ε, C>`` (no entropy term), cost |x - y|^2.

    Returns:
        A function of no argument: one solve, the estimate and the divergence.
    """
    import ot

    def fn():
        s = float(ot.bregman.empirical_sinkhorn_divergence(
            np.asarray(x, np.float64), np.asarray(y, np.float64), reg, numIterMax=max_iterations,
            stopThr=1e-6, method="sinkhorn_log", warn=False))
        return {"w2": math.sqrt(max(s, 0.0)), "divergence": s, "epsilon": reg}

    return fn


def _jaxdyn_fn(xj, yj, **kw):
    """The W2 of ``w2_sinkhorn`` with options ``kw``; the result's diagnostics beside the value."""
    from jaxdyn import compile_stats

    def fn():
        c0 = compile_stats()["compile_seconds"]
        res = w2_sinkhorn(xj, yj, **kw)
        value = float(res.value)
        return {"w2": value, "divergence": float(res.divergence), "epsilon": float(res.epsilon),
                "converged": bool(res.converged), "n_iters": int(res.num_steps),
                "num_rounds": int(res.stats["num_rounds"]), "geometry": res.geometry,
                "kernel_density": float(res.stats["kernel_density"]),
                "compile_s": compile_stats()["compile_seconds"] - c0}

    return fn


def _versions():
    """Versions of the baselines' packages (None where not installed)."""
    from importlib import metadata

    out = {}
    for dist in ("jax", "ott-jax", "geomloss", "pykeops", "torch", "pot"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _timed(fn):
    """Wrap ``fn`` to record wall and CPU seconds (all threads of the process) per call."""
    log = []

    def call():
        c0, t0 = _cpu_s(), time.perf_counter()
        out = fn()
        log.append((time.perf_counter() - t0, _cpu_s() - c0))
        return out

    return call, log


def run_compare(args, save):
    """The interleaved comparison at equal accuracy (``--compare``); one row per (N, method)."""
    rows = []
    for n in args.sizes:
        x, y = make_case(args.compare_case, n, seed=args.seed)
        ref, bures = gaussian_closed_form(x, y)
        xj, yj = jnp.asarray(x, np.float32), jnp.asarray(y, np.float32)
        impls = {"jaxdyn": _jaxdyn_fn(xj, yj)}
        if args.jaxdyn_rel_eps:
            impls["jaxdyn_tuned"] = _jaxdyn_fn(xj, yj, rel_epsilon=args.jaxdyn_rel_eps)
        if n <= args.geomloss_max:
            impls["geomloss"] = _geomloss_fn(x, y, args.geomloss_blur, args.geomloss_scaling,
                                             args.geomloss_backend)
        if n <= args.ott_max:
            impls["ott"] = _ott_fn(xj, yj, args.ott_eps, args.ott_max_iterations)
        if n <= args.pot_emd_max:
            impls["pot_emd"] = _pot_emd_fn(x, y)
        if n <= args.pot_sinkhorn_max:
            impls["pot_sinkhorn"] = _pot_sinkhorn_fn(x, y, args.pot_reg, args.pot_max_iterations)
        timed = {k: _timed(f) for k, f in impls.items()}
        outs = {}
        # first calls (compilation, KeOps builds, caches), then interleaved warm rounds
        for name, (call, _) in timed.items():
            outs[name] = call()
            print(f"[{n}] {name}: first {timed[name][1][-1][0]:.2f}s", flush=True)
        reps = args.repeat if n <= SINGLE_CALL_ABOVE else args.repeat_large
        for _ in range(reps):
            for name, (call, _) in timed.items():
                outs[name] = call()
        for name, (_, log) in timed.items():
            out = outs[name]
            warm = log[1:] or log[:1]
            row = dict(case=args.compare_case, n=n, method=name, reference=ref,
                       bures_empirical=bures, w2=out["w2"], rel_err=out["w2"] / ref - 1.0,
                       first_wall_s=log[0][0], first_cpu_s=log[0][1],
                       wall_s=statistics.median(t for t, _ in warm),
                       cpu_s=statistics.median(c for _, c in warm),
                       warm_calls=len(log) - 1, times=[list(t) for t in log],
                       **{k: v for k, v in out.items() if k != "w2"})
            row["meets_1e-3"] = abs(row["rel_err"]) <= 1e-3
            rows.append(row)
            print(f"[{n}] {name}: W2={out['w2']:.6f} ref={ref:.6f} rel_err={row['rel_err']:+.2e} "
                  f"warm {row['wall_s']:.2f}s {row['cpu_s']:.1f} CPU-s (first {row['first_wall_s']:.2f}s "
                  f"{row['first_cpu_s']:.1f} CPU-s) load {os.getloadavg()[0]:.1f}", flush=True)
        base = {r["method"]: r for r in rows if r["n"] == n}
        for r in rows:
            if r["n"] == n and "geomloss" in base:
                r["wall_over_geomloss"] = r["wall_s"] / base["geomloss"]["wall_s"]
                r["cpu_over_geomloss"] = r["cpu_s"] / base["geomloss"]["cpu_s"]
        # the fields the suite's headline reads (jaxdyn's warm wall time, per case and N)
        base["jaxdyn"]["jaxdyn_s"] = base["jaxdyn"]["wall_s"]
        if "geomloss" in base:
            base["jaxdyn"]["geomloss_s"] = base["geomloss"]["wall_s"]
        save(rows)
    return rows


def plot(rows, path_png, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    cases = sorted({r["case"] for r in rows})
    for c, case in enumerate(cases):
        rs = [r for r in rows if r["case"] == case and not r.get("skipped")]
        col = f"C{c}"
        n = [r["n"] for r in rs]
        ax1.loglog(n, [r["jaxdyn_s"] for r in rs], "o-", color=col, label=f"{case}: jaxdyn Sinkhorn")
        ne = [r["n"] for r in rs if "exact_s" in r]
        if ne:
            ax1.loglog(ne, [r["exact_s"] for r in rs if "exact_s" in r], "s--", color=col,
                       label=f"{case}: exact (scipy LSA)")
        no = [r["n"] for r in rs if "ott_default_s" in r]
        if no:
            ax1.loglog(no, [r["ott_default_s"] for r in rs if "ott_default_s" in r], "^:", color=col,
                       label=f"{case}: ott default ε")
        ner = [r for r in rs if "rel_err" in r]
        if ner:
            ax2.semilogx([r["n"] for r in ner], [100 * abs(r["rel_err"]) for r in ner], "o-", color=col,
                         label=f"{case}: jaxdyn (default ε rule)")
        ncf = [r for r in rs if "closed_form_rel_err" in r]
        if ncf:
            ax2.semilogx([r["n"] for r in ncf], [100 * abs(r["closed_form_rel_err"]) for r in ncf], "D-.",
                         color=col, label=f"{case}: jaxdyn vs closed form")
        nor = [r for r in rs if "ott_default_rel_err" in r]
        if nor:
            ax2.semilogx([r["n"] for r in nor], [100 * abs(r["ott_default_rel_err"]) for r in nor], "^:",
                         color=col, label=f"{case}: ott default ε")
    ax2.set_yscale("log")
    _finish_figure(fig, ax1, ax2, "time per W2 [s] (median, warm)",
                   "|W2 error| vs exact or closed form [%]", 2.0, title, path_png)


def _finish_figure(fig, ax1, ax2, time_label, error_label, error_target, title, path_png):
    """Labels, legends, grids and the error target of the two panels; the figure saved."""
    import matplotlib.pyplot as plt

    ax1.set_xlabel("N (points per cloud)")
    ax1.set_ylabel(time_label)
    ax2.axhline(error_target, color="gray", lw=0.8, ls="--")
    ax2.set_xlabel("N")
    ax2.set_ylabel(error_label)
    for ax in (ax1, ax2):
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path_png, dpi=120)
    plt.close(fig)


def plot_compare(rows, path_png, title):
    """Time and error against N, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for k, m in enumerate(methods):
        rs = sorted((r for r in rows if r["method"] == m), key=lambda r: r["n"])
        n = [r["n"] for r in rs]
        ax1.loglog(n, [r["wall_s"] for r in rs], "o-", color=f"C{k}", label=f"{m} (wall)")
        ax1.loglog(n, [r["cpu_s"] for r in rs], "x:", color=f"C{k}", label=f"{m} (CPU-s)")
        ax2.loglog(n, [max(abs(r["rel_err"]), 1e-9) for r in rs], "o-", color=f"C{k}", label=m)
    _finish_figure(fig, ax1, ax2, "seconds per W2 (warm)", "|W2 / closed form - 1|", 1e-3, title,
                   path_png)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes only (N = 500, 1000)")
    p.add_argument("--sizes", type=int, nargs="+", default=None)
    p.add_argument("--cases", nargs="+", default=["concentration", "affine", "spread"])
    p.add_argument("--exact-max", type=int, default=3000)
    p.add_argument("--ott-max", type=int, default=4000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=120.0, help="per case; larger N skipped after")
    p.add_argument("--case-budget", nargs="*", default=[], metavar="CASE=SECONDS",
                   help="budget of one case, overriding --budget-s (e.g. spread=300)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="w2_sinkhorn")
    p.add_argument("--outdir", default=str(RESULTS),
                   help="where the JSON and figure go (default benchmarks/runs/, ignored by git; "
                        "`python -m benchmarks run w2 --record` files them under results/)")
    g = p.add_argument_group("--compare: jaxdyn vs GeomLoss, ott-jax, POT at equal accuracy")
    g.add_argument("--compare", action="store_true",
                   help="the interleaved comparison on --compare-case (default sizes 1e4 3e4 1e5)")
    g.add_argument("--compare-case", default="gaussian_affine")
    g.add_argument("--repeat-large", type=int, default=1,
                   help="warm calls per method above 20 000 points (after the first call)")
    g.add_argument("--jaxdyn-rel-eps", type=float, default=0.0,
                   help="also run jaxdyn with this rel_epsilon (0: default only)")
    g.add_argument("--geomloss-max", type=int, default=10**6)
    g.add_argument("--geomloss-blur", type=float, default=0.01)
    g.add_argument("--geomloss-scaling", type=float, default=0.9)
    g.add_argument("--geomloss-backend", default="multiscale")
    g.add_argument("--ott-eps", type=float, default=1e-3, help="plain ott-jax: its fixed ε (|x - y|^2)")
    g.add_argument("--ott-max-iterations", type=int, default=20000)
    g.add_argument("--pot-emd-max", type=int, default=10000)
    g.add_argument("--pot-sinkhorn-max", type=int, default=0)
    g.add_argument("--pot-reg", type=float, default=1e-2)
    g.add_argument("--pot-max-iterations", type=int, default=2000)
    args = p.parse_args(argv)
    if args.sizes is None:
        args.sizes = ([1000] if args.quick else [10000, 30000, 100000]) if args.compare else (
            [500, 1000] if args.quick else [1000, 2000, 4000, 10000, 30000, 100000])
    if args.compare and args.ott_max == p.get_default("ott_max"):
        args.ott_max = 10000
    if args.quick:
        args.repeat = min(args.repeat, 2)

    dev = jax.devices()[0]
    print(f"backend={jax.default_backend()} device={dev.device_kind} jax={jax.__version__}", flush=True)
    import ott

    os.makedirs(args.outdir, exist_ok=True)
    jpath = os.path.join(args.outdir, f"{args.name}.json")
    t0 = time.perf_counter()
    minfo = machine_info()

    def save(rows, final=False):
        meta = dict(
            benchmark="bench_w2",
            description="jaxdyn w2_sinkhorn (default ε rule, ott-jax solver) vs exact assignment and ott's default ε",
            backend=jax.default_backend(), device=str(dev.device_kind), jax=jax.__version__,
            ott_jax=getattr(ott, "__version__", "?"), python=platform.python_version(),
            machine=platform.machine(), cpu_count=os.cpu_count(), dtype=args.dtype, quick=args.quick,
            sizes=args.sizes, exact_max=args.exact_max, ott_max=args.ott_max, repeat=args.repeat,
            budget_s=args.budget_s, total_s=time.perf_counter() - t0, complete=final, argv=sys.argv[1:],
            machine_info=minfo, compare=args.compare,
        )
        if args.compare:
            meta.update(
                description=("W2 of a Gaussian affine pair in R^3 (closed form) at equal accuracy: "
                             "jaxdyn w2_sinkhorn vs GeomLoss (KeOps), plain ott-jax sinkdiv, POT; "
                             "interleaved warm calls, first calls apart, wall and CPU seconds"),
                case=args.compare_case, versions=_versions(), options={
                    k: getattr(args, k) for k in (
                        "jaxdyn_rel_eps", "geomloss_blur", "geomloss_scaling", "geomloss_backend",
                        "geomloss_max", "ott_eps", "ott_max", "ott_max_iterations", "pot_emd_max",
                        "pot_sinkhorn_max", "pot_reg", "pot_max_iterations", "repeat", "repeat_large")})
        tmp = jpath + ".tmp"
        with open(tmp, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        os.replace(tmp, jpath)
        return meta

    if args.compare:
        rows = run_compare(args, save)
        meta = save(rows, final=True)
        total = meta["total_s"]
        ppath = os.path.join(args.outdir, f"{args.name}.png")
        plot_compare(rows, ppath, f"W2 of a Gaussian affine pair in R^3 at equal accuracy "
                                  f"(closed form) — {meta['backend']}, {os.cpu_count()} cores")
        print(f"wrote {jpath} and {ppath} (total {total:.1f}s)", flush=True)
        return
    rows = run(args, save)
    meta = save(rows, final=True)
    total = meta["total_s"]
    ppath = os.path.join(args.outdir, f"{args.name}.png")
    plot(rows, ppath, f"W2: Sinkhorn (default ε) vs exact — {meta['backend']} {meta['device']}, {args.dtype}")
    print(f"wrote {jpath} and {ppath} (total {total:.1f}s)", flush=True)


if __name__ == "__main__":
    main()
