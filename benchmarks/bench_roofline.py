"""Against the machine's limit: jaxdyn's pair throughput as a fraction of the exp-bound floor.

Every pair (i, j) of a softmax field evaluation costs one exponential, so on this machine
an evaluation of N particles cannot beat the **exp-bound floor**

    T_floor = N² / (exp rate per core × cores used).

Measured here, in one invocation:

* ``exp`` throughput of XLA on a cache-resident float32 array (16K and 64K elements), as
  the best of two loop forms (summed, or added into a carried array), on one device, per
  core (exps per second of wall time, or of CPU time if XLA used more than one thread).
  It is sampled at the start and after every N, and the floor uses the **best** sample
  (on a shared machine the rate drifts with the neighbours' load; the best is the
  conservative choice). Also the aggregate rate of the same loop on every device at once
  (all cores; on a shared machine, what the cores left to us give). The XLA flags are
  those of the benchmark entry points (on AVX-512 CPUs, 512-bit vectors: see
  configure_host_devices).
* matmul FLOP/s (float32, ``precision=HIGHEST``, 2048³), all cores.
* jaxdyn's blocked field evaluation (d = 3, β = 10) for N = 2¹² … 2¹⁶: pairs per second
  N²/t and the fraction T_floor/t, for the query-sharded evaluation on all devices (cores
  used = devices) and for one device (cores used = 1; XLA may still spread a loop over
  two threads, so that fraction can exceed what one core allows).

Both kinds of CPU: ``--max-isa AVX2`` caps the ISA of XLA's generated code
(``--xla_cpu_max_isa``, with XLA's default 256-bit vector preference, as on a CPU without
AVX-512; ``common.cap_isa``) for the whole run, floor included; ``--isas native AVX2`` runs the script once per
ISA (one subprocess each, in turn, ``--isa-rounds`` times) and writes
``roofline<tag>_<isa>.json`` per run plus a ``by_isa`` section in ``roofline<tag>.json``.
Every JSON records the ISA XLA targeted and the registers of an emitted exp loop
(``machine.isa``, see ``common.machine_info``).

Output: benchmarks/runs/roofline<tag>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from common import add_common_args, setup

P = argparse.ArgumentParser(description=__doc__.split("\n")[0])
P.add_argument("--min-log2n", type=int, default=12)
P.add_argument("--max-log2n", type=int, default=16)
P.add_argument("--beta", type=float, default=10.0)
P.add_argument("--exp-worker", action="store_true", help=argparse.SUPPRESS)
P.add_argument("--isas", nargs="+", default=None,
               help="run once per ISA ('native' = no cap), each in its own process")
P.add_argument("--isa-rounds", type=int, default=1, help="with --isas: alternate this often")
P.add_argument("--logits-ab", type=int, default=0, metavar="ROUNDS",
               help="also time the blocked kernel (one device) with its logits by a matrix "
                    "product and inside the exp loop, in this many interleaved rounds per N")
add_common_args(P)

EXP_SIZES = (16384, 65536)


def _cpu_s():
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def exp_loop(size, total, form="reduce"):
    """A jitted loop computing ``total`` float32 exponentials of a ``size``-float array.

    ``form="reduce"``: each pass sums exp(a − s) (nothing written back);
    ``form="elementwise"``: each pass adds exp(a − c·i) into a carried array of the same
    size (an elementwise loop, as the kernels' exponential is)."""
    import jax
    import jax.numpy as jnp

    reps = max(1, total // size)

    if form == "reduce":
        def f(a):
            return jax.lax.fori_loop(
                0, reps, lambda i, s: s + jnp.sum(jnp.exp(a - s * 1e-12)), jnp.zeros((), a.dtype))
    else:
        def f(a):
            return jax.lax.fori_loop(
                0, reps, lambda i, acc: acc + jnp.exp(a - i.astype(a.dtype) * 1e-9),
                jnp.zeros_like(a))
    return jax.jit(f), reps


def measure_exp(sizes, total, reps=5):
    """Best exp rate over sizes and the two loop forms on the default device."""
    import jax
    import jax.numpy as jnp

    best = None
    forms = {}
    for form in ("reduce", "elementwise"):
        for size in sizes:
            a = jax.random.uniform(jax.random.PRNGKey(0), (size,), jnp.float32, -8.0, 0.0)
            f, r = exp_loop(size, total, form)
            jax.block_until_ready(f(a))
            walls, cpus = [], []
            for _ in range(reps):
                c0, t0 = _cpu_s(), time.perf_counter()
                jax.block_until_ready(f(a))
                walls.append(time.perf_counter() - t0)
                cpus.append(_cpu_s() - c0)
            i = min(range(reps), key=lambda k: walls[k])
            rate = size * r / walls[i]
            rec = {"rate_per_s": rate, "wall_s": walls[i], "cpu_s": cpus[i], "size": size,
                   "form": form, "exps": size * r,
                   "median_rate_per_s": size * r / sorted(walls)[reps // 2]}
            forms[f"{form}_{size}"] = rec
            if best is None or rate > best["rate_per_s"]:
                best = dict(rec)
    best["all"] = forms
    return best


def exp_worker(args):
    total = 2**22 if args.tiny else 2**27
    print(json.dumps(measure_exp(EXP_SIZES, total)), flush=True)


def measure_exp_all_devices(total, form, size, reps=5):
    """The same loop on every device at once (shard_map): aggregate exps per second."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as Ps

    ndev = jax.device_count()
    mesh = Mesh(jax.devices(), ("d",))
    f1, r = exp_loop(size, total, form)
    f = jax.jit(jax.shard_map(lambda a: f1(a[0])[None], mesh=mesh, in_specs=Ps("d"),
                              out_specs=Ps("d"), check_vma=False))
    a = jax.random.uniform(jax.random.PRNGKey(0), (ndev, size), jnp.float32, -8.0, 0.0)
    jax.block_until_ready(f(a))
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(a))
        walls.append(time.perf_counter() - t0)
    return {"rate_per_s": ndev * size * r / min(walls), "devices": ndev, "wall_s": min(walls),
            "form": form, "size": size,
            "median_rate_per_s": ndev * size * r / sorted(walls)[reps // 2]}


def measure_matmul(n, reps=5):
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    f = jax.jit(lambda a, b: jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST))
    jax.block_until_ready(f(a, a))
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(a, a))
        walls.append(time.perf_counter() - t0)
    return {"n": n, "flops_per_s": 2 * n**3 / min(walls),
            "median_flops_per_s": 2 * n**3 / sorted(walls)[reps // 2]}


def exp_rate_sample(total):
    """One sample of the per-core exp rate on one device: the best over loop forms and sizes
    of exps per second of wall time, with the process CPU time to check it used one core."""
    best = measure_exp(EXP_SIZES, total, reps=3)
    best.pop("all", None)
    best["cpu_per_wall"] = best["cpu_s"] / best["wall_s"]
    # Per core: if XLA spread the loop over threads, count CPU seconds, not wall seconds.
    best["rate_per_core"] = best["exps"] / max(best["wall_s"], best["cpu_s"])
    # per CPU-second of the loop (time descheduled by other load not counted)
    best["rate_per_cpu_s"] = best["exps"] / best["cpu_s"] if best["cpu_s"] > 0 else None
    return best


def by_isa(args, argv):
    """Run this script once per ISA of ``--isas`` (subprocesses, in turn), merge."""
    import subprocess

    from common import HERE, RESULTS, write_json

    rest, skip = [], False
    for a in argv:  # the arguments minus --isas/--isa-rounds/--tag
        if skip:
            if a.startswith("--"):
                skip = False
            else:
                continue
        if a in ("--isas", "--isa-rounds", "--tag"):
            skip = True
            continue
        if a.startswith(("--isas=", "--isa-rounds=", "--tag=")):
            continue
        rest.append(a)
    runs = {}
    for rnd in range(args.isa_rounds):
        for isa in args.isas:
            tag = f"{args.tag}_{isa}" + (f"_r{rnd}" if args.isa_rounds > 1 else "")
            cmd = [sys.executable, str(HERE / "bench_roofline.py"), *rest, "--tag", tag,
                   "--no-plot"]
            if isa != "native":
                cmd += ["--max-isa", isa]
            print(f"== {isa} (round {rnd + 1}/{args.isa_rounds}): {' '.join(cmd[1:])}", flush=True)
            subprocess.run(cmd, check=False)
            p = RESULTS / f"roofline{tag}.json"
            if p.exists():
                runs.setdefault(isa, []).append(json.loads(p.read_text()))
    if not runs:
        return None
    first = runs.get("native", next(iter(runs.values())))[-1]
    result = dict(first)
    result["by_isa"] = {}
    for isa, rs in runs.items():
        result["by_isa"][isa] = [{"isa": r["machine"].get("isa"), "loadavg": (
            r["machine"].get("loadavg_start"), r["machine"].get("loadavg_end")),
            "exp_one_core": r["exp_one_core"], "matmul": r["matmul"],
            "rows": [{k: row[k] for k in ("n", "impl", "cores_used", "median_s", "min_s",
                                          "cpu_median_s", "fraction_of_floor",
                                          "fraction_of_floor_best", "fraction_of_floor_cpu",
                                          "fraction_of_floor_cpu_time")
                      if k in row} for row in r["rows"]],
            "logits_ab": r.get("logits_ab")} for r in rs]
    print("\nper ISA (query-sharded, fraction of the exp floor measured in the same run):")
    for isa, rs in result["by_isa"].items():
        for r in rs:
            print(f"  {isa:>7} [{(r['isa'] or {}).get('label', '?')}] exp "
                  f"{r['exp_one_core']['rate_per_s'] / 1e9:.2f}·10⁹/s: " + ", ".join(
                      f"N={row['n']} {100 * row['fraction_of_floor']:.1f}% "
                      f"(CPU {100 * row['fraction_of_floor_cpu']:.0f}%, CPU/CPU "
                      f"{100 * (row.get('fraction_of_floor_cpu_time') or 0):.0f}%)"
                      for row in r["rows"] if row["impl"] == "jaxdyn_sharded"), flush=True)
            for a in r.get("logits_ab") or []:
                print(f"          N={a['n']}: logits in the exp loop / by a product: CPU time "
                      f"{a['cpu_ratio_fused_over_matmul']:.3f}×, wall "
                      f"{a['wall_ratio_fused_over_matmul']:.3f}×", flush=True)
    write_json(f"roofline{args.tag}", result)
    return result


def logits_ab(x, beta, kb, qb, rounds):
    """The field through jaxdyn.kernels.blocked (one device, self-attention) with
    ``logits="matmul"`` (the logits of each tile as a matrix product)
    and ``logits="fused"`` (inside the exponential's loop), timed in interleaved rounds."""
    import jax

    import jaxdyn
    from common import interleaved
    from jaxdyn.kernels import blocked

    fns = {}
    for lg in ("matmul", "fused"):
        def f(x, lg=lg):
            m = blocked(beta * x, x, "softmax", k_block=kb, q_block=qb, self_keys=True, logits=lg)
            return jaxdyn.sphere.tangent_project(x, m)
        fns[lg] = jax.jit(f)
    res = interleaved({f"logits_{lg}": {"fn": (lambda f=f: f(x))} for lg, f in fns.items()},
                      reps=rounds)
    n = x.shape[0]
    out = {"n": n, "rounds": rounds}
    for k, r in res.items():
        r.pop("out", None)
        out[k] = {key: r[key] for key in ("median_s", "min_s", "cpu_median_s", "compile_s")}
    out["cpu_ratio_fused_over_matmul"] = (out["logits_fused"]["cpu_median_s"]
                                          / out["logits_matmul"]["cpu_median_s"])
    out["wall_ratio_fused_over_matmul"] = (out["logits_fused"]["median_s"]
                                           / out["logits_matmul"]["median_s"])
    print(f"  N={n:>6} logits in the exp loop / by a product, one device, {rounds} interleaved "
          f"rounds: CPU time {out['cpu_ratio_fused_over_matmul']:.3f}×, wall "
          f"{out['wall_ratio_fused_over_matmul']:.3f}× ({1e3 * out['logits_matmul']['median_s']:.2f}"
          f" → {1e3 * out['logits_fused']['median_s']:.2f} ms)", flush=True)
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = P.parse_known_args(argv)[0]
    if pre.isas:
        return by_isa(pre, argv)
    args = setup(P, argv)  # --max-isa: common.cap_isa
    if args.exp_worker:
        return exp_worker(args)
    if args.tiny:
        args.min_log2n, args.max_log2n = 8, 9
    import jax
    import jax.numpy as jnp

    import jaxdyn
    from common import fmt_s, machine_info, time_call, write_json
    from jaxdyn.kernels import DEFAULT_BLOCKS
    from jaxdyn.simulation import query_sharded_field

    result = {"machine": machine_info(), "beta": args.beta}
    print(f"ISA: {result['machine'].get('isa', {}).get('label')}", flush=True)
    total = 2**22 if args.tiny else 2**26
    samples = []

    def sample(where):
        r = exp_rate_sample(total)
        r["where"] = where
        samples.append(r)
        return r

    r0 = sample("start")
    print(f"exp, one device: {r0['rate_per_core'] / 1e9:.2f}·10⁹/s per core ({r0['form']} loop of "
          f"{r0['size']} floats, CPU/wall {r0['cpu_per_wall']:.2f})", flush=True)
    alls = [measure_exp_all_devices(total, r0["form"], r0["size"])]
    print(f"exp, {alls[0]['devices']} devices at once: {alls[0]['rate_per_s'] / 1e9:.2f}·10⁹/s",
          flush=True)
    mm = measure_matmul(256 if args.tiny else 2048)
    result["matmul"] = mm
    print(f"matmul {mm['n']}³ float32 HIGHEST: {mm['flops_per_s'] / 1e9:.1f} GFLOP/s", flush=True)

    ndev = jax.device_count()
    kb, qb = DEFAULT_BLOCKS["cpu" if jax.default_backend() == "cpu" else "gpu"]
    eye = jnp.eye(3, dtype=jnp.float32)
    model = jaxdyn.SphereAttention(eye, eye, eye, args.beta, kernel="blocked", k_block=kb,
                                   q_block=qb)
    variants = {"jaxdyn_sharded": (jax.jit(lambda x: query_sharded_field(model)(0.0, x)), ndev),
                "jax_blocked_1dev": (jax.jit(lambda x: model(0.0, x)), 1)}
    rows, ab = [], []
    for k in range(args.min_log2n, args.max_log2n + 1):
        n = 2**k
        x = jaxdyn.sample_sphere(jax.random.PRNGKey(k), n, 3, jnp.float32)
        for name, (fn, cores) in variants.items():
            stats, _ = time_call(fn, x, reps=args.reps or (7 if n <= 2**14 else 3), warmup=1,
                                 max_seconds=30)
            rows.append({"n": n, "impl": name, "cores_used": cores, **stats})
        if args.logits_ab:
            ab.append(logits_ab(x, args.beta, kb, qb, args.logits_ab))
        # Re-measure the rates between sizes: the floor uses the best seen in the whole run.
        sample(f"after N={n}")
        alls.append(measure_exp_all_devices(total, r0["form"], r0["size"]))
    rate = max(s["rate_per_core"] for s in samples)
    rate_cpu = max((s.get("rate_per_cpu_s") or 0.0) for s in samples) or None
    agg = max(a["rate_per_s"] for a in alls)
    result["exp_samples"] = samples
    result["exp_one_core"] = {"rate_per_s": rate, "how": "best per-core rate over all samples",
                              "rate_per_cpu_s": rate_cpu}
    result["exp_all_devices"] = {**max(alls, key=lambda a: a["rate_per_s"]),
                                 "samples": [a["rate_per_s"] for a in alls]}
    print(f"exp rate used for the floor: {rate / 1e9:.2f}·10⁹/s per core (best of {len(samples)} "
          f"samples, lowest {min(s['rate_per_core'] for s in samples) / 1e9:.2f}); {ndev} devices "
          f"together reached at best {agg / 1e9:.2f}·10⁹/s", flush=True)
    for row in rows:
        n, cores, t = row["n"], row["cores_used"], row["median_s"]
        floor = n * n / (rate * cores)
        row.update({
            "pairs_per_s": n * n / t, "floor_s": floor, "fraction_of_floor": floor / t,
            "fraction_of_floor_best": floor / row["min_s"],
            # Against the best exp rate the devices reached together in this run (what the
            # cores left to us by other work allowed):
            "fraction_of_measured_rate": n * n / t / (agg if cores > 1 else rate),
            # Per core-second of work: the floor's N²/rate core-seconds against the CPU time
            # the evaluation used (all threads); other load disturbs it less.
            "fraction_of_floor_cpu": n * n / rate / row["cpu_median_s"],
            # CPU time against CPU time: the exp floor from the exp loop's rate per CPU-second
            # (both sides exclude time other load took; the steadier figure on a busy machine)
            "fraction_of_floor_cpu_time": (n * n / rate_cpu / row["cpu_median_s"]
                                           if rate_cpu else None)})
        print(f"  N={n:>6} {row['impl']:>17}: {fmt_s(t):>9}  {n * n / t / 1e9:6.2f}·10⁹ pairs/s  "
              f"{100 * row['fraction_of_floor']:5.1f}% of the exp floor on {cores} core(s) (best "
              f"rep {100 * row['fraction_of_floor_best']:5.1f}%), "
              f"{100 * row['fraction_of_floor_cpu']:5.1f}% per CPU-second, "
              f"{100 * (row['fraction_of_floor_cpu_time'] or 0):5.1f}% CPU time against the exp "
              f"loop's CPU time", flush=True)
    result["rows"] = rows
    if ab:
        result["logits_ab"] = ab
    result["reference_exp_rate_per_core"] = 4.46e9
    name = f"roofline{args.tag}"
    write_json(name, result)
    if not args.no_plot:
        plot(result, name)
    return result


def plot(result, name):
    from common import plt, save_figure

    pyplot = plt()
    fig, (a1, a2) = pyplot.subplots(1, 2, figsize=(11, 4))
    for impl in sorted({r["impl"] for r in result["rows"]}):
        rs = [r for r in result["rows"] if r["impl"] == impl]
        line, = a1.semilogx([r["n"] for r in rs], [100 * r["fraction_of_floor"] for r in rs],
                            marker="o", base=2, label=f"{impl}, wall ({rs[0]['cores_used']} core(s))")
        if "fraction_of_floor_cpu" in rs[0]:
            a1.semilogx([r["n"] for r in rs], [100 * r["fraction_of_floor_cpu"] for r in rs],
                        marker="x", ls="--", color=line.get_color(), base=2,
                        label=f"{impl}, per CPU-second")
        a2.semilogx([r["n"] for r in rs], [r["pairs_per_s"] / 1e9 for r in rs], marker="o",
                    base=2, label=impl)
    a1.axhline(40, color="red", ls="--", lw=0.8, label="target 40 %")
    a1.set_xlabel("N")
    a1.set_ylabel("% of exp-bound floor N²/(exp rate × cores)")
    a1.legend(fontsize=8)
    one = result["exp_one_core"]["rate_per_s"] / 1e9
    allc = result["exp_all_devices"]
    a2.axhline(one, color="gray", ls=":", label=f"exp rate, 1 core: {one:.2f}·10⁹/s")
    a2.axhline(allc["rate_per_s"] / 1e9, color="black", ls=":",
               label=f"exp rate, {allc['devices']} devices: {allc['rate_per_s'] / 1e9:.2f}·10⁹/s")
    a2.set_xlabel("N")
    a2.set_ylabel("pairs per second (10⁹)")
    a2.legend(fontsize=7)
    m = result["machine"]
    fig.suptitle(f"roofline · {m.get('cpu_model', '')} ({m.get('isa', {}).get('target_isa')}, "
                 f"{m.get('isa', {}).get('vector_bits')}-bit) · {m['device_count']} {m['backend']} "
                 f"device(s) · matmul {result['matmul']['flops_per_s'] / 1e9:.0f} GFLOP/s · "
                 f"{m['date']}", fontsize=8)
    save_figure(fig, name)


if __name__ == "__main__":
    main(sys.argv[1:])
