"""Benchmark: a causal blocked attention pass against a full one; variants vs sphere kernel.

:class:`jaxdyn.MultiHeadAttention` and :class:`jaxdyn.SphereAttention` run on one
online-softmax core (``jaxdyn/kernels/_online.py``): with one head, no mask and softmax
weights the two fields should cost the same. Under a causal mask the CPU kernel visits, for
each query block, the key blocks wholly before its first query (unmasked), then, by
sub-blocks of as many rows as a key block, the key blocks up to each sub-block's diagonal
(those across it masked), in loops whose trip counts are the block's own; so a causal pass
should cost about half a full pass: with key blocks of k, the rows of the sub-block s
(k rows) meet s + 1 of N / k key blocks, a fraction (1 + k/N)/2 of the (row, key block)
pairs (``key_blocks_visited_fraction``; plus the masking's select on the diagonal blocks).

For each N, in one invocation and in interleaved rounds (``common.interleaved``: the first
call, compilation included, timed apart; medians of ``--reps`` rounds, wall and process CPU;
each timed sample makes ``--inner`` calls, 16384 // N by default, and the times are per call):

- ``full``: ``MultiHeadAttention(..., kernel="blocked")`` field, H = ``--heads``, no mask;
- ``causal``: the same with ``mask="causal"``;
- ``sphere_attention``: ``SphereAttention(..., kernel="blocked")``, the single-head kernel;
- ``full_auto`` and ``sphere_attention_auto``: both with ``kernel="auto"``.

d = 3, float32, β = 9, Q = K = V = I (``--weights random``: Gaussian Q, K, V), jitted; block
sizes ``--k-block`` / ``--q-block`` (default: the kernels' own, per platform and mask).
Reports the ratios causal / full and full / sphere_attention (wall and CPU). Writes
``benchmarks/results/causal.json`` and ``.png`` (``python -m benchmarks run causal``:
``benchmarks/results/causal/<machine>.json``).

    python benchmarks/bench_causal.py            # N = 4096, 16384
    python benchmarks/bench_causal.py --tiny
"""

from __future__ import annotations

import argparse

from common import add_common_args, fmt_s, interleaved, machine_info, plt, save_figure, setup, \
    write_json


def main(argv=None):
    """Run the benchmark (module doc) and write its JSON and figure."""
    p = add_common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--k-block", type=int, default=None)
    p.add_argument("--q-block", type=int, default=None)
    p.add_argument("--weights", choices=("identity", "random"), default="identity")
    p.add_argument("--inner", type=int, default=None,
                   help="calls per timed sample (default: 16384 // N, at least 1); the "
                        "times reported are per call")
    p.add_argument("--name", default="causal")
    args = setup(p, argv)

    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxdyn as jd
    import jaxdyn.kernels
    from jaxdyn.kernels import CAUSAL_LARGE_N, CAUSAL_Q_BLOCK

    sizes = [256, 512] if args.tiny else args.sizes
    reps = args.reps or (2 if args.tiny else 7)
    d, H = 3, args.heads
    blocks = dict(k_block=args.k_block, q_block=args.q_block)
    if args.weights == "identity":
        Q = K = V = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (H, d, d))
    else:
        ks = jax.random.split(jax.random.PRNGKey(1), 3)
        Q, K, V = (jax.random.normal(k, (H, d, d), jnp.float32) / np.sqrt(d) for k in ks)
    field = eqx.filter_jit(lambda m, x: m(0.0, x))
    rows = []
    for n in sizes:
        x = jd.sample_sphere(jax.random.PRNGKey(0), n, d)
        models = {
            "full": jd.MultiHeadAttention(Q, K, V / H, 9.0, kernel="blocked", **blocks),
            "causal": jd.MultiHeadAttention(Q, K, V / H, 9.0, mask="causal", kernel="blocked",
                                            **blocks),
            "sphere_attention": jd.SphereAttention(Q[0], K[0], V[0], 9.0, kernel="blocked",
                                                   **blocks),
            "full_auto": jd.MultiHeadAttention(Q, K, V / H, 9.0, kernel="auto", **blocks),
            "sphere_attention_auto": jd.SphereAttention(Q[0], K[0], V[0], 9.0, kernel="auto",
                                                        **blocks),
        }
        inner = args.inner or max(1, 16384 // n)
        print(f"N = {n} ({inner} calls a sample)")

        def calls(m):
            def fn():
                for _ in range(inner - 1):
                    jax.block_until_ready(field(m, x))
                return field(m, x)

            return fn

        res = interleaved({k: {"fn": calls(m)} for k, m in models.items()}, reps=reps, log=print)
        for r in res.values():  # per call
            for s in ("median_s", "min_s", "cpu_median_s"):
                r[s] /= inner
        outs = {k: np.asarray(res[k].pop("out")) for k in list(res)}
        # the (row, key block) pairs a causal pass visits, at the blocks it ran with (CPU
        # defaults): each sub-block of kb rows of a query block up to its last row's key block
        kb = min(n, args.k_block or jd.kernels.DEFAULT_BLOCKS["cpu"][0])
        qb = min(n, args.q_block or (CAUSAL_Q_BLOCK * (2 if n >= CAUSAL_LARGE_N else 1)))
        nkb = -(-n // kb)
        visited = 0
        for b in range(0, n, qb):
            for s in range(b, min(n, b + qb), kb):
                end = min(n, b + qb, s + kb)
                visited += (end - s) * min(nkb, (end - 1) // kb + 1)

        def ratio(a, b, s="median_s"):
            return res[a][s] / res[b][s]

        row = {
            "n": n, "heads": H, "weights": args.weights, "inner_calls": inner,
            "k_block": args.k_block,
            "q_block": args.q_block,
            **{f"{k}_{s}": res[k][s] for k in res for s in ("compile_s", "median_s", "min_s",
                                                             "cpu_median_s")},
            "causal_over_full": ratio("causal", "full"),
            "causal_over_full_cpu": ratio("causal", "full", "cpu_median_s"),
            "full_over_sphere_attention": ratio("full", "sphere_attention"),
            "full_over_sphere_attention_cpu": ratio("full", "sphere_attention", "cpu_median_s"),
            "full_auto_over_sphere_attention_auto": ratio("full_auto", "sphere_attention_auto"),
            "full_auto_over_sphere_attention_auto_cpu": ratio("full_auto",
                                                              "sphere_attention_auto",
                                                              "cpu_median_s"),
            "key_blocks_visited_fraction": visited / (n * nkb),
            # the last row attends to everything: causal and full agree there
            "last_row_max_abs_diff": float(np.max(np.abs(outs["full"][-1] - outs["causal"][-1]))),
            # one head, no mask: the same field as SphereAttention (B = QᵀK)
            "full_vs_sphere_max_abs_diff": float(np.max(np.abs(outs["full"]
                                                               - outs["sphere_attention"]))),
        }
        print(f"  causal/full {row['causal_over_full']:.3f} "
              f"(CPU {row['causal_over_full_cpu']:.3f}; "
              f"blocks visited {row['key_blocks_visited_fraction']:.3f}); full "
              f"{fmt_s(res['full']['median_s'])}, full/SphereAttention "
              f"{row['full_over_sphere_attention']:.3f} "
              f"(CPU {row['full_over_sphere_attention_cpu']:.3f}), auto "
              f"{row['full_auto_over_sphere_attention_auto']:.3f} "
              f"(CPU {row['full_auto_over_sphere_attention_auto_cpu']:.3f})")
        rows.append(row)
    write_json(args.name + args.tag, {"rows": rows, "reps": reps, "machine": machine_info()})
    if not args.no_plot:
        pyplot = plt()
        fig, ax = pyplot.subplots(figsize=(5.5, 3.5))
        ns = [r["n"] for r in rows]
        ax.plot(ns, [r["causal_over_full"] for r in rows], "o-", label="causal / full (wall)")
        ax.plot(ns, [r["causal_over_full_cpu"] for r in rows], "s--", label="causal / full (CPU)")
        ax.plot(ns, [r["key_blocks_visited_fraction"] for r in rows], "k:",
                label="key blocks visited")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (particles)")
        ax.set_ylabel("ratio")
        ax.plot(ns, [r["full_over_sphere_attention"] for r in rows], "^-",
                label="MultiHeadAttention / SphereAttention (wall)")
        ax.set_ylim(0, max(1.1, *(r["full_over_sphere_attention"] for r in rows)) * 1.05)
        ax.set_title(f"causal vs full blocked pass (d = {d}, H = {H}, "
                     f"k_block {args.k_block or 'default'}, q_block "
                     f"{args.q_block or 'default'})", fontsize=9)
        ax.legend(fontsize=8)
        save_figure(fig, args.name + args.tag)


if __name__ == "__main__":
    main()
