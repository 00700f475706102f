"""jaxdyn's benchmark suite, one entry point, run from the repository root.

    python -m benchmarks list                          # the workloads, one line each
    python -m benchmarks run [NAMES...] [--tiny] [--rounds K] [--gpu] [--max-isa AVX2]
    python -m benchmarks compare --before REV|TREE [--after TREE] [compare_revisions args]
    python -m benchmarks cost [NAMES...]               # record the cost model in the results
    python -m benchmarks docs                          # regenerate the table in docs/benchmarks.md

``run`` runs each workload's ``bench_*.py`` script in a child process (the scripts own their
measurements: interleaved rounds against the baselines of the same invocation) and writes one
file, ``benchmarks/results/<workload>/<machine kind>.json``, holding the script's JSON, the
headline the docs table shows and the machine's facts (CPU model, vector extensions, cores,
GPU, load at the start and end, jax/jaxlib versions, commit). With ``--rounds K`` the script
runs K times and the round with the median jaxdyn time is kept (every round's headline is
recorded). ``--tiny`` is a smoke test written to ``<kind>.tiny.json``, left out of the table.
Arguments after ``--`` go to every script. ``run`` and ``cost`` also record the cost model
(``benchmarks/cost.py``: FLOPs and exps of the headline computation from XLA's cost analysis),
from which ``docs`` shows the measured time over the floor the machine's rates imply.

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
    written = suite.run(names, tiny=args.tiny, rounds=args.rounds, gpu=args.gpu,
                        max_isa=args.max_isa, extra=args.extra, timeout=args.timeout)
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
    out = suite.RESULTS / "compare" / "latest"
    cmd = [sys.executable, str(suite.HERE / "compare_revisions.py"), "--before", str(before),
           "--after", str(args.after), "--out", str(out), *rest]
    print("$ " + " ".join(cmd[1:]), flush=True)
    try:
        return subprocess.run(cmd, cwd=suite.ROOT).returncode
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def cmd_cost(args):
    """Record the cost model in the committed result files."""
    names = args.names or [w.name for w in suite.WORKLOADS]
    paths = [p for n in names for p in sorted((suite.RESULTS / n).glob("*.json"))
             if not p.name.endswith(".tiny.json")]
    for p in suite.add_cost(paths):
        print(f"recorded the cost model in {p.relative_to(suite.ROOT)}")
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
    c = sub.add_parser("compare", help="this tree against another revision, interleaved")
    c.add_argument("--before", required=True, help="a git revision or a checkout")
    c.add_argument("--after", default=str(Path(__file__).resolve().parent.parent))
    k = sub.add_parser("cost", help="record the cost model in the committed results")
    k.add_argument("names", nargs="*", help="workloads (default: all)")
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
