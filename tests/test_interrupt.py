"""A signal stops ``jaxdyn run`` within seconds, between two jitted segments of the optimiser.

The control kind's optimiser runs in segments of a few iterations (:func:`jaxdyn.control.measure_control`):
SIGINT mid-optimisation ends the run at the next boundary with exit 130, keeping the finished
chunks, and ``--resume`` completes it to the values of an uninterrupted run, bit for bit (the
wall-clock fields aside). A signal that lands in a long XLA compilation stops the run after
``JAXDYN_HARD_STOP_SECONDS`` without waiting for it.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

ROOT = Path(__file__).resolve().parents[1]

#: two points (seeds) of one depth: one program set, compiled once and shared by the runs;
#: Adam only (L-BFGS's program, its line search with it, is the costliest to compile: the
#: segment test below runs it)
TINY = {
    "kind": "control", "name": "tiny_interrupt", "problem": "gaussian_to_mixture",
    "n_particles": 8, "dtype": "float64", "n_layers": 1, "max_layers": 1, "n_depths": 2,
    "adam_steps": 600, "lbfgs_steps": 0, "target": {"clusters": 2},
    "sweep": {"seed": [0, 1]},
}
#: what a stop must take at most (the test's bound; the guide's is 30 s on 2 cores)
DEADLINE = 30.0


def _env(**extra):
    return dict(os.environ, JAXDYN_NO_HOST_DEVICES="1", **extra)


def _cli(*args):
    return [sys.executable, "-m", "jaxdyn.cli", "run", *map(str, args)]


class _Stderr:
    """Collects a process's stderr in a thread (the bar rewrites its line in place)."""

    def __init__(self, proc):
        self.text = ""
        self._lock = threading.Lock()
        self._t = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._t.start()

    def _read(self, f):
        while True:
            b = f.read1(4096) if hasattr(f, "read1") else f.read(4096)
            if not b:
                return
            with self._lock:
                self.text += b.decode(errors="replace")

    def wait_for(self, pattern, proc, timeout, after=None):
        """Wait until ``pattern`` shows (in the text written once the file ``after`` exists)."""
        deadline = time.time() + timeout
        start = None
        while time.time() < deadline and proc.poll() is None:
            with self._lock:
                if start is None and (after is None or after.exists()):
                    start = len(self.text)
                if start is not None and re.search(pattern, self.text[start:]):
                    return True
            time.sleep(0.02)
        return False

    def all(self):
        self._t.join(timeout=10)
        return self.text


def _stop(cmd, pattern, sig, env, timeout=600, after=None):
    """Start ``cmd``, send ``sig`` once its stderr matches ``pattern`` (after ``after``).

    Returns:
      ``(exit code, seconds from the signal to the exit, stderr)``.
    """
    proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    err = _Stderr(proc)
    try:
        seen = err.wait_for(pattern, proc, timeout, after)
        assert seen, err.text[-3000:]
        t0 = time.time()
        proc.send_signal(sig)
        rc = proc.wait(timeout=120)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rc, took, err.all()


def _load(path):
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return ds.load()


def _identical(a, b):
    wall = ["seconds"]  # the optimisation's wall time, the one value a rerun changes
    xr.testing.assert_identical(a.drop_vars(wall).drop_attrs(), b.drop_vars(wall).drop_attrs())


@pytest.mark.slow  # three CLI processes, the control programs compiled (about a CPU-minute);
# default counterpart: the SIGTERM-mid-run test of tests/test_hostile.py (interrupted, resume)
def test_sigint_mid_optimisation_stops_at_once_and_resumes_to_identical_values(tmp_path):
    """SIGINT while the second chunk's optimiser runs: exit 130 within the deadline.

    The first chunk written, an iteration of the second shown; ``interrupted``, the first chunk kept
    and the second not written; ``--resume`` computes the second only, and the Dataset equals
    an uninterrupted run's bit for bit.
    """
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    out, ref = tmp_path / "run", tmp_path / "ref"
    # mid-optimisation of chunk 2: its first file written, then an iteration > 0 shown
    rc, took, err = _stop(_cli(cfg, "--out", out), r"iteration [1-9]\d*/", signal.SIGINT,
                          _env(), after=out / "chunks" / "chunk_00000.npz")
    assert rc == 128 + signal.SIGINT, err[-3000:]
    assert took < DEADLINE, (took, err[-2000:])
    assert "Traceback" not in err and f"resume with: jaxdyn run --resume {out}" in err, err[-3000:]
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    assert sorted(p.name for p in (out / "chunks").glob("chunk_*.npz")) == ["chunk_00000.npz"]
    assert not (out / "data.nc").exists()

    p = subprocess.run(_cli("--resume", out, "--quiet"), env=_env(), cwd=str(ROOT),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["chunks_computed"] == 1 and summary["chunks_resumed"] == 1, summary
    p = subprocess.run(_cli(cfg, "--out", ref, "--quiet"), env=_env(), cwd=str(ROOT),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    _identical(_load(ref / "data.nc"), _load(out / "data.nc"))


@pytest.mark.slow  # a second fresh compilation (about a minute of CPU)
def test_sigterm_in_a_compilation_stops_hard_and_resumes(tmp_path):
    """SIGTERM while the optimiser's programs compile, the hard stop at 1 s: exit 143.

    Sent once the run's summary is written; within the deadline whether the compilation returned or
    not, ``summary.json`` says interrupted, and ``--resume`` finishes the run.
    """
    cfg = tmp_path / "tiny.yaml"
    # another size than the fast test's: nothing of it in the compilation cache
    cfg.write_text(yaml.safe_dump({**TINY, "n_particles": 6, "adam_steps": 20}))
    out = tmp_path / "run"
    # the run's summary.json written (status running): its first chunk is compiling
    rc, took, err = _stop(_cli(cfg, "--out", out), "", signal.SIGTERM,
                          _env(JAXDYN_HARD_STOP_SECONDS="1"), after=out / "summary.json")
    assert rc == 128 + signal.SIGTERM, err[-3000:]
    assert took < DEADLINE, (took, err[-2000:])
    assert "Traceback" not in err and f"resume with: jaxdyn run --resume {out}" in err, err[-3000:]
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    p = subprocess.run(_cli("--resume", out, "--quiet"), env=_env(), cwd=str(ROOT),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["status"] in (
        "ok", "some_unsuccessful", "all_unsuccessful")


@pytest.mark.slow  # compiles the optimiser's segments in process (about a minute of CPU)
def test_segment_boundaries_do_not_change_the_values():
    """``segment_steps`` sets where the host looks, not what is computed.

    1, 5 and all the Adam steps in one segment give the same result bit for bit, and the
    callback sees every boundary with the iterations done.
    """
    import jax

    from jaxdyn.control import measure_control

    rng = np.random.default_rng(0)
    x0, y = rng.standard_normal((8, 2)), rng.standard_normal((8, 2)) + 1.0
    with jax.enable_x64(True):
        seen = []
        runs = [measure_control(x0, y, n_layers=1, adam_steps=12, lbfgs_steps=3,
                                segment_steps=s, callback=(lambda *a: seen.append(a)) if s == 5
                                else None)
                for s in (1, 5, 12)]
    for r in runs[1:]:
        for a, b in zip(jax.tree.leaves(runs[0]), jax.tree.leaves(r)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    done = [d for d, _, _ in seen]
    assert done[:4] == [0, 5, 10, 12] and done == sorted(done) and seen[0][1] == 15
