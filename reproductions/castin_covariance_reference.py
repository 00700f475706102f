"""castin's 2-D covariance experiments through jaxdyn.solve_moments_batch.

**The published ODE and scheme** (vcastin/2025-transformers-PDEs, ``utils.py`` and
``2d_plots.py``; read, not copied): the covariance of a Gaussian under softmax
self-attention,

    S' = V S A S + (V S A S)ᵀ,   A = KᵀQ/√d   (``rhs_trad``, d = 2),

integrated by explicit Euler followed by a projection onto the PSD cone (negative
eigenvalues set to 1e-14), ``evolution``: stop when ‖rhs(S)‖_F < tol_low ("converged"),
when trace(S) > tol_high = 1e3 ("diverged"), or after max_iter steps. In jaxdyn's
conventions (docs/math.md §F.5) this is the moment ODE Σ' = AΣ + ΣAᵀ + VΣBΣ + ΣBᵀΣVᵀ with
jaxdyn's A = 0, B = KᵀQ/√d (castin's A) and the same V, zero mean.

**The four softmax experiments** (parameters and random matrices regenerated with the
published seeds; the initial covariances are castin's ``init_grid``: trace-1 matrices
[[a, c], [c, b]] from a (u, w) grid inside the cone u² + w² < 1):

* ``zero``: seed 35, Q = rand(2, 2), K = −Q, V = WWᵀ (W = randn(2, 2)); 10 × 10 grid on
  [−0.5, 0.5]², h = 0.3, tol_low = 1e-5 — convergence to 0.
* ``line``: seed 36, Q = q (1 × 2 unit row), K = −q, V = I; 10 × 10 grid, h = 0.5,
  tol_low = 1e-4 — convergence to a rank-one limit on the line q⊥.
* ``blowup``: seed 33, first (Q, K) with A + Aᵀ positive definite, V = I; 40 × 40 grid on
  [−1, 1]², h = 0.01, max_iter = 10⁵, tol_low = 1e-4 — finite-time blow-up.
* ``mixed``: seed 36, first (Q, K) with A + Aᵀ indefinite, V = randn(2, 2) (seed 35 after
  an 8 × 7 draw); 30 × 30 grid on [−1, 1]², h = 0.003, tol_low = 1e-4 — convergence or
  blow-up depending on the initial covariance.

For each experiment: the published Euler (an independent vectorised NumPy transcription) and
jaxdyn (``solve_moments_batch``, rtol 1e-10) on the same initial covariances. jaxdyn's
verdict at the horizon T (the last time any Euler run was still going): ``blowup`` (status
BLOWUP, refined T*), ``converged`` (‖rhs(Σ(T))‖_F < tol_low), else ``running``; compared
member by member with Euler's verdict, with blow-up times and limits side by side. Then the
published Euler's error against jaxdyn's solution at a fixed time, for h, h/2, …, h/32 on one
member per experiment, with the fitted order.

Run: ``python reproductions/castin_covariance_reference.py`` (``--tiny``: a smoke test). Output:
reproductions/runs/castin_covariance<tag>.json and .png (ignored by git); with ``--record``, the tracked
reproductions/results/castin_covariance<tag>.json and .png that docs/reproductions.md quotes. The JSON's ``run``
holds the whole run's wall and CPU seconds and the machine (reproductions/common.py).
"""

from __future__ import annotations

import argparse
import sys
import time

from common import add_common_args, setup

P = argparse.ArgumentParser(description=__doc__.split("\n")[0])
P.add_argument("--levels", type=int, default=6, help="step sizes h, h/2, ... of the order study")
add_common_args(P)

TOL_HIGH = 1e3


def cone_grid(n_u, n_w, lim):
    """castin's init_grid with v = 1: trace-1 covariances [[a, c], [c, b]], a = (1 + u)/2,
    b = (1 − u)/2, c = w/2, for the (u, w) grid points with u² + w² < 1."""
    import numpy as np

    out = []
    for u in np.linspace(lim[0], lim[1], n_u):          # castin's meshgrid(...).T order:
        for w in np.linspace(lim[2], lim[3], n_w):      # u slowest, then w
            if 1.0 - u * u > w * w:
                out.append([[(u + 1.0) / 2, w / 2], [w / 2, (1.0 - u) / 2]])
    return np.array(out)


def experiments(tiny=False):
    """The four softmax set-ups of 2d_plots.py, regenerated from the published seeds."""
    import numpy as np

    def first(seed, ok):
        rs = np.random.RandomState(seed)
        for _ in range(1000):
            Q, K = rs.randn(2, 2), rs.randn(2, 2)
            ev = np.linalg.eigvalsh(K.T @ Q + (K.T @ Q).T)
            if ok(ev):
                return Q, K
        raise RuntimeError("no matrix pair found")

    ex = {}
    rs = np.random.RandomState(35)
    Q = rs.rand(2, 2)
    W = rs.randn(2, 2)
    ex["zero"] = dict(Q=Q, K=-Q, V=W @ W.T, grid=(10, 10, (-0.5, 0.5, -0.5, 0.5)), h=0.3,
                      tol_low=1e-5, max_iter=50000)
    rs = np.random.RandomState(36)
    q = rs.randn(1, 2)
    q = q / np.linalg.norm(q)
    ex["line"] = dict(Q=q, K=-q, V=np.eye(2), grid=(10, 10, (-0.5, 0.5, -0.5, 0.5)), h=0.5,
                      tol_low=1e-4, max_iter=50000)
    Q, K = first(33, lambda ev: ev[0] > 0)
    ex["blowup"] = dict(Q=Q, K=K, V=np.eye(2), grid=(40, 40, (-1, 1, -1, 1)), h=0.01,
                        tol_low=1e-4, max_iter=100000)
    Q, K = first(36, lambda ev: ev[0] * ev[1] < 0)
    rs = np.random.RandomState(35)
    rs.randn(8, 7)
    ex["mixed"] = dict(Q=Q, K=K, V=rs.randn(2, 2), grid=(30, 30, (-1, 1, -1, 1)), h=0.003,
                       tol_low=1e-4, max_iter=50000)
    for e in ex.values():
        e["B"] = e["K"].T @ e["Q"] / np.sqrt(2.0)       # castin's A = KᵀQ/√d, d = 2
        nu, nw, lim = e["grid"]
        if tiny:
            nu, nw = 4, 4
            e["max_iter"] = min(e["max_iter"], 2000)
        e["S0"] = cone_grid(nu, nw, lim)
    return ex


def rhs_castin(S, B, V):
    """S' = V S A S + transpose, batched over S (m, 2, 2); A = B (already /√d)."""
    import numpy as np

    r = V @ S @ B @ S
    return r + np.swapaxes(r, -1, -2)


def psd_project(S):
    import numpy as np

    w, U = np.linalg.eigh(S)
    w = np.where(w < 0, 1e-14, w)
    return (U * w[..., None, :]) @ np.swapaxes(U, -1, -2)


def published_euler(S0, B, V, h, tol_low, max_iter):
    """castin's ``evolution`` for a batch of initial covariances, each member stopping on its
    own criterion. Returns (verdict, iterations, final S, stop time): verdict "converged"
    (‖rhs‖ < tol_low: final S the last iterate before the update, as published), "diverged"
    (trace > 1e3 after the update) or "max_iter"."""
    import numpy as np

    S = np.array(S0, np.float64)
    m = len(S)
    verdict = np.array(["max_iter"] * m, dtype=object)
    iters = np.full(m, max_iter - 1)
    final = S.copy()
    active = np.ones(m, bool)
    for i in range(max_iter):
        idx = np.nonzero(active)[0]
        if idx.size == 0:
            break
        Si = S[idx]
        r = rhs_castin(Si, B, V)
        conv = np.linalg.norm(r, axis=(-1, -2)) < tol_low
        new = psd_project(Si + h * r)
        div = np.trace(new, axis1=-2, axis2=-1) > TOL_HIGH
        stop = conv | div
        final[idx[stop]] = Si[stop]
        iters[idx[stop]] = i
        verdict[idx[conv]] = "converged"
        verdict[idx[div & ~conv]] = "diverged"
        active[idx[stop]] = False
        S[idx] = new
    final[active] = S[active]
    return verdict, iters, final, iters * h


def euler_at(S0, B, V, h, steps):
    """The published step (Euler + PSD projection), ``steps`` times, no stopping rule."""
    import numpy as np

    S = np.array(S0, np.float64)[None]
    for _ in range(steps):
        S = psd_project(S + h * rhs_castin(S, B, V))
    return S[0]


def main(argv=None):
    args = setup(P, argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    import jaxdyn
    from jaxdyn import STATUS_NAMES, status_code
    from common import write_json

    ex = experiments(args.tiny)
    out = {"experiments": {}}
    for name, e in ex.items():
        t = time.perf_counter()
        verdict, iters, final, t_stop = published_euler(e["S0"], e["B"], e["V"], e["h"],
                                                        e["tol_low"], e["max_iter"])
        t_np = time.perf_counter() - t
        T = 2.0 * float(t_stop.max()) + e["h"]   # long enough: every Euler run has ended
        t = time.perf_counter()
        sol = jaxdyn.solve_moments_batch(None, e["S0"], A=np.zeros((2, 2)), B=e["B"], V=e["V"], t1=T)
        t_jx = time.perf_counter() - t
        status = np.asarray(sol.status)
        cov = np.asarray(sol.cov_final)
        blow = status == status_code("blowup")
        ok = status == status_code("successful")
        rn = np.linalg.norm(rhs_castin(cov, e["B"], e["V"]), axis=(-1, -2))
        jv = np.where(blow, "blowup", np.where(ok & (rn < e["tol_low"]), "converged", "running"))
        ev = np.where(verdict == "diverged", "blowup", verdict)
        agree = jv == ev
        r = {"h": e["h"], "tol_low": e["tol_low"], "members": len(e["S0"]), "horizon": T,
             "Q": e["Q"], "K": e["K"], "V": e["V"], "B_jaxdyn": e["B"],
             "euler_verdicts": {k: int(np.sum(ev == k)) for k in ("converged", "blowup", "max_iter")},
             "jaxdyn_verdicts": {k: int(np.sum(jv == k)) for k in ("converged", "blowup", "running")},
             "jaxdyn_status_counts": {STATUS_NAMES[int(s)]: int(np.sum(status == s))
                                      for s in np.unique(status)},
             "agree": int(agree.sum()), "disagree_members": np.nonzero(~agree)[0].tolist(),
             "seconds_numpy_euler": t_np, "seconds_jaxdyn": t_jx}
        both_blow = blow & (verdict == "diverged")
        if both_blow.any():
            tstar = np.asarray(sol.blowup_time)[both_blow]
            # Euler's divergence: trace > 1e3 after update number iters + 1
            te = (iters[both_blow] + 1) * e["h"]
            r["blowup_time_jaxdyn_range"] = [float(tstar.min()), float(tstar.max())]
            r["max_abs_euler_divergence_time_minus_Tstar"] = float(np.max(np.abs(te - tstar)))
        conv = (verdict == "converged") & (jv == "converged")
        if conv.any():
            r["max_trace_limit_euler"] = float(np.trace(final[conv], axis1=-2, axis2=-1).max())
            r["max_trace_limit_jaxdyn"] = float(np.trace(cov[conv], axis1=-2, axis2=-1).max())
            lam = np.linalg.eigvalsh(cov[conv])
            r["max_eig_ratio_jaxdyn"] = float(np.max(lam[:, 0] / lam[:, 1]))
            lam_e = np.linalg.eigvalsh(final[conv])
            r["max_eig_ratio_euler"] = float(np.max(lam_e[:, 0] / np.maximum(lam_e[:, 1], 1e-300)))
            if name == "line":
                qp = np.array([-e["Q"][0, 1], e["Q"][0, 0]])  # q⊥
                r["max_angle_to_q_perp_deg_jaxdyn"] = float(np.max(np.degrees(np.arccos(np.clip(
                    np.abs(np.einsum("mij,j->mi", cov[conv], qp) @ qp)
                    / np.linalg.norm(np.einsum("mij,j->mi", cov[conv], qp), axis=-1), 0, 1)))))
                # rank-one limits λ q⊥q⊥ᵀ: the published Euler's λ against jaxdyn's
                r["max_rel_limit_diff_euler_vs_jaxdyn"] = float(np.max(
                    np.abs(lam_e[:, 1] - lam[:, 1]) / lam[:, 1]))
        out["experiments"][name] = r
        print(f"{name}: {r['members']} initial covariances, Euler {r['euler_verdicts']}, jaxdyn "
              f"{r['jaxdyn_verdicts']} (T = {T:.4g}); agree on {r['agree']}; Euler {t_np:.1f} s, "
              f"jaxdyn {t_jx:.1f} s", flush=True)

    # Order study: the published Euler against jaxdyn's solution at a fixed time.
    study = {}
    for name, e in ex.items():
        r = out["experiments"][name]
        S0 = e["S0"][len(e["S0"]) // 3]
        one = published_euler(S0[None], e["B"], e["V"], e["h"], e["tol_low"], e["max_iter"])
        stop = float(one[3][0])
        steps0 = max(int(0.5 * stop / e["h"]), 4 if args.tiny else 20)
        T = steps0 * e["h"]
        ref = jaxdyn.solve_moments_batch(None, S0, A=np.zeros((2, 2)), B=e["B"], V=e["V"], t1=T)
        assert int(np.asarray(ref.status)[0]) == status_code("successful")
        Sref = np.asarray(ref.cov_final)[0]
        hs, errs = [], []
        for k in range(args.levels if not args.tiny else 3):
            hk = e["h"] / 2**k
            Sk = euler_at(S0, e["B"], e["V"], hk, steps0 * 2**k)
            hs.append(hk)
            errs.append(float(np.linalg.norm(Sk - Sref) / np.linalg.norm(Sref)))
        slope = float(np.polyfit(np.log(hs), np.log(errs), 1)[0])
        study[name] = {"S0": S0, "T": T, "h": hs, "rel_error": errs, "fitted_order": slope,
                       "euler_stop_time_of_this_member": stop}
        print(f"order study {name}: T = {T:.4g}, rel. error {errs[0]:.3g} (h = {hs[0]:g}) → "
              f"{errs[-1]:.3g} (h = {hs[-1]:g}), fitted order {slope:.3f}", flush=True)
    out["order_study"] = study
    write_json(f"castin_covariance{args.tag}", out)
    if not args.no_plot:
        plot(out, f"castin_covariance{args.tag}")
    return out


def plot(out, name):
    from common import plt, save_figure

    pyplot = plt()
    fig, ax = pyplot.subplots(1, 1, figsize=(6, 4.2))
    for k, s in out["order_study"].items():
        ax.loglog(s["h"], s["rel_error"], "o-",
                  label=f"{k} (T = {s['T']:.3g}): order {s['fitted_order']:.2f}")
    ax.set_xlabel("step h (published h, h/2, …)")
    ax.set_ylabel("‖S_Euler(T) − Σ_jaxdyn(T)‖_F / ‖Σ_jaxdyn(T)‖_F")
    ax.set_title("castin's projected Euler against solve_moments_batch", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, name)


if __name__ == "__main__":
    main(sys.argv[1:])
