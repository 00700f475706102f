"""Time to stop: SIGINT to ``jaxdyn run`` of every shipped config, at full size.

For each config of ``configs/*.yaml``: start ``jaxdyn run CONFIG --out DIR`` (an empty
compilation cache shared by this invocation's runs, so each config starts as a user's first
run does), wait for the plan line (``... grid point(s) in K chunk(s) ...``: the folder is set
up and the first chunk starts, its compilation first), then for the bar to move (compute under
way; at most ``--compute-wait`` seconds: a chunk that reports no progress within itself, or a
long compilation, is signalled then) and ``--delay`` seconds more, send SIGINT, and record the seconds from the signal to the process's exit, the exit code (130
expected), where the bar stood when the signal came (chunks done, the kind's note), whether
the watchdog stopped it (a compilation or one long call held the signal over
``JAXDYN_HARD_STOP_SECONDS``), and ``summary.json``'s status and chunks. Then the resume
check: ``jaxdyn run --resume DIR`` must take the folder (its plan line, its finished chunks
adopted), and is stopped the same way after ``--resume-delay`` seconds (its stop timed too).
A run that finishes before its signal (or as it comes: exit 0) runs again, signalled
``RETRY_DELAY_S`` after its plan line (in its first compilation or chunk).

The code run is a ``git archive`` of HEAD, so that edits made meanwhile in the working tree do
not mix in. Writes benchmarks/runs/interrupt.json (``python -m benchmarks run interrupt
--record`` files it as benchmarks/results/interrupt/<machine kind>.json, from which the docs
table is generated).

    python benchmarks/interrupt_table.py [--only NAME ...] [--compute-wait 60] [--delay 5] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import ROOT, add_common_args, setup, write_json

#: the bound a stop is read against (the CLI guide's)
TARGET_S = 30.0
#: a run that finished before its signal runs again, signalled this long after its plan line
RETRY_DELAY_S = 1.0
#: --tiny: two configs at small sizes (a smoke test of the script)
TINY = {"gaussian_stable": [], "control_gaussian_to_mixture": [
    "n_particles=16", "adam_steps=200", "lbfgs_steps=5", "sweep.n_layers=[1, 2]"]}


class _Stderr:
    """A process's stderr collected in a thread (the bar rewrites its line in place)."""

    def __init__(self, proc):
        self.text = ""
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self.thread.start()

    def _read(self, f):
        while True:
            b = f.read1(4096)
            if not b:
                return
            with self.lock:
                self.text += b.decode(errors="replace")

    def wait_for(self, pattern, proc, timeout):
        end = time.time() + timeout
        while time.time() < end and proc.poll() is None:
            with self.lock:
                if re.search(pattern, self.text):
                    return True
            time.sleep(0.05)
        return False

    def bar(self):
        """The bar's last state (the last of its in-place rewrites)."""
        with self.lock:
            parts = [p.strip() for p in re.split(r"[\r\n]", self.text) if "chunks" in p]
        return parts[-1] if parts else ""


#: the bar past its start: a fraction of a chunk (or a chunk) done
MOVED = r"(?:[1-9]\d*\.\d\d|0\.(?:0[1-9]|[1-9]\d))/\d+ chunks"


def _stopped(cmd, env, delay, timeout, compute_wait=0.0):
    """Run ``cmd`` and stop it with SIGINT: the record of the stop.

    The signal comes ``delay`` s after the bar first moved, or after ``compute_wait`` s past
    the plan line if it had not.

    Returns:
      The times (plan line, signal, stop), the exit code, the bar at the signal, and whether
      the watchdog stopped it.
    """
    t_start = time.time()
    proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    err = _Stderr(proc)
    rec = {}
    try:
        if not err.wait_for(r"grid point\(s\) in \d+ chunk", proc, timeout):
            rec["error"] = "no plan line" if proc.poll() is not None else "no plan line in time"
        else:
            rec["plan_after_s"] = round(time.time() - t_start, 2)
            if compute_wait > 0:  # into compute: the bar moved within the first chunk
                rec["bar_moved"] = err.wait_for(MOVED, proc, compute_wait)
            end = time.time() + delay
            while time.time() < end and proc.poll() is None:
                time.sleep(0.05)
            if proc.poll() is not None:
                rec["finished_before_signal"] = True
            else:
                rec["bar_at_signal"] = err.bar()
                rec["signal_after_s"] = round(time.time() - t_start, 2)
                t0 = time.time()
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=600)
                except subprocess.TimeoutExpired:
                    rec["error"] = "still running 600 s after the signal"
                rec["stop_s"] = round(time.time() - t0, 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err.thread.join(timeout=10)
    rec["rc"] = proc.returncode
    rec["hard_stop"] = "held the signal over" in err.text
    rec["traceback"] = "Traceback" in err.text
    rec["stderr_tail"] = err.text[-600:]
    return rec


def _summary(out):
    try:
        s = json.loads((Path(out) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"status": s.get("status"), "chunks_done": s.get("chunks_done"),
            "chunks_total": s.get("n_chunks")}


def _configs(only, tiny):
    names = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    if tiny:
        names = [n for n in names if n in TINY]
    return [n for n in names if not only or n in only]


def resumed(res, chunks, kept) -> bool:
    """Whether a ``--resume`` run took the folder.

    Returns:
      True for a run with its plan line, every chunk of the interrupted run kept, and a clean
      stop (130) or a finished run (0 or 3, before its signal or as the signal came).
    """
    return bool("error" not in res and set(chunks) <= set(kept)
                and res.get("rc") in (0, 3, 128 + signal.SIGINT))


def main():
    """Stop every config's run once, check that it resumes, write the JSON (module doc)."""
    p = add_common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--only", nargs="*", default=None, help="config names (default: all)")
    p.add_argument("--compute-wait", type=float, default=60.0,
                   help="after the plan line, wait for the bar to move (compute under way), "
                        "at most this many seconds (default 60; 0: do not wait)")
    p.add_argument("--delay", type=float, default=5.0,
                   help="seconds after that before the signal (default 5)")
    p.add_argument("--resume-delay", type=float, default=5.0,
                   help="seconds after the resumed run's plan line before its signal")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds to wait for a run's plan line")
    args = setup(p)
    from common import machine_info

    info = machine_info(codegen_check=False)
    work = Path(tempfile.mkdtemp(prefix="jaxdyn_interrupt_"))
    code = work / "code"
    code.mkdir()
    arch = subprocess.run(["git", "archive", "HEAD"], capture_output=True, cwd=ROOT, check=True)
    subprocess.run(["tar", "-x", "-C", str(code)], input=arch.stdout, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT, check=True).stdout.strip()
    info["commit"] = commit
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JAXDYN_NO_CACHE")}
    env.update({"PYTHONPATH": str(code), "OPENBLAS_NUM_THREADS": "1",
                "JAXDYN_CACHE_DIR": str(work / "cache"), "PYTHONUNBUFFERED": "1"})
    rows = []
    for name in _configs(args.only, args.tiny):
        out = work / "runs" / name
        sets = [a for s in (TINY.get(name, []) if args.tiny else []) for a in ("--set", s)]
        cmd = [sys.executable, "-m", "jaxdyn.cli", "run", str(code / "configs" / f"{name}.yaml"),
               "--out", str(out), *sets]
        print(f"{name}: ", end="", flush=True)
        row = {"config": name, "overrides": TINY.get(name, []) if args.tiny else [],
               **_stopped(cmd, env, args.delay, args.timeout, args.compute_wait)}
        if row.get("finished_before_signal") or row.get("rc") in (0, 3):
            # a short run (done before the signal, or as it came): again, signalled sooner
            shutil.rmtree(out, ignore_errors=True)
            first = {k: row.get(k) for k in ("rc", "plan_after_s")}
            row = {"config": name, "overrides": row["overrides"],
                   **_stopped(cmd, env, RETRY_DELAY_S, args.timeout), "finished_first": first,
                   "retry_delay_s": RETRY_DELAY_S}
        row["summary"] = _summary(out)
        chunks = sorted(p.name for p in (out / "chunks").glob("chunk_*.npz"))
        row["chunk_files"] = len(chunks)
        if not row.get("finished_before_signal") and "error" not in row:
            res = _stopped([sys.executable, "-m", "jaxdyn.cli", "run", "--resume", str(out)],
                           env, args.resume_delay, args.timeout)
            kept = sorted(p.name for p in (out / "chunks").glob("chunk_*.npz"))
            row["resume"] = {k: res.get(k) for k in ("rc", "stop_s", "plan_after_s",
                                                     "finished_before_signal", "hard_stop",
                                                     "error", "bar_at_signal")}
            # the resumed run took the folder: its plan line, the chunks kept, a clean stop, or
            # it finished (before its signal or as the signal came, as the first run may)
            row["resumes"] = resumed(res, chunks, kept)
        print(f"stop {row.get('stop_s')} s, rc {row.get('rc')}, hard {row.get('hard_stop')}, "
              f"resumes {row.get('resumes')}; bar: {row.get('bar_at_signal', '')[-90:]}",
              flush=True)
        rows.append(row)
    stops = [r["stop_s"] for r in rows if r.get("stop_s") is not None]
    result = {"target_s": TARGET_S, "delay_s": args.delay, "compute_wait_s": args.compute_wait, "resume_delay_s": args.resume_delay,
              "tiny": bool(args.tiny), "machine": info, "rows": rows,
              "max_stop_s": max(stops) if stops else None,
              "over_target": [r["config"] for r in rows if (r.get("stop_s") or 0) > TARGET_S]}
    write_json("interrupt", result)


if __name__ == "__main__":
    main()
