"""Phase-diagram workload: jaxdyn against PyTorch eager, same initial points, same answer.

Workload (the published PyTorch phase-diagram script of borjanG/2023-transformers-rotf):
16 β in [0.1, 9] × 512 independent systems × n = 32 particles on S¹ (d = 2), Q = K = V = I,
300 steps of h = 0.1 of the published scheme (Euler on the unprojected field, then
renormalise; jaxdyn's ``method="euler_renormalise"``, docs/math.md §F.4),

    x_i ← normalize(x_i + h Σ_j softmax_j(β⟨x_i, x_j⟩) x_j),

then, per β, the fraction of pairs i < j with ⟨x_i, x_j⟩ > 0.999 (averaged over systems).
Initial points: uniform angles from NumPy's default_rng(seed), float32, shared by all.
The PyTorch baseline (``torch_eager``) is a re-implementation of that loop (the published
script cannot be fetched here); ``--torch-scheme projected`` times instead the projected step
x_i ← normalize(x_i + h P⊥(x_i) Σ_j …) that earlier versions of this benchmark used.

Implementations timed in one invocation:

* ``torch_eager``: PyTorch eager (β in a Python loop, the 512 systems batched, bmm +
  softmax), on the CPU (or ``--torch-device cuda``), with one thread and with its default
  thread count; the faster of the two is the baseline.
* ``jax_vmap``: ``jax.jit(jax.vmap(simulate))`` over all 8192 systems on one device (the
  plain JAX way).
* ``jaxdyn_sharded``: :func:`jaxdyn.simulation.sharded_vmap` over all devices (on CPU: the
  host cores, as devices), each device mapping over cache-sized chunks of ``--batch-size``
  systems.
* ``jaxdyn_sharded_nochunk``: the same without chunks (one vmap per device).
* ``jaxdyn_ensemble``: :func:`jaxdyn.simulate_ensemble`, jaxdyn's path for many small
  systems (systems on the vector lanes, chunks split over all devices): the one the target
  is measured on.
* ``jaxdyn_ensemble_projected``: the same with jaxdyn's own projected Euler step
  (``method="euler"``): a second row, not the same answer — its pair fractions differ from
  the published scheme's by the step difference of docs/math.md §F.4 (about 9 % of clock).

Every ``jax*`` variant except the last runs the published scheme (``--jax-method`` to change).

All implementations are first called once (JAX: compilation), then timed in interleaved
rounds (torch, jax, jaxdyn, torch, ...) so that they share the machine's load drift; we
report the median over rounds, wall clock and process CPU time.

Output: benchmarks/runs/phase<tag>.json and .png (fractions against β for every
implementation; times as ratios to torch_eager).
"""

from __future__ import annotations

import argparse
import sys

from common import add_common_args, setup

P = argparse.ArgumentParser(description=__doc__.split("\n")[0])
P.add_argument("--betas", type=int, default=16)
P.add_argument("--beta-max", type=float, default=9.0)
P.add_argument("--systems", type=int, default=512)
P.add_argument("--n", type=int, default=32)
P.add_argument("--d", type=int, default=2)
P.add_argument("--steps", type=int, default=300)
P.add_argument("--h", type=float, default=0.1)
P.add_argument("--seed", type=int, default=0)
P.add_argument("--batch-size", type=int, default=-1,
               help="systems per chunk on each device (-1: 32 on CPU, whole share on GPU)")
P.add_argument("--torch-device", default="cpu")
P.add_argument("--skip-torch", action="store_true")
P.add_argument("--torch-threads", default="1,0",
               help="PyTorch intra-op thread counts to try (0: its default); the fastest is "
                    "the baseline (PyTorch's threads spin badly when other work shares the cores)")
P.add_argument("--variants", default="jax_vmap,jaxdyn_sharded,jaxdyn_sharded_nochunk,jaxdyn_ensemble,"
                                     "jaxdyn_ensemble_projected")
P.add_argument("--torch-scheme", choices=("published", "projected"), default="published",
               help="the baseline's step: the published one (no tangent projection, then "
                    "renormalise) or the projected step")
P.add_argument("--jax-method", default="euler_renormalise",
               help="jaxdyn method of the jax* variants (the published step by default)")
add_common_args(P)


def initial_points(n_beta, systems, n, d, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    if d == 2:
        th = rng.uniform(0.0, 2 * np.pi, (n_beta, systems, n))
        x = np.stack([np.cos(th), np.sin(th)], axis=-1)
    else:
        x = rng.normal(size=(n_beta, systems, n, d))
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return x.astype(np.float32)


def cluster_fractions(x, thr=0.999):
    """x: (n_beta, systems, n, d) → (n_beta,) mean fraction of pairs i<j with <x_i,x_j> > thr."""
    import numpy as np

    x = np.asarray(x, np.float32)
    n = x.shape[-2]
    g = np.einsum("bsid,bsjd->bsij", x, x)
    iu = np.triu_indices(n, k=1)
    return (g[..., iu[0], iu[1]] > thr).mean(axis=(1, 2))


def torch_run(x0, betas, steps, h, device, scheme="published"):
    """The baseline loop: ``published`` x ← normalise(x + h softmax(βxxᵀ)x) (rotf's step);
    ``projected`` with P⊥(x) applied to the increment first."""
    import torch

    out = []
    for b, xb in zip(betas, x0):
        x = torch.as_tensor(xb, device=device)
        for _ in range(steps):
            a = torch.softmax(float(b) * torch.bmm(x, x.transpose(1, 2)), dim=-1)
            m = torch.bmm(a, x)
            v = m if scheme == "published" else m - (m * x).sum(-1, keepdim=True) * x
            x = x + h * v
            x = x / x.norm(dim=-1, keepdim=True)
        out.append(x)
    return torch.stack(out)


def main(argv=None):
    args = setup(P, argv)
    if args.tiny:
        args.betas, args.systems, args.n, args.steps = 3, 8, 8, 20
    reps = args.reps or (1 if args.tiny else 3)

    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxdyn
    from common import fmt_s, interleaved, machine_info, torch_sync, write_json
    from jaxdyn.simulation import sharded_vmap

    betas = np.linspace(0.1, args.beta_max, args.betas).astype(np.float32)
    x0 = initial_points(args.betas, args.systems, args.n, args.d, args.seed)
    S = args.betas * args.systems
    on_cpu = jax.default_backend() == "cpu"
    bs = args.batch_size if args.batch_size >= 0 else (32 if on_cpu else 0)
    bs = bs or None
    print(f"phase workload: {args.betas} β × {args.systems} systems × n={args.n} × d={args.d} × "
          f"{args.steps} steps; {jax.device_count()} {jax.default_backend()} device(s)", flush=True)

    result = {"workload": {k: getattr(args, k) for k in ("betas", "beta_max", "systems", "n", "d",
                                                         "steps", "h", "seed")},
              "betas": betas, "machine": machine_info(), "impl": {}, "batch_size": bs,
              "pairs_per_run": S * args.n * args.n * args.steps}

    d = args.d
    eye = jnp.eye(d, dtype=jnp.float32)
    models = jaxdyn.stack_models([jaxdyn.SphereAttention(eye, eye, eye, float(b))
                                  for b in np.repeat(betas, args.systems)])
    xs0 = jnp.asarray(x0.reshape(S, args.n, d))
    t1 = args.steps * args.h

    def sim(model, x):
        return jaxdyn.simulate(model, x, t1=t1, dt=args.h, method=args.jax_method,
                               save_every=args.steps).xs[-1]

    def ensemble(models, x, method=args.jax_method):
        return jaxdyn.simulate_ensemble(models, x, t1=t1, dt=args.h, method=method,
                                        save_every=args.steps).xs[:, -1]

    jax_variants = {
        "jax_vmap": jax.jit(jax.vmap(sim)),
        "jaxdyn_sharded": sharded_vmap(sim, batch_size=bs),
        "jaxdyn_sharded_nochunk": sharded_vmap(sim),
        "jaxdyn_ensemble": ensemble,
        "jaxdyn_ensemble_projected": lambda m, x: ensemble(m, x, method="euler"),
    }
    result["schemes"] = {"torch_eager": args.torch_scheme, "jaxdyn_ensemble_projected": "euler",
                         **{k: args.jax_method for k in jax_variants
                            if k != "jaxdyn_ensemble_projected"}}
    impls = {}
    if not args.skip_torch:
        import torch

        sync = torch_sync(args.torch_device)
        default_threads = torch.get_num_threads()
        counts = [int(v) for v in args.torch_threads.split(",") if v != ""]
        if args.torch_device != "cpu":
            counts = counts[:1]  # threads do not matter on a GPU
        for k in dict.fromkeys(k or default_threads for k in counts):
            impls[f"torch_eager@{k}"] = {
                "fn": lambda: torch_run(x0, betas, args.steps, args.h, args.torch_device,
                                        args.torch_scheme),
                "sync": sync, "setup": (lambda k=k: torch.set_num_threads(k))}
    for name in [v for v in args.variants.split(",") if v]:
        impls[name] = {"fn": (lambda f=jax_variants[name]: f(models, xs0))}
    # Interleaved rounds: every implementation sees the same drift of the machine's load.
    res = interleaved(impls, reps=reps, log=lambda m: print(m, flush=True))

    torch_names = [k for k in res if k.startswith("torch_eager@")]
    if torch_names:
        torch.set_num_threads(default_threads)
        for k in torch_names:
            res[k]["fractions"] = cluster_fractions(res[k].pop("out").cpu().numpy())
        best = min(torch_names, key=lambda k: res[k]["median_s"])
        result["impl"]["torch_eager"] = {**res[best], "device": args.torch_device,
                                         "threads": int(best.partition("@")[2]),
                                         "all_thread_counts": {k: res[k] for k in torch_names}}
        for k in torch_names:
            print(f"  {k} ({args.torch_device}): median {fmt_s(res[k]['median_s'])} over "
                  f"{res[k]['rounds']} round(s)", flush=True)
    for name in [v for v in args.variants.split(",") if v]:
        stats = res[name]
        xf = stats.pop("out")
        frac = cluster_fractions(np.asarray(xf).reshape(x0.shape))
        entry = {**stats, "fractions": frac, "devices": 1 if name == "jax_vmap" else jax.device_count()}
        if "torch_eager" in result["impl"]:
            tf = np.asarray(result["impl"]["torch_eager"]["fractions"])
            entry["max_abs_fraction_diff_vs_torch"] = float(np.max(np.abs(frac - tf)))
            entry["speedup_vs_torch"] = result["impl"]["torch_eager"]["median_s"] / stats["median_s"]
            tc = result["impl"]["torch_eager"].get("cpu_median_s")
            if tc:
                entry["cpu_time_ratio_vs_torch"] = tc / stats["cpu_median_s"]
        result["impl"][name] = entry
        extra = (f", {entry['speedup_vs_torch']:.2f}× torch, max |Δfraction| "
                 f"{entry['max_abs_fraction_diff_vs_torch']:.2g}") if "speedup_vs_torch" in entry else ""
        if "cpu_time_ratio_vs_torch" in entry:
            extra += f"; CPU time {stats['cpu_median_s']:.2f} s ({entry['cpu_time_ratio_vs_torch']:.2f}× less than torch)"
        print(f"  {name}: median {fmt_s(stats['median_s'])} (compile+first "
              f"{fmt_s(stats['compile_s'])}){extra}", flush=True)

    name = f"phase{args.tag}"
    write_json(name, result)
    if not args.no_plot:
        plot(result, name)
    return result


def plot(result, name):
    import numpy as np

    from common import plt, save_figure

    pyplot = plt()
    fig, (a1, a2) = pyplot.subplots(1, 2, figsize=(11, 4))
    betas = np.asarray(result["betas"])
    markers = {"torch_eager": "o", "jax_vmap": "s", "jaxdyn_sharded": "x", "jaxdyn_sharded_nochunk": "+",
               "jaxdyn_ensemble": "D", "jaxdyn_ensemble_projected": "v"}
    for k, v in result["impl"].items():
        scheme = result.get("schemes", {}).get(k, "")
        a1.plot(betas, v["fractions"], marker=markers.get(k, "."), label=f"{k} ({scheme})",
                alpha=0.8)
    a1.set_xlabel("β")
    a1.set_ylabel("fraction of pairs with ⟨x_i, x_j⟩ > 0.999")
    a1.set_title("phase-diagram workload (the same scheme gives the same answer)")
    a1.legend(fontsize=8)
    base = result["impl"].get("torch_eager")
    names = list(result["impl"])
    if base:
        ratios = [base["median_s"] / result["impl"][k]["median_s"] for k in names]
        a2.bar(names, ratios, color=["gray" if k == "torch_eager" else "C0" for k in names])
        a2.set_ylabel("speed-up vs PyTorch eager (median, same run)")
        for i, r in enumerate(ratios):
            a2.text(i, r, f"{r:.2f}×\n{result['impl'][names[i]]['median_s']:.2f} s", ha="center",
                    va="bottom", fontsize=8)
    else:
        a2.bar(names, [result["impl"][k]["median_s"] for k in names])
        a2.set_ylabel("median seconds")
    a2.tick_params(axis="x", rotation=20)
    m = result["machine"]
    fig.suptitle(f"{m.get('cpu_model', '')} · {m['device_count']} {m['backend']} device(s) · "
                 f"{m['date']}", fontsize=8)
    save_figure(fig, name)


if __name__ == "__main__":
    main(sys.argv[1:])
