"""The README's times: the quick start's main job and each example, measured as a reader runs them.

Each example runs ``--repeats`` times in a fresh interpreter (``python examples/NAME.py --out
TMP``, the shell example with ``bash``), each run timed for wall seconds and CPU seconds (user +
system of every process it started, ``resource.getrusage(RUSAGE_CHILDREN)``), startup and
compilation included. The quick start's ``jaxdyn run --out DIR`` runs twice in a fresh JAX
compilation cache folder: the first run compiles, the second loads its programs from the cache
(its compile and compute seconds from ``summary.json``). The result file
``docs/results/readme/readme_times.json`` feeds the README's generated spans
(``python -m jaxdyn.experiments.guide_numbers``).

With ``--suite`` it also runs the README's test command (``python -m pytest -n 2 -q``, the
default suite) and records its wall and CPU seconds and its outcome counts.

    python benchmarks/readme_times.py [--repeats 3] [--only beta_sweep,noisy_run] [--suite]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxdyn.experiments import guide_numbers as gn  # noqa: E402

EXAMPLES = gn.README_EXAMPLES
OUT = ROOT / "docs" / "results" / "readme" / "readme_times.json"


def _timed(args, env=None, cwd=ROOT, check=True):
    """Run ``args``, timed.

    Returns:
        (wall seconds, CPU seconds of the child and its children, the completed process).

    Raises:
        RuntimeError: a non-zero exit, when ``check``.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc


def time_example(name, repeats):
    """``repeats`` runs of one example: lists of wall and CPU seconds."""
    walls, cpus = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as out:
            script = ROOT / "examples" / (f"{name}.sh" if name == "two_process_sweep"
                                          else f"{name}.py")
            cmd = (["bash", str(script), "--out", out] if script.suffix == ".sh"
                   else [sys.executable, str(script), "--out", out])
            wall, cpu, _ = _timed(cmd)
        walls.append(wall)
        cpus.append(cpu)
    return {"wall_s": walls, "cpu_s": cpus}


def time_quick_start():
    """The main job twice in a fresh cache folder: the first run compiles, the second loads."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, JAXDYN_CACHE_DIR=str(Path(tmp) / "cache"))
        env.pop("JAXDYN_NO_CACHE", None)
        for i in range(2):
            out = Path(tmp) / f"run{i}"
            jaxdyn = Path(sys.executable).with_name("jaxdyn")
            wall, cpu, _ = _timed([str(jaxdyn), "run", "--out", str(out), "--quiet"], env=env)
            summary = json.loads((out / "summary.json").read_text())
            runs.append({"wall_s": wall, "cpu_s": cpu,
                         "compile_s": summary.get("compile_seconds"),
                         "compute_s": summary.get("compute_seconds"),
                         "elapsed_s": summary.get("elapsed_seconds")})
    return {"first": runs[0], "second": runs[1]}


def time_suite(most: int = 12):
    """The default suite as the README runs it.

    Args:
      most: how many of the costliest tests to keep.

    Returns:
      Wall and CPU seconds, the machine (``--suite-only`` may run on another machine than the
      file's other times), the outcome counts, and the ``most`` costliest tests (CPU seconds a
      test, from ``JAXDYN_TEST_CPU``: tests/conftest.py).
    """
    load = list(os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        prefix = str(Path(tmp) / "cpu")
        env = dict(os.environ, JAXDYN_TEST_CPU=prefix)
        wall, cpu, proc = _timed([sys.executable, "-m", "pytest", "-n", "2", "-q"], env=env,
                                 check=False)
        per_test = {}
        for f in Path(tmp).glob("cpu.*.json"):
            rec = json.loads(f.read_text())
            rec.pop("_outside_tests", None)  # the controller's counts its workers as children
            per_test.update({k: v["cpu"] for k, v in rec.items()})
    last = [line for line in proc.stdout.splitlines() if line.strip()][-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|"
                                                r"errors?|deselected)", last)}
    costliest = sorted(per_test.items(), key=lambda kv: -kv[1])[:most]
    return {"command": "python -m pytest -n 2 -q", "machine": gn.machine(), "returncode": proc.returncode,
            "summary_line": last.strip("= "), "counts": counts, "wall_s": wall, "load_start": load,
            "cpu_s": cpu, "tests_cpu_s": round(sum(per_test.values()), 1),
            "outside_tests_cpu_s": round(cpu - sum(per_test.values()), 1),
            "costliest": [{"test": k, "cpu_s": round(v, 1)} for k, v in costliest]}


def main(argv=None):
    """Measure and write the result file (the command line's options: the module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=",".join(EXAMPLES))
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--suite", action="store_true", help="also time the default test suite")
    ap.add_argument("--suite-only", action="store_true",
                    help="time the default test suite again, keeping the file's other times")
    a = ap.parse_args(argv)
    started = gn.clock()
    if a.suite_only:  # the other times as they are; the suite measured again
        res = json.loads(Path(a.out).read_text())
        res["results"]["suite"] = time_suite()
        print(res["results"]["suite"]["summary_line"], flush=True)
        res["meta"]["suite_remeasured_by"] = "python benchmarks/readme_times.py --suite-only"
        res["meta"]["suite_commit"] = gn.provenance("")["commit"]
        print(gn.write_result(a.out, res))
        return
    results = {"repeats": a.repeats, "load_start": list(os.getloadavg()),
               "quick_start": time_quick_start(), "examples": {}}
    for name in a.only.split(","):
        results["examples"][name] = time_example(name, a.repeats)
        print(name, results["examples"][name], flush=True)
    if a.suite:
        results["suite"] = time_suite()
        print(results["suite"]["summary_line"], flush=True)
    results["load_end"] = list(os.getloadavg())
    command = "python benchmarks/readme_times.py " + " ".join(argv or sys.argv[1:])
    print(gn.write_measurement(a.out, "readme_times", command.strip(), results, started))


if __name__ == "__main__":
    main()
