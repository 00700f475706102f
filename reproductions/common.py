"""Shared helpers of the reproduction scripts: arguments, device setup, timing, output.

Every reproduction calls :func:`setup` before importing JAX-using modules. A run writes its
JSON (and figure) to ``reproductions/runs/`` (ignored by git), so running a reproduction never
changes a tracked file; ``--record`` writes the tracked result in ``reproductions/results/``
instead. Each JSON carries ``run``: the whole run's wall seconds and process CPU seconds (all
threads), the load average at its start and end, the CPU model and cores, jax's version and
the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RECORDED = HERE / "results"  # the tracked results the docs quote
#: Where a run writes: ``reproductions/runs`` (ignored by git), or :data:`RECORDED` with
#: ``--record``.
RESULTS = HERE / "runs"
sys.path.insert(0, str(ROOT))

_START = {}


def _cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def add_common_args(p: argparse.ArgumentParser):
    """The arguments every reproduction takes."""
    p.add_argument("--no-host-devices", action="store_true",
                   help="do not expose the CPU cores as separate JAX devices")
    p.add_argument("--tiny", action="store_true",
                   help="tiny sizes (a smoke test of the script, numbers meaningless)")
    p.add_argument("--tag", default="", help="suffix of the result file names")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--record", action="store_true",
                   help="write the tracked result in reproductions/results/ (maintainers)")
    return p


def setup(parser: argparse.ArgumentParser, argv=None):
    """Parse arguments, start the run's clocks and configure host devices before JAX starts."""
    global RESULTS
    args = parser.parse_args(argv)
    if args.record and args.tiny:
        parser.error("--tiny is a smoke test and is never recorded")
    if args.record:
        RESULTS = RECORDED
    _START.update(wall=time.perf_counter(), cpu=_cpu_s(), load=list(os.getloadavg()))
    if args.no_host_devices:
        os.environ["JAXDYN_NO_HOST_DEVICES"] = "1"
    from jaxdyn.simulation import configure_host_devices

    args.host_devices_configured = configure_host_devices()
    return args


def _run_facts():
    import jax

    facts = {}
    if _START:
        facts.update(wall_s=time.perf_counter() - _START["wall"], cpu_s=_cpu_s() - _START["cpu"],
                     loadavg_start=_START["load"])
    facts["loadavg_end"] = list(os.getloadavg())
    try:
        facts["cpu_model"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                                  if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    facts["cores_usable"] = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                             else os.cpu_count())
    facts["jax"] = jax.__version__
    facts["devices"] = jax.device_count()
    try:
        facts["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                                         capture_output=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        pass
    return facts


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def write_json(name, data):
    """Write ``<RESULTS>/<name>.json`` with the run's timing and machine (``run``)."""
    data["run"] = _run_facts()
    RESULTS.mkdir(parents=True, exist_ok=True)
    p = RESULTS / f"{name}.json"
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default))
    tmp.replace(p)
    r = data["run"]
    if "wall_s" in r:
        print(f"run: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} CPU-s; wrote {p}")
    else:
        print(f"wrote {p}")
    return p


def plt():
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def save_figure(fig, name):
    """Write ``<RESULTS>/<name>.png``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    p = RESULTS / f"{name}.png"
    fig.savefig(p, dpi=110, bbox_inches="tight")
    print(f"wrote {p}")
    return p
