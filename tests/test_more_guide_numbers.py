"""The renderers of the noise, clusters and variants guides' numbers.

They are checked on small synthetic result files: the ``variants`` and ``sphere`` kinds'
``GUIDE_RENDERERS``, and the causal benchmark's.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxdyn.experiments import guide_numbers as gn
from jaxdyn.experiments.sphere import summary as sphere_summary
from jaxdyn.experiments.variants import summary as variants_summary

META = {"machine": {"cores": 2, "cpu": "Test CPU"}, "wall_seconds": 12.3, "cpu_seconds": 20.4,
        "command": "jaxdyn run test.yaml", "config": "kind: variants\nt1: 6.0\n"}
KEY = "time_to_single_cluster (ip >= 0.75)"


def _variants(points, key=KEY):
    per = {}
    for coords, t, ip, rad in points:
        label = ",".join(f"{k}={v}" for k, v in coords.items())
        per[label] = {key: t, "final_mean_inner_product": ip, "final_mean_radius": rad}
    return {"kind": "variants", "meta": dict(META), "results": {"per_point": per}}


def _noise():
    pts = []
    for seed, (t1, t2) in enumerate([(5.0, None), (6.5, 40.0), (7.0, None)]):
        pts.append(({"beta": 1.0, "sigma": 0.0, "seed": seed}, t1, 0.9, 1.0))
        pts.append(({"beta": 1.0, "sigma": 0.4, "seed": seed}, t2, 0.8, 1.0))
        pts.append(({"beta": 4.0, "sigma": 0.0, "seed": seed}, None, 0.5, 1.0))
        pts.append(({"beta": 4.0, "sigma": 0.4, "seed": seed}, 20.0 + seed, 0.8, 1.0))
    return _variants(pts)


def test_time_cell_mean_range_and_count():
    """A cell: mean (range) of the seeds that reach it, and how many."""
    assert variants_summary.guide_time_cell([5.0, 6.5, 7.0]) == "6.2 (5–7) [3 of 3]"
    assert variants_summary.guide_time_cell([None, 40.0, None]) == "40 [1 of 3]"
    assert variants_summary.guide_time_cell([None, None]) == "never [0 of 2]"


def test_variants_points_parse_labels():
    """Point labels parse into their coordinates."""
    pts = variants_summary.guide_points(_noise())
    assert pts[0][0] == {"beta": 1.0, "sigma": 0.0, "seed": 0.0}
    assert len(pts) == 12


def test_sigma_table_and_cells():
    """The σ × β table, its cells, the threshold and the run cost."""
    R = variants_summary.GUIDE_RENDERERS
    res = _noise()
    table = R["sigma_table"](res).splitlines()
    assert table[0] == "| σ | 0 | 0.4 |"
    assert table[2] == "| β = 1 | 6.2 (5–7) [3 of 3] | 40 [1 of 3] |"
    assert table[3] == "| β = 4 | never [0 of 3] | 21 (20–22) [3 of 3] |"
    assert R["cell_beta4_sigma0.4"](res) == "21 (20–22) [3 of 3]"
    assert R["threshold"](res) == "0.75"
    assert R["run"](res) == "3 seeds; 20 CPU-s, 12 s wall on 2 CPU cores (Test CPU)"


def test_layernorm_renderers():
    """Per placement: times, radii and the β = 4 inner products."""
    key = "time_to_single_cluster (ip >= 0.9)"
    pts = []
    for seed in range(2):
        pts += [({"norm": "postln", "beta": 1.0, "seed": seed}, 6.0 + seed, 0.95, 1.0),
                ({"norm": "preln", "beta": 1.0, "seed": seed}, 18.0, 0.92, 20.0 + 2 * seed),
                ({"norm": "periln", "beta": 1.0, "seed": seed}, None, 0.5, 30.0),
                ({"norm": "postln", "beta": 4.0, "seed": seed}, None, 0.03 + seed / 100, 1.0),
                ({"norm": "preln", "beta": 4.0, "seed": seed}, None, 0.08, 9.0),
                ({"norm": "periln", "beta": 4.0, "seed": seed}, None, 0.05, 9.0)]
    res = _variants(pts, key)
    R = variants_summary.GUIDE_RENDERERS
    assert R["norm_times_beta1"](res) == ("6.5 (6–7) [2 of 2] (post-LN), never [0 of 2] "
                                          "(peri-LN), 18 (18–18) [2 of 2] (pre-LN)")
    assert R["norm_radius_beta1"](res) == "21.0 (20.0–22.0) (pre-LN) and 30.0 (30.0–30.0) (peri-LN)"
    assert R["final_ip_beta4"](res) == "0.030–0.080 over 6 runs, 0 of which reach 0.9"


def test_minilm_renderers():
    """All heads together and the single heads."""
    key = "time_to_single_cluster (ip >= 0.9)"
    pts = []
    for seed in range(2):
        for beta in (1.0, 25.0):
            pts.append(({"beta": beta, "head": -1, "seed": seed}, 3.9 + seed, 0.99, 1.0))
            pts += [({"beta": beta, "head": h, "seed": seed}, None, 0.05 + h / 100, 1.0)
                    for h in (0, 5)]
    res = _variants(pts, key)
    R = variants_summary.GUIDE_RENDERERS
    assert R["heads_all"](res) == (
        "0.9 reached at t = 4.4 (3.9–4.9) [2 of 2] for β = 1 (final mean inner product "
        "0.990 (0.990–0.990)); "
        "0.9 reached at t = 4.4 (3.9–4.9) [2 of 2] for β = 25 (final mean inner product "
        "0.990 (0.990–0.990))")
    assert R["heads_single"](res) == "heads 0, 5: mean inner product 0.050–0.10 at t = 6 over every β and seed"


def _sphere(rows, seeds="{range: [0, 512]}"):
    per = {f"beta={b}": {"time_to_mean_inner_product_0.99": t, "final_pair_fraction": pf,
                         "final_mean_cluster_count": cc, "final_mean_gram_rank": gr,
                         "fraction_of_saved_frames_count_equals_gram_rank": fa,
                         "final_mean_inner_product": 0.5}
           for b, t, pf, cc, gr, fa in rows}
    meta = dict(META, config=f"kind: sphere\nsweep:\n  beta: [1, 2, 9]\n  seed: {seeds}\n",
                peak_rss_mib=819.2)
    return {"kind": "sphere", "meta": meta, "results": {"per_beta": per}}


def test_sphere_cluster_renderers():
    """The cluster-statistics readings per β."""
    res = _sphere([(0.1, 9.0, 1.0, 1.0, 1.0, 1.0), (1.0, 13.0, 0.98, 1.04, 1.04, 0.9),
                   (2.0, None, 0.6, 2.0, 2.0, 0.8), (9.0, None, 0.34, 3.19, 3.19, 0.5)])
    R = sphere_summary.GUIDE_RENDERERS
    assert R["one_cluster"](res) == "by t = 9–13 for β ≤ 1.00 (2 of 4 β)"
    assert R["pair_fraction"](res) == "from 0.60 (β = 2.00) to 0.34 (β = 9.00)"
    assert R["cluster_count"](res) == "from 2.00 to 3.19"
    assert R["rank_agreement"](res) == "agree on every system"
    assert R["frames_agreement"](res) == "80 %"
    assert R["systems"](res) == "4 β × 512 seeds"
    assert R["run"](res) == "20 CPU-s, 12 s wall, peak RSS 0.8 GiB on 2 CPU cores (Test CPU)"
    table = R["table"](res).splitlines()
    assert len(table) == 6 and table[3] == "| 1.00 | 13 | 0.980 | 1.04 | 1.04 | 90 % |"
    assert table[4].startswith("| 2.00 | — |")


def test_sphere_rank_disagreement_is_counted():
    """A β whose mean rank exceeds its mean count counts as disagreeing."""
    res = _sphere([(1.0, None, 0.9, 1.0, 1.0, 1.0), (9.0, None, 0.3, 3.0, 3.5, 0.5)], "[0, 1, 2]")
    R = sphere_summary.GUIDE_RENDERERS
    assert R["rank_agreement"](res) == "agree on every system at 1 of 2 β"
    assert R["systems"](res) == "2 β × 3 seeds"


def test_renderers_registered_for_their_kinds():
    """guide_numbers finds the kinds' renderers."""
    assert "sigma_table" in gn.renderers("variants")
    assert "table" in gn.renderers("sphere")


def test_bench_causal_renderer():
    """The causal benchmark: ratios per N, the visited pairs and the machine."""
    row = lambda n, w, c, v: {"n": n, "causal_over_full": w, "causal_over_full_cpu": c,  # noqa: E731
                              "key_blocks_visited_fraction": v}
    res = {"result": {"rows": [row(16384, 0.529, 0.517, 0.508), row(4096, 0.636, 0.618, 0.531)],
                      "reps": 7},
           "machine": {"cpu_count": 2, "cpu_model": "Test Xeon", "loadavg_start": [1.39, 2.5, 4.5]}}
    assert gn.RENDERERS["benchmark"]["causal"](res) == (
        "causal / full = 0.64 and 0.53 of the wall time at N = 4096 and 16384 (CPU time 0.62 and "
        "0.52), against 0.53 and 0.51 of the (row, key block) pairs visited (medians of 7 "
        "interleaved repeats on 2 CPU cores (Test Xeon), load 1.4 at its start)")


def test_bench_machine_words():
    """A benchmark's machine in words: the model and the load where recorded."""
    m = {"cpu_count": 2, "cpu_model": "Test Xeon", "loadavg_start": [1.39, 2.5, 4.5]}
    assert gn.bench_machine_words(m) == "2 CPU cores (Test Xeon), load 1.4 at its start"
    assert gn.bench_machine_words({"cpu_count": 2}) == "2 CPU cores"


def test_machine_words_names_the_cpu_generation_where_recorded():
    """A result file's machine: the family, model and vector extension follow the model name when
    the record has them (records made before they were kept read as before)."""
    old = {"machine": {"cores": 2, "cpu": "AMD EPYC"}}
    assert gn.machine_words(old) == "2 CPU cores (AMD EPYC)"
    new = {"machine": {"cores": 2, "cpu": "AMD EPYC", "cpu_id": "family 26 model 2",
                       "vector": "AVX-512"}}
    assert gn.machine_words(new) == "2 CPU cores (AMD EPYC, family 26 model 2, AVX-512)"
    m = gn.machine()
    assert m["cores"] >= 1 and m["cpu"]
    assert gn.machine_words({"machine": m}).startswith(f"{m['cores']} CPU cores ({m['cpu']}")


def test_readme_suite_line_uses_the_suites_own_machine():
    """A suite re-measured with ``--suite-only`` names the machine it ran on, not the file's."""
    suite = {"counts": {"passed": 10, "skipped": 1}, "wall_s": 100.0, "cpu_s": 200.0,
             "load_start": [0.5, 0.5, 0.5],
             "machine": {"cores": 2, "cpu": "Other CPU", "cpu_id": "family 6 model 85"}}
    res = {"meta": {"machine": {"cores": 2, "cpu": "AMD EPYC"}}, "results": {"suite": suite}}
    line = gn._readme_suite(res)
    assert "on 2 CPU cores (Other CPU, family 6 model 85), load 0.5" in line
    assert line.endswith("within the 8 CPU-minutes it is meant to fit")
    del suite["machine"]
    suite["cpu_s"] = 500.0
    line = gn._readme_suite(res)
    assert "on 2 CPU cores (AMD EPYC), load 0.5" in line and "over the 8" in line


def _sphere_variants():
    """Two variants at β = 1 over three seeds, counts saved at t = 0, 5, 10, 15, 20."""
    t = [0.0, 5.0, 10.0, 15.0, 20.0]
    counts = {"heads=1, mask=causal": [[512, 30, 1, 1, 1], [512, 40, 2, 1, 1], [512, 20, 1, 1, 1]],
              "heads=1, mask=none": [[512, 7, 3, 2, 2], [512, 8, 3, 3, 3], [512, 9, 2, 1, 1]]}
    per = {f"beta=1, {k}": {"cluster_count_per_seed": {"seed": [0, 1, 2], "t": t, "count": c}}
           for k, c in counts.items()}
    return {"kind": "sphere", "meta": dict(META), "results": {"per_beta": {}, "per_variant": per}}


def test_sphere_variants_table():
    """Per variant: counts at t = 5, 10, 20 as mean (range); first times as median (range) [k of n]."""
    R = sphere_summary.GUIDE_RENDERERS
    table = R["variants_table"](_sphere_variants()).splitlines()
    assert len(table) == 4
    assert table[0].startswith("| β | heads | mask | clusters at t = 5 |")
    assert table[2] == "| 1 | 1 | full | 8 (7–9) | 2.67 (2–3) | 2 (1–3) | 12.5 (10–15) [2 of 3] | 15 [1 of 3] |"
    assert table[3] == "| 1 | 1 | causal | 30 (20–40) | 1.33 (1–2) | 1 | 10 [3 of 3] | 10 (10–15) [3 of 3] |"
    assert R["seeds"](_sphere_variants()) == "3 seeds (0–2)"


def test_sphere_variants_phrases():
    """The findings' phrases: one variant per head count, and every run at a β."""
    R = sphere_summary.GUIDE_RENDERERS
    res = _sphere_variants()
    assert R["beta1_one_causal"](res) == "10 (10–15) [3 of 3] (1 head)"
    assert R["beta1_one_full"](res) == "15 [1 of 3] (1 head)"
    assert R["beta1_two"](res) == "5 of the 6 runs"
    res["results"]["per_variant"]["beta=1, heads=1, mask=none"]["cluster_count_per_seed"][
        "count"][1][-1] = 2
    assert R["beta1_two"](res) == "every one of the 6 runs, at t = 10–20"
    with pytest.raises(KeyError, match="β = 9"):
        R["beta9_t5_full"](res)


def test_variants_heads_causal_spans_render_from_their_result_file():
    """The variants guide's heads × mask section equals what its committed result file renders."""
    guide = (gn.ROOT / "docs/guides/variants.md").read_text()
    spans = [m for m in gn.SPAN.finditer(guide) if m.group(2).startswith("variants_heads_causal.")]
    assert {m.group(2).split(".", 1)[1] for m in spans} >= {"variants_table", "run", "seeds"}
    cache = {}
    for m in spans:
        body = gn.render(m.group(2), gn.ROOT, cache)
        assert m.group(3).strip("\n") == body, m.group(2)
    res = cache["variants_heads_causal"]
    assert res["kind"] == "sphere" and res["meta"]["command"].startswith("jaxdyn run")
    variants = res["results"]["per_variant"]
    assert len(variants) == 12  # β × heads × mask
    for v in variants.values():
        ps = v["cluster_count_per_seed"]
        assert len(ps["seed"]) >= 5 and len(ps["count"]) == len(ps["seed"])
    assert len(gn.render("variants_heads_causal.variants_table", gn.ROOT).splitlines()) == 14


def test_covariance_ode_renderers():
    """The moment-ODE-vs-particles renderers: mean (range; attention, N) per attention, and
    the seeds, kernel, steps and result file of the measurement."""
    def row(n, dt, sweeps, vals):
        return {"n": n, "dt": dt, "sinkhorn_iters": sweeps,
                "cov": {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals),
                        "values": vals},
                "mean": {"mean": 0.0, "min": 0.0, "max": 0.0, "values": [0.0] * len(vals)}}
    res = {"kind": "covariance_ode", "meta": dict(META), "_path": "docs/results/x/c.json",
           "results": {"seeds": [1, 2, 3], "kernel": "blocked", "by_attention": {
               "softmax": row(8000, 0.05, 0, [0.001, 0.002, 0.003]),
               "sinkhorn": row(1000, 0.1, 20, [1e-4, 2e-4, 3e-4])}}}
    R = gn.renderers("covariance_ode")
    assert R["cov"](res) == ("0.2 % (0.1–0.3 %; softmax, N = 8000), "
                             "0.02 % (0.01–0.03 %; Sinkhorn, N = 1000)")
    how = R["how"](res)
    assert "3 clouds (NumPy seeds 1–3)" in how and "blocked kernel" in how
    assert "softmax h = 0.05; Sinkhorn h = 0.1, 20 sweeps" in how and "docs/results/x/c.json" in how


def test_energy_steps_counts_decreases_beyond_rounding():
    """The sphere summary's E_β steps: a rounding-size dip is not a decrease, a real one is."""
    import xarray as xr

    sph = sphere_summary

    up = np.array([1.0, 1.5, 1.5 * (1 - 1e-15), 2.0])  # a dip of 1e-15: rounding
    down = np.array([1.0, 2.0, 1.9, 2.5])              # a real decrease of 5 %
    e = xr.DataArray(np.stack([up, down]), dims=("seed", "t"))
    got = sph.energy_steps(e)
    assert got["steps"] == 6 and got["decreases"] == 1 and got["systems"] == 2
    assert abs(got["largest_relative_decrease"] - 0.05) < 1e-12
    text = sph.guide_energy_steps({"results": {"energy_steps": got}})
    assert "1 of 6 steps" in text
    flat = sph.energy_steps(xr.DataArray(up[None], dims=("seed", "t")))
    assert "never decreases" in sph.guide_energy_steps({"results": {"energy_steps": flat}})


def test_slow_suite_and_costliest_renderers():
    """The slow suite's record (partial, then whole) and the default suite's costliest tests."""
    f = {"tests": 3, "counts": {"passed": 2, "failed": 1}, "wall_s": 4000.0, "cpu_s": 7200.0,
         "workers": 1, "load_start": [1.5, 1.0, 1.0],
         "failed": [{"test": "tests/test_a.py::test_x", "message": "AssertionError: 1 != 2"}]}
    res = {"kind": "slow_suite", "meta": META,
           "results": {"files": {"tests/test_a.py": f}, "total_files": 2, "total_tests": 5}}
    text = gn.render("slow_suite.summary", cache={"slow_suite": res})
    assert text.startswith("1 of its 2 files so far (3 of 5 slow tests") and "1 failed" in text
    assert "1.1 h of wall time (2.0 CPU-hours)" in text
    assert "`tests/test_a.py::test_x` (AssertionError: 1 != 2)" == gn.render(
        "slow_suite.failures", cache={"slow_suite": res})
    assert "| `tests/test_a.py` | 3 | 2 passed, 1 failed | 4000 | 7200 | 1 |" in gn.render(
        "slow_suite.table", cache={"slow_suite": res})
    res["results"]["total_files"], res["results"]["total_tests"] = 1, 3
    f["counts"], f["failed"] = {"passed": 3}, []
    text = gn.render("slow_suite.summary", cache={"slow_suite": res})
    assert text.startswith("the whole slow suite, 3 tests in 1 file: 3 passed;")
    assert gn.render("slow_suite.failures", cache={"slow_suite": res}) == "none"
    suite = {"costliest": [{"test": "tests/t.py::a", "cpu_s": 9.0}, {"test": "tests/t.py::b",
                                                                     "cpu_s": 3.0}],
             "tests_cpu_s": 100.0, "outside_tests_cpu_s": 20.0, "cpu_s": 125.0}
    table = gn.render("readme_times.suite_costliest",
                      cache={"readme_times": {"kind": "readme_times", "meta": META,
                                              "results": {"suite": suite}}})
    assert "| `tests/t.py::a` | 9.0 |" in table
    assert "These 2 take 12 of the tests' 100 CPU-s" in table and "spends 20 of its 125 CPU-s" in table
