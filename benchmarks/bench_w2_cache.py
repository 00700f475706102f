"""Benchmark: the multiscale W2 at large N in a fresh process, twice, with jaxdyn's persistent
compilation cache on (``jaxdyn.enable_compilation_cache``, what the CLI does by default) in one
new, empty folder: the first process compiles and writes, the second loads.

Each process runs ``jaxdyn.w2_sinkhorn(x, y, multiscale=True)`` once (float32; x: clusters near
±e1, ``normalise(±e1 + 0.05 ξ)``, y: a noisy copy, ``normalise(x + 0.05 ξ')``, the
``concentration`` case of ``bench_w2.py`` with its own seed) and reports its wall and CPU time
and ``jaxdyn.compile_stats()`` (trace, lower and backend seconds, cache hits). The W2 values
of the two processes must be identical (the loaded programs are the compiled ones).

    python benchmarks/bench_w2_cache.py [--n 100000] [--name w2_cache_1e5]

Writes ``benchmarks/runs/NAME.json`` and ``NAME.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
import jaxdyn

folder = jaxdyn.enable_compilation_cache(sys.argv[1])
assert folder is not None, "the cache folder could not be created"
n, seed = int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(seed)
unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)
c = np.zeros((n, 3))
c[:, 0] = np.where(rng.random(n) < 0.5, 1.0, -1.0)
x = unit(c + 0.05 * rng.standard_normal((n, 3)))
y = unit(x + 0.05 * rng.standard_normal((n, 3)))
x, y = x.astype(np.float32), y.astype(np.float32)
t, cpu = time.perf_counter(), time.process_time()
r = jaxdyn.w2_sinkhorn(x, y, multiscale=True)
out = {"wall_s": time.perf_counter() - t, "cpu_s": time.process_time() - cpu,
       "w2": float(r.value), "converged": bool(r.converged), "status": str(r.names)}
out.update({k: v for k, v in jaxdyn.compile_stats().items() if isinstance(v, (int, float))})
print("RESULT " + json.dumps(out), flush=True)
"""


def _cpu_flags():
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
        return sorted(f for f in flags if f.startswith(("avx", "fma", "sse4")))
    except (OSError, StopIteration):
        return []


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--name", default="w2_cache")
    p.add_argument("--outdir", default=os.environ.get("JAXDYN_BENCH_RESULTS")
                   or str(Path(__file__).resolve().parent / "runs"))
    a = p.parse_args(argv)
    runs = []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE",
                                                                     "JAX_PERSISTENT_CACHE"))}
    env.pop("JAXDYN_NO_CACHE", None)
    with tempfile.TemporaryDirectory(prefix="jaxdyn-w2-cache-") as cache:
        for i in range(2):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", CHILD, cache, str(a.n), str(a.seed)],
                                  capture_output=True, text=True, env=env)
            line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
            if proc.returncode != 0 or not line:
                raise SystemExit(f"process {i + 1} failed:\n{proc.stderr[-3000:]}")
            r = json.loads(line[0][7:])
            r["process_wall_s"] = time.perf_counter() - t0  # interpreter start and imports too
            runs.append(r)
            print(f"process {i + 1}: W2 {r['w2']:.10g} in {r['wall_s']:.1f} s wall "
                  f"({r['cpu_s']:.1f} CPU-s), compile {r['compile_seconds']:.1f} s, "
                  f"cache hits {r['cache_hits']}/{r['compiles']}", flush=True)
    same = runs[0]["w2"] == runs[1]["w2"]
    res = {"benchmark": "w2_cache", "n": a.n, "seed": a.seed, "dtype": "float32",
           "cpu": platform.processor() or platform.machine(), "cpu_flags": _cpu_flags(),
           "loadavg_after": list(os.getloadavg()), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                          time.gmtime()),
           "runs": runs, "identical_w2": same,
           "second_over_first_wall": runs[1]["wall_s"] / runs[0]["wall_s"],
           "second_over_first_compile": runs[1]["compile_seconds"] / runs[0]["compile_seconds"]}
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{a.name}.json").write_text(json.dumps(res, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    labels = ["first process\n(compiles, writes)", "second process\n(loads)"]
    comp = [r["compile_seconds"] for r in runs]
    rest = [r["wall_s"] - r["compile_seconds"] for r in runs]
    ax.bar(labels, comp, label="trace + lower + compile / load")
    ax.bar(labels, rest, bottom=comp, label="the rest (solve)")
    ax.set_ylabel("wall seconds")
    ax.set_title(f"multiscale W2, N = {a.n}, cache on", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{a.name}.png", dpi=120)
    print(f"identical W2: {same}; wrote {out / (a.name + '.json')} and .png")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
