"""Compare two checkouts of jaxdyn on the CPU benchmark suite, interleaved on one machine.

It runs the benchmark suite (``benchmarks/run_all.sh``) on two revisions of the code,
interleaved on the same machine, and flags any workload more than 10 % slower:

    python benchmarks/compare_revisions.py --before /work/base --after /work/main \\
        [--rounds 2] [--moments] [--tiny] [--out benchmarks/runs/compare/latest]

``--before`` and ``--after`` are two checkouts of jaxdyn, each with its own ``benchmarks/``.
Each tree runs **its own** scripts as subprocesses with ``cwd`` = the tree and
``PYTHONPATH`` = the tree, so each imports its own ``jaxdyn`` (a probe subprocess prints
the file of the imported ``jaxdyn`` package per tree first and the run stops if it is not inside that tree).

Workloads (the jaxdyn side of ``run_all.sh``; the baselines PyTorch, NumPy and KeOps are
not run, they did not change):

* ``bench_phase.py --skip-torch``: the phase-diagram workload, variants ``jax_vmap``,
  ``jaxdyn_sharded``, ``jaxdyn_sharded_nochunk``, ``jaxdyn_ensemble``;
* ``bench_large_n.py --impls jax_dense,jax_blocked,jaxdyn_sharded``: one field evaluation
  per N (2¹⁰ … 2¹⁷), and the interleaved head-to-head at N = 4096;
* ``bench_roofline.py``: the blocked field evaluation for N = 2¹² … 2¹⁶ on all devices and
  on one; its exp-rate and matmul probes (pure XLA, the same code in both trees) are kept
  as a measure of the machine's drift between the runs;
* with ``--moments``: ``bench_moments.py --repeats 1 --euler-dt`` (no Euler baselines):
  ``solve_moments_batch`` on 4096 sets (about 41 s of compilation, reported apart); its
  scipy loop (not jaxdyn) is kept as another drift probe.

Order: in round k every script runs once per tree, the two trees back to back
(before → after in odd rounds, after → before in even rounds, so that neither tree always
runs second; ``--fixed-order`` keeps before → after). Result files are written with
``--tag _cmp_before_rK`` / ``_cmp_after_rK`` (``--no-plot``) into a scratch folder
(``JAXDYN_BENCH_RESULTS``; a tree whose scripts ignore it writes to its
``benchmarks/results/``), read, and deleted, so the tracked results and the trees stay as
they were (``PYTHONDONTWRITEBYTECODE=1``: no ``__pycache__`` either).

Per workload (script / implementation / N): the steady-state wall time is the script's
median over its timed calls; over the rounds we take the median of those medians for each
tree; ``ratio = after / before``; verdict ``ok`` if ratio ≤ 1.10 (``--threshold``), else
``SLOWER``. The first call (compile + run, ``compile_s``) and the process CPU time per call
(``cpu_median_s``, less disturbed by other load) are reported beside it, with their ratios,
but the verdict is on the wall time. Timings under 1 ms are flagged ``noisy``: at that size
a 10 % difference is below what a shared machine resolves.

Writes ``<out>.json`` (machine, trees, per-round raw numbers, the table) and ``<out>.png``
(bar chart of the ratios), and prints the table. The machine record: CPU model, whether
``avx512f`` is among the CPU flags, load average at start and at end, jax version, commits.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import fmt_s  # the benchmarks' one time formatter (stdlib only at import)

HERE = Path(__file__).resolve().parent

THRESHOLD = 1.10
NOISY_S = 1e-3
LARGE_N_IMPLS = "jax_dense,jax_blocked,jaxdyn_sharded"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="checkout of the code before the redesign")
    p.add_argument("--after", required=True, help="checkout of the redesigned code")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tiny", action="store_true", help="smoke test: the scripts' --tiny sizes")
    p.add_argument("--moments", action="store_true",
                   help="also bench_moments.py (about 41 s of compilation per run, plus scipy)")
    p.add_argument("--out", default=str(HERE / "runs" / "compare" / "latest"),
                   help="output path without suffix (.json and .png are written)")
    p.add_argument("--threshold", type=float, default=THRESHOLD)
    p.add_argument("--large-n-impls", default=LARGE_N_IMPLS)
    p.add_argument("--before-phase-args", default="",
                   help="extra bench_phase.py arguments for the BEFORE tree only (space-separated)")
    p.add_argument("--after-phase-args", default="",
                   help="extra bench_phase.py arguments for the AFTER tree only, e.g. to select "
                        "the same step as the before tree when the default changed "
                        "('--jax-method euler --variants jax_vmap,jaxdyn_sharded,...')")
    p.add_argument("--fixed-order", action="store_true",
                   help="before → after in every round (default: alternate the order)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per script run (default 1800, 600 with --tiny)")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- machine


def cpu_facts():
    facts = {"cpu_model": None, "avx512f": None}
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.readlines()
        facts["cpu_model"] = next((l.split(":", 1)[1].strip() for l in lines
                                   if l.startswith("model name")), None)
        flags = next((l for l in lines if l.startswith("flags")), "")
        facts["avx512f"] = "avx512f" in flags.split()
    except OSError:
        pass
    return facts


def loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _load1(la):
    return f"{la[0]:.2f}" if la else "?"


def git(tree, *args):
    try:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True,
                              timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None


# ------------------------------------------------------------------------------ running


def tree_env(tree):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    for k in ("OUT", "JAXDYN_BENCH_TINY"):  # OUT: common.out_dirs would write there too
        env.pop(k, None)
    return env


def probe(tree):
    """Which jaxdyn and jax a subprocess in ``tree`` imports."""
    code = ("import json, jax, jaxdyn; print(json.dumps({'jaxdyn_file': getattr(jaxdyn, '__file__'), "
            "'jax': jax.__version__}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tree, env=tree_env(tree),
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"probe in {tree} failed:\n{proc.stderr[-2000:]}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    path = Path(info["jaxdyn_file"]).resolve()
    if Path(tree).resolve() not in path.parents:
        raise SystemExit(f"{tree}: a subprocess imported jaxdyn from {path}, not from the tree")
    return info


SCRATCH = Path(tempfile.mkdtemp(prefix="jaxdyn_compare_"))  # the runs' JSON, removed at exit
atexit.register(shutil.rmtree, SCRATCH, True)


def script_runs(args, tag, tree):
    """name → (argv after the interpreter, result JSON path) of one tree's workloads.

    The path is in a scratch folder that the run's ``JAXDYN_BENCH_RESULTS`` names; a tree
    whose scripts predate that variable writes to its ``benchmarks/results/`` instead
    (:func:`run_script` looks there too).
    """
    results = SCRATCH
    tiny = ["--tiny"] if args.tiny else []
    side = args.after_phase_args if Path(tree).resolve() == Path(args.after).resolve() else args.before_phase_args
    runs = {
        "phase": (["benchmarks/bench_phase.py", "--skip-torch", "--tag", tag, "--no-plot", *tiny,
                   *side.split()],
                  results / f"phase{tag}.json"),
        "large_n": (["benchmarks/bench_large_n.py", "--impls", args.large_n_impls, "--tag", tag,
                     "--no-plot", *tiny], results / f"large_n{tag}.json"),
        "roofline": (["benchmarks/bench_roofline.py", "--tag", tag, "--no-plot", *tiny],
                     results / f"roofline{tag}.json"),
    }
    if args.moments:
        out = results / f"moments_batch{tag}"
        runs["moments"] = (["benchmarks/bench_moments.py", "--repeats", "1", "--euler-dt",
                            "--out", str(out), *(["--quick"] if args.tiny else [])],
                           out.with_suffix(".json"))
    return runs


def run_script(tree, argv, json_path, tag, timeout):
    """Run one script in ``tree``; return (parsed JSON or None, record). Deletes the files
    the run created whose names carry ``tag``."""
    dirs = [json_path.parent, Path(tree) / "benchmarks" / "results"]
    for d in dirs[:1]:
        d.mkdir(parents=True, exist_ok=True)
    before_files = {d: set(d.iterdir()) if d.exists() else set() for d in dirs}
    env = dict(tree_env(tree), JAXDYN_BENCH_RESULTS=str(json_path.parent))
    t0 = time.perf_counter()
    rec = {"argv": argv, "load_start": loadavg()}
    try:
        proc = subprocess.run([sys.executable, *argv], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=timeout)
        rec["returncode"] = proc.returncode
        if proc.returncode != 0:
            rec["error"] = (proc.stderr or "")[-3000:] + (proc.stdout or "")[-1000:]
    except subprocess.TimeoutExpired:
        rec["returncode"] = None
        rec["error"] = f"timeout after {timeout} s"
    rec["wall_s"] = time.perf_counter() - t0
    rec["load_end"] = loadavg()
    data = None
    if not json_path.exists() and (dirs[1] / json_path.name).exists():
        json_path = dirs[1] / json_path.name  # a tree whose scripts write to results/
    if json_path.exists():
        try:
            data = json.loads(json_path.read_text())
        except json.JSONDecodeError as e:
            rec["error"] = rec.get("error", "") + f"\nunreadable {json_path}: {e}"
    elif "error" not in rec:
        rec["error"] = f"{json_path} not written"
    for d in dirs:
        if d.exists():
            for p in set(d.iterdir()) - before_files[d]:
                if tag in p.name and p.is_file():
                    p.unlink()
    return data, rec


# ----------------------------------------------------------------------------- parsing


def _entry(median, compile_s=None, cpu=None, kind="workload"):
    return {"median_s": median, "compile_s": compile_s, "cpu_median_s": cpu, "kind": kind}


def _kind(impl):
    """Baselines (if a run includes them) are not jaxdyn: kept as probes of the machine."""
    return "probe" if impl.partition("@")[0] in ("torch", "numpy", "keops") else "workload"


def extract(name, data):
    """Workload key → timing entry, from one script's JSON."""
    out = {}
    if data is None:
        return out
    if name == "phase":
        for impl, v in data.get("impl", {}).items():
            if impl.startswith("torch") or "median_s" not in v:
                continue
            out[f"phase/{impl}"] = _entry(v["median_s"], v.get("compile_s"), v.get("cpu_median_s"))
    elif name == "large_n":
        for impl, v in data.get("impl", {}).items():
            for r in v.get("rows", []):
                if "median_s" in r:
                    out[f"large_n/{impl}/N={r['n']}"] = _entry(r["median_s"], r.get("compile_s"),
                                                               r.get("cpu_median_s"), _kind(impl))
        head = data.get("headline") or {}
        for impl, v in head.get("impl", {}).items():
            if "median_s" in v:
                out[f"large_n_headline/{impl}/N={head.get('n')}"] = _entry(
                    v["median_s"], v.get("compile_s"), v.get("cpu_median_s"), _kind(impl))
    elif name == "roofline":
        for r in data.get("rows", []):
            out[f"roofline/{r['impl']}/N={r['n']}"] = _entry(r["median_s"], r.get("compile_s"),
                                                             r.get("cpu_median_s"))
        # Machine probes (pure XLA, same code in both trees): seconds per 10⁹ operations.
        if "exp_one_core" in data:
            out["probe/exp_one_core (s per 1e9 exp)"] = _entry(
                1e9 / data["exp_one_core"]["rate_per_s"], kind="probe")
        if "exp_all_devices" in data:
            out["probe/exp_all_devices (s per 1e9 exp)"] = _entry(
                1e9 / data["exp_all_devices"]["rate_per_s"], kind="probe")
        if "matmul" in data:
            out["probe/matmul (s per 1e9 flop)"] = _entry(
                1e9 / data["matmul"]["flops_per_s"], kind="probe")
    elif name == "moments":
        m = data.get("methods", {})
        j = m.get("jaxdyn", {})
        if "seconds_median" in j:
            out["moments/jaxdyn_solve_moments_batch"] = _entry(j["seconds_median"],
                                                               j.get("first_call_seconds"))
        s = m.get("scipy_dop853", {})
        if "seconds" in s:
            out["probe/moments_scipy_loop (not jaxdyn)"] = _entry(s["seconds"], kind="probe")
    return out


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _ratio(a, b):
    return a / b if a is not None and b else None


def table(rounds, threshold):
    """Per workload: before/after medians over rounds, ratios, verdict."""
    keys = []
    for rnd in rounds:
        for side in ("before", "after"):
            for k in rnd[side]:
                if k not in keys:
                    keys.append(k)
    rows = []
    for k in keys:
        vals = {side: [rnd[side].get(k) for rnd in rounds] for side in ("before", "after")}
        row = {"workload": k}
        for side in ("before", "after"):
            es = [e for e in vals[side] if e]
            row[side] = _med([e["median_s"] for e in es])
            row[f"{side}_rounds"] = [e["median_s"] if e else None for e in vals[side]]
            row[f"{side}_compile"] = _med([e["compile_s"] for e in es])
            row[f"{side}_cpu"] = _med([e["cpu_median_s"] for e in es])
            row["kind"] = es[0]["kind"] if es else row.get("kind", "workload")
        row["ratio"] = _ratio(row["after"], row["before"])
        row["compile_ratio"] = _ratio(row["after_compile"], row["before_compile"])
        row["cpu_ratio"] = _ratio(row["after_cpu"], row["before_cpu"])
        if row["kind"] == "probe":
            row["verdict"] = "probe"
        elif row["ratio"] is None:
            row["verdict"] = "missing"
        else:
            row["verdict"] = "ok" if row["ratio"] <= threshold else "SLOWER"
            if min(row["before"], row["after"]) < NOISY_S:
                row["verdict"] += " (noisy)"
        rows.append(row)
    return rows


def fmt_r(r):
    return "-" if r is None else f"{r:.3f}"


def print_table(rows):
    w = max([len(r["workload"]) for r in rows] + [8])
    head = (f"{'workload':<{w}}  {'before':>9}  {'after':>9}  {'ratio':>6}  {'verdict':<13}  "
            f"{'cpu ratio':>9}  {'1st call b':>10}  {'1st call a':>10}  {'ratio':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['workload']:<{w}}  {fmt_s(r['before']):>9}  {fmt_s(r['after']):>9}  "
              f"{fmt_r(r['ratio']):>6}  {r['verdict']:<13}  {fmt_r(r['cpu_ratio']):>9}  "
              f"{fmt_s(r['before_compile']):>10}  {fmt_s(r['after_compile']):>10}  "
              f"{fmt_r(r['compile_ratio']):>6}")


def plot(rows, path, title, threshold):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["ratio"] is not None]
    if not rows:
        return None
    names = [r["workload"] for r in rows]
    fig, axs = plt.subplots(1, 2, figsize=(14, 0.28 * len(rows) + 1.8), sharey=True)
    y = range(len(rows))
    colors = ["gray" if r["kind"] == "probe" else ("C3" if r["ratio"] > threshold else "C0")
              for r in rows]
    axs[0].barh(y, [r["ratio"] for r in rows], color=colors)
    axs[0].set_title("steady state: after / before (median wall time)", fontsize=9)
    cr = [r["compile_ratio"] if r["compile_ratio"] is not None else 0.0 for r in rows]
    axs[1].barh(y, cr, color=["gray" if r["kind"] == "probe" else "C1" for r in rows])
    axs[1].set_title("first call (compile + run): after / before", fontsize=9)
    for a in axs:
        a.axvline(1.0, color="black", lw=0.8)
        a.axvline(threshold, color="red", lw=0.8, ls="--")
        a.set_xlabel("ratio (< 1: after is faster)")
    axs[0].set_yticks(list(y), names, fontsize=7)
    axs[0].invert_yaxis()
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    trees = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    for side, tree in trees.items():
        if not (tree / "benchmarks" / "bench_phase.py").exists():
            raise SystemExit(f"--{side} {tree}: no benchmarks/bench_phase.py")
    timeout = args.timeout or (600 if args.tiny else 1800)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    machine = {**cpu_facts(), "load_start": loadavg(), "cpu_count": os.cpu_count(),
               "python": platform.python_version(), "platform": platform.platform(),
               "date_start": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    tree_info = {}
    for side, tree in trees.items():
        info = probe(tree)
        info.update(path=str(tree), commit=git(tree, "rev-parse", "HEAD"),
                    status_start=git(tree, "status", "--porcelain"))
        tree_info[side] = info
        print(f"{side}: {tree} @ {(info['commit'] or '?')[:10]}, imports {info['jaxdyn_file']} "
              f"(jax {info['jax']})", flush=True)
    machine["jax"] = tree_info["after"]["jax"]
    print(f"machine: {machine['cpu_model']}, avx512f={machine['avx512f']}, "
          f"{machine['cpu_count']} cpus, load {machine['load_start']}", flush=True)

    names = list(script_runs(args, "_x", trees["before"]))
    rounds = []
    for k in range(1, args.rounds + 1):
        order = ["before", "after"] if (args.fixed_order or k % 2 == 1) else ["after", "before"]
        rnd = {"round": k, "order": order, "before": {}, "after": {}, "runs": []}
        for name in names:
            for side in order:
                tag = f"_cmp_{side}_r{k}"
                argv, json_path = script_runs(args, tag, trees[side])[name]
                print(f"[round {k}/{args.rounds}] {name} / {side} ...", end=" ", flush=True)
                data, rec = run_script(trees[side], argv, json_path, tag, timeout)
                got = extract(name, data)
                rnd[side].update(got)
                rnd["runs"].append({"script": name, "side": side, **rec, "workloads": len(got)})
                msg = f"{rec['wall_s']:.0f} s, {len(got)} timings"
                if "error" in rec:
                    msg += f"; ERROR: {rec['error'].strip().splitlines()[-1] if rec['error'].strip() else '?'}"
                print(msg, flush=True)
        rounds.append(rnd)

    machine["load_end"] = loadavg()
    machine["date_end"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    machine["duration_s"] = time.time() - t_start
    for side, tree in trees.items():
        tree_info[side]["status_end"] = git(tree, "status", "--porcelain")
        if tree_info[side]["status_end"] != tree_info[side]["status_start"]:
            print(f"warning: git status of {tree} changed during the run", flush=True)

    rows = table(rounds, args.threshold)
    work = [r for r in rows if r["kind"] == "workload"]
    slower = [r["workload"] for r in work if r["verdict"].startswith("SLOWER")]
    missing = [r["workload"] for r in work if r["verdict"] == "missing"]
    errors = [f"round {rnd['round']} {run['script']}/{run['side']}" for rnd in rounds
              for run in rnd["runs"] if "error" in run]
    summary = {"workloads": len(work), "ok": len(work) - len(slower) - len(missing),
               "slower": slower, "missing": missing, "script_errors": errors,
               "all_ok": not slower and not missing and not errors,
               "threshold": args.threshold}

    print()
    print_table(rows)
    print()
    print(f"{summary['ok']}/{summary['workloads']} workloads within ×{args.threshold:.2f}"
          + (f"; slower: {', '.join(slower)}" if slower else "")
          + (f"; missing: {', '.join(missing)}" if missing else "")
          + (f"; script errors: {', '.join(errors)}" if errors else ""))
    print(f"machine: {machine['cpu_model']}, avx512f={machine['avx512f']}, jax {machine['jax']}, "
          f"load {machine['load_start']} → {machine['load_end']}, {machine['duration_s']:.0f} s")

    result = {"what": "benchmarks/compare_revisions.py: run_all.sh's jaxdyn workloads, before vs "
                      "after, interleaved", "argv": sys.argv[1:], "tiny": args.tiny,
              "rounds_requested": args.rounds, "machine": machine, "trees": tree_info,
              "summary": summary, "table": rows, "rounds": rounds}
    jpath = out.with_suffix(".json")
    jpath.write_text(json.dumps(result, indent=2, default=str))
    title = (f"after {(tree_info['after']['commit'] or '?')[:8]} / before "
             f"{(tree_info['before']['commit'] or '?')[:8]} · {args.rounds} round(s)"
             f"{' · TINY' if args.tiny else ''} · {machine['cpu_model']} · avx512f="
             f"{machine['avx512f']} · load {_load1(machine['load_start'])}"
             f"→{_load1(machine['load_end'])} · {machine['date_start']}")
    ppath = plot(rows, out.with_suffix(".png"), title, args.threshold)
    print(f"wrote {jpath}" + (f" and {ppath}" if ppath else ""))
    return 0 if summary["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
