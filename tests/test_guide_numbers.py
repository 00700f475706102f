"""The guides' measured numbers are generated from the committed result files (docs/results/).

``python -m jaxdyn.experiments.guide_numbers`` renders every ``<!-- BEGIN GENERATED stem.what -->``
span of a guide from ``docs/results/**/stem.json``; these tests regenerate the guides and fail
where the text differs (a number typed by hand inside a span, or a result file changed without
regenerating), check that every result file records where it came from, and check the
per-seed readings of a concentration run on a small synthetic run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from jaxdyn.experiments import guide_numbers as gn

ROOT = Path(__file__).resolve().parents[1]
#: the pages whose measured numbers are generated (the others still state some by hand)
OWNED = ("docs/guides/concentration.md", "docs/guides/reachability.md",
         "docs/guides/long_context.md", "docs/guides/gaussian.md", "docs/guides/density.md",
         "docs/guides/gaussianity.md")


def test_guides_are_what_their_result_files_render():
    """Every guide with result-file spans equals its regeneration."""
    assert gn.stale(ROOT) == [], ("regenerate with `python -m jaxdyn.experiments.guide_numbers` "
                                  "(and never edit inside a GENERATED span by hand)")


@pytest.mark.parametrize("guide", OWNED)
def test_guide_numbers_come_from_spans(guide):
    """The guide has generated spans, and each renders from an existing result file."""
    text = (ROOT / guide).read_text()
    keys = [m.group(2) for m in gn.SPAN.finditer(text)]
    assert keys, f"{guide} has no generated span"
    for k in keys:
        assert gn.render(k, ROOT)  # raises KeyError for a missing file or renderer
    assert (ROOT / guide) in gn.guides(ROOT)
    # a phrase span must not open its line: Markdown reads a line that starts with an HTML
    # comment as a block of its own and breaks the paragraph there
    for m in gn.SPAN.finditer(text):
        if not m.group(3).startswith("\n"):
            line_start = text.rfind("\n", 0, m.start()) + 1
            assert text[line_start:m.start()].strip(), f"{guide}: span {m.group(2)} opens a line"


def test_a_hand_edit_inside_a_span_does_not_survive():
    """Changing a number inside a span is undone by the generator (so the check fails on it)."""
    text = (ROOT / OWNED[0]).read_text()
    m = next(m for m in gn.SPAN.finditer(text) if m.group(2).endswith(".table"))
    body = m.group(3)
    assert "|" in body
    edited = text[:m.start(3)] + body.replace("|", "| 9.99", 1) + text[m.end(3):]
    assert edited != text
    assert gn.generate(edited, ROOT) == text


def test_an_unknown_renderer_or_result_is_named():
    with pytest.raises(KeyError, match="no renderer 'nonsense'"):
        gn.render("concentration_s2.nonsense", ROOT)
    with pytest.raises(KeyError, match="no_such_result"):
        gn.render("no_such_result.table", ROOT)


def test_result_files_record_where_they_come_from():
    files = sorted((ROOT / gn.RESULTS).rglob("*.json"))
    assert files
    for f in files:
        r = json.loads(f.read_text())
        meta = r["meta"]
        assert gn.renderers(r["kind"]), f
        assert meta["command"] and meta["commit"], f
        assert meta["machine"]["cores"] >= 1 and meta["machine"]["cpu"], f
        assert meta["wall_seconds"] is not None and meta["wall_seconds"] > 0, f


def test_sampling_floor_statistics_are_those_of_its_distances():
    """The floor's mean, standard error and 5–95 % range are recomputed from its stored pairs."""
    r = json.loads((ROOT / gn.RESULTS / "reachability" / "sampling_floor.json").read_text())
    for problem, v in r["results"].items():
        w = np.asarray(v["distances"])
        assert v["pairs"] == w.size >= 100, problem
        assert v["mean"] == pytest.approx(w.mean(), rel=1e-5)
        assert v["standard_error"] == pytest.approx(w.std(ddof=1) / np.sqrt(w.size), rel=1e-4)
        assert v["p05"] == pytest.approx(np.quantile(w, 0.05), rel=1e-4)
        assert v["p95"] == pytest.approx(np.quantile(w, 0.95), rel=1e-4)


def test_spread_and_num_formats():
    assert gn.num(0.22046) == "0.220"
    assert gn.num(-0.152) == "−0.152"
    assert gn.num(3.4e-15, 2) == "3.4e−15"
    assert gn.num(None) == "—"
    assert gn.spread([1.0, 2.0, None]) == "1.50 (1.00–2.00) [2 of 3]"
    assert gn.spread([None, None]) == "—"
    assert gn.spread([-1.0, 0.5]) == "−0.250 (−1.00 to 0.500)"


def test_powers_of_ten_and_the_readme_times():
    """N as the guides write it; the README's times from a synthetic result: medians, the
    quick start's two runs, the machine."""
    assert [gn._pow10(n) for n in (30000, 100000, 10**7, 2500, 123456)] == [
        "3·10⁴", "10⁵", "10⁷", "2 500", "123 456"]
    res = {"meta": {"machine": {"cores": 2, "cpu": "CPU X"}},
           "results": {"repeats": 3, "load_start": [0.5, 0.4, 0.3],
                       "quick_start": {"first": {"wall_s": 22.04, "cpu_s": 30.2, "compile_s": 5.21},
                                       "second": {"wall_s": 17.66, "cpu_s": 25.0,
                                                  "compile_s": 1.04}},
                       "examples": {"noisy_run": {"wall_s": [4.0, 9.0, 4.2],
                                                  "cpu_s": [3.9, 3.8, 4.4]}}}}
    table = gn.RENDERERS["readme_times"]
    assert table["noisy_run"](res) == "4.2 s (3.9 CPU-s)"
    assert table["quick_start"](res) == (
        "takes 22.0 s of wall time (30 CPU-s) on 2 CPU cores (CPU X), of which 5.2 s compiling; "
        "a second run loads its programs from JAX's cache: 17.7 s, 1.0 s of it loading them")
    assert table["how"](res) == "the median of 3 runs each on 2 CPU cores (CPU X), load 0.5 at the start"
    assert set(gn.README_EXAMPLES) <= set(table)
    res["results"]["suite"] = {"counts": {"passed": 10, "skipped": 1, "xfailed": 2,
                                          "deselected": 5},
                               "wall_s": 300.2, "cpu_s": 481.0, "load_start": [0.2, 0.1, 0.1]}
    assert table["suite"](res) == (
        "13 tests (1 skipped; 2 strict expected failures record known defects with their inputs) "
        "took 300 s of wall time with `-n 2` and 481 CPU-s on 2 CPU cores (CPU X), load 0.2 at "
        "its start: over the 8 CPU-minutes it is meant to fit")


def _two_seed_run():
    """Two β, two seeds whose W2 minima lie at different times (the mean curve's minimum is
    neither seed's)."""
    t = np.linspace(0.0, 10.0, 11)
    a = 0.5 + (t - 3.0) ** 2 / 50          # minimum 0.5 at t = 3
    b = 0.2 + (t - 7.0) ** 2 / 50          # minimum 0.2 at t = 7
    w2 = np.stack([np.stack([a, b]), np.stack([a + 0.1, b + 0.1])])  # (beta, seed, t)
    mE = np.zeros((2, 2, t.size))
    mV = np.zeros((2, 2, t.size))
    mE[..., 1:5] = 0.5                     # a metastable phase …
    mV[..., 6:] = 0.9                      # … ended at t = 6
    ds = xr.Dataset({"w2_exact": (("beta", "seed", "t_w2"), w2),
                     "mass_E": (("beta", "seed", "t"), mE), "mass_V": (("beta", "seed", "t"), mV)},
                    coords={"beta": [10.0, 100.0], "seed": [0, 1], "t": t, "t_w2": t})
    return {"metastable_mass": 0.1, "beta": None}, ds


def test_concentration_per_seed_reads_each_seeds_curves():
    from jaxdyn.experiments.concentration.summary import analyse, per_seed

    cfg, ds = _two_seed_run()
    ps = per_seed(cfg, ds)
    assert ps["seed"] == [0, 1]
    assert np.allclose(ps["min_w2"], [[0.5, 0.6], [0.2, 0.3]])
    assert np.allclose(ps["argmin_t"], [[3.0, 3.0], [7.0, 7.0]])
    assert np.allclose(ps["overtake_time"], 6.0)
    sp = ps["spread"]["min_w2"][0]
    assert (sp["mean"], sp["min"], sp["max"], sp["n"]) == pytest.approx((0.35, 0.2, 0.5, 2))
    # the seed-averaged curve has its minimum elsewhere (t = 5), above the seeds' mean minimum
    top = analyse(cfg, ds)
    assert top["argmin_t"][0] == pytest.approx(5.0)
    assert top["min_w2"][0] == pytest.approx(0.43)
    assert top["min_w2"][0] > sp["mean"]
    assert per_seed(cfg, ds.isel(seed=[0])) is None


def test_concentration_figures_show_every_seed(tmp_path):
    """With a seed axis the figures draw every seed's curve and readings (and still draw)."""
    from jaxdyn.experiments.concentration.figures import _per_seed_curves, plot

    cfg, ds = _two_seed_run()
    cfg.update(name="two_seeds", near_angle_deg=3.0)
    curves = _per_seed_curves(ds, "w2_exact", [10.0, 100.0])
    assert curves[0].shape == (2, ds.sizes["t_w2"])  # (seed, t): one curve a seed
    figs = plot(cfg, ds, tmp_path)
    names = {Path(f).name for f in figs}
    assert {"w2_vs_t.png", "min_w2_vs_beta.png", "argmin_t_vs_log_beta.png",
            "mass_fractions.png"} <= names
    assert all(Path(f).stat().st_size > 0 for f in figs)


#: Pages whose text may state a time or a memory size outside a generated span: a setting, a
#: budget or arithmetic, each named here with what it is (a measured one belongs in a span).
STATED = {
    ("docs/guides/cli.md", "120 s"): "the default of --distributed-timeout, a setting",
    ("docs/guides/cli.md", "20 s"): "the interrupt watchdog's allowance, a setting",
    ("docs/guides/density.md", "134 MB"): "16.8 M float64 entries, arithmetic",
    ("docs/guides/density.md", "1 GB"): "a (64·128)² float64 matrix, arithmetic",
    ("docs/guides/distributed.md", "30 s"): "JAX's heartbeat timeout, a setting",
    ("docs/guides/testing.md", "8 CPU-minutes"): "the default suite's budget, a target",
}
#: a number with a unit of time or memory (a measured duration or size, when typed by hand)
_MEASURE = re.compile(r"(?<![\w.^{-])\d+(?:[.,]\d+)?\s?(?:ms|µs|s|min|minutes|hours|CPU-s|"
                      r"CPU-seconds|CPU-minutes|CPU-hours|MiB|GiB|MB|GB)(?!\w)")


def _prose(text: str) -> str:
    """The text outside generated spans, code blocks, inline code and LaTeX (lines kept)."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = gn.SPAN.sub(blank, text)
    text = re.sub(r"^```.*?^```", blank, text, flags=re.S | re.M)
    text = re.sub(r"\$\$.*?\$\$", blank, text, flags=re.S)
    return re.sub(r"`[^`\n]*`|\$[^$\n]*\$", "", text)


def test_no_time_or_memory_is_typed_by_hand():
    """Outside generated spans, the README and the docs' pages state no duration or memory
    size except the settings, budgets and arithmetic listed in STATED (the benchmarks page is
    generated whole from the result files)."""
    pages = [ROOT / "README.md"] + [p for p in sorted((ROOT / "docs").rglob("*.md"))
                                    if p.name != "benchmarks.md"]
    found = []
    for page in pages:
        rel = page.relative_to(ROOT).as_posix()
        for i, line in enumerate(_prose(page.read_text()).split("\n"), 1):
            found += [(rel, i, m.group(0)) for m in _MEASURE.finditer(line)
                      if (rel, m.group(0)) not in STATED]
    assert found == [], ("a time or memory size typed by hand: render it from a result file "
                         f"(a GENERATED span) or list it in STATED with what it is: {found}")


def test_the_typed_time_check_finds_a_typed_time():
    text = "It took 12.5 s and 3 GiB. <!-- BEGIN GENERATED a.b -->4 s<!-- END GENERATED a.b -->"
    assert [m.group(0) for m in _MEASURE.finditer(_prose(text))] == ["12.5 s", "3 GiB"]


def test_every_shipped_config_has_a_time_row(tmp_path):
    """The CLI guide's table has one row a config under ``configs/``: a recorded run's times
    (the run as shipped preferred over one with ``--set``), "not recorded" otherwise; the
    repository's own table lists every shipped config."""
    for name in ("alpha", "beta", "gamma"):
        (tmp_path / "configs").mkdir(exist_ok=True)
        (tmp_path / "configs" / f"{name}.yaml").write_text("kind: sphere\n")
    meta = {"machine": {"cores": 2, "cpu": "Test CPU"}}

    def result(rel, command, wall, cpu):
        p = tmp_path / "docs" / "results" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"kind": "x", "meta": dict(meta, command=command,
                                                          wall_seconds=wall, cpu_seconds=cpu)}))

    result("a/alpha_seeds.json", 'jaxdyn run configs/alpha.yaml --set "sweep.seed=[0,1]"', 5.0, 9.0)
    result("a/alpha.json", "jaxdyn run configs/alpha.yaml --out runs/alpha", 1200.0, 700.0)
    result("b/beta.json", "jaxdyn run configs/beta.yaml --set n=3 --set t1=2.0", 12.34, None)
    result("b/other.json", "python -m something configs/gamma.yaml", 1.0, 1.0)
    rows = gn.config_times(tmp_path).splitlines()[2:]
    assert [r.split("|")[1].strip() for r in rows] == ["`alpha`", "`beta`", "`gamma`"]
    alpha, beta, gamma = ([c.strip() for c in r.split("|")[1:-1]] for r in rows)
    assert alpha == ["`alpha`", "20 min", "12 min", "2 CPU cores (Test CPU)", "as shipped",
                     "`docs/results/a/alpha.json`"]
    assert beta[1:5] == ["12 s", "not recorded", "2 CPU cores (Test CPU)", "`n=3` `t1=2.0`"]
    assert gamma[1] == "not recorded"
    ours = gn.config_times(ROOT).splitlines()[2:]
    assert len(ours) == len(list((ROOT / "configs").glob("*.yaml")))
    with pytest.raises(KeyError, match="configs.times"):
        gn.render("configs.other", tmp_path)
