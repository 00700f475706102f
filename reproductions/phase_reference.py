"""rotf's phase diagram reproduced, and the step-size study of the two Euler steps.

1. **Reference.** The published loop (borjanG/2023-transformers-rotf; the script cannot be
   fetched here, so it is re-implemented independently in NumPy, float64):
   ``x ← normalise(x + h·softmax(β x xᵀ) x)``, d = 2, n = 32, Q = K = V = I, h = 0.1,
   t = 30, 16 β in [0.1, 9] × 512 systems, from the initial points jaxdyn's sphere kind uses
   (``jaxdyn.sample_sphere(PRNGKey(seed), 32, 2)``, seeds 0..511). jaxdyn's
   ``simulate_ensemble(method="euler_renormalise")`` runs the same systems; we compare the
   states (max |Δx|) and the per-β pair fractions (pairs i < j with ⟨x_i, x_j⟩ > 0.999) and
   Gram ranks (threshold 0.9999).
2. **Step-size study.** Pair fractions at t = 30 with the published step and with jaxdyn's
   projected Euler for h = 0.1, 0.05, 0.025, 0.0125, and with RK4 at h = 0.0125 (the flow):
   both Euler steps are first order (docs/math.md §F.4) and their difference shrinks with h.

Run: ``python reproductions/phase_reference.py`` (``--tiny``: a smoke test). Output:
reproductions/runs/phase_reference<tag>.json (ignored by git); with ``--record``, the tracked
reproductions/results/phase_reference<tag>.json that docs/reproductions.md quotes. The JSON's ``run``
holds the whole run's wall and CPU seconds and the machine (reproductions/common.py).
"""

from __future__ import annotations

import argparse
import sys
import time

from common import add_common_args, setup

P = argparse.ArgumentParser(description=__doc__.split("\n")[0])
P.add_argument("--betas", type=int, default=16)
P.add_argument("--systems", type=int, default=512)
P.add_argument("--n", type=int, default=32)
P.add_argument("--t1", type=float, default=30.0)
P.add_argument("--steps", default="0.1,0.05,0.025,0.0125", help="step sizes of the study")
add_common_args(P)


def numpy_published_loop(x, betas, h, steps):
    """x (S, n, d) float64, betas (S,): ``steps`` published steps, vectorised over systems."""
    import numpy as np

    b = np.asarray(betas, np.float64)[:, None, None]
    for _ in range(steps):
        logits = b * np.einsum("sid,sjd->sij", x, x)
        w = np.exp(logits - logits.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        x = x + h * np.einsum("sij,sjd->sid", w, x)
        x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    return x


def main(argv=None):
    args = setup(P, argv)
    if args.tiny:
        args.betas, args.systems, args.t1 = 3, 4, 3.0
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    import jaxdyn
    from jaxdyn import clusters
    from common import write_json

    betas = np.linspace(0.1, 9.0, args.betas)
    beta_s = np.repeat(betas, args.systems)
    seeds = np.tile(np.arange(args.systems), args.betas)
    x0 = jax.vmap(lambda k: jaxdyn.sample_sphere(k, args.n, 2, dtype=jnp.float64))(
        jnp.stack([jax.random.PRNGKey(int(s)) for s in seeds]))
    eye = np.eye(2)
    models = jaxdyn.stack_models([jaxdyn.SphereAttention(eye, eye, eye, float(b)) for b in beta_s])

    def per_beta(v):
        return np.asarray(v, float).reshape(args.betas, args.systems).mean(axis=1)

    def run(method, h):
        steps = round(args.t1 / h)
        t = time.perf_counter()
        xs = jaxdyn.simulate_ensemble(models, x0, t1=args.t1, dt=h, method=method,
                                      save_every=steps).xs[:, -1]
        xs.block_until_ready()
        return xs, time.perf_counter() - t

    out = {"betas": betas, "systems": args.systems, "n": args.n, "t1": args.t1}
    h = 0.1
    steps = round(args.t1 / h)
    t = time.perf_counter()
    ref = numpy_published_loop(np.asarray(x0), beta_s, h, steps)
    t_np = time.perf_counter() - t
    xs, t_jx = run("euler_renormalise", h)
    xs = np.asarray(xs)
    pf_ref = np.asarray(clusters.pair_fraction(ref, 0.999))
    pf_jx = np.asarray(clusters.pair_fraction(xs, 0.999))
    gr_ref = np.asarray(clusters.gram_rank(ref, 0.9999))
    gr_jx = np.asarray(clusters.gram_rank(xs, 0.9999))
    out["reference"] = {
        "max_abs_state_diff": float(np.max(np.abs(xs - ref))),
        "systems_with_different_pair_fraction": int(np.sum(pf_ref != pf_jx)),
        "systems_with_different_gram_rank": int(np.sum(gr_ref != gr_jx)),
        "pair_fraction_numpy": per_beta(pf_ref), "pair_fraction_jaxdyn": per_beta(pf_jx),
        "mean_gram_rank_numpy": per_beta(gr_ref), "mean_gram_rank_jaxdyn": per_beta(gr_jx),
        "seconds_numpy": t_np, "seconds_jaxdyn_with_compile": t_jx,
    }
    print(f"reference: max |Δx| = {out['reference']['max_abs_state_diff']:.3g}; systems with a "
          f"different pair fraction: {out['reference']['systems_with_different_pair_fraction']}, "
          f"Gram rank: {out['reference']['systems_with_different_gram_rank']} of {len(beta_s)}",
          flush=True)

    study = {}
    flow, _ = run("rk4", 0.0125)
    pf_flow = np.asarray(clusters.pair_fraction(flow, 0.999))
    study["rk4_h0.0125"] = per_beta(pf_flow)
    for hs in [float(v) for v in args.steps.split(",")]:
        row = {}
        for method in ("euler_renormalise", "euler"):
            x, _ = run(method, hs)
            pf = np.asarray(clusters.pair_fraction(x, 0.999))
            row[method] = per_beta(pf)
            row[f"{method}_max_abs_diff_vs_rk4"] = float(np.max(np.abs(per_beta(pf) - per_beta(pf_flow))))
        row["max_abs_diff_between_schemes"] = float(np.max(np.abs(row["euler_renormalise"] - row["euler"])))
        study[f"h{hs:g}"] = row
        print(f"h = {hs:g}: max_β |Δ pair fraction| published vs projected "
              f"{row['max_abs_diff_between_schemes']:.4f}; vs RK4(h=0.0125): published "
              f"{row['euler_renormalise_max_abs_diff_vs_rk4']:.4f}, projected "
              f"{row['euler_max_abs_diff_vs_rk4']:.4f}", flush=True)
    out["step_study"] = study
    write_json(f"phase_reference{args.tag}", out)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
