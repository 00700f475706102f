"""Large N: time and peak memory of one field evaluation, jaxdyn against baselines.

The field of Paper A's particle system with Q = K = V = I, d = 3, β = 10,

    X_i = P⊥(x_i) Σ_j softmax_j(β⟨x_i, x_j⟩) x_j,

for N = 2¹⁰ … 2¹⁷ on CPU (to 2²⁰ on a GPU, ``--max-log2n 20``). Implementations:

* ``jax_dense``      jaxdyn, kernel="dense" (materialises N×N), one device
* ``jax_blocked``    jaxdyn, kernel="blocked" (online softmax), one device
* ``jaxdyn_sharded`` jaxdyn blocked with the query particles split across all devices
                     (on CPU the host cores as devices): ``query_sharded_field``
* ``torch``          PyTorch eager, dense softmax (CPU or CUDA)
* ``numpy``          NumPy, dense softmax (CPU only)
* ``keops``          KeOps ``LazyTensor.sumsoftmaxweight`` (CPU only here)

Each implementation runs in its own subprocess, N increasing. Timing: first call
(compile) separately, then the median of up to ``--reps`` calls. Peak memory, measured two
ways and labelled: ``rss_peak_delta_bytes`` = the process's peak RSS (VmHWM, reset through
``/proc/self/clear_refs`` just before the timed calls) minus its RSS at that moment, i.e.
the memory the evaluations add on top of their inputs; the first call (JAX compilation,
KeOps code generation) is measured apart as ``rss_peak_delta_first_call_bytes``; for JAX also
``xla_bytes`` = XLA's memory analysis of the compiled function (arguments + outputs +
temporaries); on GPUs the allocator's peak (``jax``: ``memory_stats()['peak_bytes_in_use']``,
``torch``: ``max_memory_allocated``). Configurations predicted to exceed ``--time-cap``
seconds per evaluation (from the previous N, ×4) or ``--mem-cap-gb`` are skipped and say so.

Output: benchmarks/runs/large_n<tag>.json and .png (time per evaluation and speed-up
against PyTorch eager and KeOps, and peak memory, against N).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from common import add_common_args, setup

IMPLS = ("jax_dense", "jax_blocked", "jaxdyn_sharded", "torch", "numpy", "keops")
P = argparse.ArgumentParser(description=__doc__.split("\n")[0])
P.add_argument("--min-log2n", type=int, default=10)
P.add_argument("--max-log2n", type=int, default=17)
P.add_argument("--d", type=int, default=3)
P.add_argument("--beta", type=float, default=10.0)
P.add_argument("--impls", default=",".join(IMPLS))
P.add_argument("--time-cap", type=float, default=20.0, help="seconds per evaluation, predicted")
P.add_argument("--mem-cap-gb", type=float, default=2.0, help="dense N×N working set cap")
P.add_argument("--budget", type=float, default=240.0, help="seconds of timing per implementation")
P.add_argument("--torch-device", default="cpu")
P.add_argument("--baseline-threads", default="0,1",
               help="thread counts for the CPU baselines (0: the library default); each runs "
                    "as its own implementation (name@1 for one thread) and the fastest per N is "
                    "the baseline of the speed-ups")
P.add_argument("--headline-n", type=int, default=4096,
               help="N of the interleaved head-to-head comparison (0: skip)")
P.add_argument("--headline-rounds", type=int, default=15)
P.add_argument("--probe", action="store_true",
               help="time block-step formulations and block sizes at --probe-n, pick the best")
P.add_argument("--probe-n", type=int, default=65536)
P.add_argument("--worker", default=None, help=argparse.SUPPRESS)
P.add_argument("--ns", default=None, help=argparse.SUPPRESS)
add_common_args(P)


def points(n, d, seed=0):
    import numpy as np

    x = np.random.default_rng(seed).normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


# ------------------------------------------------------------------------------- workers


def _jax_fn(impl, d, beta):
    import jax
    import jax.numpy as jnp

    import jaxdyn
    from jaxdyn.kernels import DEFAULT_BLOCKS
    from jaxdyn.simulation import query_sharded_field

    eye = jnp.eye(d, dtype=jnp.float32)
    kernel = "dense" if impl == "jax_dense" else "blocked"
    # The kernel's per-platform default blocks (models may still carry older defaults), or
    # the GPU probe's choice passed by gpu.sh.
    kb, qb = DEFAULT_BLOCKS["cpu" if jax.default_backend() == "cpu" else "gpu"]
    kb = int(os.environ.get("JAXDYN_BENCH_K_BLOCK") or kb)
    qb = int(os.environ.get("JAXDYN_BENCH_Q_BLOCK") or qb)
    form = os.environ.get("JAXDYN_BENCH_FORMULATION") or None
    if impl == "jax_blocked" and form:
        return _direct_field(beta, kb, qb, form)
    model = jaxdyn.SphereAttention(eye, eye, eye, beta, kernel=kernel, k_block=kb, q_block=qb)
    if impl == "jaxdyn_sharded":
        model = query_sharded_field(model)
    return jax.jit(lambda x: model(0.0, x))


def _direct_field(beta, kb, qb, form):
    """The same field (Q = K = V = I) through jaxdyn's blocked kernel with a forced block
    step formulation."""
    import jax

    import jaxdyn
    from jaxdyn.kernels import blocked

    def f(x):
        m = blocked(beta * x, x, "softmax", k_block=kb, q_block=qb, formulation=form)
        return jaxdyn.sphere.tangent_project(x, m)

    return jax.jit(f)


def probe(args):
    """Time the blocked kernel's formulations and block sizes at one N; pick the best."""
    import jax

    from common import fmt_s, machine_info, time_call, write_json

    n = args.probe_n
    on_cpu = jax.default_backend() == "cpu"
    if on_cpu:
        blocks = [(64, 128), (256, 4096)] if n <= 4096 else [(256, 4096), (512, 4096), (256, 1024)]
    else:
        blocks = [(8192, 32768), (4096, 65536), (16384, 65536), (2048, 16384)]
    x = jax.device_put(points(n, args.d, seed=1))
    rows = []
    for form in ("fused", "dot"):
        for kb, qb in blocks:
            fn = _direct_field(args.beta, kb, qb, form)
            try:
                stats, _ = time_call(fn, x, reps=3, warmup=1, max_seconds=10)
            except Exception as e:
                rows.append({"formulation": form, "k_block": kb, "q_block": qb, "error": repr(e)[:300]})
                print(f"  {form} kb={kb} qb={qb}: failed {repr(e)[:120]}", flush=True)
                continue
            rows.append({"formulation": form, "k_block": kb, "q_block": qb, **stats,
                         "pairs_per_s": n * n / stats["median_s"]})
            print(f"  {form:>5} kb={kb:>6} qb={qb:>6}: {fmt_s(stats['median_s']):>10} "
                  f"(first {fmt_s(stats['compile_s'])}), {n * n / stats['median_s'] / 1e9:.1f}·10⁹ pairs/s",
                  flush=True)
    ok = [r for r in rows if "median_s" in r]
    best = min(ok, key=lambda r: r["median_s"]) if ok else None
    write_json(f"gpu_probe{args.tag}", {"n": n, "d": args.d, "beta": args.beta, "rows": rows,
                                          "best": best, "machine": machine_info()})
    return best


def _torch_fn(d, beta, device):
    import torch

    def f(x):
        a = torch.softmax(beta * (x @ x.T), dim=-1)
        m = a @ x
        return m - (m * x).sum(-1, keepdim=True) * x

    return f


def _numpy_fn(beta):
    import numpy as np

    def f(x):
        l = beta * (x @ x.T)
        l -= l.max(axis=1, keepdims=True)
        np.exp(l, out=l)
        m = (l @ x) / l.sum(axis=1, keepdims=True)
        return m - (m * x).sum(-1, keepdims=True) * x

    return f


def _keops_fn(beta):
    from pykeops.torch import LazyTensor

    def f(x):
        xi = LazyTensor(x[:, None, :])
        xj = LazyTensor(x[None, :, :])
        m = (beta * (xi | xj)).sumsoftmaxweight(xj, axis=1)
        return m - (m * x).sum(-1, keepdim=True) * x

    return f


def worker(args):
    """Run one implementation over the N list; print a JSON line per N."""
    from common import hwm_bytes, peak_rss_bytes, reset_peak_rss, rss_bytes, time_call, torch_sync

    impl, _, threads = args.worker.partition("@")
    ns = [int(v) for v in args.ns.split(",")]
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    d, beta = args.d, args.beta
    reps = args.reps or 5
    gpu_jax = False
    if impl.startswith("jax"):
        import jax

        fn = _jax_fn(impl, d, beta)
        gpu_jax = jax.default_backend() != "cpu"
        to_in = lambda a: jax.device_put(a)
        sync = None
        ndev = jax.device_count() if impl == "jaxdyn_sharded" else 1
    elif impl in ("torch", "keops"):
        import torch

        dev = args.torch_device if impl == "torch" else "cpu"
        fn = _torch_fn(d, beta, dev) if impl == "torch" else _keops_fn(beta)
        to_in = lambda a: torch.as_tensor(a, device=dev)
        sync = torch_sync(dev)
        ndev = 1
    else:
        fn = _numpy_fn(beta)
        to_in = lambda a: a
        sync = lambda r: r
        ndev = 1
    # Warm-up on a small problem so imports, thread pools and (KeOps) compilation are in
    # the baseline.
    small = to_in(points(256, d))
    (sync or _jax_sync)(fn(small))
    base_rss = rss_bytes()
    from common import cpu_isa

    # the ISA XLA targets in this worker process (its XLA_FLAGS are the parent's)
    print(json.dumps({"impl": args.worker, "baseline_rss_bytes": base_rss, "devices": ndev,
                      "isa": cpu_isa(), "xla_flags": os.environ.get("XLA_FLAGS", "")}),
          flush=True)
    spent = 0.0
    prev_t = None
    for n in ns:
        rec = {"impl": args.worker, "n": n}
        dense_bytes = 3 * 4 * n * n
        if impl in ("jax_dense", "torch", "numpy") and dense_bytes > args.mem_cap_gb * 2**30:
            rec["skipped"] = f"dense working set ~{dense_bytes / 2**30:.1f} GiB > cap {args.mem_cap_gb} GiB"
            print(json.dumps(rec), flush=True)
            continue
        if prev_t is not None and prev_t * 4 > args.time_cap:
            rec["skipped"] = f"predicted {prev_t * 4:.1f} s per evaluation > cap {args.time_cap} s"
            print(json.dumps(rec), flush=True)
            continue
        if spent > args.budget:
            rec["skipped"] = f"time budget {args.budget} s spent"
            print(json.dumps(rec), flush=True)
            continue
        x = to_in(points(n, d, seed=1))
        if impl.startswith("jax"):
            try:
                import jax

                c = jax.jit(fn).lower(x).compile()
                ma = c.memory_analysis()
                if ma is not None:
                    rec["xla_bytes"] = int(ma.argument_size_in_bytes + ma.output_size_in_bytes
                                           + ma.temp_size_in_bytes - ma.alias_size_in_bytes)
                    rec["xla_temp_bytes"] = int(ma.temp_size_in_bytes)
            except Exception as e:  # memory analysis is best-effort
                rec["xla_bytes_error"] = repr(e)[:200]
        if gpu_jax:
            dev0 = jax.devices()[0]
            try:
                dev0.memory_stats()  # touch
            except Exception:
                pass
        if impl == "torch" and str(args.torch_device).startswith("cuda"):
            import torch

            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        sync_ = sync or _jax_sync
        try:
            # First call (compilation for JAX, kernel generation for KeOps): timed and
            # memory-measured on its own, then the steady state.
            base = rss_bytes()
            can_reset = reset_peak_rss()
            t1 = time.perf_counter()
            out = sync_(fn(x))
            first = time.perf_counter() - t1
            if can_reset:
                rec["rss_peak_delta_first_call_bytes"] = max(0, hwm_bytes() - base)
            base = rss_bytes()
            can_reset = reset_peak_rss()
            stats, out = time_call(fn, x, reps=reps if n <= 2**14 else max(2, reps // 2),
                                   warmup=0, sync=sync_, max_seconds=max(1.0, args.time_cap))
            stats["compile_s"] = first
            if can_reset:
                rec["rss_peak_delta_bytes"] = max(0, hwm_bytes() - base)
                rec["rss_method"] = "VmHWM reset before the timed calls (after the first call)"
            else:
                rec["rss_peak_delta_bytes"] = max(0, peak_rss_bytes() - base_rss)
                rec["rss_method"] = "ru_maxrss above the post-warm-up RSS"
        except Exception as e:  # out of memory, KeOps build failure, ...
            rec["error"] = repr(e)[:300]
            print(json.dumps(rec), flush=True)
            continue
        spent += time.perf_counter() - t0
        rec.update(stats)
        prev_t = stats["median_s"]
        if gpu_jax:
            try:
                rec["gpu_peak_bytes"] = int(jax.devices()[0].memory_stats()["peak_bytes_in_use"])
            except Exception:
                pass
        if impl == "torch" and str(args.torch_device).startswith("cuda"):
            import torch

            rec["gpu_peak_bytes"] = int(torch.cuda.max_memory_allocated())
        # A checksum against a float64 reference on a few rows keeps everyone honest.
        import numpy as np

        o = np.asarray(out.cpu() if hasattr(out, "cpu") else out)[:8].astype(np.float64)
        xr = points(n, d, seed=1).astype(np.float64)
        l = beta * xr[:8] @ xr.T
        w = np.exp(l - l.max(1, keepdims=True))
        m = (w @ xr) / w.sum(1, keepdims=True)
        ref = m - (m * xr[:8]).sum(-1, keepdims=True) * xr[:8]
        rec["max_abs_err_8rows"] = float(np.max(np.abs(o - ref)))
        print(json.dumps(rec), flush=True)
        del x, out


def _set_omp_threads(k):
    """Set the OpenMP thread count of the system libgomp (KeOps's runtime) for this thread."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1").omp_set_num_threads(int(k))
        return True
    except OSError:
        return False


def headline(n, impls, args):
    """All implementations at one N in this process, timed in interleaved rounds (they share
    the machine's load drift); thread variants switched in-process (torch.set_num_threads,
    omp_set_num_threads for KeOps)."""
    import jax

    from common import fmt_s, interleaved, torch_sync

    x_np = points(n, args.d, seed=1)
    specs = {}
    for impl in impls:
        lib, _, k = impl.partition("@")
        if lib.startswith("jax"):
            if lib == "jax_dense" and 3 * 4 * n * n > args.mem_cap_gb * 2**30:
                continue
            f = _jax_fn(lib, args.d, args.beta)
            x = jax.device_put(x_np)
            specs[impl] = {"fn": (lambda f=f, x=x: f(x))}
        elif lib in ("torch", "keops"):
            import torch

            dev = args.torch_device if lib == "torch" else "cpu"
            if lib == "torch" and 3 * 4 * n * n > args.mem_cap_gb * 2**30:
                continue
            try:
                f = _torch_fn(args.d, args.beta, dev) if lib == "torch" else _keops_fn(args.beta)
            except ImportError as e:  # a baseline not installed: the others still run
                print(f"  {impl}: skipped ({e})", flush=True)
                continue
            x = torch.as_tensor(x_np, device=dev)
            threads = int(k) if k else None
            default = torch.get_num_threads()

            def setup(lib=lib, threads=threads, default=default):
                if lib == "torch":
                    torch.set_num_threads(threads or default)
                else:
                    _set_omp_threads(threads or default)

            specs[impl] = {"fn": (lambda f=f, x=x: f(x)), "sync": torch_sync(dev), "setup": setup}
    print(f"head-to-head at N={n}, {args.headline_rounds} interleaved rounds:", flush=True)
    res = interleaved(specs, reps=args.headline_rounds, drop_factor=4.0)
    out = {"n": n, "rounds": args.headline_rounds, "impl": {}}
    for k, r in res.items():
        r.pop("out", None)
        out["impl"][k] = r
        cpu = f", CPU {fmt_s(r['cpu_median_s'])}" if "cpu_median_s" in r else ""
        print(f"  {k:>15}: median {fmt_s(r['median_s']):>10} (min {fmt_s(r['min_s'])}){cpu}"
              + (" [dropped]" if r["dropped"] else ""), flush=True)
    return out


def _jax_sync(r):
    import jax

    return jax.block_until_ready(r)


# ------------------------------------------------------------------------------ driver


def run_impl(impl, ns, args):
    import subprocess

    from common import HERE, ROOT

    cmd = [sys.executable, str(HERE / "bench_large_n.py"), "--worker", impl,
           "--ns", ",".join(map(str, ns)), "--d", str(args.d), "--beta", str(args.beta),
           "--time-cap", str(args.time_cap), "--mem-cap-gb", str(args.mem_cap_gb),
           "--budget", str(args.budget), "--torch-device", args.torch_device]
    if args.reps:
        cmd += ["--reps", str(args.reps)]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + str(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    if "@" in impl:
        k = impl.partition("@")[2]
        env.update(OMP_NUM_THREADS=k, MKL_NUM_THREADS=k, OPENBLAS_NUM_THREADS=k)
    if impl != "jaxdyn_sharded":
        # The single-device implementations see the machine as one device; JAX and the
        # baselines still use every core their libraries' thread pools take.
        env["JAXDYN_NO_HOST_DEVICES"] = "1"
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          timeout=args.budget * 3 + 600)
    recs = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    head = recs[0] if recs and "baseline_rss_bytes" in recs[0] else {}
    rows = [r for r in recs if "n" in r]
    out = {"rows": rows, "wall_s": time.perf_counter() - t0, **{k: v for k, v in head.items()
                                                                 if k != "impl"}}
    if proc.returncode != 0:
        out["error"] = (proc.stderr or "")[-2500:]
    return out


def main(argv=None):
    args = setup(P, argv)
    if args.worker:
        return worker(args)
    if args.probe:
        return probe(args)
    if args.tiny:
        args.min_log2n, args.max_log2n, args.budget = 6, 8, 20.0
    import jax

    from common import fmt_s, machine_info, write_json

    ns = [2**k for k in range(args.min_log2n, args.max_log2n + 1)]
    on_cpu = jax.default_backend() == "cpu"
    impls = []
    for i in [i for i in args.impls.split(",") if i]:
        if i in ("torch", "numpy", "keops") and (on_cpu or i != "torch" or args.torch_device == "cpu"):
            for k in [int(v) for v in args.baseline_threads.split(",") if v != ""]:
                impls.append(i if k == 0 else f"{i}@{k}")
        else:
            impls.append(i)
    result = {"d": args.d, "beta": args.beta, "ns": ns, "machine": machine_info(), "impl": {},
              "memory_note": ("rss_peak_delta_bytes: peak RSS (VmHWM reset right before the "
                              "timed calls) minus RSS then, one subprocess per implementation; "
                              "rss_peak_delta_first_call_bytes: the same over the first call "
                              "(includes compilation); xla_bytes: XLA memory analysis of the compiled "
                              "function (arguments + outputs + temporaries); gpu_peak_bytes: "
                              "the device allocator's peak")}
    for impl in impls:
        if impl.partition("@")[0] in ("numpy", "keops") and not on_cpu:
            continue
        print(f"{impl}: N = {ns[0]} … {ns[-1]}", flush=True)
        r = run_impl(impl, ns, args)
        result["impl"][impl] = r
        for row in r["rows"]:
            if "median_s" in row:
                mem = row.get("gpu_peak_bytes", row.get("rss_peak_delta_bytes", 0)) / 2**20
                print(f"  N={row['n']:>8}: {fmt_s(row['median_s']):>10}  mem {mem:9.1f} MiB  "
                      f"err {row.get('max_abs_err_8rows', float('nan')):.1e}", flush=True)
            else:
                print(f"  N={row['n']:>8}: {row.get('skipped') or row.get('error')}", flush=True)
        if "error" in r:
            print(f"  {impl} worker failed: {r['error'][-600:]}", flush=True)
        _ratios(result)
        write_json(f"large_n{args.tag}", result)  # partial results survive a timeout
    if args.headline_n and not args.tiny or (args.tiny and args.headline_n):
        hn = args.headline_n if not args.tiny else 2 ** args.max_log2n
        result["headline"] = headline(hn, impls, args)
    _ratios(result)
    name = f"large_n{args.tag}"
    write_json(name, result)
    if not args.no_plot:
        plot(result, name)
    return result


def _times(result, impl):
    return {r["n"]: r["median_s"] for r in result["impl"].get(impl, {}).get("rows", [])
            if "median_s" in r}


def _best_times(result, lib):
    """Per N, the fastest of a library's thread variants (lib, lib@1, ...)."""
    best = {}
    for impl in result["impl"]:
        if impl.partition("@")[0] == lib:
            for n, t in _times(result, impl).items():
                best[n] = min(t, best.get(n, float("inf")))
    return best


def _ratios(result):
    """Speed-ups of the jaxdyn implementations against each baseline (its fastest thread
    variant), per N."""
    ratios = {}
    for j in ("jax_blocked", "jaxdyn_sharded", "jax_dense"):
        tj = _times(result, j)
        for b in ("torch", "keops", "numpy", "jax_dense"):
            if b == j:
                continue
            tb = _best_times(result, b)
            common_n = sorted(set(tj) & set(tb))
            if common_n:
                ratios[f"{j}_vs_{b}"] = {n: tb[n] / tj[n] for n in common_n}
    result["speedups"] = ratios


def plot(result, name):
    from common import plt, save_figure

    pyplot = plt()
    fig, axs = pyplot.subplots(1, 3, figsize=(15, 4.2))
    for impl in result["impl"]:
        t = _times(result, impl)
        if t:
            ns = sorted(t)
            axs[0].loglog(ns, [t[n] for n in ns], marker="o", label=impl, base=2)
        rows = [r for r in result["impl"][impl]["rows"] if "median_s" in r]
        if rows and "@" not in impl:
            key = "gpu_peak_bytes" if "gpu_peak_bytes" in rows[0] else "rss_peak_delta_bytes"
            floor = 1 / 16  # MiB: RSS growth below this reads as noise (allocator reuse)
            line, = axs[2].loglog([r["n"] for r in rows],
                                  [max(r.get(key, 0) / 2**20, floor) for r in rows], marker="o",
                                  label=f"{impl} ({'GPU allocator' if key.startswith('gpu') else 'RSS'})",
                                  base=2)
            if any("xla_bytes" in r for r in rows):
                axs[2].loglog([r["n"] for r in rows if "xla_bytes" in r],
                              [max(r["xla_bytes"] / 2**20, floor) for r in rows if "xla_bytes" in r],
                              ls="--", color=line.get_color(), base=2, label=f"{impl} (XLA analysis)")
    axs[0].set_xlabel("N")
    axs[0].set_ylabel("seconds per field evaluation (median)")
    axs[0].legend(fontsize=7)
    for key, v in result.get("speedups", {}).items():
        if key.endswith(("_vs_torch", "_vs_keops")) and not key.startswith("jax_dense"):
            ns = sorted(int(n) for n in v)
            axs[1].semilogx([n for n in ns], [v[n] if n in v else v[str(n)] for n in ns],
                            marker="o", label=key, base=2)
    axs[1].axhline(1.0, color="gray", lw=0.8)
    axs[1].set_xlabel("N")
    axs[1].set_ylabel("speed-up (baseline time / jaxdyn time, same run)")
    axs[1].legend(fontsize=7)
    axs[2].axhline(1024, color="red", lw=0.8, ls=":", label="1 GiB")
    axs[2].set_xlabel("N")
    axs[2].set_ylabel("peak memory, MiB (measured)")
    axs[2].legend(fontsize=7)
    m = result["machine"]
    fig.suptitle(f"field evaluation, d={result['d']}, β={result['beta']} · {m.get('cpu_model', '')}"
                 f" · {m['device_count']} {m['backend']} device(s) · {m['date']}", fontsize=8)
    save_figure(fig, name)


if __name__ == "__main__":
    main(sys.argv[1:])
