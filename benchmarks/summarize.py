"""Read benchmarks/results/{phase,large_n,roofline}<tag>.json and print each target: met or
the gap. Writes benchmarks/results/summary<tag>.json. Usage: python summarize.py [--tag _gpu]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _load(name):
    p = HERE / "results" / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _rows(large, impl):
    """Rows by N; for a CPU baseline, the fastest of its thread variants (impl, impl@1)."""
    best = {}
    for name, v in large["impl"].items():
        if name == impl or name.partition("@")[0] == impl:
            for r in v.get("rows", []):
                if "median_s" in r and (r["n"] not in best or r["median_s"] < best[r["n"]]["median_s"]):
                    best[r["n"]] = r
    return best


def summarize(tag=""):
    out = {"tag": tag, "targets": []}

    def target(name, ok, detail):
        out["targets"].append({"target": name, "met": ok, "detail": detail})
        flag = "MET " if ok else ("GAP " if ok is not None else "n/a ")
        print(f"[{flag}] {name}: {detail}")

    phase = _load(f"phase{tag}")
    if phase:
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
        if t and "jaxdyn_sharded" in impl:
            v = impl["jaxdyn_sharded"]
            target("(a) phase diagram ≥ 4× PyTorch eager", v["speedup_vs_torch"] >= 4,
                   f"{v['speedup_vs_torch']:.2f}× ({t['median_s']:.2f} s → {v['median_s']:.2f} s)")
            d = v["max_abs_fraction_diff_vs_torch"]
            target("(a) identical fractions", d == 0.0, f"max |Δfraction| = {d:.3g}")
    large = _load(f"large_n{tag}")
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
                if n0 in torch_:
                    s = torch_[n0]["median_s"] / t
                    target(f"(b) {impl} ≥ 8× PyTorch eager at N=4096", s >= 8,
                           f"{s:.2f}× ({1e3 * torch_[n0]['median_s']:.1f} ms → {1e3 * t:.2f} ms)")
                if n0 in keops:
                    s = keops[n0]["median_s"] / t
                    target(f"(b) {impl} ≥ 12× KeOps at N=4096", s >= 12,
                           f"{s:.2f}× ({1e3 * keops[n0]['median_s']:.1f} ms → {1e3 * t:.2f} ms)")
                print(msg)
        blk = _rows(large, "jax_blocked")
        common = sorted(set(blk) & set(dense))
        if common:
            worst = min(common, key=lambda n: dense[n]["median_s"] / blk[n]["median_s"])
            ratios = ", ".join(f"{n}: {dense[n]['median_s'] / blk[n]['median_s']:.2f}" for n in common)
            big = [n for n in common if n >= 1024]
            ok = all(dense[n]["median_s"] >= blk[n]["median_s"] for n in big) if big else None
            target("(b) blocked no slower than dense (N ≥ 1024, where auto picks blocked)", ok,
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
        one = roof["exp_one_core"]["rate_per_s"]
        print(f"roofline: exp {one / 1e9:.2f}·10⁹/s per core (reference 4.46·10⁹), "
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
    p = HERE / "results" / f"summary{tag}.json"
    p.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="")
    a, _ = ap.parse_known_args()
    summarize(a.tag)
