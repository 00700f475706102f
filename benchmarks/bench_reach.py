"""Benchmark: time to steer N(0, I) to a random Gaussian target to Bures W2 < 1e-4.

For each d (default 2, 4, 8, 16) and a few random targets (``random_target(seed, d)``:
mean ~ N(0, I), eigenvalues log-uniform in [0.25, 4]), t1 = 1, 8 piecewise-constant pieces,
all controls (A, b, V, B) free, optimiser started from zero controls. In one invocation:

- ``jaxdyn``: :func:`jaxdyn.control.reach` (gradients through its fixed-step Dopri8 solve,
  2 steps a piece, error estimate within rtol 1e-9; a trial failing that check alone is
  backtracked first, the steps halved only after 3 such halvings, and lengthened again on an
  accepted iterate far inside the check: ``steps_per_piece``, ``step_refinements``,
  ``step_backtracks``, ``step_coarsenings`` per target), stopping as soon as its W2 < tol
  (``stop_factor=1``). Two schedules: ``lbfgs`` (L-BFGS only) and ``adam20_lbfgs`` (20 Adam
  steps first). Every target is first solved once untimed-for-the-median (``cold_times_s``:
  trace + compile + run wherever it needs a program not yet compiled — a new d, or a
  ``steps_per_piece`` reached for the first time); ``compile_s`` is the first target's cold
  time less its warm time. Then every target is timed warm (all its programs compiled).
- ``torch_scipy_lbfgsb`` (baseline, independent code): the moment ODE of docs/math.md §B.2 with
  fixed-step RK4 (16 steps a piece) in PyTorch float64, autograd gradients, scipy's
  L-BFGS-B, the same Bures loss (eigvalsh), same start, stopping at W2 < tol (budget 120 s
  a target).
- ``certificate`` (reference): the closed-form controls (Monge map, A = log T / t1, b by
  φ-functions) — no optimisation.

Every final W2 (jaxdyn, torch, certificate) is re-measured by one independent tight
jaxdyn solve (Dopri8, rtol 1e-11) and reported as ``w2_verified``. Times are wall-clock
medians over the targets, with the process's CPU seconds (all threads) beside them
(``cpu_times_s``; per d ``cpu_s`` and the load average before/after, ``load``). Writes
``benchmarks/runs/reach.json`` (after every d, so a partial run keeps its rows) and ``reach.png``.

    python benchmarks/bench_reach.py                # d = 2 4 8 16, 3 targets each
    python benchmarks/bench_reach.py --dims 2 4 --seeds 2 --tiny
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

from common import (add_common_args, fmt_s, machine_info, plt, save_figure, setup,
                    write_json)

TOL = 1e-4
T1 = 1.0
N_PIECES = 8


def cpu_s():
    """CPU seconds of this process so far (user + system, all threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def torch_reach(m0, S0, m1, S1, *, tol=TOL, steps_per_piece=16, max_iter=500, budget_s=120.0):
    """Baseline: RK4 moment ODE in PyTorch float64 + autograd gradients, driven by scipy's
    L-BFGS-B (torch.optim.LBFGS with strong Wolfe stalled above 1e-4 in d = 4 in a trial
    here, so scipy's line search is used). Stops at W2 < tol, after max_iter iterations or
    after budget_s seconds. Returns (values dict, W2, iterations, evaluations)."""
    import numpy as np
    import torch
    from scipy.optimize import minimize

    dt = torch.float64
    d = len(m0)
    n = N_PIECES
    shapes = {"A": (n, d, d), "B": (n, d, d), "V": (n, d, d), "b": (n, d)}
    sizes = {k: int(np.prod(v)) for k, v in shapes.items()}
    w, u = np.linalg.eigh(S1)
    R1 = torch.tensor((u * np.sqrt(np.maximum(w, 0))) @ u.T, dtype=dt)
    m0t, S0t = torch.tensor(m0, dtype=dt), torch.tensor(S0, dtype=dt)
    m1t, S1t = torch.tensor(m1, dtype=dt), torch.tensor(S1, dtype=dt)
    h = T1 / n / steps_per_piece

    def unpack(x):
        out, i = {}, 0
        for k in "ABVb":
            out[k] = x[i:i + sizes[k]].reshape(shapes[k])
            i += sizes[k]
        return out

    def rhs(m, S, A, B, V, b):
        SB = S @ B
        G = (A + V @ SB) @ S
        return (A + V) @ m + V @ (SB @ m) + b, G + G.T

    def loss_of(x):
        p = unpack(x)
        m, S = m0t, S0t
        for k in range(n):
            A, B, V, b = p["A"][k], p["B"][k], p["V"][k], p["b"][k]
            for _ in range(steps_per_piece):
                k1 = rhs(m, S, A, B, V, b)
                k2 = rhs(m + h / 2 * k1[0], S + h / 2 * k1[1], A, B, V, b)
                k3 = rhs(m + h / 2 * k2[0], S + h / 2 * k2[1], A, B, V, b)
                k4 = rhs(m + h * k3[0], S + h * k3[1], A, B, V, b)
                m = m + h / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
                S = S + h / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
        C = R1 @ S @ R1
        C = 0.5 * (C + C.T)
        if not bool(torch.all(torch.isfinite(C))):
            raise RuntimeError("non-finite state")
        ev = torch.clamp(torch.linalg.eigvalsh(C), min=0.0)
        return (torch.sum((m - m1t) ** 2) + torch.trace(S) + torch.trace(S1t)
                - 2 * torch.sum(torch.sqrt(ev + 1e-300)))

    hist = []
    rejected = [0]

    def fg(x):
        # A trial that blows up (non-finite state, eigh failure) returns NaN with a
        # zero gradient: scipy's L-BFGS-B then backtracks (a huge finite value made it stop).
        xt = torch.tensor(x, dtype=dt, requires_grad=True)
        try:
            loss = loss_of(xt)
            loss.backward()
            val, grad = float(loss.detach()), xt.grad.numpy().copy()
        except (RuntimeError, torch._C._LinAlgError):
            val, grad = float("nan"), None
        if not (np.isfinite(val) and np.all(np.isfinite(grad))):
            rejected[0] += 1
            val, grad = float("nan"), np.zeros_like(x)
        hist.append(val)
        return val, grad

    t0 = time.perf_counter()

    def callback(xk):
        if np.sqrt(max(hist[-1], 0.0)) < tol or time.perf_counter() - t0 > budget_s:
            raise StopIteration

    res = minimize(fg, np.zeros(sum(sizes.values())), jac=True, method="L-BFGS-B",  # noqa
                   callback=callback, options={"maxiter": max_iter, "ftol": 0.0, "gtol": 0.0})
    with torch.no_grad():
        w2 = float(np.sqrt(max(float(loss_of(torch.tensor(res.x, dtype=dt))), 0.0)))
    vals = {k: v.numpy().copy() for k, v in unpack(torch.tensor(res.x, dtype=dt)).items()}
    return vals, w2, int(res.nit), len(hist), rejected[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--dims", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--seeds", type=int, default=3, help="random targets per d")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--replot", action="store_true",
                   help="only redraw the PNG from benchmarks/runs/reach<tag>.json")
    args = setup(p, argv)
    if args.replot:
        import json

        from common import RESULTS

        plot(json.loads((RESULTS / f"reach{args.tag}.json").read_text()), args.tag)
        return

    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    from jaxdyn.control import ReachOptions, certificate, controlled_moments, random_target, reach
    from jaxdyn.distances import bures_w2
    from jaxdyn.gaussian import Control

    info = machine_info()  # at the start (load average before the runs)
    dims = [2, 4] if args.tiny else args.dims
    n_seeds = 1 if args.tiny else args.seeds

    def verified_w2(vals, m0, S0, m1, S1):
        ctr = {k: Control(jnp.asarray(v), T1) for k, v in vals.items()}
        sol = controlled_moments(ctr, m0, S0, t1=T1)
        return float(bures_w2(sol.mean_final, sol.cov_final, jnp.asarray(m1), jnp.asarray(S1)))

    schedules = {"lbfgs": 0, "adam20_lbfgs": 20}
    rows = []

    def result(rows):
        out = {"benchmark": "reach", "description": __doc__.split("\n\n")[0],
               "setup": {"t1": T1, "n_pieces": N_PIECES, "start": "N(0, I)", "init": "zero controls",
                         "targets": "random_target(seed, d), seeds 0..k-1", "tol": TOL,
                         "jaxdyn_solver": "fixed-step Dopri8 (2 steps a piece, halved while the "
                                          "embedded error estimate alone exceeds rtol 1e-9 / "
                                          "atol 1e-11), gradients through one lax.scan; host "
                                          "L-BFGS two-loop + Armijo",
                         "torch_solver": "RK4, 16 fixed steps a piece, float64, autograd; scipy L-BFGS-B",
                         "verification": "Dopri8 rtol 1e-11 (jaxdyn.control.controlled_moments)"},
               "rows": rows, "machine": info}
        if args.tiny:
            out["note"] = "--tiny: smoke test, numbers meaningless"
        return out

    for d in dims:
        cpu_d0, load0 = cpu_s(), os.getloadavg()
        m0, S0 = np.zeros(d), np.eye(d)
        targets = [random_target(s, d) for s in range(n_seeds)]
        row = {"d": d, "targets": n_seeds, "tol": TOL}
        for name, adam in schedules.items():
            kw = dict(t1=T1, n_pieces=N_PIECES,
                      options=ReachOptions(init="zero", adam_steps=adam, stop_factor=1.0, tol=TOL,
                                           verify=False, with_certificate=False))
            cold, cold_cpu = [], []
            for m1, S1 in targets:  # trace + compile + run (each new steps_per_piece compiles)
                t0, c0 = time.perf_counter(), cpu_s()
                reach(m0, S0, m1, S1, **kw)
                cold.append(time.perf_counter() - t0)
                cold_cpu.append(cpu_s() - c0)
            first, first_cpu = cold[0], cold_cpu[0]
            times, cpus, iters, w2s, w2v, rej, spp, refs = [], [], [], [], [], [], [], []
            bts, crs = [], []
            for m1, S1 in targets:
                t0, c0 = time.perf_counter(), cpu_s()
                res = reach(m0, S0, m1, S1, **kw)
                times.append(time.perf_counter() - t0)
                cpus.append(cpu_s() - c0)
                spp.append(res.steps_per_piece)
                refs.append(res.step_refinements)
                bts.append(res.stats["step_backtracks"])
                crs.append(res.stats["step_coarsenings"])
                iters.append(res.iterations)
                w2s.append(res.w2_optimizer)
                rej.append(res.rejected)
                w2v.append(verified_w2({k: c.values for k, c in res.controls.items()}, m0, S0, m1, S1))
            row[f"jaxdyn_{name}"] = {
                # the first schedule's first cold call compiles the loss at this d (shared by
                # both schedules); a later cold call compiles only a step count new to it
                "first_call_s": first, "first_call_cpu_s": first_cpu,
                "compile_s": max(first - times[0], 0.0),
                "cold_times_s": cold, "cold_cpu_times_s": cold_cpu,
                "cold_median_s": statistics.median(cold),
                "median_s": statistics.median(times), "times_s": times,
                "cpu_median_s": statistics.median(cpus), "cpu_times_s": cpus, "iterations": iters,
                "w2_optimizer": w2s, "w2_verified": w2v, "rejected_trials": rej,
                "steps_per_piece": spp, "step_refinements": refs,
                "step_backtracks": bts, "step_coarsenings": crs,
                "reached": sum(w < TOL for w in w2v)}
            print(f"d={d:2d} jaxdyn {name:13s}: cold {[fmt_s(t) for t in cold]}, warm median "
                  f"{fmt_s(statistics.median(times))}"
                  f" (CPU {fmt_s(statistics.median(cpus))}), iterations {iters}, steps a piece {spp}, "
                  f"W2 verified {['%.1e' % w for w in w2v]}", flush=True)
        # certificate
        ct, cw = [], []
        for m1, S1 in targets:
            certificate(m0, S0, m1, S1, t1=T1, n_pieces=N_PIECES, verify=False)  # warm
            t0 = time.perf_counter()
            c = certificate(m0, S0, m1, S1, t1=T1, n_pieces=N_PIECES, verify=False)
            ct.append(time.perf_counter() - t0)
            cw.append(verified_w2({k: v.values for k, v in c.controls().items()}, m0, S0, m1, S1))
        row["certificate"] = {"median_s": statistics.median(ct), "times_s": ct, "w2_verified": cw}
        print(f"d={d:2d} certificate       : median {fmt_s(statistics.median(ct))}, W2 verified "
              f"{['%.1e' % w for w in cw]}", flush=True)
        if not args.no_torch:
            import torch

            tt, tc, ti, tw, tv, trej = [], [], [], [], [], []
            for m1, S1 in targets:
                t0, c0 = time.perf_counter(), cpu_s()
                vals, w2, it, _, rej = torch_reach(m0, S0, m1, S1)
                trej.append(rej)
                tt.append(time.perf_counter() - t0)
                tc.append(cpu_s() - c0)
                ti.append(it)
                tw.append(w2)
                tv.append(verified_w2(vals, m0, S0, m1, S1))
            row["torch_scipy_lbfgsb"] = {"median_s": statistics.median(tt), "times_s": tt,
                                  "cpu_median_s": statistics.median(tc), "cpu_times_s": tc,
                                  "iterations": ti, "w2_own": tw, "w2_verified": tv,
                                  "reached": sum(w < TOL for w in tv),
                                  "rejected_trials": trej,
                                  "threads": torch.get_num_threads()}
            print(f"d={d:2d} torch+scipy L-BFGS-B: median {fmt_s(statistics.median(tt))}, iterations {ti},"
                  f" rejected {trej},"
                  f" W2 verified {['%.1e' % w for w in tv]}", flush=True)
            for name in schedules:
                row[f"ratio_torch_over_jaxdyn_{name}"] = (statistics.median(tt)
                                                          / row[f"jaxdyn_{name}"]["median_s"])
                row[f"cpu_ratio_torch_over_jaxdyn_{name}"] = (statistics.median(tc)
                                                              / row[f"jaxdyn_{name}"]["cpu_median_s"])
                row[f"ratio_torch_over_jaxdyn_{name}_cold"] = (statistics.median(tt)
                                                               / row[f"jaxdyn_{name}"]["cold_median_s"])
            print(f"d={d:2d} ratio torch/jaxdyn (median wall): "
                  + ", ".join(f"{n} {row[f'ratio_torch_over_jaxdyn_{n}']:.1f}x" for n in schedules)
                  + "; CPU: " + ", ".join(f"{n} {row[f'cpu_ratio_torch_over_jaxdyn_{n}']:.1f}x"
                                          for n in schedules), flush=True)
        row["cpu_s"] = cpu_s() - cpu_d0
        row["load"] = {"before": load0, "after": os.getloadavg()}
        print(f"d={d:2d} CPU {row['cpu_s']:.1f} s, load {load0[0]:.1f} -> {row['load']['after'][0]:.1f}",
              flush=True)
        rows.append(row)
        write_json("reach" + args.tag, result(rows))  # after every d: a partial run keeps its rows

    out = result(rows)

    if not args.no_plot:
        plot(out, args.tag)


def plot(out, tag=""):
    import numpy as np

    rows = out["rows"]
    pyplot = plt()
    fig, (a1, a2) = pyplot.subplots(1, 2, figsize=(11, 4.2))
    ds = [r["d"] for r in rows]
    methods = (("jaxdyn_lbfgs", "jaxdyn, L-BFGS", "o-", "C0"),
               ("jaxdyn_adam20_lbfgs", "jaxdyn, 20 Adam + L-BFGS", "s-", "C1"),
               ("torch_scipy_lbfgsb", "torch RK4 + scipy L-BFGS-B (baseline)", "^--", "C2"),
               ("certificate", "certificate (closed form, no optimisation)", ":", "k"))
    for key, lab, mk, c in methods:
        if key in rows[0]:
            a1.plot(ds, [r[key]["median_s"] for r in rows], mk, color=c, label=lab + " (warm)")
    a1.plot(ds, [r["jaxdyn_lbfgs"]["compile_s"] for r in rows], "x:", color="0.5",
            label="jaxdyn compilation (first call − warm)")
    a1.set_xscale("log", base=2)
    a1.set_yscale("log")
    a1.set_xlabel("d")
    a1.set_ylabel("seconds to W2 < 1e-4 (median over targets)")
    a1.set_title("time to reach a random Gaussian target")
    a1.grid(alpha=0.3)
    a1.legend(fontsize=7)
    for j, (key, lab, mk, c) in enumerate(methods):
        if key in rows[0]:
            for i, r in enumerate(rows):
                w = np.maximum(np.asarray(r[key]["w2_verified"], float), 1e-12)
                x = r["d"] * 2 ** (0.08 * (j - 1.5))  # small horizontal offsets per method
                a2.plot([x] * len(w), w, mk[0] if mk[0] != ":" else ".", color=c,
                        label=lab if i == 0 else None, alpha=0.8)
    a2.axhline(out["setup"]["tol"], color="r", ls="--", lw=0.8, label="tol")
    a2.set_xscale("log", base=2)
    a2.set_yscale("log")
    a2.set_xlabel("d")
    a2.set_ylabel("final W2, independent Dopri8 solve (0 drawn at 1e-12)")
    a2.set_title("accuracy reached")
    a2.grid(alpha=0.3)
    a2.legend(fontsize=7)
    fig.suptitle(f"reach: N(0, I) → random N(m1, S1), t1 = 1, {out['setup']['n_pieces']} pieces, "
                 f"all controls free, from zero controls ({out['machine']['backend']})")
    save_figure(fig, "reach" + tag)


if __name__ == "__main__":
    main()
