"""The measured numbers of the guides, generated from committed result files.

A number a guide states from a measurement sits in a generated span,

    <!-- BEGIN GENERATED stem.what -->…<!-- END GENERATED stem.what -->

(a table on lines of its own, or a phrase inside a sentence), whose text is rendered from the
result file ``docs/results/<folder>/<stem>.json``: ``what`` names one of the renderers of that
file's ``kind`` (:data:`RENDERERS`, and a kind's own ``GUIDE_RENDERERS``: :func:`renderers`); a stem ``bench-WORKLOAD`` (``bench-WORKLOAD--MACHINE`` where several machines ran it) names the benchmark suite's recorded
result ``benchmarks/results/WORKLOAD/*.json`` (one machine kind). A result file holds the measurement's results and its
provenance (``meta``: the command, the commit, which files under ``jaxdyn/`` and ``configs/``
differed from it, the machine, wall and CPU seconds, the config). Numbers that move with the
seed are rendered as distributions: the mean and the range over the seeds, or a mean with its
standard error and a 5–95 % range over many draws.

    python -m jaxdyn.experiments.guide_numbers                      # rewrite the guides' spans
    python -m jaxdyn.experiments.guide_numbers --check              # exit 1 where a guide differs
    python -m jaxdyn.experiments.guide_numbers record RUN_DIR OUT.json [--command "jaxdyn run …"]

``record`` turns a finished ``jaxdyn run`` folder into a result file: its summary recomputed
from ``data.nc`` by the kind's ``summarize``, its timings from ``summary.json``. The default
test suite (``tests/test_guide_numbers.py``) regenerates every guide from the committed result
files and fails where the text differs, so a hand edit inside a span does not survive.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDES = ("docs/guides", "docs", ".")
RESULTS = "docs/results"
BENCH = "bench-"  # a span stem naming a benchmark workload (benchmarks/results/WORKLOAD/)
SPAN = re.compile(r"(<!-- BEGIN GENERATED ([\w.-]+) -->)(.*?)(<!-- END GENERATED \2 -->)", re.S)


# ---------------------------------------------------------------- provenance and result files


def _git(*args, root=ROOT):
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def machine() -> dict:
    """The machine a measurement ran on: CPU model, cores, platform.

    Where ``/proc/cpuinfo`` tells them, also the CPU's family and model numbers (a virtual
    machine's model name, "AMD EPYC" say, does not tell one generation from the next) and its
    widest vector extension.

    Returns:
      A dict: ``cpu``, ``cores``, ``platform``, ``python``, and ``cpu_id`` and ``vector``
      where known.
    """
    info = {"cpu": platform.processor() or platform.machine()}
    try:
        lines = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0].splitlines()
    except OSError:
        lines = []
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    if "model name" in fields:
        info["cpu"] = fields["model name"]
    if "cpu family" in fields and "model" in fields:
        info["cpu_id"] = f"family {fields['cpu family']} model {fields['model']}"
    flags = set((fields.get("flags") or fields.get("Features", "")).split())  # x86, Arm
    vector = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"),
                                           ("asimd", "NEON")) if flag in flags), None)
    if vector:
        info["vector"] = vector
    return {**info, "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}


def provenance(command: str, *, wall_seconds=None, cpu_seconds=None, config=None, **extra) -> dict:
    """The ``meta`` of a result file: command, commit, files that differed from it, machine, times.

    Args:
      command: the command that produced the result.
      wall_seconds: its wall time.
      cpu_seconds: its CPU time (None where not measured).
      config: the resolved config, or its YAML text.
      **extra: further fields (timings of a run's parts).

    Returns:
      The dict.
    """
    import jax

    changed = _git("status", "--porcelain", "--", "jaxdyn", "configs")
    commit = _git("rev-parse", "HEAD")
    meta = {"command": command, "commit": commit.strip() if commit else None,
            "changed_files": sorted(line[3:] for line in changed.splitlines() if line.strip())
                             if changed else [],
            "machine": machine(), "jax": jax.__version__, "backend": jax.default_backend(),
            "wall_seconds": wall_seconds, "cpu_seconds": cpu_seconds}
    if config is not None:
        meta["config"] = config
    meta.update(extra)
    return meta


def write_result(path, result: dict) -> Path:
    """Write a result file (``{"kind", "meta", "results"}``; JSON, sorted keys, non-finite → null)."""
    from ..io import atomic_write_text, json_safe

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(json_safe(result, nonfinite=None), indent=1,
                                              sort_keys=True, ensure_ascii=False) + "\n")


def clock() -> tuple:
    """The start of a measurement: (wall, CPU) seconds now, for :func:`write_measurement`."""
    return time.perf_counter(), time.process_time()


def write_measurement(path, kind: str, command: str, results, started) -> Path:
    """Write a script's measurement as a result file, timed from ``started``.

    Args:
      path: the result file.
      kind: the result's kind (its renderers, :data:`RENDERERS`), also its name.
      command: the command that produced it.
      results: what was measured.
      started: :func:`clock` at the start of the measurement.

    Returns:
      The path written.
    """
    wall0, cpu0 = started
    meta = provenance(command, wall_seconds=time.perf_counter() - wall0,
                      cpu_seconds=time.process_time() - cpu0)
    return write_result(path, {"kind": kind, "name": kind, "meta": meta, "results": results})


def record(run_dir, out, command=None) -> Path:
    """A finished run folder as a result file (the summary recomputed from its ``data.nc``).

    Args:
      run_dir: the folder of ``jaxdyn run``.
      out: the result file to write.
      command: the command that made the run (recorded; default: ``jaxdyn run`` of its config).

    Returns:
      The path written.
    """
    from .. import io as jio
    from ..config import parse_yaml
    from .kinds import get_kind
    from .planning import resolve_config

    run_dir = Path(run_dir)
    text = (run_dir / jio.CONFIG_FILE).read_text()
    cfg = resolve_config(parse_yaml(text, str(run_dir / jio.CONFIG_FILE)))
    run = json.loads((run_dir / jio.SUMMARY_FILE).read_text())
    ds = jio.open_results(run_dir)
    results = get_kind(cfg["kind"]).summarize(cfg, ds)
    meta = provenance(command or f"jaxdyn run CONFIG --out {run_dir.name}",
                      wall_seconds=run.get("elapsed_seconds"),
                      cpu_seconds=run.get("process_cpu_seconds"), config=text,
                      compile_seconds=run.get("compile_seconds"),
                      compute_seconds=run.get("compute_seconds"),
                      run_status=run.get("status"), started=run.get("started"),
                      run_versions=run.get("versions"), n_chunks=run.get("n_chunks"),
                      estimated_process_bytes=run.get("estimated_process_bytes"),
                      measured_peak_rss_bytes=run.get("measured_peak_rss_bytes"))
    return write_result(out, {"kind": cfg["kind"], "name": cfg["name"], "meta": meta,
                              "results": results})


# ---------------------------------------------------------------- formatting


def num(x, digits=3) -> str:
    """``x`` to ``digits`` significant digits ("—" for None; a true minus sign)."""
    if x is None:
        return "—"
    x = float(x)
    if x != 0 and (abs(x) < 1e-4 or abs(x) >= 1e5):
        m, e = f"{x:.{max(digits - 1, 0)}e}".split("e")
        s = f"{m}e{int(e)}"
    else:
        s = f"{x:#.{digits}g}"  # trailing zeros kept: 0.220, 6.00
        if "e" in s and abs(x) < 10 ** max(digits, 4):
            s = f"{x:.0f}"      # 1000 at 3 digits
        elif "e" in s:
            m, e = s.split("e")
            s = f"{m.rstrip('.')}e{int(e)}"
        s = s.rstrip(".")
    return s.replace("-", "−")


def stats(values) -> dict:
    """Mean, smallest, largest and count of the values that are not None."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": sum(v) / len(v), "min": min(v), "max": max(v), "n": len(v)}


def spread(values, digits=3, of=None) -> str:
    """The values as "mean (min–max)", with "[k of n]" when some are None.

    Args:
      values: the values (None where a seed has none).
      digits: significant digits.
      of: the count they are out of (default ``len(values)``).

    Returns:
      The text ("—" when every value is None).
    """
    vals = [x for x in values if x is not None]
    big = max((abs(x) for x in vals), default=0.0)
    # a value at rounding level next to the others' scale (a fit's slope through equal points)
    values = [None if x is None else 0.0 if abs(x) < 1e-12 * big else x for x in values]
    s = stats(values)
    of = len(values) if of is None else of
    if s["n"] == 0:
        return "—"
    if s["n"] == 1:
        text = num(s["mean"], digits)
    else:
        text = f"{num(s['mean'], digits)} ({num(s['min'], digits)}–{num(s['max'], digits)})"
        if s["min"] < 0 or s["max"] < 0:
            text = f"{num(s['mean'], digits)} ({num(s['min'], digits)} to {num(s['max'], digits)})"
    if s["n"] < of:
        text += f" [{s['n']} of {of}]"
    return text


def _decimals(err) -> int:
    """Decimals that end at the first significant digit of ``err``."""
    return max(0, -int(math.floor(math.log10(abs(err))))) if err else 3


def _fixed(x, err) -> str:
    return f"{x:.{_decimals(err)}f}".replace("-", "−")


def pm(x, err) -> str:
    """``x ± err``, both to the first significant digit of ``err``."""
    return f"{_fixed(x, err)} ± {_fixed(err, err)}"


def _seconds(x) -> str:
    return "—" if x is None else f"{x:.0f} s" if x >= 10 else f"{x:.1f} s"


def machine_words(meta) -> str:
    """The machine of a result file's ``meta`` (or of any record with a ``machine``) in words.

    Returns:
      "2 CPU cores (model)", or "2 CPU cores (model, family 26 model 2, AVX-512)" where the
      record holds the CPU's family and vector extension.
    """
    m = meta["machine"]
    detail = ", ".join([m["cpu"]] + [m[k] for k in ("cpu_id", "vector") if m.get(k)])
    return f"{m['cores']} CPU cores ({detail})"


def run_cost(meta) -> str:
    """A recorded run's cost in words.

    Returns:
      CPU seconds, wall seconds and peak memory where measured, and the machine:
      "47 CPU-s, 56 s wall on 2 CPU cores (model)".
    """
    parts = []
    if meta.get("cpu_seconds") is not None:
        parts.append(f"{meta['cpu_seconds']:.0f} CPU-s")
    if meta.get("wall_seconds") is not None:
        parts.append(f"{meta['wall_seconds']:.0f} s wall")
    if meta.get("peak_rss_mib") is not None:
        parts.append(f"peak RSS {meta['peak_rss_mib'] / 1024:.1f} GiB")
    return f"{', '.join(parts)} on {machine_words(meta)}"




def bench_machine_words(m) -> str:
    """A benchmark result's machine in words: "2 CPU cores (model), load 1.5 at its start"."""
    load = m.get("loadavg_start")
    model = f" ({m['cpu_model']})" if m.get("cpu_model") else ""
    return (f"{m['cpu_count']} CPU cores{model}"
            + (f", load {load[0]:.1f} at its start" if load else ""))

# ---------------------------------------------------------------- concentration


def _seed_words(res) -> str:
    seeds = res["results"]["per_seed"]["seed"]
    return f"{len(seeds)} seeds ({', '.join(str(s) for s in seeds)})"


def _conc_table(res) -> str:
    """The per-β readings as mean (smallest–largest) over the seeds."""
    ps = res["results"]["per_seed"]
    betas = ps["beta"]
    near = _near_angle(res)
    rows = [("min_t W2", "min_w2"), ("argmin_t W2", "argmin_t"),
            (f"max mass within {near}° of E", "max_mass_E"),
            ("t at which mass near E(V) overtakes mass near E (a metastable phase ended)", "overtake_time"),
            (f"final mass within {near}° of E(V)", "final_mass_V")]
    if any(x is not None for seed in ps.get("overtake_time_flagged", []) for x in seed):
        rows.insert(4, ("t at which mass near E(V) overtakes mass near E, flagged (no metastable "
                        "phase before it)", "overtake_time_flagged"))
    if "max_mass_V_magnitude" in ps:
        rows.append((f"max mass within {near}° of V's magnitude-dominant eigenvector",
                     "max_mass_V_magnitude"))
    lines = ["| β | " + " | ".join(f"{b:g}" for b in betas) + " |",
             "|---" * (len(betas) + 1) + "|"]
    for label, key in rows:
        cols = list(zip(*ps[key]))
        lines.append(f"| {label} | " + " | ".join(spread(c) for c in cols) + " |")
    return "\n".join(lines)


def _near_angle(res):
    m = re.search(r"^near_angle_deg:\s*([\d.]+)", res["meta"]["config"], re.M)
    return f"{float(m.group(1)):g}" if m else "?"


def _conc_fit(name, what="slope"):
    def render(res):
        ps = res["results"]["per_seed"]
        f = ps["fits"][name]
        n = len(ps["seed"])
        pts = stats(f["n_points"])
        pts_words = (f"{pts['min']:.0f}" if pts["min"] == pts["max"]
                     else f"{pts['min']:.0f} to {pts['max']:.0f}")
        text = f"{what} **{spread(f['slope'], of=n)}**"
        if stats(f["r2"])["n"]:
            text += f", R² {spread(f['r2'], of=n)}"
        return text + f" (mean (range) over {n} seeds, {pts_words} β a fit)"
    return render


def _conc_theory_slope(res):
    return num(res["results"]["fit_min_w2_vs_beta"]["theory_slope_sqrt_logb_over_b"])


def _conc_run(res):
    meta = res["meta"]
    return (f"{_seed_words(res)} in one run: {_seconds(meta['wall_seconds'])} of wall time on "
            f"{machine_words(meta)} ({_seconds(meta.get('compile_seconds'))} compiling, "
            f"{_seconds(meta.get('compute_seconds'))} computing; `{Path(_result_path(res)).as_posix()}`)")


def _conc_wall(res):
    return f"{_seconds(res['meta']['wall_seconds'])} wall, {len(res['results']['per_seed']['seed'])} seeds"


def _conc_assumption(res):
    a = res["results"]["assumption_1"]
    return (f"cond B = {num(a['cond_B'])}, asymmetry {num(a['asymmetry'], 1)}, "
            f"gap {num(a['gap'])}, dim E = {a['dim_E']}")


def _conc_sinkhorn(res):
    v = res["results"]["per_seed"]["sinkhorn_vs_exact_max_rel_error"]
    return (f"{spread([x * 100 if x is not None else None for x in v], 2)} %")


def _conc_readings(res):
    r = res["results"]["per_seed"]
    chosen = {c for seed in r["chosen"] for c in seed}
    return ", ".join(sorted(chosen))


def _result_path(res):
    return res.get("_path", "docs/results")


# ---------------------------------------------------------------- sampling floor, reach, gaussian


def _floor(problem):
    def render(res):
        r = res["results"][problem]
        return (f"W2 = {pm(r['mean'], r['standard_error'])} (mean ± standard error over "
                f"{r['pairs']} pairs of draws; 5–95 %: {_fixed(r['p05'], r['standard_error'])}–"
                f"{_fixed(r['p95'], r['standard_error'])})")
    return render


def _floor_seed0(problem):
    def render(res):
        return num(res["results"][problem]["seed_0"])
    return render


def _reach_rows(res):
    return {m["mode"]: m for m in res["results"]["modes"]}


def _median_range(values, digits=2) -> str:
    """"median (min–max)" of the values that are not None."""
    v = sorted(float(x) for x in values if x is not None)
    if not v:
        return "—"
    k = len(v)
    med = v[k // 2] if k % 2 else 0.5 * (v[k // 2 - 1] + v[k // 2])
    return f"{num(med, digits)} ({num(v[0], digits)}–{num(v[-1], digits)})"


def _reach_cell(mode):
    def render(res):
        pt = _reach_rows(res)[mode]["per_target"]
        cell = f"{sum(pt['reached'])}/{len(pt['reached'])}, W2 {_median_range(pt['w2'])}"
        if mode in ("all", "energy"):
            cell += f", energy {_median_range(pt['energy_ratio_to_certificate'])} × certificate"
        return cell
    return render


def _reach_certificate(res):
    vals = [x for m in res["results"]["modes"] for x in m["per_target"]["certificate_w2"]]
    return f"{num(stats(vals)['max'], 2)} at most over its {len(vals)} solves"


def _attention_transfer(res):
    return [t for t in res["results"]["transfer"] if t["mode"] == "attention"][0]


def _reach_transfer(res):
    tr = _attention_transfer(res)
    key = "particle_w2_bures_moments_exact_start"
    lo, hi = tr.get(f"{key}_min"), tr.get(f"{key}_max")
    cells = [num(m, 2) + (f" ({num(a, 2)}–{num(b, 2)})" if lo else "")
             for m, a, b in zip(tr[key], lo or tr[key], hi or tr[key])]
    return (", ".join(cells) + " for N = " + ", ".join(str(n) for n in tr["n_particles"])
            + f" (mean (range) over {tr['repeats']} draws)")


def _reach_layers(res):
    tr = _attention_transfer(res)
    g = tr["layer_rms_gap_to_continuous"]
    ok = [(L, x) for L, x in zip(tr["layers"], g) if x is not None and x > 0]
    order = -_slope([math.log(L) for L, _ in ok], [math.log(x) for _, x in ok])
    return (f"order {num(order, 2)} (least squares in log–log; RMS gap {num(g[0], 2)} → "
            f"{num(g[-1], 2)} for L = {tr['layers'][0]} → {tr['layers'][-1]}, one draw of "
            f"{tr['layer_n']} particles)")


def _slope(x, y) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def _reach_wall(res):
    return f"{_seconds(res['meta']['wall_seconds'])} wall on {machine_words(res['meta'])}"


def _gaussian_phase_blowup(res):
    r = res["results"]
    n = r["status_counts"].get("blowup", 0)
    return (f"T* to a relative {num(r['blowup_time_max_relative_error'], 2)} at most over its {n} "
            f"blow-ups (median {num(r['blowup_time_median_relative_error'], 2)}; default rtol)")


def _gaussian_blowup(res):
    r = res["results"]
    return num(r["closure"]["blowup_time_relative_error"], 1) if "closure" in r else "—"


def _bench_control_measure(res):
    rows = {(r["impl"], r["n"]): r for r in res["result"]["rows"]}
    n = max(r["n"] for r in res["result"]["rows"])
    j, t = rows[("jaxdyn-flow", n)], rows[("torch-flow-ckpt", n)]
    plain = rows.get(("torch-flow", n), {}).get("note", "")
    m = res["machine"]
    text = (f"N = {n}: {j['run_s']:.1f} s ({j['first_s']:.1f} s for the first call, compilation "
            f"included) and {j['peak_rss_mb']:.0f} MB peak resident memory for jaxdyn's flow, "
            f"against {t['run_s']:.1f} s and {t['peak_rss_mb']:.0f} MB for PyTorch autograd "
            f"with a checkpoint per RK4 step")
    if plain.startswith("skipped: "):
        text += f" (plain autograd was {plain})"
    return text + f"; one run of each on {bench_machine_words(m)}"


def _bench_moments(res):
    r = res["result"]
    j, s = r["methods"]["jaxdyn"], r["methods"]["scipy_dop853"]
    e, m, w = r["methods"]["euler_psd_dt0.001"], res["machine"], r["workload"]
    cov = lambda x: num(x["errors"]["cov_rel_nonstiff"]["max"], 2)  # noqa: E731
    return (f"{w['n']} sets, {j['counts']['blowup']} blow-ups: `solve_moments_batch` "
            f"{j['seconds_median']:.2f} s (median of {len(j['seconds_all'])}; "
            f"{min(j['seconds_all']):.2f}–{max(j['seconds_all']):.2f} s; the first call, "
            f"compiling, {j['first_call_seconds']:.0f} s) against {s['seconds']:.1f} s for the "
            f"per-set SciPy DOP853 loop ({s['speedup_of_jaxdyn']:.0f}×), with a largest relative "
            f"covariance error of {cov(j)} against {cov(s)} (reference: rtol "
            f"{r['reference']['rtol']:g}); explicit Euler with PSD projection at dt = {e['dt']:g}: "
            f"{e['seconds']:.1f} s, off by up to {100 * e['errors']['cov_rel_nonstiff']['max']:.0f} %; "
            f"one run of each on {bench_machine_words(m)}")


_SUP = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _pow10(n) -> str:
    """30000 → 3·10⁴, 100000 → 10⁵ (other integers as they are)."""
    e = int(math.floor(math.log10(n)))
    m = n / 10 ** e
    if e < 3 or m != int(m):
        return f"{n:,}".replace(",", " ")
    return (f"10{str(e).translate(_SUP)}" if m == 1 else f"{int(m)}·10{str(e).translate(_SUP)}")


def _local_rows(res, case):
    return res["result"]["cases"][case]["rows"]


def _bench_local_scan(res):
    rows = [r for r in _local_rows(res, "scan") if not r["answered_dense"]]
    parts = []
    for beta in sorted({r["beta"] for r in rows}):
        at = sorted((r for r in rows if r["beta"] == beta), key=lambda r: r["n"])
        if beta not in (100.0, 1000.0):
            continue
        vis = " and ".join(f"{num(r['visited'], 2)} (N = {_pow10(r['n'])})" for r in at)
        cap = " and ".join(num(r["expected_visited"], 2) for r in at)
        fast = " and ".join(f"{1 / r['local_over_blocked']:.1f}×" for r in at)
        parts.append(f"at β = {beta:g} the lists visit {vis} of the pairs, against a cap of "
                     f"{cap}, and the local kernel runs {fast} faster than the blocked one")
    return "; ".join(parts)


def _bench_local_field(res):
    times = {r["n"]: r["time"]["median_s"] for r in _local_rows(res, "field")}
    for r in _local_rows(res, "keops"):
        times.setdefault(r["n"], r["impl"]["jaxdyn_local"]["median_s"])
    return ", ".join(f"{_seconds(t) if t >= 1 else f'{t:.2f} s'} at N = {_pow10(n)}"
                     for n, t in sorted(times.items()))


def _bench_local_keys(res):
    rows = sorted(_local_rows(res, "field"), key=lambda r: r["n"])
    keys = " and ".join(f"{r['visited'] * r['n']:.0f}" for r in rows)
    return f"{keys} keys a query at N = {' and '.join(_pow10(r['n']) for r in rows)}"


def _bench_local_pair_cost(res):
    rows = [r for r in _local_rows(res, "scan") if not r["answered_dense"] and r["beta"] == 100.0]
    cost = [r["local_over_blocked"] / r["visited"] for r in rows]
    vis = [r["visited"] for r in rows]
    return (f"{min(cost):.1f}–{max(cost):.1f}× what it costs the blocked one in these runs "
            f"(β = 100, visited {min(vis):.2f}–{max(vis):.2f})")


def _bench_local_small_beta(res):
    auto = [100 * (r["auto_over_blocked"] - 1) for r in _local_rows(res, "auto")
            if r["beta"] == 1.0]
    at30 = [100 * (r["local_over_blocked"] - 1) for r in _local_rows(res, "scan")
            if r["beta"] == 30.0]
    span = lambda v: f"{min(v):.0f}–{max(v):.0f} %"  # noqa: E731
    return (f"{span(auto)} over the blocked kernel at β = 1 (answered before any ordering) and "
            f"{span(at30)} at β = 30")


def _ms(seconds) -> str:
    ms = 1e3 * seconds
    return f"{seconds:.2f} s" if seconds >= 1 else f"{ms:.3g} ms"


def _bench_pde(res):
    r = res["result"]
    parts = {}
    for p in r["particles"]:
        parts.setdefault(p["kind"], []).append(p)
    def text(ps):
        costs = [_ms(p["rk4_step_cpu_s"]) for p in ps]
        listed = ", ".join(costs[:-1]) + " and " + costs[-1] if len(costs) > 1 else costs[0]
        return f"{listed} at N = " + ", ".join(_pow10(p["n"]) for p in ps)

    return (f"one Heun step of the density at M = {r['m']} (two right-hand sides, each three FFT "
            f"convolutions of length {r['m']} plus the flux) costs "
            f"{_ms(r['density']['heun_step_cpu_s'])} of CPU; one RK4 particle step (four field "
            f"evaluations) costs {text(parts['fourier'])} with the Fourier field and "
            f"{text(parts['dense_or_blocked'])} with the dense/blocked kernel")


def _bench_pde_ratio(res):
    r = res["result"]
    top = max((p for p in r["particles"] if p["kind"] == "fourier"), key=lambda p: p["n"])
    heun = r["density"]["heun_step_cpu_s"]
    return (f"{_ms(top['rk4_step_cpu_s'])} against {_ms(heun)}: "
            f"{top['rk4_step_cpu_s'] / heun:.0f}")


def _bench_causal(res):
    """The causal benchmark: causal / full wall and CPU time, and the pairs visited, per N."""
    rows = sorted(res["result"]["rows"], key=lambda r: r["n"])
    m = res["machine"]
    def both(key, fmt="{:.2f}"):
        words = [fmt.format(r[key]) for r in rows]
        return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]

    return (f"causal / full = {both('causal_over_full')} of the wall time at N = "
            f"{both('n', '{}')} (CPU time {both('causal_over_full_cpu')}), "
            f"against {both('key_blocks_visited_fraction')} of the (row, key block) pairs visited "
            f"(medians of {res['result']['reps']} interleaved repeats on {bench_machine_words(m)})")


def _bench_distributed(res):
    """The two-process sweep against one process with two devices: time ratios, identity."""
    r = res["result"]
    reps = {len(v) for v in r["runs"].values()}
    ratio = r["ratio_2x1_over_1x2"]
    same = "identical" if r["identical"] else "not identical"
    return (f"2 processes × 1 device against 1 process × 2 devices took {ratio['wall_s']:.2f}× "
            f"the wall time of the whole command and {ratio['cpu_s']:.2f}× the CPU time of all "
            f"processes; the two `data.nc` are {same} ({'one run' if reps == {1} else 'medians of runs'} "
            f"of each on {bench_machine_words(res['machine'])})")


def _bench_w2_large(res):
    """The multiscale W2 at the largest N of a w2 benchmark: kernel density, CPU and wall."""
    row = max(res["result"]["rows"], key=lambda r: r["n"])
    m = res["machine"]
    return (f"the last kernels keep {100 * row['kernel_density']:.1f} % of the blocks at "
            f"N = {_pow10(row['n'])} ({row['case']} clouds, {row['dtype']}): "
            f"{row['jaxdyn_first_call_cpu_s']:.0f} s of CPU time and {row['jaxdyn_s']:.0f} s of wall "
            f"time from a cold start on {bench_machine_words(m)}, one run")


def _corollary(config, what):
    def render(res):
        r = res["results"][config]
        return f"**{spread(r[what], 2)}**"
    return render


def _corollary_setup(res):
    r = next(iter(res["results"].values()))
    t0, t1 = r["t_fit"]
    return (f"N = {r['n']}, {len(r['seed'])} seeds, fitted on t ∈ [{t0:g}, {t1:g}]; "
            f"{_seconds(res['meta']['wall_seconds'])} of wall time for both weights")


def _diverged(sd) -> bool:
    """A seed's climb that ended above its start somewhere (the optimiser made W2 worse)."""
    return any(row["w2"] > sd["w2_start"] for row in sd["rows"])


def _depth_col(res, problem, key):
    """Per depth, the values of ``key`` over the seeds of ``problem``."""
    seeds = res["results"][problem]["seeds"]
    return [[sd["rows"][i][key] for sd in seeds] for i in range(len(seeds[0]["rows"]))]


def _depth_table(res):
    r = res["results"]
    layers = r["sphere_clusters"]["layers"]
    s_w2 = _depth_col(res, "sphere_clusters", "w2")
    s_e2 = _depth_col(res, "sphere_clusters", "sqrt_s_eps")
    s_e3 = _depth_col(res, "sphere_clusters", "sqrt_s_eps_1e-3")
    s_rs = _depth_col(res, "sphere_clusters", "w2_resampled")
    e_w2 = _depth_col(res, "gaussian_to_mixture", "w2")
    start = {p: _median_range([sd["w2_start"] for sd in r[p]["seeds"]]) for p in r}
    lines = [f"| L | S²: W2 (start {start['sphere_clusters']}) | S²: √S_ε at ε = 0.01 / 1e-3 | "
             f"S²: W2 to an independent draw of ν | R²: W2 (start {start['gaussian_to_mixture']}) |",
             "|---|---|---|---|---|"]
    for i, L in enumerate(layers):
        lines.append(f"| {L} | {_median_range(s_w2[i])} | {_median_range(s_e2[i])} / "
                     f"{_median_range(s_e3[i])} | {_median_range(s_rs[i])} | {_median_range(e_w2[i])} |")
    return "\n".join(lines)


def _depth_slope(problem, first=0):
    def render(res):
        seeds = res["results"][problem]["seeds"]
        slopes = [_slope([math.log(x["L"]) for x in sd["rows"][first:]],
                         [math.log(x["w2"]) for x in sd["rows"][first:]])
                  for sd in seeds if not _diverged(sd)]
        left = len(seeds) - len(slopes)
        return spread(slopes, 2) + (f" (over the {len(slopes)} seeds that did not diverge)" if left else "")
    return render


def _depth_divergences(res):
    out = []
    for problem, v in res["results"].items():
        for sd in v["seeds"]:
            if _diverged(sd):
                bad = [row for row in sd["rows"] if row["w2"] > sd["w2_start"]]
                out.append(f"{'S²' if problem == 'sphere_clusters' else 'R²'} seed {sd['seed']} at "
                           f"L = {', '.join(str(row['L']) for row in bad)} (W2 up to "
                           f"{num(max(row['w2'] for row in bad), 2)} from a start at "
                           f"{num(sd['w2_start'], 3)}; status "
                           f"{', '.join(sorted({row['status'] for row in bad}))}, "
                           f"`stats[\"stop\"]` {', '.join(str(c) for c in sorted({row['stop'] for row in bad}))})")
    return "; ".join(out) if out else "none"


def _depth_seeds(res):
    r = res["results"]
    k = {len(v["seeds"]) for v in r.values()}
    n = {v["n"] for v in r.values()}
    return (f"{'/'.join(str(x) for x in sorted(k))} seeds, N = {'/'.join(str(x) for x in sorted(n))}; "
            f"{_seconds(res['meta']['wall_seconds'])} of wall time on {machine_words(res['meta'])}")


def _rows_kept(res, problems):
    return [row for p in problems for sd in res["results"][p]["seeds"] if not _diverged(sd)
            for row in sd["rows"]]


def _depth_agreement(key, ref="w2"):
    def render(res):
        rel = [abs(row[key] - row[ref]) / row[ref] for row in _rows_kept(res, ["sphere_clusters"])]
        return f"{100 * max(rel):.2g} %"
    return render


def _depth_replay(res):
    rel = [abs(row["loss_fine"] - row["loss"]) / abs(row["loss"])
           for row in _rows_kept(res, list(res["results"]))]
    return f"{100 * max(rel):.2g} %"


def _depth_status(problem):
    def render(res):
        counts = {}
        for sd in res["results"][problem]["seeds"]:
            for row in sd["rows"]:
                counts[row["status"]] = counts.get(row["status"], 0) + 1
        total = sum(counts.values())
        return ", ".join(f"{c} of {total} `{k}`" for k, c in sorted(counts.items()))
    return render


# ---------------------------------------------------------------- the README's times

#: the examples whose times the README states (benchmarks/readme_times.py measures them)
README_EXAMPLES = ("beta_sweep", "multihead_causal", "noisy_run", "density_solver",
                   "gaussian_blowup", "reachability", "two_process_sweep")


def _readme_example(name):
    def render(res):
        e = res["results"]["examples"][name]
        return f"{statistics.median(e['wall_s']):.1f} s ({statistics.median(e['cpu_s']):.1f} CPU-s)"
    return render


def _readme_quick_start(res):
    q = res["results"]["quick_start"]
    first, second = q["first"], q["second"]
    return (f"takes {first['wall_s']:.1f} s of wall time ({first['cpu_s']:.0f} CPU-s) on "
            f"{machine_words(res['meta'])}, of which {first['compile_s']:.1f} s compiling; a "
            f"second run loads its programs from JAX's cache: {second['wall_s']:.1f} s, "
            f"{second['compile_s']:.1f} s of it loading them")


#: the CPU time the default suite is meant to fit in (seconds, on 2 cores)
SUITE_BUDGET_CPU_S = 480


def _readme_suite(res):
    s = res["results"]["suite"]
    c = s["counts"]
    total = sum(v for k, v in c.items() if k != "deselected")
    parts = [f"{total:,} tests".replace(",", " ")]
    if c.get("failed") or c.get("errors") or c.get("error"):
        parts.append(f"{c.get('failed', 0) + c.get('errors', 0) + c.get('error', 0)} failed in "
                     "the measured run")
    if c.get("skipped"):
        parts.append(f"{c['skipped']} skipped")
    if c.get("xfailed"):
        parts.append(f"{c['xfailed']} strict expected failures record known defects with their "
                     "inputs")
    fits = ("within" if s["cpu_s"] <= SUITE_BUDGET_CPU_S else "over") + \
        f" the {SUITE_BUDGET_CPU_S // 60} CPU-minutes it is meant to fit"
    where = machine_words(s if "machine" in s else res["meta"])  # --suite-only keeps its own
    return (f"{parts[0]} ({'; '.join(parts[1:])}) took {s['wall_s']:.0f} s of wall time with "
            f"`-n 2` and {s['cpu_s']:.0f} CPU-s on {where}, load "
            f"{s['load_start'][0]:.1f} at its start: {fits}")


def _readme_suite_costliest(res):
    """The default suite's costliest tests (a table) and where its CPU seconds go."""
    s = res["results"]["suite"]
    if "costliest" not in s:  # a record made before readme_times kept the per-test costs
        return "\n(not in this record: `benchmarks/readme_times.py --suite-only` measures them)\n"
    rows = ["| test | CPU-s |", "|---|---|"]
    rows += [f"| `{r['test']}` | {r['cpu_s']:.1f} |" for r in s["costliest"]]
    share = sum(r["cpu_s"] for r in s["costliest"])
    return ("\n" + "\n".join(rows) + "\n\n"
            f"These {len(s['costliest'])} take {share:.0f} of the tests' {s['tests_cpu_s']:.0f} "
            f"CPU-s; outside the tests (the processes' start, imports and collection) the "
            f"run spends {s['outside_tests_cpu_s']:.0f} of its {s['cpu_s']:.0f} CPU-s.\n")


def _readme_how(res):
    r = res["results"]
    return (f"the median of {r['repeats']} runs each on {machine_words(res['meta'])}, load "
            f"{r['load_start'][0]:.1f} at the start")


# ---------------------------------------------------------------- covariance right-hand sides


def _pct(x) -> str:
    return f"{100 * x:.2g} %"


def _cov_particles(n):
    def render(res):
        r = res["results"]["by_n"][str(n)]
        names = {"softmax": "softmax", "l2": "L2", "sinkhorn": "Sinkhorn"}
        return ", ".join(f"{names[a]} {_pct(v['mean'])} ({_pct(v['min'])[:-2]}–{_pct(v['max'])})"
                         for a, v in r.items() if a in names)
    return render


def _cov_particles_how(res):
    r = res["results"]
    ns = sorted(int(n) for n in r["by_n"])
    return (f"the mean and, in brackets, the smallest and largest relative error over {r['seeds']} "
            f"draws of the cloud at each N ({', '.join(map(str, ns))}; "
            f"`{res['_path']}`)")


_ATTENTION_NAMES = {"softmax": "softmax", "l2": "L2", "sinkhorn": "Sinkhorn"}


def _cov_ode(res):
    """The moment ODE's error of Σ(1) for each attention: mean (range, N)."""
    r = res["results"]["by_attention"]
    return ", ".join(f"{_pct(v['cov']['mean'])} ({_pct(v['cov']['min'])[:-2]}–{_pct(v['cov']['max'])}; "
                     f"{_ATTENTION_NAMES[a]}, N = {v['n']})"
                     for a, v in r.items() if a in _ATTENTION_NAMES)


def _cov_ode_how(res):
    r = res["results"]
    seeds = r["seeds"]
    steps = "; ".join(f"{_ATTENTION_NAMES[a]} h = {v['dt']:g}"
                      + (f", {v['sinkhorn_iters']} sweeps" if a == "sinkhorn" else "")
                      for a, v in r["by_attention"].items())
    return (f"the mean and, in brackets, the smallest and largest error of Σ(1) relative to its "
            f"change over {len(seeds)} clouds (NumPy seeds {seeds[0]}–{seeds[-1]}), "
            f"{r['kernel']} kernel, RK4 ({steps}; `{res['_path']}`)")


# ---------------------------------------------------------------- the slow suite


def _slow_totals(res):
    files = res["results"]["files"]
    counts: dict = {}
    for r in files.values():
        for k, v in r["counts"].items():
            counts[k] = counts.get(k, 0) + v
    return files, counts


def _slow_summary(res):
    """Where the file-by-file slow suite stands: files and tests run, outcomes, time."""
    r = res["results"]
    files, counts = _slow_totals(res)
    wall = sum(f["wall_s"] for f in files.values())
    cpu = sum(f["cpu_s"] for f in files.values())
    ran = sum(counts.values())  # the tests each file's run reported (its junit record)
    bad = counts.get("failed", 0) + counts.get("errors", 0)
    outcome = f"{counts.get('passed', 0)} passed"
    if counts.get("skipped"):
        outcome += f", {counts['skipped']} skipped"
    outcome += f", {bad} failed" if bad else ""
    hours = f"{wall / 3600:.1f} h" if wall >= 3600 else f"{wall / 60:.0f} min"
    if len(files) == r["total_files"]:
        head = f"the whole slow suite, {ran} tests in {len(files)} file{'s' * (len(files) != 1)}"
    else:
        head = (f"{len(files)} of its {r['total_files']} files so far ({ran} of "
                f"{r['total_tests']} slow tests; the others are not run yet)")
    load = max(f["load_start"][0] for f in files.values()) if files else 0.0
    return (f"{head}: {outcome}; {hours} of wall time ({cpu / 3600:.1f} CPU-hours) on "
            f"{machine_words(res['meta'])}, file by file, load up to {load:.1f} at a file's start")


def _slow_table(res):
    """One row a recorded file: tests, outcome, wall and CPU seconds, workers."""
    files, _ = _slow_totals(res)
    rows = ["| file | slow tests | outcome | wall (s) | CPU (s) | workers |", "|---|---|---|---|---|---|"]
    for name in sorted(files):
        f = files[name]
        c = f["counts"]
        out = ", ".join(f"{v} {k}" for k, v in c.items() if v)
        rows.append(f"| `{name}` | {f['tests']} | {out} | {f['wall_s']:.0f} | {f['cpu_s']:.0f} | "
                    f"{f['workers']} |")
    return "\n" + "\n".join(rows) + "\n"


def _slow_failures(res):
    """The failed slow tests with the first line of their message (or "none")."""
    files, _ = _slow_totals(res)
    bad = [x for f in files.values() for x in f["failed"]]
    if not bad:
        return "none"
    return "; ".join(f"`{x['test']}` ({x['message'][:120]})" for x in bad)


#: result kind → renderer name → function(result) -> text
RENDERERS = {
    "covariance_particles": {"n1000": _cov_particles(1000), "n4000": _cov_particles(4000),
                             "how": _cov_particles_how},
    "covariance_ode": {"cov": _cov_ode, "how": _cov_ode_how},
    "slow_suite": {"summary": _slow_summary, "table": _slow_table, "failures": _slow_failures},
    "readme_times": {"quick_start": _readme_quick_start, "how": _readme_how,
                     "suite": _readme_suite, "suite_costliest": _readme_suite_costliest,
                     **{name: _readme_example(name) for name in README_EXAMPLES}},
    "concentration": {
        "table": _conc_table, "run": _conc_run, "wall": _conc_wall, "assumption_1": _conc_assumption,
        "fit_min_w2": _conc_fit("fit_min_w2_vs_beta", "log–log slope"),
        "fit_argmin": _conc_fit("fit_argmin_t_vs_log_beta"),
        "fit_overtake": _conc_fit("fit_overtake_t_vs_log_beta"),
        "theory_slope": _conc_theory_slope, "sinkhorn": _conc_sinkhorn,
        "readings": _conc_readings,
    },
    "sampling_floor": {
        "sphere_clusters": _floor("sphere_clusters"),
        "gaussian_to_mixture": _floor("gaussian_to_mixture"),
        "sphere_clusters_seed0": _floor_seed0("sphere_clusters"),
        "gaussian_to_mixture_seed0": _floor_seed0("gaussian_to_mixture"),
    },
    "reachability": {
        **{f"mode_{m}": _reach_cell(m) for m in ("all", "attention", "bounded", "energy")},
        "certificate": _reach_certificate, "transfer": _reach_transfer, "layers": _reach_layers,
        "wall": _reach_wall,
    },
    "gaussian": {"phase_blowup": _gaussian_phase_blowup, "blowup": _gaussian_blowup},
    "benchmark": {"control_measure_gradient": _bench_control_measure, "moments": _bench_moments,
                  "local_scan": _bench_local_scan, "local_field": _bench_local_field,
                  "local_keys": _bench_local_keys, "local_pair_cost": _bench_local_pair_cost,
                  "local_small_beta": _bench_local_small_beta, "pde": _bench_pde,
                  "pde_ratio": _bench_pde_ratio, "causal": _bench_causal,
                  "distributed": _bench_distributed, "w2_large": _bench_w2_large},
    "control_depth": {
        "table": _depth_table, "seeds": _depth_seeds, "replay": _depth_replay,
        "diverged": _depth_divergences,
        "slope_s2": _depth_slope("sphere_clusters"), "slope_s2_from_2": _depth_slope("sphere_clusters", 1),
        "slope_r2": _depth_slope("gaussian_to_mixture"),
        "eps_1e-3": _depth_agreement("sqrt_s_eps_1e-3"), "eps_0.01": _depth_agreement("sqrt_s_eps"),
        "status_s2": _depth_status("sphere_clusters"), "status_r2": _depth_status("gaussian_to_mixture"),
        "floor_s2": lambda res: spread([sd["w2_floor"] for sd in res["results"]["sphere_clusters"]["seeds"]]),
        "floor_r2": lambda res: spread([sd["w2_floor"] for sd in res["results"]["gaussian_to_mixture"]["seeds"]]),
    },
    "corollary_2": {
        "setup": _corollary_setup,
        **{f"{w}_{c}": _corollary(c, w) for w in ("w2_rate", "angle_rate")
           for c in ("concentration_s2", "concentration_no_metastability")},
    },
}


# ---------------------------------------------------------------- the guides


#: the stem of the span that tabulates the recorded run of every shipped config
CONFIG_TIMES = "configs"


def _minutes(seconds) -> str:
    if seconds is None:
        return "—"
    return _seconds(seconds) if seconds < 600 else f"{seconds / 60:.0f} min"


def config_times(root=ROOT) -> str:
    """The time of every config under ``configs/``, from the result files that record a run of it.

    One row a config: the recorded run's wall and CPU time and machine, with the ``--set``
    options it ran with (a run at another size or seed count than the file's own says so), or
    "not recorded" when no result file records one.

    Args:
      root: the repository.

    Returns:
      A Markdown table.
    """
    runs = {}
    for path in sorted((Path(root) / RESULTS).rglob("*.json")):
        meta = json.loads(path.read_text()).get("meta", {})
        m = re.match(r"jaxdyn run configs/([\w-]+)\.yaml(.*)", meta.get("command") or "")
        if not m or meta.get("wall_seconds") is None:
            continue
        sets = " ".join(f"`{x}`" for x in re.findall(r"--set\s+(\"[^\"]*\"|'[^']*'|\S+)",
                                                      m.group(2)))
        row = (sets, meta, path.relative_to(root).as_posix())
        # the run as shipped first, then the one with the fewest changed settings
        old = runs.get(m.group(1))
        if old is None or (len(row[0]), row[2]) < (len(old[0]), old[2]):
            runs[m.group(1)] = row
    lines = ["| config | wall time | CPU time | machine | run with | result file |",
             "|---|---|---|---|---|---|"]
    for cfg in sorted((Path(root) / "configs").glob("*.yaml")):
        name = cfg.stem
        if name not in runs:
            lines.append(f"| `{name}` | not recorded | | | | |")
            continue
        sets, meta, rel = runs[name]
        cpu = meta.get("cpu_seconds")
        lines.append(f"| `{name}` | {_minutes(meta['wall_seconds'])} | "
                     f"{_minutes(cpu) if cpu is not None else 'not recorded'} | "
                     f"{machine_words(meta)} | {sets or 'as shipped'} | `{rel}` |")
    return "\n".join(lines)


def render(key: str, root=ROOT, cache=None) -> str:
    """The text of the span ``key`` (``stem.what``).

    Args:
      key: the span's name.
      root: the repository.
      cache: result files already read, by stem.

    Returns:
      The rendered text.

    Raises:
      KeyError: no such result file, or no renderer ``what`` for its kind (named).
    """
    stem, _, what = key.partition(".")
    if stem == CONFIG_TIMES:
        if what != "times":
            raise KeyError(f"span {key!r}: the config table's span is {CONFIG_TIMES}.times")
        return config_times(root)
    cache = {} if cache is None else cache
    if stem not in cache:
        hits = _result_files(stem, root)
        if len(hits) != 1:
            raise KeyError(f"span {key!r}: {len(hits)} result files for {stem!r} (need one: "
                           f"{RESULTS}/**/{stem}.json, or benchmarks/results/WORKLOAD/*.json "
                           f"for bench-WORKLOAD, benchmarks/results/WORKLOAD/MACHINE.json for "
                           f"bench-WORKLOAD--MACHINE)")
        res = json.loads(hits[0].read_text())
        res["_path"] = hits[0].relative_to(root).as_posix()
        if stem.startswith(BENCH):
            res["kind"] = "benchmark"
        cache[stem] = res
    res = cache[stem]
    kind = res.get("kind")
    table = renderers(kind)
    fn = table.get(what)
    if fn is None:
        raise KeyError(f"span {key!r}: no renderer {what!r} for result kind {kind!r} "
                       f"(have: {sorted(table)})")
    return fn(res)


def renderers(kind) -> dict:
    """The renderers of a result kind: :data:`RENDERERS`' and the kind's own.

    An experiment kind registers its own as ``GUIDE_RENDERERS`` (name → function(result) ->
    text) in ``jaxdyn/experiments/<kind>/summary.py``, next to the summary they read.

    Args:
      kind: the result file's ``kind``.

    Returns:
      Name → renderer.
    """
    import importlib

    table = dict(RENDERERS.get(kind, {}))
    if isinstance(kind, str) and kind.isidentifier():
        try:
            mod = importlib.import_module(f"{__package__}.{kind}.summary")
        except ModuleNotFoundError:
            mod = None
        table.update(getattr(mod, "GUIDE_RENDERERS", {}))
    return table


def guides(root=ROOT) -> list[Path]:
    """The Markdown pages that hold generated spans of this module (result-file spans)."""
    out = []
    for folder in GUIDES:
        for p in sorted((Path(root) / folder).glob("*.md")):
            if any(_ours(m.group(2)) for m in SPAN.finditer(p.read_text())):
                out.append(p)
    return out


def _ours(key) -> bool:
    # a span of this module has a dotted name, stem.what (the benchmarks page's and the
    # long-context guide's spans, filled by their own tools, have none); a span whose result
    # file is missing is an error when it is rendered, never skipped
    return "." in key


def _result_files(stem, root=ROOT) -> list[Path]:
    # docs/results/**/<stem>.json; a benchmark's recorded result for bench-<workload>
    if stem.startswith(BENCH):  # bench-WORKLOAD, or bench-WORKLOAD--MACHINE for one of several
        workload, _, machine_kind = stem[len(BENCH):].partition("--")
        return sorted((Path(root) / "benchmarks" / "results" / workload).glob(
            f"{machine_kind or '*'}.json"))
    return sorted((Path(root) / RESULTS).rglob(f"{stem}.json"))


def generate(text: str, root=ROOT) -> str:
    """``text`` with every result-file span re-rendered (other spans untouched)."""
    cache = {}

    def fill(m):
        key = m.group(2)
        if not _ours(key):
            return m.group(0)
        body = render(key, root, cache)
        if m.group(3).startswith("\n"):  # a block span: its text on lines of its own
            body = f"\n{body}\n"
        return m.group(1) + body + m.group(4)

    return SPAN.sub(fill, text)


def stale(root=ROOT) -> list[str]:
    """The guides whose spans differ from what the result files render."""
    return [p.relative_to(root).as_posix() for p in guides(root)
            if generate(p.read_text(), root) != p.read_text()]


def write(root=ROOT) -> list[str]:
    """Rewrite the spans of every guide; returns the pages that changed."""
    changed = []
    for p in guides(root):
        old = p.read_text()
        new = generate(old, root)
        if new != old:
            p.write_text(new)
            changed.append(p.relative_to(root).as_posix())
    return changed


def main(argv=None) -> int:
    """The command line (module doc); returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m jaxdyn.experiments.guide_numbers",
                                description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    p.add_argument("--check", action="store_true", help="exit 1 where a guide differs")
    r = sub.add_parser("record", help="a run folder as a result file")
    r.add_argument("run_dir")
    r.add_argument("out")
    r.add_argument("--command", default=None, help="the command that made the run")
    a = p.parse_args(argv)
    if a.cmd == "record":
        print(record(a.run_dir, a.out, a.command))
        return 0
    if a.check:
        bad = stale()
        for g in bad:
            print(f"{g}: differs from its result files (python -m jaxdyn.experiments.guide_numbers)")
        return 1 if bad else 0
    for g in write():
        print(f"rewrote {g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
