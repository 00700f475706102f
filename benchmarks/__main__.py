"""jaxdyn's benchmark suite, one entry point, run from the repository root.

    python -m benchmarks list                          # the workloads, one line each
    python -m benchmarks run [NAMES...] [--tiny] [--rounds K] [--gpu] [--max-isa AVX2] [--record]
    python -m benchmarks compare --before REV|TREE [--after TREE] [compare_revisions args]
    python -m benchmarks cost [NAMES...] [--rates] [--record]   # the cost model and its floors
    python -m benchmarks docs                          # regenerate the table in docs/benchmarks.md

``run`` runs each workload's ``bench_*.py`` script in a child process (the scripts own their
measurements: interleaved rounds against the baselines of the same invocation) and writes one
file holding the script's JSON, the headline the docs table shows and the machine's facts (CPU
model, vector extensions, cores, GPU, load at the start and end, jax/jaxlib versions, commit):
``benchmarks/runs/<workload>/<machine kind>-<stamp>.json``, which git ignores, so a run never
changes a tracked file. ``--record`` (the maintainers' flag) writes the tracked latest instead,
``benchmarks/results/<workload>/<machine kind>.json``, which ``docs`` reads. With ``--rounds K``
the script runs K times and the round with the median jaxdyn time is kept (every round's
headline is recorded). ``--tiny`` is a smoke test (``<kind>-<stamp>.tiny.json``, never
recorded). Arguments after ``--`` go to every script. ``run`` also counts the cost model
(``benchmarks/cost.py``: FLOPs, exps and bytes of the headline computation, from XLA's cost
analysis and our own count), from which ``docs`` shows the measured time over the floor the
machine's rates imply. ``cost`` prints the model of the tracked results (``--rates``: with the
rates of this machine measured now); with ``--record`` it writes the counts into them and the
rates to ``benchmarks/results/machines/<kind>.json``.

Why not asv (airspeed velocity): asv builds an environment per commit from the git history
and measures one function at a time in its own harness, then serves the history from a web
page. Our workloads are whole scripts whose baselines (PyTorch, KeOps, SciPy) must run in the
same invocation, interleaved with jaxdyn, on a shared machine whose load drifts; the useful
comparisons are "jaxdyn against the baseline now" (``run``) and "this tree against that
revision, interleaved" (``compare``), both in one invocation, and the record is one JSON per
workload and machine kind that the docs page is generated from.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import suite  # noqa: E402


def cmd_list(args):
    """Print the workloads, one line each."""
    width = max(len(w.name) for w in suite.WORKLOADS)
    for w in suite.WORKLOADS:
        gpu = " [gpu]" if w.gpu_args is not None else ""
        print(f"{w.name:<{width}}  {w.summary}{gpu}  ({w.script})")
    return 0


def cmd_run(args):
    """Run workloads; one result file each."""
    names = args.names or [w.name for w in suite.WORKLOADS]
    unknown = [n for n in names if n not in suite.BY_NAME]
    if unknown:
        print(f"unknown workload(s): {', '.join(unknown)}; see `python -m benchmarks list`")
        return 2
    if args.gpu:
        no_gpu = [n for n in names if suite.BY_NAME[n].gpu_args is None]
        if no_gpu:
            print(f"not GPU workloads: {', '.join(no_gpu)}")
            return 2
    if args.record and args.tiny:
        print("--tiny is a smoke test and is never recorded: drop --record")
        return 2
    written = suite.run(names, tiny=args.tiny, rounds=args.rounds, gpu=args.gpu,
                        max_isa=args.max_isa, extra=args.extra, timeout=args.timeout,
                        record=args.record)
    return 0 if len(written) >= len(names) else 1


def cmd_compare(args, rest):
    """Compare this tree with a revision or checkout (compare_revisions.py)."""
    before = Path(args.before)
    tmp = None
    if not (before / "jaxdyn").is_dir():  # a git revision: extract it
        tmp = tempfile.mkdtemp(prefix="jaxdyn_before_")
        archive = subprocess.run(["git", "archive", args.before], cwd=suite.ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        before = Path(tmp)
    out = suite.RUNS / "compare" / "latest"
    cmd = [sys.executable, str(suite.HERE / "compare_revisions.py"), "--before", str(before),
           "--after", str(args.after), "--out", str(out), *rest]
    print("$ " + " ".join(cmd[1:]), flush=True)
    try:
        return subprocess.run(cmd, cwd=suite.ROOT).returncode
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def cmd_cost(args):
    """Print the cost model of the tracked results; with --record, write it into them."""
    import json

    names = args.names or [w.name for w in suite.WORKLOADS]
    unknown = [n for n in names if n not in suite.BY_NAME]
    if unknown:
        print(f"unknown workload(s): {', '.join(unknown)}; see `python -m benchmarks list`")
        return 2
    paths = [p for n in names for p in sorted((suite.RESULTS / n).glob("*.json"))
             if not p.name.endswith(".tiny.json")]
    here = None
    if args.rates:
        kind = suite.machine_kind(suite.machine_facts())
        rates = suite.measure_rates()
        if rates:
            here = (kind, rates)
            print(f"{kind}: exp {rates['exp_per_s_per_core']:.3g}/s per core x {rates['cores']}, "
                  f"matmul {rates['matmul_flops_per_s']:.3g} FLOP/s, memory "
                  f"{rates['bytes_per_s']:.3g} B/s")
            if args.record:
                print(f"wrote {suite.record_rates(kind, rates).relative_to(suite.ROOT)}")
    if args.record:
        for p in suite.add_cost(paths):
            print(f"recorded the cost model in {p.relative_to(suite.ROOT)}")
        records = [(p, json.loads(p.read_text()).get("cost")) for p in paths]
    else:
        counts = suite.cost_counts(paths)
        records = [(p, counts.get(str(p))) for p in paths]
    for p, c in records:
        rec = json.loads(p.read_text())
        kind = rec.get("machine_kind", p.stem)
        rec["cost"] = c
        js = (rec.get("headline") or {}).get("jaxdyn_s")
        line = f"{p.parent.name:<22} {kind:<24} "
        if not c or "error" in c:
            print(line + (f"not counted ({c['error']})" if c else "not counted"))
            continue
        f_kind = suite.floor(c, suite.machine_rates(kind))
        f_gpu = suite.h200_floor(rec)
        line += (f"FLOPs {c['flops']:.3g}, exps {c['transcendentals']:.3g}, bytes "
                 f"{c['bytes_min']:.3g}; floor {'%.3g s' % f_kind['floor_s'] if f_kind else '—'}"
                 f"{' (%s)' % f_kind['bound'] if f_kind else ''}, H200 "
                 f"{'%.3g s' % f_gpu if f_gpu else '—'}")
        if js and f_kind:
            line += f"; measured / floor {js / f_kind['floor_s']:.3g}"
        if here:
            f_here = suite.floor(c, here[1])
            line += f"; floor on this machine ({here[0]}) {f_here['floor_s']:.3g} s" if f_here else ""
        print(line)
    return 0


def cmd_docs(args):
    """Regenerate the table in docs/benchmarks.md."""
    changed = suite.write_docs()
    print(f"{suite.DOCS_PAGE.relative_to(suite.ROOT)}: {'regenerated' if changed else 'up to date'}")
    return 0


def main(argv=None):
    """Parse the command line and run a subcommand."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the workloads, one line each")
    r = sub.add_parser("run", help="run workloads, one result file each")
    r.add_argument("names", nargs="*", help="workloads (default: all)")
    r.add_argument("--tiny", action="store_true", help="smoke test: tiny sizes, not in the table")
    r.add_argument("--rounds", type=int, default=1, help="runs of each script; the median is kept")
    r.add_argument("--gpu", action="store_true", help="the GPU arguments of each workload")
    r.add_argument("--max-isa", default=None, help="cap XLA:CPU's vector ISA (e.g. AVX2)")
    r.add_argument("--timeout", type=float, default=None, help="seconds per script run")
    r.add_argument("--record", action="store_true",
                   help="write the tracked latest results/<workload>/<kind>.json (maintainers) "
                        "instead of runs/<workload>/<kind>-<stamp>.json")
    c = sub.add_parser("compare", help="this tree against another revision, interleaved")
    c.add_argument("--before", required=True, help="a git revision or a checkout")
    c.add_argument("--after", default=str(Path(__file__).resolve().parent.parent))
    k = sub.add_parser("cost", help="the cost model of the tracked results and its floors")
    k.add_argument("names", nargs="*", help="workloads (default: all)")
    k.add_argument("--rates", action="store_true",
                   help="measure this machine's exp, matmul and memory rates now")
    k.add_argument("--record", action="store_true",
                   help="write the counts into the tracked results (and, with --rates, the "
                        "rates to results/machines/<kind>.json)")
    sub.add_parser("docs", help="regenerate the table in docs/benchmarks.md")
    args, rest = p.parse_known_args(argv)
    if args.cmd == "compare":
        return cmd_compare(args, rest + extra)
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    args.extra = extra
    return {"list": cmd_list, "run": cmd_run, "cost": cmd_cost, "docs": cmd_docs}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
