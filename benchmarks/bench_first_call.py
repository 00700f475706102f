"""First call (compilation + run) against a warm call of two jitted paths, per checkout.

Issue 18, item 2: the first call of ``solve_moments_batch`` (the ``bench_moments`` workload:
4096 sets, d = 3, float64) and of ``reach`` (d = 8, zero controls, L-BFGS, one random target,
no verification) should compile in at most a quarter of the time of the code before. Each
tree is run in its own subprocess (``PYTHONPATH`` = the tree), the trees interleaved
(``--rounds``); per call the wall time and the process CPU time (less disturbed by other
load) are recorded; "compile" is first call − warm call.

    python benchmarks/bench_first_call.py --trees /path/to/before . --rounds 2 [--which moments reach]

Writes ``benchmarks/results/first_call.json`` (``--name``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r'''
import json, os, sys, time
tree, which = sys.argv[1], sys.argv[2]
sys.path.insert(0, tree); sys.path.insert(0, os.path.join(tree, "benchmarks"))
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
import importlib.util
origin = importlib.util.find_spec("jaxdyn").origin
assert os.path.realpath(origin).startswith(os.path.realpath(tree)), origin
if which == "moments":
    from jaxdyn.gaussian import solve_moments_batch
    from bench_moments import workload
    A, B, V, b, m0, S0 = workload(4096, 0)
    def call():
        s = solve_moments_batch(m0, S0, A=A, B=B, V=V, b=b, t1=1.0)
        return dict(counts=s.counts(), t=np.asarray(s.t_final).tolist()[:0])
else:
    from jaxdyn.control import random_target, reach
    d = 8
    m0, S0 = np.zeros(d), np.eye(d)
    m1, S1 = random_target(0, d)
    def call():
        r = reach(m0, S0, m1, S1, t1=1.0, n_pieces=8, init="zero", adam_steps=0, stop_factor=1.0,
                  tol=1e-4, verify=False, with_certificate=False)
        return dict(iterations=int(r.iterations), w2=float(r.w2_optimizer))
out = {}
for k in ("first", "warm"):
    t0, c0 = time.perf_counter(), time.process_time()
    res = call()
    out[k] = dict(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0, result=res)
print("RESULT " + json.dumps(out))
'''


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", nargs="+", required=True)
    p.add_argument("--which", nargs="+", default=["moments", "reach"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--name", default="first_call")
    args = p.parse_args(argv)
    rows = []
    for r in range(args.rounds):
        for which in args.which:
            trees = args.trees if r % 2 == 0 else args.trees[::-1]
            for tree in trees:
                tree = str(Path(tree).resolve())
                env = dict(os.environ, PYTHONPATH=tree, PYTHONDONTWRITEBYTECODE="1")
                proc = subprocess.run([sys.executable, "-c", CHILD, tree, which], env=env,
                                      capture_output=True, text=True, cwd="/tmp")
                line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                if not line:
                    raise SystemExit(f"{tree} {which} failed:\n{proc.stderr[-3000:]}")
                out = json.loads(line[0][7:])
                row = dict(round=r, which=which, tree=tree, **out,
                           compile_cpu_s=out["first"]["cpu_s"] - out["warm"]["cpu_s"],
                           compile_wall_s=out["first"]["wall_s"] - out["warm"]["wall_s"])
                rows.append(row)
                print(f"[{r}] {which:8s} {tree}: first {out['first']['wall_s']:.1f} s wall / "
                      f"{out['first']['cpu_s']:.1f} s CPU, warm {out['warm']['wall_s']:.2f} / "
                      f"{out['warm']['cpu_s']:.2f}, compile ~{row['compile_cpu_s']:.1f} CPU-s", flush=True)
    meta = dict(load_avg=os.getloadavg(), cpu_count=os.cpu_count(), time=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    try:
        flags = Path("/proc/cpuinfo").read_text()
        meta["cpu"] = next(ln.split(":", 1)[1].strip() for ln in flags.splitlines() if ln.startswith("model name"))
        meta["avx512f"] = " avx512f" in flags
    except (OSError, StopIteration):
        pass
    path = Path(__file__).resolve().parent / "results" / f"{args.name}.json"
    path.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
