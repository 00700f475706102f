"""The slow suite (``python -m pytest -m slow``), run file by file and recorded as it goes.

The slow tests are whole experiments, two-process and four-device runs and the fault suite's
long profile: hours of CPU on 2 cores. One ``pytest -m slow`` invocation keeps nothing when it
is interrupted; this script runs one test file at a time (``-n 2 --dist load`` where a file
has 4 slow tests or more, one process otherwise) and writes each file's outcome to
``docs/results/readme/slow_suite.json`` as soon as it ends: its counts, the failed tests with
the first line of their message, wall and CPU seconds (user + system of every process the
run started), the load average at its start, and the commit it ran at (with the files under
``jaxdyn/``, ``configs/`` and ``tests/`` that differed from it). A later call goes on with the
files not yet recorded (``--fresh`` starts over; ``--rerun FILE`` runs one again). The docs'
statement of the slow suite's wall time is generated from this file
(``python -m jaxdyn.experiments.guide_numbers``).

    python benchmarks/slow_suite.py [--files tests/test_sharding.py,...] [--fresh] [--list]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxdyn.experiments import guide_numbers as gn  # noqa: E402

OUT = ROOT / "docs" / "results" / "readme" / "slow_suite.json"
#: a file with at least this many slow tests runs on two xdist workers
PARALLEL_FROM = 4


def slow_tests() -> dict:
    """The slow tests by file (``pytest -m slow --collect-only``)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "slow", "--collect-only", "-q",
                           "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True)
    files: dict = {}
    for line in proc.stdout.splitlines():
        if "::" in line:
            files.setdefault(line.split("::", 1)[0], []).append(line)
    if not files or proc.returncode not in (0, 5):
        # a collection error (an import that fails) must not read as a file without slow tests:
        # the record would forget that file's run
        raise RuntimeError(f"collecting the slow tests failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return files


def _counts(xml_path: Path) -> tuple[dict, list]:
    """Outcome counts and the failed tests (name, first message line) of a junit file."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            counts["failed" if bad.tag == "failure" else "errors"] += 1
            first = (bad.get("message") or bad.text or "").strip().splitlines()
            failed.append({"test": name, "message": first[0][:300] if first else ""})
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, failed


def run_file(path: str, n_tests: int) -> dict:
    """Run one file's slow tests; its record."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        args = [sys.executable, "-m", "pytest", "-m", "slow", "-q", "-p", "no:cacheprovider",
                f"--junitxml={xml}", path]
        args += ["-n", "2", "--dist", "load"] if n_tests >= PARALLEL_FROM else ["-n", "0"]
        load = os.getloadavg()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        counts, failed = _counts(xml) if xml.exists() else ({}, [])
    if not counts:  # pytest itself failed (collection, a crash): keep its last words
        failed = [{"test": path, "message": (proc.stdout + proc.stderr).strip()[-300:]}]
        counts = {"errors": 1}
    changed = gn._git("status", "--porcelain", "--", "jaxdyn", "configs", "tests") or ""
    commit = gn._git("rev-parse", "HEAD")
    return {"tests": n_tests, "counts": counts, "failed": failed, "exit_code": proc.returncode,
            "wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
            "load_start": [round(x, 2) for x in load], "workers": 2 if n_tests >= PARALLEL_FROM else 1,
            "commit": commit.strip() if commit else None,
            "changed_files": sorted(line[3:] for line in changed.splitlines() if line.strip()),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _totals(res):
    """The meta's wall and CPU seconds: the sums over the recorded files."""
    files = res["results"]["files"].values()
    res["meta"]["wall_seconds"] = round(sum(f["wall_s"] for f in files), 1)
    res["meta"]["cpu_seconds"] = round(sum(f["cpu_s"] for f in files), 1)


def _load() -> dict:
    if OUT.exists():
        return json.loads(OUT.read_text())
    return {"kind": "slow_suite", "name": "slow_suite",
            "meta": gn.provenance("python benchmarks/slow_suite.py"), "results": {"files": {}}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", help="comma-separated test files (default: every slow file)")
    p.add_argument("--fresh", action="store_true", help="forget the recorded files first")
    p.add_argument("--rerun", action="store_true", help="run --files again even if recorded")
    p.add_argument("--list", action="store_true", help="print what is recorded and what is left")
    a = p.parse_args(argv)
    files = slow_tests()
    res = _load() if not a.fresh else {**_load(), "results": {"files": {}}}
    res["meta"] = gn.provenance("python benchmarks/slow_suite.py")
    res["results"]["total_files"] = len(files)
    res["results"]["total_tests"] = sum(len(v) for v in files.values())
    done = res["results"]["files"]
    for gone in [f for f in done if f not in files]:
        del done[gone]  # a file that has no slow tests any more
    todo = [f for f in files if f not in done or (a.rerun and a.files and f in a.files.split(","))]
    if a.files:
        wanted = a.files.split(",")
        unknown = [f for f in wanted if f not in files]
        if unknown:
            p.error(f"no slow tests in {unknown}")
        todo = [f for f in todo if f in wanted]
    if a.list:
        for f in files:
            r = done.get(f)
            print(f"{f:55s} " + (f"{r['wall_s']:7.0f} s {r['counts']}" if r else "   (to run)"))
        return 0
    bad = 0
    for f in todo:
        print(f"{f} ({len(files[f])} slow tests) ...", flush=True)
        rec = run_file(f, len(files[f]))
        done[f] = rec
        _totals(res)
        gn.write_result(OUT, res)
        print(f"  {rec['counts']} in {rec['wall_s']:.0f} s wall, {rec['cpu_s']:.0f} CPU-s", flush=True)
        for x in rec["failed"]:
            print(f"  FAILED {x['test']}: {x['message']}", flush=True)
        bad += bool(rec["failed"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
