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
  rule. (``results/w2_sinkhorn_gpu.json`` was measured before this call was jitted: its
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

Reference per row: ``exact`` (scipy assignment) where ``N <= --exact-max``; for ``affine``
also the closed form at every N (``reference="closed form"``).

Writes ``benchmarks/results/<name>.json`` and ``.png`` (``--name``, default
``w2_sinkhorn``). ``--quick`` runs small sizes only. Larger N for a case are skipped once the
case has used ``--budget-s`` seconds.

    python benchmarks/bench_w2.py --quick
    python benchmarks/bench_w2.py --sizes 1000 2000 5000 10000 --exact-max 5000
"""

from __future__ import annotations

import argparse
import json
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

from common import machine_info  # noqa: E402
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
            if case == "affine":
                row["closed_form_w2"] = affine_w2(x)
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
    ax1.set_xlabel("N (points per cloud)")
    ax1.set_ylabel("time per W2 [s] (median, warm)")
    ax1.legend(fontsize=7)
    ax1.grid(True, which="both", alpha=0.3)
    ax2.axhline(2.0, color="gray", lw=0.8, ls="--")
    ax2.set_yscale("log")
    ax2.set_xlabel("N")
    ax2.set_ylabel("|W2 error| vs exact or closed form [%]")
    ax2.legend(fontsize=7)
    ax2.grid(True, which="both", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path_png, dpi=120)
    plt.close(fig)


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
    p.add_argument("--outdir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.sizes is None:
        args.sizes = [500, 1000] if args.quick else [1000, 2000, 4000, 10000, 30000, 100000]
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
            machine_info=minfo,
        )
        tmp = jpath + ".tmp"
        with open(tmp, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        os.replace(tmp, jpath)
        return meta

    rows = run(args, save)
    meta = save(rows, final=True)
    total = meta["total_s"]
    ppath = os.path.join(args.outdir, f"{args.name}.png")
    plot(rows, ppath, f"W2: Sinkhorn (default ε) vs exact — {meta['backend']} {meta['device']}, {args.dtype}")
    print(f"wrote {jpath} and {ppath} (total {total:.1f}s)", flush=True)


if __name__ == "__main__":
    main()
