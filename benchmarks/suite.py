"""The benchmark suite: its workloads, where their results live, and the generated table.

A workload is one existing ``bench_*.py`` script with its arguments (full, ``--tiny`` and GPU)
and a *headline*: the one jaxdyn time and the one baseline time that the docs table shows,
read from the script's own JSON. The scripts keep their measurements; this module runs
them in a child process, wraps what they wrote with the machine's facts, and stores

    benchmarks/runs/<workload>/<machine kind>-<stamp>.json      (every run; ignored by git)
    benchmarks/results/<workload>/<machine kind>.json           (``--record``: the tracked latest)

(and ``.png`` beside it when the script drew one). A plain run never changes a tracked file;
``--record`` replaces the tracked latest of its machine kind, which the docs table shows. A
``--tiny`` run (a smoke test) is never recorded: ``runs/<workload>/<kind>-<stamp>.tiny.json``.

The machine kind names the hardware a number belongs to: ``cpu-<model>-<cores>c`` (plus
``-<isa>`` when XLA's code generation was capped, ``--max-isa``) or ``gpu-<model>``.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"  # the tracked latest result per workload and machine kind
RUNS = HERE / "runs"        # every run, ignored by git
DOCS_PAGE = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- BEGIN GENERATED BENCHMARKS -->"
END = "<!-- END GENERATED BENCHMARKS -->"


# ---------------------------------------------------------------------------------------------
# headlines: (jaxdyn seconds, what; baseline seconds, what; floor seconds) from a script's JSON
# ---------------------------------------------------------------------------------------------

def _h(jaxdyn_s=None, jaxdyn="", baseline_s=None, baseline="", floor_s=None, note=""):
    out = {"jaxdyn_s": jaxdyn_s, "jaxdyn": jaxdyn, "baseline_s": baseline_s,
           "baseline": baseline, "floor_s": floor_s, "note": note}
    return {k: v for k, v in out.items() if v not in (None, "")}


def _phase(d):
    impl = d["impl"]
    main = "jaxdyn_ensemble" if "jaxdyn_ensemble" in impl else "jaxdyn_sharded"
    t = impl.get("torch_eager") or {}
    w = d.get("workload", {})
    size = f"{w.get('betas')} β × {w.get('systems')} systems × n = {w.get('n')}, {w.get('steps')} steps"
    base = (f"PyTorch eager ({t.get('device', 'cpu')}, {t.get('threads')} thread(s))"
            if t else "")
    return _h(impl[main]["median_s"], f"{main}, {size}", t.get("median_s"), base)


def _large_n(d):
    h = d.get("headline")
    if h:
        impl = h["impl"]
        mine = "jax_blocked" if "jax_blocked" in impl else next(iter(impl))
        torch = [v for k, v in impl.items() if k.partition("@")[0] == "torch" and "median_s" in v]
        best = min(torch, key=lambda v: v["median_s"]) if torch else {}
        return _h(impl[mine]["median_s"], f"{mine}, one field evaluation, N = {h['n']}",
                  best.get("median_s"), "PyTorch eager (faster thread setting)" if best else "")
    rows = {}
    for name, v in d["impl"].items():
        for r in v.get("rows", []):
            if "median_s" in r:
                rows.setdefault(r["n"], {})[name] = r["median_s"]
    n = max(k for k, v in rows.items() if "jax_blocked" in v)
    torch = [s for k, s in rows[n].items() if k.partition("@")[0] == "torch"]
    return _h(rows[n]["jax_blocked"], f"jax_blocked, one field evaluation, N = {n}",
              min(torch) if torch else None, "PyTorch eager" if torch else "")


def _roofline(d):
    rows = [r for r in d["rows"] if r.get("impl") == "jaxdyn_sharded"] or d["rows"]
    r = max(rows, key=lambda r: r["n"])
    return _h(r["median_s"], f"{r['impl']}, one field evaluation, N = {r['n']}",
              floor_s=r.get("floor_s"), note="floor: N² exps at the measured exp rate")


def _moments(d):
    m = d["methods"]
    n = d.get("workload", {}).get("n")
    s = m.get("scipy_dop853") or {}
    return _h(m["jaxdyn"]["seconds_median"], f"solve_moments_batch, {n} sets",
              s.get("seconds"), "SciPy DOP853 loop" if s else "")


def _reach(d):
    r = max(d["rows"], key=lambda r: r["d"])
    t = r.get("torch_scipy_lbfgsb") or {}
    return _h(r["jaxdyn_lbfgs"]["median_s"], f"reach (L-BFGS), d = {r['d']}",
              t.get("median_s"), "PyTorch autograd + SciPy L-BFGS-B" if t else "")


def _pde(d):
    parts = [p for p in d.get("particles", []) if "rk4_step_s" in p]
    p = max(parts, key=lambda p: p["n"]) if parts else {}
    return _h(d["density"]["heun_step_s"], f"density Heun step, M = {d.get('m')}",
              p.get("rk4_step_s"), f"particle RK4 step, N = {p['n']} ({p.get('kind')})" if p else "")


def _w2(d):
    compare = [r for r in d["rows"] if r.get("method") and r.get("wall_s") is not None]
    if compare:  # bench_w2 --compare: jaxdyn against GeomLoss at equal accuracy
        n = max(r["n"] for r in compare if r["method"] == "jaxdyn")
        at_n = {r["method"]: r for r in compare if r["n"] == n}
        j, g = at_n["jaxdyn"], at_n.get("geomloss")
        return _h(j["wall_s"], f"w2_sinkhorn, {j['case']}, N = {n}",
                  g["wall_s"] if g else None, "GeomLoss multiscale Sinkhorn (KeOps)" if g else "",
                  note=f"warm calls; relative error {j['rel_err']:.1e} (GeomLoss "
                       f"{g['rel_err']:.1e})" if g else "")
    rows = [r for r in d["rows"] if not r.get("skipped") and r.get("jaxdyn_s") is not None]
    paired = [r for r in rows if r.get("exact_s") is not None]
    if paired:
        r = max(paired, key=lambda r: (r["case"] == "concentration", r["n"]))
        return _h(r["jaxdyn_s"], f"w2_sinkhorn, {r['case']}, N = {r['n']}",
                  r["exact_s"], "SciPy exact assignment")
    r = max(rows, key=lambda r: r["n"])
    return _h(r["jaxdyn_s"], f"w2_sinkhorn, {r['case']}, N = {r['n']}",
              note="no exact baseline at this N")


def _w2_cache(d):
    first, second = d["runs"][0], d["runs"][1]
    return _h(second["wall_s"], f"w2_sinkhorn N = {d.get('n')}, second process (cache filled)",
              first["wall_s"], "first process (empty cache)")


def _causal(d):
    r = max(d["rows"], key=lambda r: r["n"])
    return _h(r["causal_median_s"], f"causal blocked field, N = {r['n']}",
              r["full_median_s"], "the same without the mask")


def _distributed(d):
    m = d["median"]
    return _h(m["2x1"]["wall_s"], "sweep_large, 2 processes × 1 device",
              m["1x2"]["wall_s"], "1 process × 2 devices")


def _first_call(d):
    s = d["summary"]["moments"]
    before = next((v for k, v in s.items() if k.startswith("before")), None)
    now = next(v for k, v in s.items() if not k.startswith("before"))
    return _h(statistics.median(now["compile_cpu_s"]), "solve_moments_batch compile (CPU s)",
              statistics.median(before["compile_cpu_s"]) if before else None,
              "the revision before" if before else "")


def _startup(d):
    runs = {r["code"]: r for r in d["default_run"]}
    now = runs.get("now, first run") or next(iter(runs.values()))
    before = runs.get("before") or {}
    return _h(now["wall_s"], "`jaxdyn run` (default), first run",
              before.get("wall_s"), "the base revision" if before else "")


def _startup_configs(d):
    rows = [r for r in d["rows"] if "first" in r]
    return _h(sum(r["first"]["wall_s"] for r in rows), f"{len(rows)} shipped configs, first runs")


def _interrupt(d):
    rows = [r for r in d["rows"] if r.get("stop_s") is not None]
    r = max(rows, key=lambda r: r["stop_s"])
    return _h(r["stop_s"], f"the slowest stop after SIGINT of {len(d['rows'])} shipped configs "
              f"at full size ({r['config']})")


def _control_measure(d):
    rows = d["rows"]
    mine = [r for r in rows if not str(r.get("impl", "")).startswith("torch") and r.get("run_s")]
    r = max(mine, key=lambda r: r["n"])
    torch = [t for t in rows if str(t.get("impl", "")).startswith("torch") and t.get("n") == r["n"]
             and t.get("run_s")]
    t = min(torch, key=lambda t: t["run_s"]) if torch else {}
    return _h(r["run_s"], f"{r['impl']}, N = {r['n']}", t.get("run_s"),
              f"PyTorch autograd ({t['impl']})" if t else "")


def _control_kernel(d):
    rows = {r["impl"]: r for r in d["rows"] if r.get("run_s")}
    mine, base = rows["kernel-control"], rows.get("kernel-interaction") or {}
    return _h(mine["run_s"], f"control kernel, one attention gradient, N = {mine['n']}",
              base.get("run_s"), "the blocked interaction kernel" if base else "")


def _local(d):
    """bench_local: jaxdyn's local kernel against KeOps block-sparse (or the dense blocked
    kernel) at the keops case's largest N, β = N; else the field case's largest N alone."""
    c = d["cases"]
    rows = [r for r in (c.get("keops") or {}).get("rows", [])
            if "median_s" in (r.get("impl") or {}).get("jaxdyn_local", {})]
    if rows:
        r = max(rows, key=lambda r: r["n"])
        impl, v = r["impl"], (r.get("jaxdyn_local") or {}).get("visited")
        mine = f"local kernel, attention average, β = N, N = {r['n']}"
        note = f"visited {v:.2g} of the pairs (cap {r['expected_visited']:.2g})" if v else ""
        if "median_s" in impl.get("keops", {}):
            return _h(impl["jaxdyn_local"]["median_s"], mine, impl["keops"]["median_s"],
                      "KeOps block-sparse (clustering and ranges included)", note=note)
        b = impl.get("blocked") or {}
        return _h(impl["jaxdyn_local"]["median_s"], mine, b.get("median_s"),
                  ("dense blocked kernel" + (" (extrapolated from a query subsample)"
                                             if b.get("extrapolated") else "")) if b else "",
                  note=note)
    rows = [r for r in c["field"]["rows"] if "time" in r]
    r = max(rows, key=lambda r: r["n"])
    return _h(r["time"]["median_s"], f"local field evaluation, β = N, N = {r['n']}",
              note=f"visited {r['visited']:.2g} of the pairs (cap {r['expected_visited']:.2g})")


# ---------------------------------------------------------------------------------------------
# the workloads
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Workload:
    """One workload of the suite: a script, its arguments, and how to read its headline."""

    name: str
    script: str
    summary: str
    output: str                      # the stem of the JSON the script writes
    headline: Callable[[dict], dict]
    args: tuple = ()
    tiny_args: tuple = ("--tiny",)
    gpu_args: tuple | None = None    # None: not a GPU workload
    out_args: Callable[[Path], list] | None = None  # redirect the script's output folder
    timeout_s: float | None = None


WORKLOADS = (
    Workload("phase", "bench_phase.py",
             "phase diagram of 8192 small systems on S¹ (published loop) vs PyTorch eager",
             "phase", _phase,
             gpu_args=("--variants", "jax_vmap,jaxdyn_sharded,jaxdyn_ensemble"), timeout_s=None),
    Workload("large_n", "bench_large_n.py",
             "one attention-field evaluation, N = 2¹⁰ … 2¹⁷: time and peak memory vs NumPy, "
             "PyTorch, KeOps", "large_n", _large_n,
             gpu_args=("--impls", "jax_dense,jax_blocked,torch", "--max-log2n", "20",
                       "--min-log2n", "10", "--mem-cap-gb", "48", "--time-cap", "10",
                       "--budget", "50", "--reps", "5", "--headline-rounds", "10")),
    Workload("roofline", "bench_roofline.py",
             "the field evaluation against the machine's exp-bound floor", "roofline",
             _roofline),
    Workload("moments", "bench_moments.py",
             "4096 batched Gaussian moment solves with blow-ups vs a SciPy loop and Euler+PSD",
             "moments_batch", _moments, tiny_args=("--quick",),
             out_args=lambda d: ["--out", str(d / "moments_batch")]),
    Workload("reach", "bench_reach.py",
             "steer N(0, I) to random Gaussian targets (W2 < 1e-4) vs PyTorch + SciPy L-BFGS-B",
             "reach", _reach),
    Workload("pde", "bench_pde.py",
             "one step of the density solver on S¹ vs one particle step", "pde_speed", _pde),
    Workload("w2", "bench_w2.py",
             "Sinkhorn W2 (default ε) to N = 10⁵ vs exact assignment and ott's default",
             "w2_sinkhorn", _w2, tiny_args=("--quick",),
             gpu_args=("--cases", "affine", "concentration", "--sizes", "1000", "4000", "10000",
                       "30000", "100000", "--exact-max", "4000", "--ott-max", "0",
                       "--repeat", "2", "--budget-s", "120"),
             out_args=lambda d: ["--outdir", str(d)]),
    Workload("w2_cache", "bench_w2_cache.py",
             "multiscale W2 at N = 10⁵ in two fresh processes: empty vs filled compilation cache",
             "w2_cache", _w2_cache, tiny_args=("--n", "2000"),
             out_args=lambda d: ["--outdir", str(d)]),
    Workload("causal", "bench_causal.py",
             "a causal blocked attention pass vs a full one", "causal", _causal),
    Workload("distributed", "bench_distributed.py",
             "the sweep_large config in one process × 2 devices vs 2 processes × 1 device",
             "distributed", _distributed),
    Workload("first_call", "bench_first_call.py",
             "first call (compile + run) of solve_moments_batch and reach", "first_call",
             _first_call, tiny_args=("--which", "reach")),
    Workload("startup", "bench_startup.py",
             "the CLI's start and the default `jaxdyn run`, first and second run", "startup",
             _startup),
    Workload("startup_configs", "bench_startup.py",
             "every shipped config: first and second run, compile seconds", "startup_configs",
             _startup_configs, args=("--configs",), tiny_args=("--configs", "--tiny")),
    Workload("interrupt", "interrupt_table.py",
             "every shipped config at full size: seconds from SIGINT to the exit, exit code, "
             "resume", "interrupt", _interrupt, timeout_s=None),
    Workload("control_measure", "bench_control_measure.py",
             "one gradient of measure-to-measure control vs PyTorch autograd",
             "control_measure", _control_measure),
    Workload("control_measure_kernel", "bench_control_measure.py",
             "one attention gradient at N = 10⁴: the control kernel vs the blocked interaction "
             "kernel (time, peak memory)", "control_measure_kernel", _control_kernel,
             args=("--kernel-memory",)),
    Workload("local", "bench_local.py",
             "block-sparse local attention on S², β = N, to N = 10⁷: time, peak RSS, visited "
             "pairs; vs the blocked kernel, auto and KeOps block-sparse", "local", _local,
             gpu_args=("--cases", "field", "--field-ns", "10000000,100000000",
                       "--accuracy-queries", "50")),
)
BY_NAME = {w.name: w for w in WORKLOADS}


# ---------------------------------------------------------------------------------------------
# the machine
# ---------------------------------------------------------------------------------------------

def _slug(s):
    s = re.sub(r"\(r\)|\(tm\)|cpu|processor|@.*$", "", s.lower())
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-")


def _cpuinfo():
    model, flags = None, []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if model is None and line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif not flags and line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    return model, flags


def gpu_name():
    """The first GPU's name from ``nvidia-smi``, or None where there is none."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.splitlines()[0].strip() if out else None


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args):
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def machine_facts(max_isa=None):
    """The facts of the machine and code a run measures.

    Returns:
        CPU model, vector extensions, cores, GPU, library versions, commit (and whether the
        tree differs from it), the XLA ISA cap, load at the start.
    """
    model, flags = _cpuinfo()
    facts = {
        "cpu_model": model,
        "vector_extensions": {f: f in flags for f in ("avx2", "fma", "avx512f", "avx512_vnni",
                                                      "avx512_bf16", "amx_tile")},
        "cpu_count": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "gpu": gpu_name(),
        "python": sys.version.split()[0],
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "commit": _git("rev-parse", "HEAD"),
        "tree_modified": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "xla_max_isa": max_isa,
    }
    try:
        facts["loadavg_start"] = list(os.getloadavg())
    except OSError:
        pass
    return facts


def machine_kind(facts, gpu=False):
    """``gpu-<model>`` for a GPU run, else ``cpu-<model>-<cores>c`` (``-<isa>`` when capped)."""
    if gpu and facts.get("gpu"):
        return "gpu-" + _slug(facts["gpu"])
    cores = facts.get("cores_usable") or facts.get("cpu_count")
    kind = f"cpu-{_slug(facts.get('cpu_model') or 'unknown')}-{cores}c"
    if facts.get("xla_max_isa"):
        kind += "-" + facts["xla_max_isa"].lower()
    return kind


# ---------------------------------------------------------------------------------------------
# running a workload
# ---------------------------------------------------------------------------------------------

def result_path(workload, kind, tiny=False):
    """The tracked latest: benchmarks/results/<workload>/<kind>.json (``.tiny.json``: smoke test)."""
    return RESULTS / workload / (f"{kind}.tiny.json" if tiny else f"{kind}.json")


def output_path(workload, kind, record=False, tiny=False, stamp=None):
    """Where a run's result goes.

    Returns:
        With ``record`` (not for a smoke test), the tracked latest :func:`result_path`;
        otherwise ``benchmarks/runs/<workload>/<kind>-<stamp>[.tiny].json``, ignored by git.

    Raises:
        ValueError: ``record`` with ``tiny`` (a smoke test is never recorded).
    """
    if record and tiny:
        raise ValueError("a --tiny run is a smoke test and is never recorded")
    if record:
        return result_path(workload, kind)
    stamp = stamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return RUNS / workload / (f"{kind}-{stamp}.tiny.json" if tiny else f"{kind}-{stamp}.json")


def headline(workload, data):
    """The workload's headline from a script's JSON; ``{}`` where a field is missing."""
    try:
        return BY_NAME[workload].headline(data)
    except (KeyError, IndexError, TypeError, ValueError, StopIteration):
        return {}


def _run_once(w, extra, tiny, gpu, max_isa, timeout):
    tmp = Path(tempfile.mkdtemp(prefix=f"jaxdyn_bench_{w.name}_"))
    argv = [sys.executable, str(HERE / w.script), *w.args]
    argv += list(w.tiny_args) if tiny else []
    argv += list(w.gpu_args or ()) if gpu else []
    argv += ["--max-isa", max_isa] if max_isa else []
    argv += w.out_args(tmp) if w.out_args else []
    argv += list(extra)
    env = dict(os.environ, JAXDYN_BENCH_RESULTS=str(tmp), PYTHONUNBUFFERED="1")
    env.pop("OUT", None)  # the suite copies the one result file to $OUT itself
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    print("$ " + " ".join(argv[1:]), flush=True)
    t0 = time.perf_counter()
    try:
        rc = subprocess.run(argv, cwd=ROOT, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    wall = time.perf_counter() - t0
    found = sorted(tmp.glob(f"{w.output}*.json"), key=lambda p: len(p.name))
    data = json.loads(found[0].read_text()) if found else None
    pngs = sorted(tmp.glob(f"{w.output}*.png"), key=lambda p: len(p.name))
    png = pngs[0].read_bytes() if pngs else None
    shutil.rmtree(tmp, ignore_errors=True)
    return {"rc": rc, "wall_s": wall, "argv": [Path(a).name if a.endswith(".py") else a
                                               for a in argv[1:]], "data": data, "png": png}


def run(names, tiny=False, rounds=1, gpu=False, max_isa=None, extra=(), timeout=None,
        record=False):
    """Run workloads; write one result file per workload (see :func:`output_path`)."""
    if record and tiny:
        raise ValueError("a --tiny run is a smoke test and is never recorded")
    written = []
    for name in names:
        w = BY_NAME[name]
        facts = machine_facts(max_isa)
        kind = machine_kind(facts, gpu=gpu)
        runs = [_run_once(w, extra, tiny, gpu, max_isa, timeout or w.timeout_s)
                for _ in range(max(1, rounds))]
        try:
            facts["loadavg_end"] = list(os.getloadavg())
        except OSError:
            pass
        ok = [r for r in runs if r["data"] is not None]
        if not ok:
            print(f"{name}: no result (exit {[r['rc'] for r in runs]})", flush=True)
            continue
        heads = [headline(name, r["data"]) for r in ok]
        order = sorted(range(len(ok)), key=lambda i: heads[i].get("jaxdyn_s", float("inf")))
        pick = order[(len(order) - 1) // 2]  # the round with the median jaxdyn time
        rec = {
            "workload": name, "script": w.script, "machine_kind": kind, "tiny": tiny,
            "command": ok[pick]["argv"], "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                               time.gmtime()),
            "machine": facts, "headline": heads[pick],
            "rounds": [{"wall_s": r["wall_s"], "rc": r["rc"], "headline": h}
                       for r, h in zip(ok, heads)],
            "result": ok[pick]["data"],
        }
        local = output_path(name, kind, record=record, tiny=tiny)
        for out_dir in [local.parent.parent] + ([Path(os.environ["OUT"])]
                                                if os.environ.get("OUT") else []):
            path = out_dir / name / local.name
            path.parent.mkdir(parents=True, exist_ok=True)
            tracked = record and out_dir == local.parent.parent
            path.write_text(json.dumps(undated(rec) if tracked else rec, indent=1,
                                       default=str) + "\n")
            if ok[pick]["png"]:
                path.with_suffix(".png").write_bytes(ok[pick]["png"])
            written.append(path)
            print(f"wrote {path}", flush=True)
    if not tiny:
        add_cost([p for p in written if p.parent.parent in (RESULTS, RUNS)])
    return written


# ---------------------------------------------------------------------------------------------
# the cost model: FLOPs, exps and bytes of the headline computation (benchmarks/cost.py), and
# the floor they imply on the machine kind and on an H200
# ---------------------------------------------------------------------------------------------

MACHINES = RESULTS / "machines"  # measured rates of machine kinds without a roofline result


def _cost_child(args, timeout=900):
    env = dict(os.environ, JAXDYN_NO_HOST_DEVICES="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, str(HERE / "cost.py"), *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        print(f"cost.py failed: {p.stderr[-2000:]}", flush=True)
        return None
    return json.loads(lines[-1])


def cost_counts(paths):
    """The cost records of result files, from benchmarks/cost.py in a child process.

    Returns:
        path (str) -> {program, flops, transcendentals, bytes_min, ...} or None.
    """
    return _cost_child([str(p) for p in paths]) or {}


def add_cost(paths):
    """Record the cost model in result files; returns the files changed."""
    paths = [Path(p) for p in paths]
    counts = cost_counts(paths) if paths else {}
    changed = []
    for path in paths:
        c = counts.get(str(path))
        rec = json.loads(path.read_text())
        if c is None and "cost" not in rec:
            continue
        if c is not None and "error" in c:
            print(f"{path.relative_to(ROOT)}: cost not counted ({c['error']})", flush=True)
            continue
        if rec.get("cost") != c:
            if c is None:
                rec.pop("cost", None)
            else:
                rec["cost"] = c
            path.write_text(json.dumps(rec, indent=1, default=str) + "\n")
            changed.append(path)
    return changed


def measure_rates():
    """This machine's exp, matmul and memory rates, measured now (``cost.py --rates``)."""
    return _cost_child(["--rates"], timeout=600)


#: wall-clock stamps that a run writes (its file name under runs/ carries one too): the tracked
#: results identify a run by its commit and machine instead
_STAMPS = ("date", "time", "date_start", "date_end")


def undated(obj):
    """``obj`` (a result record) without its wall-clock stamps, at every depth.

    Returns:
        A copy of the JSON-like ``obj`` without the string values of keys in ``_STAMPS``.
    """
    if isinstance(obj, dict):
        return {k: undated(v) for k, v in obj.items()
                if not (k in _STAMPS and isinstance(v, str))}
    if isinstance(obj, list):
        return [undated(v) for v in obj]
    return obj


def record_rates(kind, rates):
    """Write the measured rates of a machine kind to results/machines/<kind>.json."""
    path = MACHINES / f"{kind}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {"machine_kind": kind, "machine": machine_facts(), "rates": rates}
    path.write_text(json.dumps(rec, indent=1, default=str) + "\n")
    return path


_H200 = {}


def h200_rates():
    """The published H200 rates the cost model uses (benchmarks/cost.py ``H200``)."""
    if not _H200:
        import importlib.util

        spec = importlib.util.spec_from_file_location("jaxdyn_bench_cost", HERE / "cost.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _H200.update(mod.H200)
    return _H200


def machine_rates(kind):
    """The rates of a machine kind.

    Returns:
        {exp_per_s_per_core, matmul_flops_per_s, cores, bytes_per_s (or None), source}: from
        the tracked roofline result of ``kind`` (its exp and matmul probes; the bandwidth from
        results/machines/<kind>.json where measured), else from results/machines/<kind>.json;
        for ``gpu-nvidia-h200`` the published H200 figures; None where none is known.
    """
    if kind.startswith("gpu-nvidia-h200"):
        h = h200_rates()
        return {"exp_per_s_per_core": h["exp_per_s"], "cores": 1,
                "matmul_flops_per_s": h["fp32_flops_per_s"], "bytes_per_s": h["bytes_per_s"],
                "source": "published H200 figures"}
    measured = None
    mpath = MACHINES / f"{kind}.json"
    if mpath.exists():
        measured = json.loads(mpath.read_text()).get("rates")
    path = RESULTS / "roofline" / f"{kind}.json"
    if path.exists():
        rec = json.loads(path.read_text())
        r = rec.get("result", {})
        exp = (r.get("exp_one_core") or {}).get("rate_per_s")
        mm = (r.get("matmul") or {}).get("flops_per_s")
        cores = (rec.get("machine") or {}).get("cores_usable") or (rec.get("machine") or {}).get(
            "cpu_count")
        if exp and mm and cores:
            return {"exp_per_s_per_core": exp, "matmul_flops_per_s": mm, "cores": cores,
                    "bytes_per_s": (measured or {}).get("bytes_per_s"),
                    "source": f"roofline/{kind}.json"}
    if measured:
        return {**{k: measured.get(k) for k in ("exp_per_s_per_core", "matmul_flops_per_s",
                                                 "cores", "bytes_per_s")},
                "source": f"machines/{kind}.json"}
    return None


def floor(cost, rates):
    """The least time ``cost`` takes at ``rates``.

    Returns:
        The largest of the exps at the exp rate of all cores, the FLOPs at the matmul rate
        and the least bytes at the memory bandwidth (where measured), with which one binds;
        None where the counts or the rates are unknown.
    """
    if not cost or not rates or "transcendentals" not in cost or "flops" not in cost:
        return None
    terms = {"exp": cost["transcendentals"] / (rates["exp_per_s_per_core"] * rates["cores"]),
             "flop": cost["flops"] / rates["matmul_flops_per_s"]}
    if rates.get("bytes_per_s") and cost.get("bytes_min") is not None:
        terms["bytes"] = cost["bytes_min"] / rates["bytes_per_s"]
    bound = max(terms, key=terms.get)
    return {"floor_s": terms[bound], "bound": bound, "terms_s": terms}


def cost_floor(kind, rec):
    """The least time the cost model allows on this machine kind (seconds), or None."""
    f = floor(rec.get("cost"), machine_rates(kind))
    return f["floor_s"] if f else None


def h200_floor(rec):
    """The least time the cost model allows on an H200 (published rates), or None."""
    h = h200_rates()
    f = floor(rec.get("cost"), {"exp_per_s_per_core": h["exp_per_s"], "cores": 1,
                                "matmul_flops_per_s": h["fp32_flops_per_s"],
                                "bytes_per_s": h["bytes_per_s"]})
    return f["floor_s"] if f else None


# ---------------------------------------------------------------------------------------------
# the docs table
# ---------------------------------------------------------------------------------------------

def _fmt_s(s):
    if s is None:
        return "—"
    if s < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def committed_results():
    """(workload, kind, record) for every result file in the layout, in the suite's order."""
    out = []
    for w in WORKLOADS:
        for p in sorted((RESULTS / w.name).glob("*.json"), key=lambda p: p.name.split(".")[0]):
            if not p.name.endswith(".tiny.json"):
                out.append((w.name, p.stem, json.loads(p.read_text())))
    return out


def _machine_line(kind, rec):
    m = rec.get("machine", {})
    ext = m.get("vector_extensions") or {}
    isa = ("AVX-512" if ext.get("avx512f") else "AVX2" if ext.get("avx2") else None) if ext else None
    if m.get("xla_max_isa"):
        isa = f"{isa}, XLA capped at {m['xla_max_isa']}" if isa else f"capped at {m['xla_max_isa']}"
    host = "host: " if kind.startswith("gpu-") else ""
    parts = [m.get("gpu") if kind.startswith("gpu-") else None, m.get("cpu_model"),
             isa, f"{host}{m['cpu_count']} cores" if m.get("cpu_count") else None,
             f"jax {m['jax']}" if m.get("jax") else None]
    return ", ".join(p for p in parts if p) or "—"


_SUP = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _fmt_n(x):
    """1.68·10⁷ style; — for None."""
    if x is None:
        return "—"
    if x == 0:
        return "0"
    e = int(f"{x:.2e}".split("e")[1])
    m = x / 10**e
    return f"{m:.2f}·10{str(e).translate(_SUP)}" if e else f"{m:.2f}"


#: the performance targets the detail tables below are read against
W2_TARGET_S, W2_TARGET_N, W2_TARGET_ERR = 60.0, 100_000, 1e-3
CAUSAL_TARGET, MHA_TARGET = 0.6, 1.10
LOCAL_AUTO_TARGET = 1.10  # kernel="auto" / "blocked" at β = 1 (bench_local.AUTO_TARGET)
#: one field at β = N on S²: wall seconds at N; 100 projected-Euler steps at N = 10⁶; the
#: speed-up over the blocked kernel at β = 100, N = 10⁵
LOCAL_FIELD_TARGET_S = {1_000_000: 1.0, 10_000_000: 15.0}
LOCAL_STEPS_TARGET_S, LOCAL_BETA100_TARGET = 180.0, 5.0


def _target_lines(rows):
    """Detail tables: W2 at every N of a ``--compare`` run, the causal / full ratios, and the
    local kernel's cases."""
    def who(kind, rec):  # the machine kind and the commit the run measured (where recorded)
        c = (rec.get("machine") or {}).get("commit")
        return f"`{kind}` ({c[:7]})" if c else f"`{kind}` (commit not recorded)"

    out = []
    w2 = [(k, r) for n, k, r in rows if n == "w2" and any(
        x.get("method") for x in (r.get("result") or {}).get("rows", []))]
    if w2:
        out += ["", "### W2 at large N, against the baselines", "",
                f"Target: at most {W2_TARGET_S:.0f} s wall at N = {W2_TARGET_N:,} on the machine, "
                f"relative error at most {W2_TARGET_ERR:g} against the closed form, and at least "
                "GeomLoss's speed at every N. Warm calls (the first call, compilation included, "
                "apart); one run per machine; a method absent at an N did not run there.", "",
                "| machine (commit) | N | method | wall (warm) | CPU (warm) | first call | relative error "
                "| wall / GeomLoss | target |", "|---|---|---|---|---|---|---|---|---|"]
        for kind, rec in w2:
            rs = [x for x in rec["result"]["rows"] if x.get("method") and x.get("wall_s") is not None]
            geo = {x["n"]: x["wall_s"] for x in rs if x["method"] == "geomloss"}
            for x in sorted(rs, key=lambda x: (x["n"], x["method"] != "jaxdyn", x["method"])):
                vs = f"{x['wall_s'] / geo[x['n']]:.2f}" if x["n"] in geo else "—"
                tgt = "—"
                if x["method"] == "jaxdyn":
                    ok_err = abs(x["rel_err"]) <= W2_TARGET_ERR
                    ok_geo = x["n"] not in geo or x["wall_s"] <= geo[x["n"]]
                    if x["n"] >= W2_TARGET_N:
                        ok_t = x["wall_s"] <= W2_TARGET_S
                        tgt = ("met" if ok_t and ok_err and ok_geo else
                               f"gap: {x['wall_s'] / W2_TARGET_S:.1f}× the {W2_TARGET_S:.0f} s")
                    else:
                        tgt = "met" if ok_err and ok_geo else "not met"
                out.append(f"| {who(kind, rec)} | {x['n']:,} | {x['method']} | {_fmt_s(x['wall_s'])} | "
                           f"{_fmt_s(x['cpu_s'])} | {_fmt_s(x.get('first_wall_s'))} | "
                           f"{x['rel_err']:+.1e} | {vs} | {tgt} |")
    causal = [(k, r) for n, k, r in rows if n == "causal"]
    if causal:
        out += ["", "### Attention variants at the plain kernel's speed", "",
                f"Targets: a causal pass at most {CAUSAL_TARGET} of a full one (N = 4096 and "
                f"16384), and `MultiHeadAttention` with one head and no mask within "
                f"{MHA_TARGET - 1:.0%} of `SphereAttention`. Medians of interleaved rounds.", "",
                "| machine (commit) | N | causal / full (wall) | (CPU) | key-block pairs visited | "
                "MultiHeadAttention / SphereAttention (wall) | (CPU) | targets |",
                "|---|---|---|---|---|---|---|---|"]
        for kind, rec in causal:
            res = rec.get("result") or {}
            for x in res.get("rows", []) if isinstance(res, dict) else []:
                c, cc = x["causal_over_full"], x.get("causal_over_full_cpu")
                m, mc = x.get("full_over_sphere_attention"), x.get("full_over_sphere_attention_cpu")
                worst_c = max(v for v in (c, cc) if v is not None)
                notes = [("causal met" if worst_c <= CAUSAL_TARGET
                          else f"causal: gap {worst_c - CAUSAL_TARGET:+.3f}")]
                if m is not None:
                    worst_m = max(v for v in (m, mc) if v is not None)
                    notes.append("MHA met" if worst_m <= MHA_TARGET else "MHA: not met")

                def f3(v):
                    return "—" if v is None else f"{v:.3f}"

                out.append(f"| {who(kind, rec)} | {x['n']:,} | {f3(c)} | {f3(cc)} | "
                           f"{f3(x.get('key_blocks_visited_fraction'))} | {f3(m)} | {f3(mc)} | "
                           f"{'; '.join(notes)} |")
    local = [(k, r) for n, k, r in rows if n == "local"]
    if local:
        out += ["", "### Local attention", "",
                "Uniform points on S², Q = K = V = I, tol = 1e-6. Visited: the fraction of the N² "
                "pairs the local kernel computed; cap: the crude bound's fraction of S², "
                "log(N / tol) / (2β). Targets: one field at β = N in at most "
                + " and ".join(f"{t:g} s at N = {n:,}" for n, t in LOCAL_FIELD_TARGET_S.items())
                + f"; {100} projected-Euler steps at N = 10⁶, β = N, in at most "
                f"{LOCAL_STEPS_TARGET_S:.0f} s (the ordering rebuilt in every evaluation); at "
                f"least {LOCAL_BETA100_TARGET:g}× the blocked kernel's speed at β = 100, "
                "N = 10⁵; `kernel=\"auto\"` at most "
                f"{LOCAL_AUTO_TARGET:.2f}× the blocked kernel at β = 1 (wall and CPU). Medians of "
                "interleaved rounds (the steps: one timed run, compilation apart); the relative "
                "error is the largest over the sampled queries against a float64 reference.", "",
                "| machine (commit) | case | N | β | local | baseline | baseline / local | visited "
                "| cap | relative error | target |", "|---|---|---|---|---|---|---|---|---|---|---|"]

        def f3(v):
            return "—" if v is None else f"{v:.3g}"

        for kind, rec in local:
            c = (rec.get("result") or {}).get("cases") or {}
            lines = []
            for x in (c.get("field") or {}).get("rows", []):
                if "time" in x:
                    t, goal = x["time"]["median_s"], LOCAL_FIELD_TARGET_S.get(x["n"])
                    tgt = ("—" if goal is None else "met" if t <= goal
                           else f"gap: {t / goal:.2f}× the {goal:g} s")
                    lines.append(("field", x["n"], x["beta"], t, None, "—",
                                  x.get("visited"), x.get("expected_visited"),
                                  (x.get("accuracy") or {}).get("local_vs_f64", {}).get("max"), tgt))
            steps = c.get("steps") or {}
            for x in steps.get("rows", [steps]):
                if "wall_s" in x:
                    t = x["wall_s"]
                    lines.append((f"{x['steps']} Euler steps", x["n"], x["beta"], t, None, "—",
                                  x.get("visited_start"), x.get("expected_visited"), None,
                                  "met" if t <= LOCAL_STEPS_TARGET_S and x.get("final_finite")
                                  else f"gap: {t / LOCAL_STEPS_TARGET_S:.2f}× the "
                                       f"{LOCAL_STEPS_TARGET_S:.0f} s"))
            for case in ("beta100",):
                x = c.get(case) or {}
                if "impl" in x:
                    speed = x["impl"]["blocked"]["median_s"] / x["impl"]["local"]["median_s"]
                    lines.append((case, x["n"], x["beta"], x["impl"]["local"]["median_s"],
                                  x["impl"]["blocked"]["median_s"], "blocked", x.get("visited"),
                                  x.get("expected_visited"),
                                  (x.get("accuracy") or {}).get("local_vs_f64", {}).get("max"),
                                  "met" if speed >= LOCAL_BETA100_TARGET else
                                  f"gap: {speed:.2f}× of {LOCAL_BETA100_TARGET:g}×"))
            for x in (c.get("auto") or {}).get("rows", []):
                if "impl" in x:
                    worst = max(v for v in (x["auto_over_blocked"], x.get("auto_over_blocked_cpu"))
                                if v is not None)
                    lines.append(("auto (β = 1; local column: auto)", x["n"], x["beta"],
                                  x["impl"]["auto"]["median_s"],
                                  x["impl"]["blocked"]["median_s"], "blocked", None, None, None,
                                  "met" if worst <= LOCAL_AUTO_TARGET else f"gap: {worst:.3f}×"))
            for x in (c.get("keops") or {}).get("rows", []):
                impl = x.get("impl") or {}
                mine = impl.get("jaxdyn_local", {}).get("median_s")
                for base, label in (("keops", "KeOps block-sparse"), ("blocked", "blocked")):
                    if "median_s" in impl.get(base, {}):
                        ext = " (extrapolated)" if impl[base].get("extrapolated") else ""
                        lines.append(("keops", x["n"], x["beta"], mine, impl[base]["median_s"],
                                      label + ext, (x.get("jaxdyn_local") or {}).get("visited"),
                                      x.get("expected_visited"), ((x.get("jaxdyn_local") or {}).get(
                                          "accuracy") or {}).get("local_vs_f64", {}).get("max"), "—"))
            for case, n, beta, mine, base, label, vis, cap, err, tgt in lines:
                ratio = f"{base / mine:.2f}" if mine and base else "—"
                out.append(f"| {who(kind, rec)} | {case} | {n:,} | {beta:g} | {_fmt_s(mine)} | "
                           f"{_fmt_s(base) + ': ' + label if base is not None else '—'} | {ratio} | "
                           f"{f3(vis)} | {f3(cap)} | {'—' if err is None else f'{err:.1e}'} | {tgt} |")
            for x in ((c.get("scan") or {}).get("crossover") or []):
                if x.get("beta"):
                    out.append(f"| {who(kind, rec)} | scan: local = blocked | {x['n']:,} | "
                               f"{x['beta']:.3g} | — | — | 1 | {f3(x['visited'])} | — | — | — |")
        for kind, rec in local:
            heads = [r["headline"].get("jaxdyn_s") for r in rec.get("rounds") or []]
            heads = [h for h in heads if h is not None]
            if len(heads) > 1:
                out += ["", f"{who(kind, rec)}: {len(heads)} rounds of the whole script; the rows "
                        f"are the round whose headline ({rec['headline'].get('jaxdyn')}) is the "
                        f"median, which ranged {_fmt_s(min(heads))}–{_fmt_s(max(heads))} over the "
                        "rounds (the other rounds' rows are not kept; this spread shows how much "
                        "a row can move from one round to the next on that machine)."]
        if not any(kind.startswith("gpu-") for kind, _ in local):
            out += ["", "No GPU has measured the local kernel yet: `bash benchmarks/gpu_local.sh` "
                    "runs its field at N = 10⁷ and 10⁸ in one device call and records it here."]
    return out


def _interrupt_lines(rows):
    """Detail table: every shipped config's time to stop after SIGINT (``interrupt``)."""
    out, measured = [], set()
    for name, kind, rec in rows:
        if name != "interrupt":
            continue
        res = rec.get("result") or {}
        measured.update(r["config"] for r in res.get("rows") or [])
        c = (rec.get("machine") or {}).get("commit") or (res.get("machine") or {}).get("commit")
        out += ["", f"### Time to stop after SIGINT (`{kind}`"
                f"{', ' + c[:7] if c else ''})", "",
                f"Shipped configs at full size, each a first run (an empty compilation cache): "
                f"SIGINT {res.get('delay_s', 0):g} s after the bar first moved within a chunk "
                f"(or {res.get('compute_wait_s', 0):g} s after the plan line if it had not: a "
                f"compilation, or a chunk without progress inside it), then the seconds to the "
                f"process's exit (target: at most {res.get('target_s', 30):g} s), the exit code "
                f"(130: interrupted), where the bar stood, whether the watchdog ended a held "
                f"signal (hard stop), the chunks kept, and whether `--resume` took the folder "
                f"(its own stop, {res.get('resume_delay_s', 0):g} s after its plan line, timed "
                f"too). The machine's state at the run is in its result file.", "",
                "| config | stop | exit | at the signal | hard stop | chunks kept | resumes "
                "(its stop) |", "|---|---|---|---|---|---|---|"]
        for r in res.get("rows") or []:
            if r.get("finished_before_signal"):
                stop, where = "— (finished first)", "—"
            else:
                stop = f"{r['stop_s']:.1f} s" if r.get("stop_s") is not None else \
                    r.get("error", "—")
                where = re.sub(r"^jaxdyn:\s*", "", r.get("bar_at_signal") or "—")
                where = re.sub(r"\s*\d+%\|[^|]*\|\s*", " ", where).replace("|", "/").strip()
            if r.get("finished_first"):  # run again, signalled soon after its plan line
                where = (f"{where or '—'} (run again, signalled {r.get('retry_delay_s', 1):g} s "
                         "after the plan line: the first run finished before its signal)")
            summ = r.get("summary") or {}
            kept = f"{r.get('chunk_files', 0)} of {summ.get('chunks_total', '?')}"
            rs = r.get("resume") or {}
            again = (f"yes ({rs['stop_s']:.1f} s)" if r.get("resumes") and rs.get("stop_s")
                     else "yes" if r.get("resumes") else "no" if "resumes" in r else "—")
            out.append(f"| `{r['config']}` | {stop} | {r.get('rc', '—')} | {where or '—'} | "
                       f"{'yes' if r.get('hard_stop') else 'no'} | {kept} | {again} |")
    missing = sorted({p.stem for p in (ROOT / "configs").glob("*.yaml")} - measured)
    if out and missing:
        out += ["", "Shipped configs not yet measured: " + ", ".join(f"`{m}`" for m in missing)
                + " (`python benchmarks/interrupt_table.py --only NAME ...`)."]
    return out


def table():
    """The generated Markdown between the page's markers."""
    rows = committed_results()
    lines = ["| workload | jaxdyn | baseline | ratio | measured / floor | machine |",
             "|---|---|---|---|---|---|"]
    kinds = {}
    for name, kind, rec in rows:
        h = rec.get("headline") or {}
        js, bs = h.get("jaxdyn_s"), h.get("baseline_s")
        fs = h.get("floor_s") or cost_floor(kind, rec)
        ratio = f"{bs / js:.2f}×" if js and bs else "—"
        over = f"{js / fs:.3g}" if js and fs else "—"
        what = f"{_fmt_s(js)}: {h['jaxdyn']}" if h.get("jaxdyn") and js is not None else _fmt_s(js)
        base = f"{_fmt_s(bs)}: {h['baseline']}" if bs is not None else "—"
        lines.append(f"| `{name}` | {what} | {base} | {ratio} | {over} | `{kind}` |")
        kinds.setdefault(kind, _machine_line(kind, rec))
    lines += ["", "ratio = baseline / jaxdyn (above 1: jaxdyn is faster). measured / floor: the "
              "jaxdyn time over the least time the machine allows for the headline computation "
              "(1 is the floor; the cost model below, or for `roofline` its own exp-bound floor). "
              "Each row's file, with every timing of the run and its figure where the script "
              "draws one: `benchmarks/results/<workload>/<machine>.json` (`.png`).", "",
              "Machines:", ""]
    lines += [f"- `{k}`: {v}" for k, v in sorted(kinds.items())]
    lines += _target_lines(rows)
    lines += _interrupt_lines(rows)
    lines += ["", "### Cost model", "",
              "| workload | machine | FLOPs | exps | bytes (least) | floor here (bound) | "
              "floor on an H200 (bound) | measured / floor here | counted |",
              "|---|---|---|---|---|---|---|---|---|"]
    h200 = h200_rates()
    for name, kind, rec in rows:
        c = rec.get("cost")
        if not c:
            lines.append(f"| `{name}` | `{kind}` | — | — | — | — | — | — | not counted |")
            continue
        js = (rec.get("headline") or {}).get("jaxdyn_s")
        here = floor(c, machine_rates(kind))
        gpu = floor(c, {"exp_per_s_per_core": h200["exp_per_s"], "cores": 1,
                        "matmul_flops_per_s": h200["fp32_flops_per_s"],
                        "bytes_per_s": h200["bytes_per_s"]})
        fh = f"{_fmt_s(here['floor_s'])} ({here['bound']})" if here else "— (no rates)"
        fg = f"{_fmt_s(gpu['floor_s'])} ({gpu['bound']})" if gpu else "—"
        over = f"{js / here['floor_s']:.3g}" if js and here and here["floor_s"] else "—"
        lines.append(f"| `{name}` | `{kind}` | {_fmt_n(c.get('flops'))} | "
                     f"{_fmt_n(c.get('transcendentals'))} | {_fmt_n(c.get('bytes_min'))} | {fh} | "
                     f"{fg} | {over} | {c.get('program', '')}"
                     f"{'; ' + c['note'] if c.get('note') else ''} |")
    src = h200["sources"]
    lines += ["", "FLOPs and exps: XLA's cost analysis (`jax.jit(f).lower(...).compile()"
              ".cost_analysis()`) of a loop-free, dense unit of the headline computation, times "
              "how often it runs (our count; analytic where XLA's count exceeds the least work: "
              "a causal mask's N(N + 1)/2 pairs, a multiscale kernel's kept fraction). Bytes: the "
              "least the computation moves (inputs read and outputs written once). Floor here: "
              "the largest of exps at the exp rate of all cores, FLOPs at the matmul rate and "
              "bytes at the memory bandwidth that were measured on that machine kind (the "
              "roofline's probes, or `python -m benchmarks cost --rates --record` where a kind has no "
              "roofline result); where the count leaves work out (a CLI run's W2 evaluations, "
              "compilation) the floor stays a lower bound. The H200 floor uses published "
              f"figures: FP32 {h200['fp32_flops_per_s'] / 1e12:.0f} TFLOP/s ({src['fp32_flops_per_s']}); "
              f"exp {h200['exp_per_s'] / 1e12:.2f}·10¹²/s ({src['exp_per_s']}); memory "
              f"{h200['bytes_per_s'] / 1e12:.1f} TB/s ({src['bytes_per_s']}). {h200['note']}."]
    return "\n".join(lines) + "\n"


def render_page(text):
    """The page with the generated table between its markers."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    if not rest:
        raise ValueError(f"{DOCS_PAGE} has no {BEGIN} marker")
    return f"{head}{BEGIN}\n{table()}{END}{tail}"


def write_docs(page=DOCS_PAGE):
    """Regenerate the table in docs/benchmarks.md; returns whether the page changed."""
    old = page.read_text()
    new = render_page(old)
    if new != old:
        page.write_text(new)
    return new != old
