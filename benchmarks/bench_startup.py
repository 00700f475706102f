"""The first experience, one revision against another, in one run on one machine:

* the CLI's start: ``jaxdyn --help``, ``jaxdyn run --help``, ``jaxdyn config`` (wall and CPU
  seconds of a fresh process, and which heavy modules it imports, by ``-X importtime``);
* the default run ``jaxdyn run`` (wall, CPU seconds, load average): the code before (a
  ``git archive`` of ``--base``, no cache) and now on a first run (an empty compilation
  cache) and a second run (the cache filled by the first); ``compile_seconds`` and
  ``compute_seconds`` from summary.json, and whether the progress bar moved within the chunk;
* one more shipped config (``phase_diagram_s1`` with 16 seeds): compile seconds, first
  and second run;
* ``stack_models`` of 4096 models: ``jnp.stack`` over the device arrays (before) and on the
  host (now); the README Library example's ensemble section;
* ``--configs``: every shipped config (a scaled-down variant of each: fewer particles, a
  shorter horizon, a smaller sweep; ``SMALL`` lists the overrides), run twice into one fresh
  cache each: ``compile_seconds`` of the first and of the second run, their ratio (the
  target: at most 20 %), the programs and cache hits; from a ``git archive`` of HEAD, so that edits
  made meanwhile do not mix in. Writes benchmarks/runs/startup_configs.json.

Every cache lives in a temporary folder (the user's is never touched). Writes
benchmarks/runs/startup.json and startup.png.

    python benchmarks/bench_startup.py [--base main] [--tiny]
    python benchmarks/bench_startup.py --configs [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, add_common_args, save_figure, setup, write_json

HEAVY = ("jax", "jaxlib", "diffrax", "equinox", "ott", "optax", "scipy", "matplotlib", "xarray")


def _children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(cmd, *, code_root, env=None, cwd=None, timeout=3600):
    """One fresh process: wall and CPU seconds (user + system, all threads), exit code, output."""
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JAXDYN_NO_CACHE")}
    e.update({"PYTHONPATH": str(code_root), "OPENBLAS_NUM_THREADS": "1"})
    e.update(env or {})
    c0, t0, load0 = _children_cpu(), time.perf_counter(), os.getloadavg()[0]
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=cwd or code_root,
                       timeout=timeout)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": _children_cpu() - c0, "rc": p.returncode,
            "load_start": load0, "load_end": os.getloadavg()[0],
            "stdout": p.stdout, "stderr": p.stderr}


def heavy_imports(importtime_stderr):
    mods = set()
    for line in importtime_stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", line)
        if m and m.group(1).split(".")[0] in HEAVY:
            mods.add(m.group(1).split(".")[0])
    return sorted(mods)


def cli_rows(code_root, label, reps):
    rows = []
    for argv in (["--help"], ["run", "--help"], ["config"]):
        walls, cpus = [], []
        for _ in range(reps):
            r = run([sys.executable, "-m", "jaxdyn.cli", *argv], code_root=code_root)
            assert r["rc"] == 0, r["stderr"][-2000:]
            walls.append(r["wall_s"])
            cpus.append(r["cpu_s"])
        imp = run([sys.executable, "-X", "importtime", "-m", "jaxdyn.cli", *argv],
                  code_root=code_root)
        rows.append({"code": label, "command": "jaxdyn " + " ".join(argv),
                     "wall_s": sorted(walls)[len(walls) // 2], "cpu_s": sorted(cpus)[len(cpus) // 2],
                     "wall_all_s": walls, "heavy_imports": heavy_imports(imp["stderr"]),
                     "load_end": r["load_end"]})
        print(f"  {label:6s} {rows[-1]['command']:18s} {rows[-1]['wall_s']:6.2f} s wall "
              f"{rows[-1]['cpu_s']:6.2f} s CPU  imports {rows[-1]['heavy_imports']}", flush=True)
    return rows


def experiment(code_root, label, out, args, env):
    r = run([sys.executable, "-m", "jaxdyn.cli", "run", *args, "--out", str(out)],
            code_root=code_root, env=env)
    assert r["rc"] == 0, r["stderr"][-3000:]
    s = json.loads((out / "summary.json").read_text())
    fracs = sorted({float(m) for m in re.findall(r"\b(0\.\d\d)/1 chunks", r["stderr"])})
    row = {"code": label, "wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "load_start": r["load_start"],
           "load_end": r["load_end"], "elapsed_seconds": s.get("elapsed_seconds"),
           "compile_seconds": s.get("compile_seconds"), "compute_seconds": s.get("compute_seconds"),
           "figures_seconds": s.get("figures_seconds"), "compiled_programs": s.get("compiled_programs"),
           "compile_cache_hits": s.get("compile_cache_hits"),
           "progress_fractions_within_chunk": fracs}
    print(f"  {label:14s} {row['wall_s']:7.1f} s wall {row['cpu_s']:7.1f} s CPU  compile "
          f"{row['compile_seconds']} s  load {row['load_start']:.1f}→{row['load_end']:.1f}", flush=True)
    return row


STACK = """
import time, resource, jax, jax.numpy as jnp, numpy as np, jaxdyn
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
I = jnp.eye(3)
N = {n}
ms = [jaxdyn.SphereAttention(I, I, I, b) for b in np.linspace(0.1, 9, N)]
jax.block_until_ready(ms)
out = {{}}
for name, f in (("host", jaxdyn.stack_models), ("jnp_stack", lambda ms: jax.tree.map(lambda *a: jnp.stack(a), *ms))):
    if name == "jnp_stack" and not {old}:
        continue
    c, t = cpu(), time.perf_counter()
    st = jax.block_until_ready(f(ms))
    out[name] = {{"wall_s": time.perf_counter() - t, "cpu_s": cpu() - c}}
# the README Library example's ensemble section (256 systems of 32 particles)
c, t = cpu(), time.perf_counter()
small = jaxdyn.stack_models([jaxdyn.SphereAttention(I, I, I, b) for b in np.linspace(0.1, 9, 256)])
x_small = jax.vmap(lambda k: jaxdyn.sample_sphere(k, 32, 3))(jax.random.split(jax.random.PRNGKey(1), 256))
ens = jaxdyn.simulate_ensemble(small, x_small, t1=30.0, dt=0.1, method="euler")
jax.block_until_ready(ens.xs)
out["readme_ensemble"] = {{"wall_s": time.perf_counter() - t, "cpu_s": cpu() - c}}
import json; print("RESULT" + json.dumps(out))
"""


# Scaled-down variants of the shipped configs (same kind, study and code paths; fewer
# particles, shorter horizons, smaller sweeps) for the first/second-run compile table.
SMALL = {
    "beta_sweep_s2": ["n=256", "t1=4.0"],
    "concentration_d4_plane": ["n=256", "t1=4.0"],
    "concentration_no_metastability": ["n=256", "t1=4.0"],
    "concentration_s2": ["n=256", "t1=4.0"],
    "gaussian_blowup": ["sweep.n=[250, 500]", "sweep.seed=[0, 1]"],
    "gaussian_phase_diagram": ["phase.a=[-2.0, 2.0, 21]", "phase.c=[-2.0, 2.0, 21]"],
    "gaussian_stable": ["sweep.n=[250, 500]", "sweep.seed=[0, 1]"],
    "gaussianity_deit_random": ["batch=4", "seq=64", "layers=2"],
    "gaussianity_minilm": ["batch=4", "seq=32"],
    "gaussianity_modernbert_random": ["batch=2", "seq=64", "layers=2"],
    "minilm_heads": ["t1=2.0", "sweep.head=[-1, 0]"],
    "noisy_metastability": ["t1=10.0", "sweep.seed=[0]", "sweep.sigma=[0.0, 0.2]"],
    "pde_s1_clusters": ["m=128", "t1=20.0", "n_save=21", "particles.cluster_n=2000",
                        "sweep.beta=[2.0, 5.0]", "sweep.seed=[0]", "figure_betas=[2.0]"],
    "pde_s1_merges": ["t1=50.0", "n_save=51", "sweep.beta=[2.0]"],
    "pde_s2": ["n_lat=12", "t1=0.5", "n_save=3", "particles.n=[100]", "particles.repeats=[4]",
               "particles.times=[0.0, 0.5]"],
    "pde_vs_particles": ["m=512", "t1=2.0", "n_save=21", "particles.n=[100, 1000]",
                         "particles.repeats=[4, 4]", "particles.times=[0.0, 2.0]", "particles.timing_m=512"],
    "phase_diagram_s1": ["sweep.seed={range: [0, 16]}"],
    "reach_d2": ["sweep.mode=[all]", "sweep.seed=[0]", "lbfgs_steps=50",
                 "transfer.n_particles=[64]", "transfer.layers=[4]", "transfer.layer_n=64"],
    "reach_d8": ["sweep.mode=[all]", "sweep.seed=[0]", "lbfgs_steps=50",
                 "transfer.n_particles=[64]", "transfer.layers=[4]", "transfer.layer_n=64"],
    "sweep_large": ["t1=2.0", "sweep.n=[128]", "sweep.seed=[0, 1]"],
    "terminal_phase": ["n=256", "t1=4.0"],
    "terminal_phase_readings": ["n=256", "t1=4.0"],
    "variants_heads_causal": ["n=128", "t1=4.0"],
    "variants_layernorm": ["n=64", "t1=4.0"],
}


def _data_differs(a, b):
    """The variables of ``a/data.nc`` that are not bitwise those of ``b/data.nc`` (NaN equal to
    NaN), or ["data.nc missing"]."""
    import numpy as np
    import xarray as xr

    fa, fb = a / "data.nc", b / "data.nc"
    if not (fa.exists() and fb.exists()):
        return ["data.nc missing"]
    with xr.open_dataset(fa, engine="h5netcdf") as da, xr.open_dataset(fb, engine="h5netcdf") as db:
        out = []
        for k in sorted(set(da.variables) | set(db.variables)):
            if k not in da.variables or k not in db.variables:
                out.append(k)
                continue
            x, y = da[k].values, db[k].values
            nan = x.dtype.kind in "fc"
            if x.shape != y.shape or not np.array_equal(x, y, equal_nan=nan):
                out.append(k)
        return out


def config_table(only=None, tag=""):
    """First and second run of every shipped config (scaled down, ``SMALL``), each pair into one
    fresh compilation cache, from a snapshot of HEAD; the JSON is rewritten after every config."""
    from common import machine_info

    tmp = Path(tempfile.mkdtemp(prefix="jaxdyn_configs_"))
    code = tmp / "code"
    code.mkdir()
    arch = subprocess.run(["git", "archive", "HEAD"], capture_output=True, cwd=ROOT, check=True)
    subprocess.run(["tar", "x", "-C", str(code)], input=arch.stdout, check=True)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.strip()
    result = {"machine": machine_info(), "commit": rev, "overrides": SMALL, "rows": []}
    for name in sorted(SMALL):
        if only and name not in only:
            continue
        sets = [a for o in SMALL[name] for a in ("--set", o)]
        cache = {"JAXDYN_CACHE_DIR": str(tmp / f"cache_{name}")}
        row = {"config": name, "overrides": SMALL[name]}
        try:
            runs = [experiment(code, f"{name} {k}", tmp / f"{name}_{k}",
                               [f"configs/{name}.yaml", "--quiet", *sets], cache)
                    for k in ("first", "second")]
        except (AssertionError, subprocess.TimeoutExpired) as e:  # recorded, not fatal
            row["error"] = str(e)[-600:]
            print(f"  {name}: failed ({row['error'][-200:]})", flush=True)
        else:
            # loaded programs must give the compiled ones' numbers: every variable of data.nc
            row["data_differs"] = _data_differs(tmp / f"{name}_first", tmp / f"{name}_second")
            # timings recorded in the data (solve_seconds, ...) differ from run to run
            row["data_differs_beyond_timings"] = [k for k in row["data_differs"]
                                                  if not k.endswith("seconds")]
            first, second = (r["compile_seconds"] for r in runs)
            row.update(first=runs[0], second=runs[1], first_compile_s=first, second_compile_s=second,
                       ratio=second / first if first else None, met=bool(first and second <= 0.2 * first))
            print(f"  {name:32s} compile {first:7.2f} s -> {second:6.2f} s  ratio {row['ratio']:.0%}"
                  f"  programs {runs[1]['compiled_programs']} (hits {runs[1]['compile_cache_hits']})"
                  f"  data {'bitwise the same' if not row['data_differs'] else 'differs: ' + str(row['data_differs'])}",
                  flush=True)
        result["rows"].append(row)
        result["machine"]["loadavg_end"] = os.getloadavg()
        write_json("startup_configs" + tag, result)
    return result


def main():
    p = add_common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--base", default="main", help="git revision of the 'before' code")
    p.add_argument("--skip-before", action="store_true")
    p.add_argument("--configs", action="store_true",
                   help="only the first/second-run compile table of the shipped configs")
    p.add_argument("--only", nargs="*", help="with --configs: these configs only")
    args = setup(p)
    if args.configs:
        config_table(args.only, args.tag)
        return
    from common import machine_info

    reps = args.reps or (1 if args.tiny else 3)
    tmp = Path(tempfile.mkdtemp(prefix="jaxdyn_startup_"))
    result = {"machine": machine_info(), "base": args.base, "tiny": args.tiny}
    before = None
    if not args.skip_before:
        before = tmp / "before"
        before.mkdir()
        rev = subprocess.run(["git", "rev-parse", args.base], capture_output=True, text=True,
                             cwd=ROOT, check=True).stdout.strip()
        arch = subprocess.run(["git", "archive", rev], capture_output=True, cwd=ROOT, check=True)
        subprocess.run(["tar", "x", "-C", str(before)], input=arch.stdout, check=True)
        result["base_commit"] = rev
    print("== CLI start ==", flush=True)
    result["cli"] = ([] if before is None else cli_rows(before, "before", reps)) + cli_rows(ROOT, "now", reps)

    print("== the default run ==", flush=True)
    extra = ["--set", "sweep.beta=[10.0]", "--set", "n=128"] if args.tiny else []
    rows = []
    if before is not None:
        rows.append(experiment(before, "before", tmp / "run_before", ["--quiet", *extra], {}))
    cache = {"JAXDYN_CACHE_DIR": str(tmp / "cache")}
    rows.append(experiment(ROOT, "now, first run", tmp / "run_first", ["--quiet", *extra], cache))
    rows.append(experiment(ROOT, "now, second run", tmp / "run_second", extra, cache))
    result["default_run"] = rows

    print("== phase_diagram_s1 (16 seeds) ==", flush=True)
    cfg = ["configs/phase_diagram_s1.yaml", "--quiet", "--set",
           "sweep.seed={range: [0, %d]}" % (2 if args.tiny else 16)]
    cache2 = {"JAXDYN_CACHE_DIR": str(tmp / "cache2")}
    result["phase_diagram_s1"] = [experiment(ROOT, "now, first run", tmp / "pd_first", cfg, cache2),
                                  experiment(ROOT, "now, second run", tmp / "pd_second", cfg, cache2)]

    print("== stack_models ==", flush=True)
    r = run([sys.executable, "-c", STACK.format(n=256 if args.tiny else 4096, old=True)], code_root=ROOT)
    assert r["rc"] == 0, r["stderr"][-3000:]
    result["stack_models"] = json.loads(r["stdout"].split("RESULT", 1)[1])
    result["stack_models"]["n_models"] = 256 if args.tiny else 4096
    print(" ", result["stack_models"], flush=True)
    result["machine"]["loadavg_end"] = os.getloadavg()

    ratio = [x["compile_seconds"] for x in rows[-2:]]
    pd = [x["compile_seconds"] for x in result["phase_diagram_s1"]]
    result["targets"] = {
        "cli_under_1s": {row["command"]: row["wall_s"] for row in result["cli"] if row["code"] == "now"},
        "second_run_compile_fraction": {"default": ratio[1] / ratio[0], "phase_diagram_s1": pd[1] / pd[0]},
        "default_first_run_wall_s": rows[-2]["wall_s"], "default_first_run_cpu_s": rows[-2]["cpu_s"],
        "stack_models_4096_s": result["stack_models"]["host"]["wall_s"],
        "progress_moves_within_chunk": bool(rows[-1]["progress_fractions_within_chunk"]),
    }
    print(json.dumps(result["targets"], indent=1))
    write_json("startup" + args.tag, result)
    if not args.no_plot:
        plot(result, args.tag)


def plot(result, tag):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    ax = axes[0]
    cmds = [r["command"] for r in result["cli"] if r["code"] == "now"]
    for i, code in enumerate(("before", "now")):
        vals = {r["command"]: r["wall_s"] for r in result["cli"] if r["code"] == code}
        if vals:
            ax.bar([j + 0.4 * i for j in range(len(cmds))], [vals.get(c, 0) for c in cmds], 0.4,
                   label=code)
    ax.axhline(1.0, color="k", ls=":", lw=1)
    ax.set_xticks([j + 0.2 for j in range(len(cmds))], cmds, fontsize=8)
    ax.set_ylabel("wall s")
    ax.set_title("CLI start")
    ax.legend()
    ax = axes[1]
    rows = result["default_run"]
    labels = [r["code"] for r in rows]
    comp = [r["compile_seconds"] or 0 for r in rows]
    ax.bar(labels, [r["wall_s"] for r in rows], color="0.8", label="wall")
    ax.bar(labels, [r["cpu_s"] for r in rows], 0.4, color="C1", label="CPU s")
    ax.bar(labels, comp, 0.2, color="C3", label="compile s")
    ax.axhline(15, color="k", ls=":", lw=1)
    ax.set_title("jaxdyn run (default)")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend()
    ax = axes[2]
    sm = result["stack_models"]
    names = [k for k in ("jnp_stack", "host") if k in sm]
    ax.bar(names, [sm[k]["wall_s"] for k in names])
    ax.set_yscale("log")
    ax.set_title(f"stack_models of {sm['n_models']} models (wall s)")
    fig.tight_layout()
    save_figure(fig, "startup" + tag)


if __name__ == "__main__":
    main()
