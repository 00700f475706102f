"""tfdy's split experiment reproduced with jaxdyn (TimRoith/TransformerDynamics).

**What the published script integrates** (``exps/max_on_sphere_split.py``, with
``tfdy.optim_diracs.usa_flow``; read, not copied): d = 2, n = 100 particles, D = diag(dd, 1)
for 20 values dd = linspace(0, 1.5, 20), β = 1, τ = 0.1, 1500 steps, ``sgn = -1``,
``sigma = 0`` (no noise), float32 (torch's default), 100 runs per dd from fresh
``proj(randn(n, 2))`` clouds. One step is

    x_i ← normalise(x_i + (τ/n) Σ_j exp(β⟨x_i, D x_j⟩) D x_j),

i.e. unnormalised attention (USA, weights exp(·)/n) with B = QᵀK = D and V = D, explicit
Euler on the field *before* the tangent projection, then renormalisation: jaxdyn's
``SphereAttention(I, D, D, beta=1, normalization="unnormalized")`` with
``method="euler_renormalise"``, dt = τ, t1 = 1500 τ = 150 (docs/math.md §F.4, §F.5).

**How clusters are counted** (``cc_kmeans``): scipy's ``kmeans(x, 3)`` (best of 20 random
restarts; empty codes dropped), then, with k centres left, s = (ordered pairs of centres
farther apart than 0.1) // (k − 1) (s = 1 when k = 1) and cc = max(s − 1, 0): cc = 0 is one
cluster, cc = 1 two. The published table ``exps/results/split_eval/CC.txt`` holds, per dd,
the number of runs (out of 100) with cc = 0, 1, 2; ``Es.txt`` the mean final energy
E = (1/n²) Σ_ij exp(⟨x_i, D x_j⟩) (= 2β E_β of jaxdyn.clusters.interaction_energy).

We run the same 20 × 100 systems (jaxdyn's initial clouds ``sample_sphere(PRNGKey(s), n, 2)``,
s = 0..1999: the same law, not the same draws) and count clusters twice: with the same
kmeans rule (an independent re-implementation on scipy's kmeans) and with
``jaxdyn.clusters.cluster_count`` at δ = 0.005 (components of ⟨x_i, x_j⟩ > 1 − δ; a chord
of 0.1, kmeans' threshold). The single-cluster fraction p̂ per dd carries the binomial
standard error sqrt(p̂(1 − p̂)/100); ours and the published one are compared by the
two-proportion z-score.

Run: ``python reproductions/tfdy_split_reference.py`` (``--tiny``: a smoke test). Output:
reproductions/runs/tfdy_split<tag>.json and .png (ignored by git); with ``--record``, the tracked
reproductions/results/tfdy_split<tag>.json and .png that docs/reproductions.md quotes. The JSON's ``run``
holds the whole run's wall and CPU seconds and the machine (reproductions/common.py).
"""

from __future__ import annotations

import argparse
import sys
import time

from common import add_common_args, setup

# Published numbers (exps/results/split_eval of TimRoith/TransformerDynamics): runs out of 100
# with one cluster (cc = 0), CC.txt's second column, and the mean final energy, Es.txt.
PUBLISHED_SINGLE = [0, 1, 0, 1, 2, 2, 5, 8, 16, 50, 100, 100, 100, 100, 100, 100, 45, 6, 3, 1]
PUBLISHED_TWO = [100, 99, 100, 99, 98, 98, 95, 92, 84, 50, 0, 0, 0, 0, 0, 0, 55, 94, 97, 99]
PUBLISHED_ENERGY = [1.618811, 1.618740, 1.601089, 1.620649, 1.615295, 1.619154, 1.663891,
                    1.689285, 1.775320, 2.143901, 2.713120, 2.718281, 2.718281, 2.790767,
                    3.020019, 3.268106, 2.671755, 2.231255, 2.329786, 2.471794]
PUBLISHED_REPS = 100

P = argparse.ArgumentParser(description=__doc__.split("\n")[0])
P.add_argument("--runs", type=int, default=100, help="runs per dd (published: 100)")
P.add_argument("--num-ds", type=int, default=20)
P.add_argument("--n", type=int, default=100)
P.add_argument("--steps", type=int, default=1500)
P.add_argument("--tau", type=float, default=0.1)
P.add_argument("--beta", type=float, default=1.0)
P.add_argument("--dtype", default="float32", choices=("float32", "float64"),
               help="float32 as published (torch's default)")
P.add_argument("--delta", type=float, default=0.005, help="cluster_count's δ")
add_common_args(P)


def kmeans_count(x, rng):
    """tfdy's cc_kmeans rule on one final cloud x (n, 2): 0 = one cluster, 1 = two, 2 = three."""
    import numpy as np
    from scipy.cluster.vq import kmeans

    centres, _ = kmeans(np.asarray(x, np.float64), 3, seed=rng)
    k = centres.shape[0]
    if k == 1:
        return 0
    far = np.linalg.norm(centres[:, None, :] - centres[None, :, :], axis=-1) > 0.1
    return max(int(far.sum()) // (k - 1) - 1, 0)


def binomial_se(p, reps):
    import numpy as np

    return np.sqrt(p * (1.0 - p) / reps)


def two_proportion_z(p1, n1, p2, n2):
    import numpy as np

    pool = (p1 * n1 + p2 * n2) / (n1 + n2)
    se = np.sqrt(pool * (1.0 - pool) * (1.0 / n1 + 1.0 / n2))
    return np.where(se > 0, (p1 - p2) / np.where(se > 0, se, 1.0), 0.0)


def main(argv=None):
    args = setup(P, argv)
    if args.tiny:
        args.runs, args.num_ds, args.n, args.steps = 4, 3, 16, 50
    import jax

    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    import jaxdyn
    from jaxdyn import clusters
    from common import write_json

    dtype = jnp.float64 if args.dtype == "float64" else jnp.float32
    ds = np.linspace(0.0, 1.5, args.num_ds)
    nsys = args.num_ds * args.runs
    x0 = jax.vmap(lambda k: jaxdyn.sample_sphere(k, args.n, 2, dtype=dtype))(
        jax.vmap(jax.random.PRNGKey)(jnp.arange(nsys)))
    eye = np.eye(2)
    Ds = [np.diag([dd, 1.0]) for dd in ds]
    per_dd = jaxdyn.stack_models([
        jaxdyn.SphereAttention(jnp.asarray(eye, dtype), jnp.asarray(D, dtype),
                               jnp.asarray(D, dtype), args.beta, normalization="unnormalized")
        for D in Ds])
    # each dd's model repeated for its runs (one stack of num_ds, not of num_ds × runs, models)
    models = jax.tree.map(lambda a: jnp.repeat(a, args.runs, axis=0), per_dd)
    t1 = args.steps * args.tau
    print(f"tfdy split: {args.num_ds} dd × {args.runs} runs × n = {args.n}, {args.steps} steps "
          f"of τ = {args.tau} ({args.dtype})", flush=True)
    t = time.perf_counter()
    traj = jaxdyn.simulate_ensemble(models, x0, t1=t1, dt=args.tau, method="euler_renormalise",
                                    save_every=args.steps)
    xs = np.asarray(traj.xs[:, -1], np.float64).reshape(args.num_ds, args.runs, args.n, 2)
    seconds = time.perf_counter() - t
    print(f"  integrated in {seconds:.1f} s (with compilation); all finite: "
          f"{bool(np.all(np.asarray(traj.ok)))}", flush=True)

    rng = np.random.default_rng(0)
    cc = np.array([[kmeans_count(x, rng) for x in row] for row in xs])
    comp = np.asarray(clusters.cluster_count(jnp.asarray(xs), args.delta))
    energy = np.stack([2.0 * args.beta * np.asarray(
        clusters.interaction_energy(jnp.asarray(xs[i]), args.beta, B=jnp.asarray(Ds[i])))
        for i in range(args.num_ds)])
    g = np.abs(np.einsum("sria,srja->srij", xs, xs))
    pmin = g.min(axis=(-1, -2))

    p_ours = (cc == 0).mean(axis=1)
    p_comp = (comp == 1).mean(axis=1)
    out = {
        "workload": {k: getattr(args, k) for k in ("runs", "num_ds", "n", "steps", "tau", "beta",
                                                   "dtype", "delta")},
        "dd": ds, "seconds_with_compile": seconds,
        "single_fraction_kmeans": p_ours, "single_se_kmeans": binomial_se(p_ours, args.runs),
        "two_fraction_kmeans": (cc == 1).mean(axis=1), "three_fraction_kmeans": (cc == 2).mean(axis=1),
        "single_fraction_components": p_comp,
        "count_agreement_kmeans_vs_components": float(np.mean((cc + 1) == comp)),
        "mean_energy": energy.mean(axis=1), "single_dirac_energy": np.exp(np.maximum(ds, 1.0)),
        "fraction_antipodal_min_abs_inner_gt_0.999": (pmin > 0.999).mean(axis=1),
    }
    if args.num_ds == 20 and not args.tiny:
        p_pub = np.asarray(PUBLISHED_SINGLE, float) / PUBLISHED_REPS
        z = two_proportion_z(p_ours, args.runs, p_pub, PUBLISHED_REPS)
        out["published"] = {
            "single_fraction": p_pub, "single_se": binomial_se(p_pub, PUBLISHED_REPS),
            "two_fraction": np.asarray(PUBLISHED_TWO, float) / PUBLISHED_REPS,
            "mean_energy": np.asarray(PUBLISHED_ENERGY)}
        out["z_single_fraction"] = z
        out["max_abs_z"] = float(np.max(np.abs(z)))
        out["dd_with_abs_z_gt_2"] = [float(v) for v in ds[np.abs(z) > 2]]
        out["max_abs_energy_diff"] = float(np.max(np.abs(out["mean_energy"] - out["published"]["mean_energy"])))
    for i, dd in enumerate(ds):
        pub = (f" | published {PUBLISHED_SINGLE[i] / 100:.2f}, z = {out['z_single_fraction'][i]:+.2f}"
               if "published" in out else "")
        print(f"  dd = {dd:.3f}: one cluster {p_ours[i]:.2f} ± {out['single_se_kmeans'][i]:.2f} "
              f"(components {p_comp[i]:.2f}), E = {out['mean_energy'][i]:.4f}{pub}", flush=True)
    write_json(f"tfdy_split{args.tag}", out)
    if not args.no_plot:
        plot(out, f"tfdy_split{args.tag}")
    return out


def plot(out, name):
    import numpy as np

    from common import plt, save_figure

    pyplot = plt()
    fig, (a1, a2) = pyplot.subplots(1, 2, figsize=(11, 4))
    ds = np.asarray(out["dd"])
    w = out["workload"]
    a1.errorbar(ds, out["single_fraction_kmeans"], yerr=out["single_se_kmeans"], marker="o",
                capsize=3, label=f"jaxdyn, kmeans count ({w['runs']} runs, ±1 s.e.)")
    a1.plot(ds, out["single_fraction_components"], "x", label=f"jaxdyn, components (δ = {w['delta']})")
    if "published" in out:
        pub = out["published"]
        a1.errorbar(ds + 0.01, pub["single_fraction"], yerr=pub["single_se"], marker="s",
                    capsize=3, alpha=0.8, label="published (split_eval/CC.txt, ±1 s.e.)")
        a2.plot(ds, pub["mean_energy"], "s-", alpha=0.8, label="published (Es.txt)")
    a1.set_xlabel("dd  (D = diag(dd, 1))")
    a1.set_ylabel("fraction of runs ending in one cluster")
    a1.set_title(f"tfdy split: n = {w['n']}, τ = {w['tau']}, {w['steps']} steps, USA, β = {w['beta']}",
                 fontsize=9)
    a1.legend(fontsize=8)
    a2.plot(ds, out["mean_energy"], "o-", label="jaxdyn")
    a2.plot(ds, out["single_dirac_energy"], "k--", lw=0.8, label="one Dirac at the top eigenvector")
    a2.set_xlabel("dd")
    a2.set_ylabel("mean final energy (1/n²) Σ exp(⟨x_i, D x_j⟩)")
    a2.legend(fontsize=8)
    save_figure(fig, name)


if __name__ == "__main__":
    main(sys.argv[1:])
