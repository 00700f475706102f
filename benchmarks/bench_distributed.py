"""Benchmark: the overhead of the process boundary (jax.distributed over gloo on CPU).

The sweep of ``configs/sweep_large.yaml`` (16 β × 8 seeds × 3 N = 384 systems, 24 chunks)
run by the CLI in two layouts of the same two devices:

- ``1x2``: one process with two host devices (``jaxdyn run CONFIG --out DIR``, the host
  cores exposed as devices, the default on this machine);
- ``2x1``: two processes with one device each, one JAX cluster on localhost
  (``jaxdyn run CONFIG --out DIR --distributed`` twice, ``JAX_COORDINATOR_ADDRESS`` /
  ``JAXDYN_NUM_PROCESSES`` / ``JAXDYN_PROCESS_ID``, one host device each, gloo collectives).

For each: the wall time of the whole command (start-up, compilation and figures included;
for ``2x1`` until both processes have ended), the engine's ``elapsed_seconds`` (from
``summary.json``: the chunks, the merge and the figures), the sum of the chunks' compute
seconds (chunk metadata) and the CPU seconds of all processes. The figure is the ratio
``2x1 / 1x2`` of each. The two ``data.nc`` are compared (largest absolute difference).
Rounds alternate the layouts. Writes ``benchmarks/runs/distributed.json`` and ``.png``.

    python benchmarks/bench_distributed.py            # one round
    python benchmarks/bench_distributed.py --rounds 2 --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, ROOT, add_common_args, machine_info, plt, save_figure, write_json

CONFIG = ROOT / "configs" / "sweep_large.yaml"
TINY = ["--set", "sweep.n=[64]", "--set", "sweep.seed=[0,1]", "--set", "t1=1.0"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "JAXDYN_NO_HOST_DEVICES") and not k.startswith("JAX_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra)
    return env


def _wait_all(procs, timeout):
    """Wait for every process; returns (return codes, CPU seconds of all, wall seconds)."""
    t0 = time.perf_counter()
    rcs, cpu = [None] * len(procs), 0.0
    while None in rcs:
        for i, p in enumerate(procs):
            if rcs[i] is None:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    rcs[i] = os.waitstatus_to_exitcode(status)
                    p.returncode = rcs[i]
                    cpu += ru.ru_utime + ru.ru_stime
        if time.perf_counter() - t0 > timeout:
            for p in procs:
                p.kill()
            raise RuntimeError(f"a run took more than {timeout} s")
        time.sleep(0.05)
    return rcs, cpu


def run_layout(layout, out, extra, timeout):
    cmd = [sys.executable, "-m", "jaxdyn.cli", "run", str(CONFIG), "--out", str(out), "--quiet",
           *extra]
    t0 = time.perf_counter()
    if layout == "1x2":
        procs = [subprocess.Popen(cmd, env=_env(), cwd=str(ROOT), stdout=subprocess.DEVNULL)]
    else:
        port = _free_port()
        procs = [subprocess.Popen(cmd + ["--distributed"], cwd=str(ROOT), stdout=subprocess.DEVNULL,
                                  env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=1",
                                           JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                                           JAXDYN_NUM_PROCESSES="2", JAXDYN_PROCESS_ID=str(i)))
                 for i in range(2)]
    rcs, cpu = _wait_all(procs, timeout)
    wall = time.perf_counter() - t0
    if any(rcs):
        raise RuntimeError(f"{layout}: exit statuses {rcs}")
    summary = json.loads((out / "summary.json").read_text())
    from jaxdyn.io import read_chunk

    chunk_s = sum(float(read_chunk(p, meta_only=True)[1]["seconds"])
                  for p in sorted((out / "chunks").glob("chunk_*.npz")))
    return {"wall_s": wall, "engine_s": summary["elapsed_seconds"], "chunks_s": chunk_s,
            "cpu_s": cpu, "devices": summary["versions"]["devices"],
            "n_chunks": summary["n_chunks"]}


def compare(a, b):
    import numpy as np
    import xarray as xr

    with xr.open_dataset(a / "data.nc", engine="h5netcdf") as x, \
            xr.open_dataset(b / "data.nc", engine="h5netcdf") as y:
        diffs = {v: float(np.nanmax(np.abs(x[v].values.astype(float) - y[v].values.astype(float))))
                 for v in x.data_vars}
        identical = all(np.array_equal(x[v].values, y[v].values, equal_nan=True)
                        for v in x.data_vars)
    return diffs, identical


def main():
    p = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--rounds", type=int, default=1, help="rounds (each runs both layouts)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run before giving up")
    p.add_argument("--replot", action="store_true", help="redraw the figure from the saved JSON")
    args = p.parse_args()
    if args.replot:
        plot(json.loads((RESULTS / f"distributed{args.tag}.json").read_text()), args.tag)
        return
    extra = TINY if args.tiny else []
    runs = {"1x2": [], "2x1": []}
    with tempfile.TemporaryDirectory(prefix="bench_distributed_") as tmp:
        last = {}
        for r in range(args.rounds):
            order = ["1x2", "2x1"] if r % 2 == 0 else ["2x1", "1x2"]
            for layout in order:
                out = Path(tmp) / f"{layout}_{r}"
                res = run_layout(layout, out, extra, args.timeout)
                runs[layout].append(res)
                last[layout] = out
                print(f"round {r} {layout}: wall {res['wall_s']:.1f} s, engine {res['engine_s']:.1f} s, "
                      f"chunks {res['chunks_s']:.1f} s, CPU {res['cpu_s']:.1f} s", flush=True)
        diffs, identical = compare(last["1x2"], last["2x1"])

    def med(layout, key):
        vals = sorted(x[key] for x in runs[layout])
        return vals[len(vals) // 2]

    keys = ("wall_s", "engine_s", "chunks_s", "cpu_s")
    ratio = {k: med("2x1", k) / med("1x2", k) for k in keys}
    data = {"workload": "configs/sweep_large.yaml" + (" (tiny: " + " ".join(extra) + ")" if extra else ""),
            "layouts": {"1x2": "1 process x 2 host devices", "2x1": "2 processes x 1 device (gloo)"},
            "runs": runs, "median": {lay: {k: med(lay, k) for k in keys} for lay in runs},
            "ratio_2x1_over_1x2": ratio, "max_abs_diff": diffs, "identical": identical,
            "machine": machine_info()}
    write_json("distributed" + args.tag, data)
    print("2x1 / 1x2: " + ", ".join(f"{k} {v:.2f}" for k, v in ratio.items())
          + f"; data.nc identical: {identical}")
    if not args.no_plot:
        plot(data, args.tag)


def plot(data, tag=""):
    keys = ("wall_s", "engine_s", "chunks_s", "cpu_s")
    fig, ax = plt().subplots(figsize=(6.4, 3.4))
    labels = ["whole command", "engine", "chunk\ncompute", "CPU\n(all processes)"]
    w = 0.38
    for j, lay in enumerate(("1x2", "2x1")):
        ax.bar([x + (j - 0.5) * w for x in range(len(keys))],
               [data["median"][lay][k] for k in keys], w, label=data["layouts"][lay])
    ax.set_xticks(list(range(len(keys))), labels)
    ax.set_ylabel("seconds")
    r = data["ratio_2x1_over_1x2"]
    ax.set_title(f"sweep_large: 2 processes x 1 device / 1 process x 2 devices = "
                 f"{r['wall_s']:.2f} (wall), {r['cpu_s']:.2f} (CPU)", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, "distributed" + tag)

if __name__ == "__main__":
    main()
