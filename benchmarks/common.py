"""Shared helpers of the benchmark scripts: device setup, timing, machine facts, output.

Every benchmark entry point calls :func:`setup` *before* importing JAX-using modules:

    from common import setup
    args = setup(parser)          # exposes the host cores as JAX devices (opt out:
                                  # --no-host-devices or JAXDYN_NO_HOST_DEVICES=1)

Timing rules (STYLE.md): the first call (trace + compile + run) is reported separately as
``compile_s``; then ``warmup`` untimed calls; then ``reps`` timed calls, each ended by
``block_until_ready`` (JAX) or ``torch.cuda.synchronize`` (PyTorch on GPU); we report the
median and the minimum. Baselines run in the same invocation, and every figure is a ratio
to a baseline measured there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Where the scripts write: ``benchmarks/runs/`` (ignored by git), so that running a script
#: never changes a tracked file. ``python -m benchmarks run`` points it at a scratch folder
#: (``JAXDYN_BENCH_RESULTS``) and files the result under ``runs/<workload>/``, or, with
#: ``--record``, as the tracked latest ``results/<workload>/<machine kind>.json``.
RESULTS = Path(os.environ.get("JAXDYN_BENCH_RESULTS") or HERE / "runs")
sys.path.insert(0, str(ROOT))


def add_common_args(p: argparse.ArgumentParser):
    p.add_argument("--no-host-devices", action="store_true",
                   help="do not expose the CPU cores as separate JAX devices")
    p.add_argument("--tiny", action="store_true",
                   help="tiny sizes (a smoke test of the script, numbers meaningless)")
    p.add_argument("--tag", default="", help="suffix of the result file names (e.g. _gpu)")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--max-isa", default=None,
                   help="run as on a CPU without the newer vector extensions: cap XLA:CPU's "
                        "code generation (--xla_cpu_max_isa, e.g. AVX2) and PyTorch's kernels "
                        "(ATEN_CPU_CAPABILITY) for this run")
    return p


def cap_isa(isa):
    """Set the environment for a run capped at ``isa`` (before JAX and PyTorch start):
    ``--xla_cpu_max_isa`` and, below AVX-512, XLA's default vector preference (256; jaxdyn
    asks for 512-bit vectors on AVX-512 CPUs) unless one is already named, and PyTorch's
    ``ATEN_CPU_CAPABILITY=avx2`` (or ``default`` below AVX2). Library kernels that XLA calls
    (YNNPACK matmuls) still pick their ISA from the CPU."""
    isa = isa.upper()
    if isa not in XLA_ISAS:
        raise SystemExit(f"--max-isa must be one of {', '.join(XLA_ISAS)}; got {isa!r}")
    flags = os.environ.get("XLA_FLAGS", "")
    flags += f" --xla_cpu_max_isa={isa}"
    below512 = XLA_ISAS.index(isa) < XLA_ISAS.index("AVX512")
    if below512 and "xla_cpu_prefer_vector_width" not in flags:
        flags += " --xla_cpu_prefer_vector_width=256"
    os.environ["XLA_FLAGS"] = flags.strip()
    if below512:
        os.environ.setdefault("ATEN_CPU_CAPABILITY",
                              "avx2" if XLA_ISAS.index(isa) >= XLA_ISAS.index("AVX2") else "default")


def setup(parser: argparse.ArgumentParser, argv=None):
    """Parse arguments and configure host devices before JAX starts."""
    args = parser.parse_args(argv)
    if os.environ.get("JAXDYN_BENCH_TINY") == "1":
        args.tiny = True
    if getattr(args, "max_isa", None):
        cap_isa(args.max_isa)
    if args.no_host_devices:
        os.environ["JAXDYN_NO_HOST_DEVICES"] = "1"
    from jaxdyn.simulation import configure_host_devices

    args.host_devices_configured = configure_host_devices()
    return args


def block(x):
    import jax

    return jax.block_until_ready(x)


def _cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def time_call(fn, *args, reps=5, warmup=1, sync=None, max_seconds=None):
    """Time ``fn(*args)``. Returns (stats, last result); stats: compile_s (first call),
    median_s, min_s, times_s (wall clock), and cpu_median_s / cpu_times_s: the process's CPU
    time (all threads) per call, a measure of work that other load on the machine disturbs
    less than wall time.

    ``sync(result)`` waits for the result (default: ``jax.block_until_ready``). With
    ``max_seconds``, stops repeating once that much time was spent timing (at least one
    timed call).
    """
    sync = sync or block
    t0 = time.perf_counter()
    out = sync(fn(*args))
    first = time.perf_counter() - t0
    for _ in range(warmup):
        sync(fn(*args))
    times, cpus = [], []
    spent = 0.0
    for _ in range(max(1, reps)):
        c0 = _cpu_s()
        t0 = time.perf_counter()
        out = sync(fn(*args))
        dt = time.perf_counter() - t0
        cpus.append(_cpu_s() - c0)
        times.append(dt)
        spent += dt
        if max_seconds is not None and spent > max_seconds:
            break
    return {"compile_s": first, "median_s": statistics.median(times), "min_s": min(times),
            "times_s": times, "cpu_median_s": statistics.median(cpus), "cpu_times_s": cpus}, out


def interleaved(impls, reps=3, drop_factor=2.0, log=None):
    """Time several implementations in interleaved rounds, so that they share the machine's
    load conditions (on a shared machine, load drifts over minutes).

    ``impls``: name → dict(fn=callable without arguments, sync=callable or None,
    setup=callable or None run before each call). Names ``lib@k`` form a group (thread
    settings of one library): after the first calls, a member more than ``drop_factor``
    times slower than its group's fastest first call runs no further rounds.

    Returns name → stats (compile_s = first call, median_s, min_s, times_s, cpu_median_s,
    cpu_times_s, rounds, dropped) with ``out`` = the last result.
    """
    res = {}
    for name, spec in impls.items():
        if spec.get("setup"):
            spec["setup"]()
        sync = spec.get("sync") or block
        t0 = time.perf_counter()
        out = sync(spec["fn"]())
        res[name] = {"compile_s": time.perf_counter() - t0, "times_s": [], "cpu_times_s": [],
                     "out": out, "dropped": False}
        if log:
            log(f"  {name}: first call {fmt_s(res[name]['compile_s'])}")
    groups = {}
    for name in impls:
        groups.setdefault(name.partition("@")[0], []).append(name)
    for members in groups.values():
        best = min(res[m]["compile_s"] for m in members)
        for m in members:
            if len(members) > 1 and res[m]["compile_s"] > drop_factor * best:
                res[m]["dropped"] = True
    for _ in range(max(1, reps)):
        for name, spec in impls.items():
            r = res[name]
            if r["dropped"]:
                continue
            if spec.get("setup"):
                spec["setup"]()
            sync = spec.get("sync") or block
            c0 = _cpu_s()
            t0 = time.perf_counter()
            r["out"] = sync(spec["fn"]())
            r["times_s"].append(time.perf_counter() - t0)
            r["cpu_times_s"].append(_cpu_s() - c0)
    for name, r in res.items():
        if not r["times_s"]:  # dropped: its first call is its only measurement
            r["times_s"] = [r["compile_s"]]
            r["note"] = f"one call only: more than {drop_factor}× slower than its group's fastest"
        r["median_s"] = statistics.median(r["times_s"])
        r["min_s"] = min(r["times_s"])
        r["rounds"] = len(r["times_s"])
        if r["cpu_times_s"]:
            r["cpu_median_s"] = statistics.median(r["cpu_times_s"])
    return res


def torch_sync(device):
    import torch

    def sync(x):
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()
        return x

    return sync


#: XLA:CPU's ISA levels in order (the values of ``--xla_cpu_max_isa``).
XLA_ISAS = ("SSE4_2", "AVX", "AVX2", "AVX512", "AVX512_VNNI", "AVX512_BF16", "AMX", "AMX_FP16")
_ISA_FLAGS = {"SSE4_2": "sse4_2", "AVX": "avx", "AVX2": "avx2", "AVX512": "avx512f",
              "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16", "AMX": "amx_tile",
              "AMX_FP16": "amx_fp16"}


def _xla_flag(flags, name):
    """The value of ``--name=value`` in an XLA_FLAGS string (the last one wins), or None."""
    val = None
    for tok in flags.split():
        if tok.startswith(f"--{name}="):
            val = tok.split("=", 1)[1]
    return val


def cpu_isa(flags=None, cpu_flags=None):
    """The vector ISA XLA:CPU generates code for here: the CPU's extensions (/proc/cpuinfo),
    the cap ``--xla_cpu_max_isa`` and the preferred width ``--xla_cpu_prefer_vector_width``
    from ``XLA_FLAGS``, and the result: ``target_isa`` (the highest level the CPU has and the
    cap allows), ``vector_bits`` (512 only where AVX-512 is allowed and 512 is preferred; XLA's
    default preference is 256) and a one-line ``label``. Library kernels that XLA calls
    (YNNPACK/XNNPACK matmuls) choose their ISA at run time from the CPU and ignore the cap."""
    flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    if cpu_flags is None:
        try:
            cpu_flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
        except (OSError, StopIteration):
            cpu_flags = None
    info = {"cpu_flags": None if cpu_flags is None else
            {f: f in cpu_flags for f in ("avx", "avx2", "fma", "avx512f", "avx512_vnni",
                                         "avx512_bf16")}}
    cap = _xla_flag(flags, "xla_cpu_max_isa")
    info["xla_max_isa"] = cap
    width = _xla_flag(flags, "xla_cpu_prefer_vector_width")
    info["xla_prefer_vector_width"] = int(width) if width else None
    if cpu_flags is None:
        info.update(target_isa=None, vector_bits=None, label="unknown CPU extensions")
        return info
    have = [isa for isa in XLA_ISAS if _ISA_FLAGS[isa] in cpu_flags]
    best = have[-1] if have else None
    target = best
    if cap is not None and cap.upper() in XLA_ISAS and best is not None:
        target = XLA_ISAS[min(XLA_ISAS.index(best), XLA_ISAS.index(cap.upper()))]
    info["target_isa"] = target
    wide = target is not None and XLA_ISAS.index(target) >= XLA_ISAS.index("AVX512")
    avx = target is not None and XLA_ISAS.index(target) >= XLA_ISAS.index("AVX")
    pref = info["xla_prefer_vector_width"] or 256
    info["vector_bits"] = min(pref, 512) if wide else (min(pref, 256) if avx else 128)
    fma = " + FMA" if "fma" in cpu_flags and avx and XLA_ISAS.index(target) >= 2 else ""
    name = "AVX-512" if wide else (target or "scalar")
    label = f"{name}{fma}, {info['vector_bits']}-bit vectors"
    if cap is not None and best is not None and target != best:
        label += f" (CPU has {best}; capped by --xla_cpu_max_isa={cap})"
    info["label"] = label
    return info


def emitted_vectors():
    """What XLA:CPU actually emits here: compile a float32 exp loop with its object files
    dumped (a per-compilation option) and count the vector registers in the machine code
    (``objdump``). Returns {"zmm": k, "ymm": k, "xmm": k, "widest": "zmm"|"ymm"|"xmm"|None}
    or None where that cannot be checked (not a CPU backend, no objdump)."""
    import glob
    import shutil
    import tempfile

    import jax
    import jax.numpy as jnp

    if jax.default_backend() != "cpu" or not shutil.which("objdump"):
        return None
    d = tempfile.mkdtemp(prefix="jaxdyn_isa_")
    try:
        fn = jax.jit(lambda a: jnp.exp(a - 1.0) * 2.0)
        fn.lower(jnp.zeros(4096, jnp.float32)).compile(compiler_options={"xla_dump_to": d})
        counts = {"zmm": 0, "ymm": 0, "xmm": 0}
        objs = glob.glob(os.path.join(d, "*.o"))
        for o in objs:
            asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", o], capture_output=True,
                                 text=True, timeout=60).stdout
            for r in counts:
                counts[r] += asm.count(f"%{r}")
    except Exception as e:  # a check, never a failure of the benchmark
        return {"error": f"{type(e).__name__}: {e}"[:200]}
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if not objs:
        return None
    counts["widest"] = next((r for r in ("zmm", "ymm", "xmm") if counts[r]), None)
    return counts


def machine_info(codegen_check=True):
    """Facts of the machine and the run, recorded in every benchmark JSON: CPU model and
    vector extensions (``isa``: :func:`cpu_isa`, plus with ``codegen_check`` the registers of
    XLA's emitted exp loop, :func:`emitted_vectors`), JAX version, devices, XLA flags, load."""
    import jax

    info = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_count": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "x64": bool(jax.config.jax_enable_x64),
    }
    try:
        info["cpu_model"] = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                                 if l.startswith("model name"))
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags"))
        info["avx512"] = "avx512f" in flags
    except (OSError, StopIteration):
        pass
    info["isa"] = cpu_isa()
    if codegen_check:
        em = info["isa"]["emitted"] = emitted_vectors()
        if em and em.get("widest"):
            info["isa"]["label"] += f"; emitted exp loop uses {em['widest']} registers"
    try:
        info["loadavg_start"] = os.getloadavg()
    except OSError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        try:  # the ISA of PyTorch's CPU kernels (ATEN_CPU_CAPABILITY caps it)
            info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        except AttributeError:
            pass
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        info["torch"] = None
    return info


def out_dirs():
    """:data:`RESULTS` (``benchmarks/runs``), and $OUT too when set (the GPU machine's return folder)."""
    dirs = [RESULTS]
    if os.environ.get("OUT"):
        dirs.append(Path(os.environ["OUT"]))
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def write_json(name, data):
    try:
        data.setdefault("machine", {})["loadavg_end"] = os.getloadavg()
    except OSError:
        pass
    paths = []
    for d in out_dirs():
        p = d / f"{name}.json"
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=2, default=_json_default))
        tmp.replace(p)
        paths.append(p)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return paths


def _json_default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:
        pass
    return str(o)


def save_figure(fig, name):
    paths = []
    for d in out_dirs():
        p = d / f"{name}.png"
        fig.savefig(p, dpi=110, bbox_inches="tight")
        paths.append(p)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return paths


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def rss_bytes():
    """Current resident set size of this process, bytes (Linux /proc)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _status_kb(key):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux ≥ 4.0:
    ``/proc/self/clear_refs`` ← 5). Returns whether that worked."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def hwm_bytes():
    """Peak RSS since the last :func:`reset_peak_rss` (VmHWM), bytes; None if unknown."""
    return _status_kb("VmHWM")


def peak_rss_bytes():
    """Peak resident set size of this process so far (ru_maxrss), bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_json_subprocess(args, env_extra=None, timeout=None):
    """Run ``python args...``; the last stdout line is JSON. Returns (obj or None, stderr)."""
    env = dict(os.environ)
    env.update(env_extra or {})
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + str(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return None, f"timeout after {timeout}s: {e}"
    lines = [l for l in proc.stdout.strip().splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        return None, (proc.stderr or "")[-3000:] + (proc.stdout or "")[-1000:]
    return json.loads(lines[-1]), proc.stderr[-2000:]


def fmt_s(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"
