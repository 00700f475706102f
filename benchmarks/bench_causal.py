"""Benchmark: a causal blocked attention pass against a full one.

The blocked kernel of :class:`jaxdyn.MultiHeadAttention` skips every key block that lies
wholly after the last query of a query block (``lax.cond`` in the key scan), so a causal
pass should cost about half a full pass: with query blocks of q and key blocks of k, query
block b processes ⌈(b + 1) q / k⌉ of N / k key blocks, a fraction (1 + q/N)/2 of the work
(plus the masking's elementwise select on the diagonal blocks).

For each N, in one invocation and in interleaved rounds (``common.interleaved``):

- ``full``: ``MultiHeadAttention(..., kernel="blocked")`` field, no mask;
- ``causal``: the same with ``mask="causal"``;
- ``sphere_attention`` (baseline of the variant kernel itself): ``SphereAttention`` blocked
  (the production single-head kernel, bound-shift softmax), full.

All at the same block sizes (``--k-block``, ``--q-block``), d = 3, H = ``--heads``, float32,
jitted; the first call (compilation) timed apart. Reports the median wall and CPU times and
the ratios causal / full and full / sphere_attention. Writes
``benchmarks/results/causal.json`` and ``.png``.

    python benchmarks/bench_causal.py            # N = 2048, 4096, 8192
    python benchmarks/bench_causal.py --tiny
"""

from __future__ import annotations

import argparse

from common import add_common_args, fmt_s, interleaved, machine_info, plt, save_figure, setup, \
    write_json


def main(argv=None):
    p = add_common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192])
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--k-block", type=int, default=256)
    p.add_argument("--q-block", type=int, default=512)
    p.add_argument("--name", default="causal")
    args = setup(p, argv)

    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxdyn as jd

    sizes = [256, 512] if args.tiny else args.sizes
    reps = args.reps or (2 if args.tiny else 5)
    d, H = 3, args.heads
    blocks = dict(k_block=args.k_block, q_block=args.q_block)
    eye = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (H, d, d))
    field = eqx.filter_jit(lambda m, x: m(0.0, x))
    rows = []
    for n in sizes:
        x = jd.sample_sphere(jax.random.PRNGKey(0), n, d)
        models = {
            "full": jd.MultiHeadAttention(eye, eye, eye / H, 9.0, kernel="blocked", **blocks),
            "causal": jd.MultiHeadAttention(eye, eye, eye / H, 9.0, mask="causal",
                                            kernel="blocked", **blocks),
            "sphere_attention": jd.SphereAttention(eye[0], eye[0], eye[0], 9.0, kernel="blocked",
                                                   **blocks),
        }
        print(f"N = {n}")
        res = interleaved({k: {"fn": (lambda m=m: field(m, x))} for k, m in models.items()},
                          reps=reps, log=print)
        full, causal = (np.asarray(res[k].pop("out")) for k in ("full", "causal"))
        res["sphere_attention"].pop("out")
        nkb = -(-n // args.k_block)
        nqb = -(-n // args.q_block)
        visited = sum(min(nkb, -(-min(n, (b + 1) * args.q_block) // args.k_block))
                      for b in range(nqb))
        row = {
            "n": n, "heads": H, **blocks,
            **{f"{k}_{s}": res[k][s] for k in res for s in ("compile_s", "median_s", "min_s",
                                                             "cpu_median_s")},
            "causal_over_full": res["causal"]["median_s"] / res["full"]["median_s"],
            "causal_over_full_cpu": res["causal"]["cpu_median_s"] / res["full"]["cpu_median_s"],
            "full_over_sphere_attention": res["full"]["median_s"]
            / res["sphere_attention"]["median_s"],
            "key_blocks_visited_fraction": visited / (nkb * nqb),
            # the last row attends to everything: causal and full agree there
            "last_row_max_abs_diff": float(np.max(np.abs(full[-1] - causal[-1]))),
        }
        print(f"  causal/full {row['causal_over_full']:.3f} "
              f"(CPU {row['causal_over_full_cpu']:.3f}; "
              f"blocks visited {row['key_blocks_visited_fraction']:.3f}); full "
              f"{fmt_s(res['full']['median_s'])}, full/SphereAttention "
              f"{row['full_over_sphere_attention']:.3f}")
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
        ax.set_ylim(0, 1.1)
        ax.set_xlabel("N (particles)")
        ax.set_ylabel("ratio")
        ax.set_title(f"causal vs full blocked pass (d = {d}, H = {H}, "
                     f"k_block {args.k_block}, q_block {args.q_block})", fontsize=9)
        ax.legend(fontsize=8)
        save_figure(fig, args.name + args.tag)


if __name__ == "__main__":
    main()
