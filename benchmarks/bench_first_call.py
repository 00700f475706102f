"""First call (compilation + run) against a warm call of two jitted paths, per checkout.

The first call of ``solve_moments_batch`` (the ``bench_moments`` workload:
4096 sets, d = 3, float64) and of ``reach`` (d = 8, zero controls, L-BFGS, one random target,
no verification) against another revision's (the target: at most a quarter of its compile time). Each
tree is run in its own subprocess (``PYTHONPATH`` = the tree), the trees interleaved
(``--rounds``); per call the wall time and the process CPU time (less disturbed by other
load) are recorded; "compile" is first call − warm call.

    python benchmarks/bench_first_call.py --before d9541bb --trees . --rounds 2 [--which moments reach]

``--before COMMIT`` extracts ``git archive COMMIT`` of this repository into a temporary folder
and runs it as the first tree (the code before); ``--trees`` adds checkouts by path. A child
that fails is recorded with its error (the JSON is written whatever happens). Writes
``benchmarks/runs/first_call.json`` (``--name``), with ``machine_info()`` and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

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


def _archive(commit):
    """``git archive`` of ``commit`` (this repository) in a temporary folder: its path."""
    root = Path(__file__).resolve().parent.parent
    dest = Path(tempfile.mkdtemp(prefix=f"jaxdyn-before-{commit[:10]}-"))
    tar = subprocess.run(["git", "-C", str(root), "archive", commit], check=True,
                         capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return str(dest)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default=None, help="a commit of this repository: the code before")
    p.add_argument("--trees", nargs="*", default=["."])
    p.add_argument("--which", nargs="+", default=["moments", "reach"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--name", default="first_call")
    args = p.parse_args(argv)
    trees = [str(Path(t).resolve()) for t in args.trees]
    labels = {t: t for t in trees}
    if args.before:
        b = _archive(args.before)
        trees.insert(0, b)
        labels[b] = f"before ({args.before})"
    rows = []
    for r in range(args.rounds):
        for which in args.which:
            order = trees if r % 2 == 0 else trees[::-1]
            for tree in order:
                env = dict(os.environ, PYTHONPATH=tree, PYTHONDONTWRITEBYTECODE="1")
                c0 = os.times()
                proc = subprocess.run([sys.executable, "-c", CHILD, tree, which], env=env,
                                      capture_output=True, text=True, cwd="/tmp")
                c1 = os.times()
                line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                load = os.getloadavg()
                if not line:
                    rows.append(dict(round=r, which=which, tree=labels[tree], error=proc.stderr[-3000:],
                                     load_avg=load))
                    print(f"[{r}] {which:8s} {labels[tree]}: FAILED\n{proc.stderr[-1500:]}", flush=True)
                    continue
                out = json.loads(line[0][7:])
                row = dict(round=r, which=which, tree=labels[tree], **out,
                           compile_cpu_s=out["first"]["cpu_s"] - out["warm"]["cpu_s"],
                           compile_wall_s=out["first"]["wall_s"] - out["warm"]["wall_s"],
                           process_cpu_s=(c1.children_user + c1.children_system
                                          - c0.children_user - c0.children_system),
                           load_avg=load)
                rows.append(row)
                print(f"[{r}] {which:8s} {labels[tree]}: first {out['first']['wall_s']:.1f} s wall / "
                      f"{out['first']['cpu_s']:.1f} s CPU, warm {out['warm']['wall_s']:.2f} / "
                      f"{out['warm']['cpu_s']:.2f}, compile ~{row['compile_cpu_s']:.1f} CPU-s "
                      f"(load {load[0]:.1f})", flush=True)
    summary = {}
    for which in args.which:
        per = {}
        for row in rows:
            if row["which"] == which and "compile_cpu_s" in row:
                per.setdefault(row["tree"], []).append(row)
        summary[which] = {t: dict(compile_cpu_s=[x["compile_cpu_s"] for x in v],
                                  warm_cpu_s=[x["warm"]["cpu_s"] for x in v]) for t, v in per.items()}
        if args.before and len(per) >= 2:
            b = per.get(labels[trees[0]])
            for t, v in per.items():
                if t != labels[trees[0]] and b:
                    ratio = (sum(x["compile_cpu_s"] for x in v) / len(v)) / \
                        (sum(x["compile_cpu_s"] for x in b) / len(b))
                    summary[which][t]["ratio_to_before"] = ratio
                    summary[which][t]["target_quarter_met"] = bool(ratio <= 0.25)
                    print(f"{which}: compile {ratio:.2f}x the code before "
                          f"({'met' if ratio <= 0.25 else 'not met'}: target 0.25)")
    try:
        from common import machine_info
        meta = machine_info()
    except Exception as e:  # noqa: BLE001 — the rows are written whatever happens
        meta = dict(machine_info_error=repr(e))
    meta.update(load_avg_end=os.getloadavg(), time=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                before=args.before)
    out = Path(os.environ.get("JAXDYN_BENCH_RESULTS") or Path(__file__).resolve().parent / "runs")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.name}.json"
    path.write_text(json.dumps(dict(meta=meta, summary=summary, rows=rows), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
