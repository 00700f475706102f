"""Batched Gaussian moment solves with blow-ups: jaxdyn vs a per-set scipy loop vs Euler+PSD.

Workload: 4096 random parameter sets, d = 3, entries of A, B, V, b, m0 drawn
0.3·N(0, 1) (numpy default_rng(seed), in that order), S0 = 2 I, t1 = 1. With S0 = 2 I about
12 % of the sets blow up before t1 (S0 = I gives ~2 %).

Methods (same process, float64):
  * jaxdyn   ``solve_moments_batch`` (lock-step Dopri8 with compaction + Rodas5 for stiff
             members); compile time measured separately (first call), then the median of
             ``--repeats`` calls.
  * scipy    a per-set ``solve_ivp`` loop, DOP853, rtol 1e-8, atol 1e-10, with a terminal
             event at the same ‖Σ‖ threshold; the same pole test and the same T*
             refinement (projective system in τ, integrated by DOP853 at the same
             tolerances) as jaxdyn, so only the integrators and their driving differ.
  * euler    explicit Euler with PSD projection (eigenvalues clipped at 0 each step: the
             published covariance code's method), numpy, vectorised over the batch, at two
             step sizes; blow-up when ‖Σ‖ passes the threshold (T* = that step's time).
Reference: scipy DOP853 per set at rtol 1e-13, atol 1e-15 (the same event/refinement).

Errors, per method, against the reference: on members OK in both, the relative error of
the final Σ (max |ΔΣ| / max |Σ_ref|), split into members jaxdyn found non-stiff / stiff;
on members BLOWUP in both, |ΔT*| / T*; and the status confusion counts.

Writes benchmarks/runs/moments_batch.json and moments_batch.png.
Run: python benchmarks/bench_moments.py [--n 4096] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

from scipy.integrate import solve_ivp  # noqa: E402

from jaxdyn import status_code  # noqa: E402
from jaxdyn.gaussian import (  # noqa: E402
    DOMINANCE,
    POLE_FRACTION,
    solve_moments_batch,
)

#: the statuses a moment solve ends with
STATUSES = ("successful", "blowup", "large", "nonfinite", "max_steps_reached", "invalid_input",
            "stiff")

# where a run writes (ignored by git; ``python -m benchmarks run`` passes ``--out``)
RESULTS = Path(os.environ.get("JAXDYN_BENCH_RESULTS") or Path(__file__).resolve().parent / "runs")
D = 3


def workload(n, seed):
    rng = np.random.default_rng(seed)
    A, B, V = (0.3 * rng.standard_normal((n, D, D)) for _ in range(3))
    b = 0.3 * rng.standard_normal((n, D))
    m0 = 0.3 * rng.standard_normal((n, D))
    S0 = 2.0 * np.eye(D)
    return A, B, V, b, m0, S0


def _pole_and_tstar(t, S, A, B, V, rtol, atol):
    """The jaxdyn blow-up rule with scipy: the pole test at detection, then the projective
    system in τ (dt/dτ = 1/‖Σ‖, w = log(1/‖Σ‖)) integrated by DOP853 until the remaining
    time u/g is below 8 eps max(t, 1): (is_pole, T*)."""
    s = np.linalg.norm(S)
    Sh = S / s
    ell = 2.0 * np.sum(Sh * (A @ Sh))
    q = 2.0 * np.sum(Sh * (V @ Sh @ B @ Sh))
    vb = np.linalg.norm(V @ Sh) * np.linalg.norm(B @ Sh)  # jaxdyn.gaussian.pole_scale
    pole = q > 0 and q * s >= DOMINANCE * abs(ell) and q >= POLE_FRACTION * vb
    if not pole:
        return False, np.inf
    eps = np.finfo(float).eps

    def rates(z):
        Sh, w = z[1:1 + D * D].reshape(D, D), z[-1]
        u = np.exp(w)
        L = A @ Sh
        L = L + L.T
        G = V @ Sh @ B @ Sh
        Q = G + G.T
        return L, Q, np.sum(Sh * (u * L + Q)) / np.sum(Sh * Sh), u, Sh

    def f(tau, z):
        L, Q, g, u, Sh = rates(z)
        return np.concatenate([[u], (u * L + Q - g * Sh).ravel(), [-g]])

    def done(tau, z):
        _, _, g, u, _ = rates(z)
        return u - 8 * eps * max(abs(z[0]), 1.0) * max(g, 0.0)

    z0 = np.concatenate([[t], Sh.ravel(), [-np.log(s)]])
    done.terminal = True
    r = solve_ivp(f, (0.0, 1e4), z0, method="DOP853", rtol=rtol, atol=atol, events=done)
    z = r.y[:, -1]
    L, Q, g, u, Sh = rates(z)
    if r.status != 1 or g <= 0:  # no convergence by τ = 1e4: the flow left the pole
        return False, np.inf
    n2 = np.sum(Sh * Sh)
    ell, q = np.sum(Sh * L) / n2, np.sum(Sh * Q) / n2 ** 1.5
    x = ell * u / (q * np.sqrt(n2))
    ratio = np.log1p(x) / x if abs(x) > 1e-8 else 1.0 - x / 2
    return True, z[0] + ratio * u / (q * np.sqrt(n2))


def scipy_loop(A, B, V, b, m0, S0, t1, thr, rtol, atol, label=""):
    n = A.shape[0]

    def rhs(t, y, A, B, V, b):
        m, S = y[:D], y[D:].reshape(D, D)
        SB = S @ B
        G = (A + V @ SB) @ S
        return np.concatenate([(A + V) @ m + V @ (SB @ m) + b, (G + G.T).ravel()])

    def event(t, y, *args):
        return np.linalg.norm(y[D:]) - thr

    event.terminal = True
    status = np.zeros(n, np.int32)
    tstar = np.full(n, np.inf)
    tfin = np.zeros(n)
    cov = np.zeros((n, D, D))
    per = np.zeros(n)
    t0 = time.perf_counter()
    for i in range(n):
        ti = time.perf_counter()
        y0 = np.concatenate([m0[i], S0.ravel()])
        sol = solve_ivp(rhs, (0.0, t1), y0, method="DOP853", rtol=rtol, atol=atol, events=event,
                        args=(A[i], B[i], V[i], b[i]))
        S = sol.y[D:, -1].reshape(D, D)
        tfin[i], cov[i] = sol.t[-1], 0.5 * (S + S.T)
        if sol.status == 1:
            pole, T = _pole_and_tstar(sol.t[-1], S, A[i], B[i], V[i], rtol, atol)
            status[i] = status_code("blowup") if pole else status_code("large")
            tstar[i] = T
        elif sol.status == 0:
            status[i] = status_code("successful")
        else:
            status[i] = status_code("nonfinite")
        per[i] = time.perf_counter() - ti
        if label and (i + 1) % 512 == 0:
            print(f"  {label}: {i + 1}/{n} sets, {time.perf_counter() - t0:.1f} s", flush=True)
    return dict(status=status, blowup_time=tstar, t_final=tfin, cov=cov,
                seconds=time.perf_counter() - t0, per_set=per)


def euler_psd(A, B, V, b, m0, S0, t1, thr, dt):
    """Explicit Euler with PSD projection, vectorised over the batch (numpy)."""
    n = A.shape[0]
    t0 = time.perf_counter()
    S = np.broadcast_to(S0, (n, D, D)).copy()
    m = m0.copy()
    status = np.full(n, -1, np.int32)
    tstar = np.full(n, np.inf)
    nsteps = int(round(t1 / dt))
    act = np.arange(n)
    for k in range(nsteps):
        Sa, ma = S[act], m[act]
        Aa, Ba, Va, ba = A[act], B[act], V[act], b[act]
        SB = Sa @ Ba
        G = (Aa + Va @ SB) @ Sa
        dS = G + np.swapaxes(G, 1, 2)
        dm = ((Aa + Va) @ ma[..., None])[..., 0] + (Va @ (SB @ ma[..., None]))[..., 0] + ba
        Sn = Sa + dt * dS
        w, U = np.linalg.eigh(0.5 * (Sn + np.swapaxes(Sn, 1, 2)))
        Sn = (U * np.clip(w, 0.0, None)[:, None, :]) @ np.swapaxes(U, 1, 2)
        S[act], m[act] = Sn, ma + dt * dm
        big = ~(np.linalg.norm(Sn, axis=(1, 2)) < thr)
        if big.any():
            status[act[big]] = status_code("blowup")
            tstar[act[big]] = (k + 1) * dt
            act = act[~big]
        if act.size == 0:
            break
    status[status == -1] = status_code("successful")
    return dict(status=status, blowup_time=tstar, cov=S, seconds=time.perf_counter() - t0)


def errors(method, ref, stiff):
    st, rs = method["status"], ref["status"]
    ok = (st == status_code("successful")) & (rs == status_code("successful"))
    bu = (st == status_code("blowup")) & (rs == status_code("blowup"))
    rel = (np.abs(method["cov"] - ref["cov"]).max(axis=(1, 2))
           / np.abs(ref["cov"]).max(axis=(1, 2)))
    tre = np.abs(method["blowup_time"] - ref["blowup_time"]) / ref["blowup_time"]

    def stats(x):
        return dict(n=int(x.size), max=float(x.max()) if x.size else None,
                    median=float(np.median(x)) if x.size else None)

    names = {status_code(s): s for s in STATUSES}
    conf = {}
    for a in np.unique(rs):
        for c in np.unique(st):
            k = int(np.sum((rs == a) & (st == c)))
            if k:
                conf[f"{names.get(int(a), a)}->{names.get(int(c), c)}"] = k
    return dict(cov_rel_nonstiff=stats(rel[ok & ~stiff]), cov_rel_stiff=stats(rel[ok & stiff]),
                tstar_rel=stats(tre[bu]), status_ref_to_method=conf)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--t1", type=float, default=1.0)
    ap.add_argument("--threshold", type=float, default=1e6)
    ap.add_argument("--rtol", type=float, default=1e-10, help="jaxdyn rtol (atol = rtol/100)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--euler-dt", type=float, nargs="*", default=[1e-3, 1e-4])
    ap.add_argument("--quick", action="store_true", help="n = 256, one repeat (smoke test)")
    ap.add_argument("--out", default=str(RESULTS / "moments_batch"))
    args = ap.parse_args()
    if args.quick:
        args.n, args.repeats = 256, 1
    load0 = os.getloadavg()
    A, B, V, b, m0, S0 = workload(args.n, args.seed)
    thr = args.threshold * max(np.linalg.norm(S0), 1.0)
    t1 = args.t1
    print(f"workload: n={args.n}, d={D}, seed={args.seed}, S0=2I, t1={t1}, threshold={thr:.3g}")

    # jaxdyn
    kw = dict(A=A, B=B, V=V, b=b, t1=t1, rtol=args.rtol, atol=args.rtol / 100,
              blowup_threshold=args.threshold)
    tc = time.perf_counter()
    sol = solve_moments_batch(m0, S0, **kw)
    first = time.perf_counter() - tc
    times = []
    for _ in range(args.repeats):
        tc = time.perf_counter()
        sol = solve_moments_batch(m0, S0, **kw)
        times.append(time.perf_counter() - tc)
    jx = dict(status=np.asarray(sol.status), blowup_time=np.asarray(sol.blowup_time),
              cov=np.asarray(sol.cov_final), seconds=float(np.median(times)))
    stiff = np.asarray(sol.stiff)
    print(f"jaxdyn: first call {first:.2f} s (compile + run), median {jx['seconds']:.3f} s "
          f"over {args.repeats}: {sol.counts()}; stiff-stage members {int(stiff.sum())}")
    st = {k: np.asarray(v) for k, v in sol.stats.items()}
    rounds = [(int(a), int(b), round(float(c), 3)) for a, b, c in
              zip(st["round_sizes"], st["round_iterations"], st["round_seconds"])]
    print(f"  rounds (size, iterations, s): {rounds}, "
          f"stiff stage {int(st['stiff_iterations'])} it, {float(st['stiff_seconds']):.3f} s")

    print("scipy DOP853 loop (rtol 1e-8) ...", flush=True)
    sp = scipy_loop(A, B, V, b, m0, S0, t1, thr, 1e-8, 1e-10, label="scipy")
    print(f"scipy loop: {sp['seconds']:.2f} s")
    print("reference: scipy DOP853 loop (rtol 1e-13) ...", flush=True)
    ref = scipy_loop(A, B, V, b, m0, S0, t1, thr, 1e-13, 1e-15, label="reference")
    print(f"reference loop: {ref['seconds']:.2f} s")
    eul = {}
    for dt in args.euler_dt:
        eul[dt] = euler_psd(A, B, V, b, m0, S0, t1, thr, dt)
        print(f"euler+PSD dt={dt:g}: {eul[dt]['seconds']:.2f} s")

    res = dict(
        workload=dict(n=args.n, d=D, seed=args.seed, entries="0.3*N(0,1) for A,B,V,b,m0",
                      S0="2*I", t1=t1, threshold_norm=thr, dtype="float64"),
        machine=dict(platform=platform.platform(), python=sys.version.split()[0],
                     jax=jax.__version__, cpu_count=os.cpu_count(), loadavg_start=load0,
                     loadavg_end=os.getloadavg()),
        reference=dict(method="scipy DOP853 per set", rtol=1e-13, atol=1e-15,
                       seconds=ref["seconds"], counts={s: int(np.sum(ref["status"] == status_code(s)))
                                                       for s in STATUSES}),
        methods={},
    )
    res["methods"]["jaxdyn"] = dict(
        method="solve_moments_batch (lock-step Dopri8 + compaction, Rodas5 stiff stage)",
        rtol=args.rtol, atol=args.rtol / 100, seconds_median=jx["seconds"], seconds_all=times,
        first_call_seconds=first, counts=sol.counts(), stiff_members=int(stiff.sum()),
        explicit_iterations=int(st["explicit_iterations"]), stiff_iterations=int(st["stiff_iterations"]),
        rounds=[list(r) for r in rounds], errors=errors(jx, ref, stiff))
    res["methods"]["scipy_dop853"] = dict(
        method="scipy solve_ivp DOP853 loop, terminal event at the threshold", rtol=1e-8,
        atol=1e-10, seconds=sp["seconds"], slowest_sets=[(int(i), float(sp["per_set"][i]))
                                                        for i in np.argsort(-sp["per_set"])[:10]],
        counts={s: int(np.sum(sp["status"] == status_code(s))) for s in STATUSES},
        errors=errors(sp, ref, stiff), speedup_of_jaxdyn=sp["seconds"] / jx["seconds"])
    for dt, e in eul.items():
        res["methods"][f"euler_psd_dt{dt:g}"] = dict(
            method="explicit Euler + PSD projection (numpy, vectorised)", dt=dt,
            seconds=e["seconds"], counts={s: int(np.sum(e["status"] == status_code(s)))
                                          for s in STATUSES},
            errors=errors(e, ref, stiff), speedup_of_jaxdyn=e["seconds"] / jx["seconds"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2, default=float))
    print(json.dumps({k: dict(seconds=v.get("seconds", v.get("seconds_median")),
                              errors={kk: vv for kk, vv in v["errors"].items()
                                      if kk != "status_ref_to_method"})
                      for k, v in res["methods"].items()}, indent=1, default=float))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["methods"])
    secs = [res["methods"][k].get("seconds", res["methods"][k].get("seconds_median")) for k in names]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    ax[0].barh(names, secs, color=["C0", "C1"] + ["C2"] * (len(names) - 2))
    ax[0].set_xscale("log")
    ax[0].set_xlabel("wall time [s] (median for jaxdyn)")
    for i, s_ in enumerate(secs):
        ax[0].text(s_, i, f" {s_:.3g} s", va="center")
    ax[0].set_title(f"{args.n} sets, d=3, t1={t1}")
    ok_mask = lambda m: (m["status"] == status_code("successful")) & (ref["status"] == status_code("successful"))  # noqa: E731
    bu_mask = lambda m: (m["status"] == status_code("blowup")) & (ref["status"] == status_code("blowup"))  # noqa: E731
    allm = [("jaxdyn", jx), ("scipy_dop853", sp)] + [(f"euler_psd_dt{dt:g}", e) for dt, e in eul.items()]
    for k, (name, m) in enumerate(allm):
        okm = ok_mask(m)
        rel = np.abs(m["cov"] - ref["cov"]).max(axis=(1, 2)) / np.abs(ref["cov"]).max(axis=(1, 2))
        ax[1].scatter(np.full(okm.sum(), k) + 0.15 * np.random.default_rng(k).standard_normal(okm.sum()),
                      np.maximum(rel[okm], 1e-17), s=2, alpha=0.4)
        bum = bu_mask(m)
        tre = np.abs(m["blowup_time"] - ref["blowup_time"]) / ref["blowup_time"]
        ax[2].scatter(np.full(bum.sum(), k) + 0.15 * np.random.default_rng(k).standard_normal(bum.sum()),
                      np.maximum(tre[bum], 1e-17), s=2, alpha=0.4)
    for a_, ttl in ((ax[1], "final Σ rel. error (OK members)"), (ax[2], "T* rel. error (blow-up members)")):
        a_.set_yscale("log")
        a_.set_xticks(range(len(allm)), [nm for nm, _ in allm], rotation=20, fontsize=8)
        a_.set_title(ttl)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
