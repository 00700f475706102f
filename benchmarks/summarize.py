"""Read the latest phase, large_n, roofline and local results and print each target: met or the gap.

Writes benchmarks/runs/summary<tag>.json (ignored by git). Usage: python summarize.py [--tag _gpu]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _load(name):
    """The latest result of workload ``name`` (``phase``, ``large_n``, ``roofline``; a ``_gpu``
    suffix: on a GPU) from ``results/<workload>/<machine kind>.json``, the script's own JSON;
    a CPU result capped by ``--max-isa`` is not taken. A file ``runs/<name>.json`` that a
    script wrote when run alone wins."""
    p = HERE / "runs" / f"{name}.json"
    if p.exists():
        return json.loads(p.read_text())
    gpu = name.endswith("_gpu")
    workload = name[:-len("_gpu")] if gpu else name
    recs = []
    for q in (HERE / "results" / workload).glob("*.json"):
        rec = json.loads(q.read_text())
        kind = rec.get("machine_kind", q.stem)
        if (q.name.endswith(".tiny.json") or kind.startswith("gpu-") != gpu
                or (rec.get("machine") or {}).get("xla_max_isa")):
            continue
        recs.append(rec)
    if not recs:
        return None
    return max(recs, key=lambda r: r.get("date") or "")["result"]


def _rows(large, impl):
    """Rows by N; for a CPU baseline, the fastest of its thread variants (impl, impl@1)."""
    best = {}
    for name, v in large["impl"].items():
        if name == impl or name.partition("@")[0] == impl:
            for r in v.get("rows", []):
                if "median_s" in r and (r["n"] not in best or r["median_s"] < best[r["n"]]["median_s"]):
                    best[r["n"]] = r
    return best


def isa_label(result):
    """The CPU's vector ISA as XLA targeted it in a benchmark result (``machine.isa``); for
    results written before it was recorded, the cpuinfo flag alone."""
    m = (result or {}).get("machine", {})
    isa = m.get("isa")
    if isa:
        em = (isa.get("emitted") or {}).get("widest")
        cap = f", capped by --xla_cpu_max_isa={isa['xla_max_isa']}" if isa.get("xla_max_isa") else ""
        return (f"{isa.get('target_isa')}, {isa.get('vector_bits')}-bit{cap}"
                + (f", emitted {em}" if em else ""))
    if "avx512" in m:
        return "AVX-512 CPU (ISA not recorded)" if m["avx512"] else "no AVX-512 (ISA not recorded)"
    return "ISA not recorded"


def summarize(tag=""):
    out = {"tag": tag, "targets": []}
    current = {"isa": None}

    def target(name, ok, detail, isa=None):
        isa = isa or current["isa"]
        out["targets"].append({"target": name, "met": ok, "detail": detail, "isa": isa})
        flag = "MET " if ok else ("GAP " if ok is not None else "n/a ")
        print(f"[{flag}] {name}: {detail}" + (f" [{isa}]" if isa else ""))

    phase = _load(f"phase{tag}")
    if phase:
        current["isa"] = isa_label(phase)
        impl = phase["impl"]
        t = impl.get("torch_eager")
        for k, v in impl.items():
            if k == "torch_eager":
                print(f"phase: torch_eager ({t.get('device')}) median {t['median_s']:.3f} s")
                continue
            s = v.get("speedup_vs_torch")
            print(f"phase: {k} median {v['median_s']:.3f} s (first call {v['compile_s']:.2f} s)"
                  + (f", {s:.2f}× torch, max |Δfraction| {v['max_abs_fraction_diff_vs_torch']:.3g}"
                     if s else ""))
        # the target is about jaxdyn's path for this workload: simulate_ensemble (many small
        # systems), or the generic sharded vmap in results written before it existed
        main = "jaxdyn_ensemble" if "jaxdyn_ensemble" in impl else "jaxdyn_sharded"
        if t and main in impl:
            v = impl[main]
            cpu = (f"; CPU time {t['cpu_median_s']:.2f} s → {v['cpu_median_s']:.2f} s "
                   f"({v['cpu_time_ratio_vs_torch']:.2f}× less work)") if "cpu_time_ratio_vs_torch" in v else ""
            target("(a) phase diagram ≥ 4× PyTorch eager", v["speedup_vs_torch"] >= 4,
                   f"{main}: {v['speedup_vs_torch']:.2f}× wall ({t['median_s']:.2f} s → {v['median_s']:.2f} s)"
                   f"{cpu}; PyTorch with {t.get('threads')} thread(s), the faster setting")
            d = v["max_abs_fraction_diff_vs_torch"]
            target("(a) identical fractions", d == 0.0, f"max |Δfraction| = {d:.3g}")
    large = _load(f"large_n{tag}")
    current["isa"] = isa_label(large) if large else None
    head = (large or {}).get("headline")
    if head:
        n0 = head["n"]
        hi = head["impl"]

        def best(lib):
            c = [(v["median_s"], k) for k, v in hi.items() if k.partition("@")[0] == lib]
            return min(c) if c else None

        print(f"head-to-head at N={n0} ({head['rounds']} interleaved rounds, medians): "
              + ", ".join(f"{k} {1e3 * v['median_s']:.2f} ms" for k, v in hi.items()))
        for impl in ("jaxdyn_sharded", "jax_blocked"):
            if impl not in hi:
                continue
            t = hi[impl]["median_s"]
            for lib, goal in (("torch", 8), ("keops", 12)):
                b = best(lib)
                if b:
                    cj, cb = hi[impl].get("cpu_median_s"), hi[b[1]].get("cpu_median_s")
                    cpu = f"; CPU time {1e3 * cb:.1f} → {1e3 * cj:.2f} ms ({cb / cj:.1f}×)" if cj and cb else ""
                    target(f"(b) {impl} ≥ {goal}× {lib} at N={n0} (head-to-head)", b[0] / t >= goal,
                           f"{b[0] / t:.2f}× ({1e3 * b[0]:.1f} ms [{b[1]}] → {1e3 * t:.2f} ms){cpu}")
        if "jax_dense" in hi and "jax_blocked" in hi:
            r = hi["jax_dense"]["median_s"] / hi["jax_blocked"]["median_s"]
            target(f"(b) blocked no slower than dense at N={n0} (head-to-head)", r >= 1,
                   f"dense/blocked = {r:.2f}")
    if large:
        n0 = 4096
        torch_ = _rows(large, "torch")
        keops = _rows(large, "keops")
        dense = _rows(large, "jax_dense")
        for impl in ("jaxdyn_sharded", "jax_blocked"):
            r = _rows(large, impl)
            if n0 in r:
                t = r[n0]["median_s"]
                msg = f"N={n0}: {impl} {1e3 * t:.2f} ms"
                def cpu_note(b):
                    cb, cj = b[n0].get("cpu_median_s"), r[n0].get("cpu_median_s")
                    return (f"; CPU time {1e3 * cb:.1f} → {1e3 * cj:.2f} ms ({cb / cj:.1f}×)"
                            if cb and cj else "")

                if n0 in torch_:
                    s = torch_[n0]["median_s"] / t
                    target(f"(b) {impl} ≥ 8× PyTorch eager at N=4096 (sweep)", s >= 8,
                           f"{s:.2f}× ({1e3 * torch_[n0]['median_s']:.1f} ms [{torch_[n0]['impl']}]"
                           f" → {1e3 * t:.2f} ms){cpu_note(torch_)}")
                if n0 in keops:
                    s = keops[n0]["median_s"] / t
                    target(f"(b) {impl} ≥ 12× KeOps at N=4096 (sweep)", s >= 12,
                           f"{s:.2f}× ({1e3 * keops[n0]['median_s']:.1f} ms [{keops[n0]['impl']}]"
                           f" → {1e3 * t:.2f} ms){cpu_note(keops)}")
                print(msg)
        blk = _rows(large, "jax_blocked")
        common = sorted(set(blk) & set(dense))
        if common:
            worst = min(common, key=lambda n: dense[n]["median_s"] / blk[n]["median_s"])
            ratios = ", ".join(f"{n}: {dense[n]['median_s'] / blk[n]['median_s']:.2f}" for n in common)
            big = [n for n in common if n >= 1024]
            ok = all(dense[n]["median_s"] >= blk[n]["median_s"] for n in big) if big else None
            target("(b) blocked no slower than dense (sweep, N ≥ 1024, where auto picks blocked)", ok,
                   f"dense/blocked time per N: {ratios}")
        nmax = max((n for impl in ("jax_blocked", "jaxdyn_sharded") for n in _rows(large, impl)),
                   default=None)
        if nmax:
            for impl in ("jax_blocked", "jaxdyn_sharded"):
                r = _rows(large, impl).get(nmax)
                if r:
                    mem = r.get("gpu_peak_bytes", r.get("rss_peak_delta_bytes"))
                    xla = r.get("xla_bytes")
                    target(f"(b) N={nmax} peak memory < 1 GiB ({impl})", mem < 2**30,
                           f"measured {mem / 2**20:.1f} MiB"
                           + (f", XLA analysis {xla / 2**20:.1f} MiB" if xla else "")
                           + f", {r['median_s']:.2f} s per evaluation")
    roof = _load(f"roofline{tag}")
    if roof:
        current["isa"] = isa_label(roof)
        one = roof["exp_one_core"]["rate_per_s"]
        print(f"roofline: exp {one / 1e9:.2f}·10⁹/s per core, best sample (reference 4.46·10⁹), "
              f"{roof['exp_all_devices']['rate_per_s'] / 1e9:.2f}·10⁹/s on "
              f"{roof['exp_all_devices']['devices']} devices; matmul "
              f"{roof['matmul']['flops_per_s'] / 1e9:.0f} GFLOP/s")
        rows = [r for r in roof["rows"] if r["impl"] == "jaxdyn_sharded" and r["n"] >= 4096]
        if rows:
            worst = min(rows, key=lambda r: r["fraction_of_floor"])
            target("(c) ≥ 40 % of the exp-bound floor on all cores, N ≥ 4096",
                   worst["fraction_of_floor"] >= 0.4,
                   ", ".join(f"N={r['n']}: {100 * r['fraction_of_floor']:.0f}% "
                             f"(best rep {100 * r['fraction_of_floor_best']:.0f}%)" for r in rows))
            if "fraction_of_floor_cpu" in rows[0]:
                print("    per CPU-second of work (exp floor core-seconds / CPU time used): "
                      + ", ".join(f"N={r['n']}: {100 * r['fraction_of_floor_cpu']:.0f}%" for r in rows))
            if rows[0].get("fraction_of_floor_cpu_time"):
                print("    CPU time against the exp loop's CPU time (busy-machine figure): "
                      + ", ".join(f"N={r['n']}: {100 * r['fraction_of_floor_cpu_time']:.0f}%"
                                  for r in rows))
            if "fraction_of_measured_rate" in rows[0]:
                print("    against the exp rate the devices reached together in this run: "
                      + ", ".join(f"N={r['n']}: {100 * r['fraction_of_measured_rate']:.0f}%"
                                  for r in rows))
            ones = [r for r in roof["rows"] if r["impl"] == "jax_blocked_1dev" and r["n"] >= 4096]
            if ones:
                print("    one device against one core's exp rate: "
                      + ", ".join(f"N={r['n']}: {100 * r['fraction_of_floor']:.0f}%" for r in ones))
        for isa, runs in (roof.get("by_isa") or {}).items():
            for r in runs:
                rows = [x for x in r["rows"] if x["impl"] == "jaxdyn_sharded" and x["n"] >= 4096]
                if not rows:
                    continue
                worst = min(rows, key=lambda x: x["fraction_of_floor"])
                target(f"(c) ≥ 40 % of the exp-bound floor, N ≥ 4096, run '{isa}' (floor "
                       f"{r['exp_one_core']['rate_per_s'] / 1e9:.2f}·10⁹ exp/s per core, same run)",
                       worst["fraction_of_floor"] >= 0.4,
                       ", ".join(f"N={x['n']}: {100 * x['fraction_of_floor']:.1f}% (per CPU-second "
                                 f"{100 * x['fraction_of_floor_cpu']:.0f}%"
                                 + (f", CPU time against the exp loop's CPU time "
                                    f"{100 * x['fraction_of_floor_cpu_time']:.0f}%"
                                    if x.get("fraction_of_floor_cpu_time") else "") + ")"
                                 for x in rows),
                       isa=isa_label({"machine": {"isa": r["isa"]}}))
    loc = _load(f"local{tag}")
    cases = (loc or {}).get("cases") or {}
    if cases:
        current["isa"] = isa_label(loc)
        for r in (cases.get("field") or {}).get("rows", []):
            if "time" in r:
                print(f"local: field N={r['n']} β=N {r['time']['median_s']:.3g} s, visited "
                      f"{r['visited']:.3g} (cap {r['expected_visited']:.3g}), peak RSS "
                      f"{r['peak_rss_bytes'] / 2**20:.0f} MiB")
        goal = loc.get("auto_target", 1.10)
        for r in (cases.get("auto") or {}).get("rows", []):
            if "auto_over_blocked" in r:
                cpu = r.get("auto_over_blocked_cpu")
                worst = max(v for v in (r["auto_over_blocked"], cpu) if v is not None)
                target(f"local: auto within {goal - 1:.0%} of blocked at β = 1, N={r['n']}",
                       worst <= goal, f"auto / blocked {r['auto_over_blocked']:.3f} wall"
                       + (f", {cpu:.3f} CPU" if cpu is not None else ""))
    p = HERE / "runs" / f"summary{tag}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="")
    a, _ = ap.parse_known_args()
    summarize(a.tag)
