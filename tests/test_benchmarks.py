"""The benchmark suite's entry point and its generated docs table.

``python -m benchmarks list`` works; every workload's script exists; the table in
docs/benchmarks.md is what ``python -m benchmarks docs`` generates from the committed result
files (deterministically), and each file's headline is the one its script JSON gives; every
workload has a cost model and every tracked result records it. A run without ``--record``
writes only under the ignored ``benchmarks/runs/``: the suite's ``run`` (its script's child
process replaced by a result in-process) writes there and ``git status`` of benchmarks/ is
unchanged by it; the same with one tiny workload run for real (a child process that starts
JAX) under ``-m slow``.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _suite():
    name = "jaxdyn_benchmark_suite"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH / "suite.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_list_names_every_workload():
    """`python -m benchmarks list` names every workload, in order."""
    suite = _suite()
    p = subprocess.run([sys.executable, "-m", "benchmarks", "list"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    listed = [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
    assert listed == [w.name for w in suite.WORKLOADS]


def test_every_workload_has_its_script():
    """Every workload's script exists."""
    suite = _suite()
    assert len({w.name for w in suite.WORKLOADS}) == len(suite.WORKLOADS)
    for w in suite.WORKLOADS:
        assert (BENCH / w.script).is_file(), w.script


def test_result_files_are_in_the_layout():
    """Result files sit at results/<workload>/<kind>.json with computed headlines."""
    suite = _suite()
    rows = suite.committed_results()
    assert rows, "no committed result"
    for name, kind, rec in rows:
        assert rec["workload"] == name and rec["machine_kind"] == kind
        assert kind.startswith(("cpu-", "gpu-"))
        # the headline is read from the script's JSON, not written by hand
        assert rec["headline"] == suite.headline(name, rec["result"]), (name, kind)
    stray = [p.name for p in (BENCH / "results").iterdir()
             if p.name not in suite.BY_NAME and p.name != "machines"]
    assert not stray, f"results/ holds only results/<workload>/ and results/machines/: {stray}"


def test_tracked_results_carry_no_wall_clock_stamps():
    """The tracked results name a run by its commit and machine, not by a date and time."""
    suite = _suite()
    rec = {"date": "2026-01-01T00:00:00Z", "n": 3, "meta": {"machine_info": {
        "date": "x", "cpu_count": 2}, "rows": [{"time": "y", "wall_s": 1.0}]}}
    assert suite.undated(rec) == {"n": 3, "meta": {"machine_info": {"cpu_count": 2},
                                                   "rows": [{"wall_s": 1.0}]}}
    dated = [str(p.relative_to(BENCH)) for p in (BENCH / "results").rglob("*.json")
             if suite.undated(json.loads(p.read_text())) != json.loads(p.read_text())]
    assert not dated, f"tracked results with wall-clock stamps: {dated}"


def test_docs_table_is_generated_from_the_results():
    """The page's table is the generated one, deterministically."""
    suite = _suite()
    page = suite.DOCS_PAGE.read_text()
    once = suite.render_page(page)
    assert suite.render_page(once) == once  # deterministic, idempotent
    assert page == once, "docs/benchmarks.md is stale: run `python -m benchmarks docs`"
    table = once.split(suite.BEGIN)[1].split(suite.END)[0]
    for name, kind, _ in suite.committed_results():
        assert f"| `{name}` |" in table and f"`{kind}`" in table


def test_headline_tolerates_missing_fields():
    """A result without a field gives an empty headline, not an error."""
    suite = _suite()
    for w in suite.WORKLOADS:
        assert suite.headline(w.name, {}) == {}
    assert json.loads(json.dumps(suite.headline("causal", {"rows": [
        {"n": 8, "causal_median_s": 1.0, "full_median_s": 2.0}]})))["baseline_s"] == 2.0


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60).stdout


def test_output_path_is_untracked_unless_recorded():
    """A plain run writes under benchmarks/runs/ (ignored by git); --record the tracked latest."""
    suite = _suite()
    plain = suite.output_path("pde", "cpu-x-2c", stamp="20260101T000000Z")
    assert plain == BENCH / "runs" / "pde" / "cpu-x-2c-20260101T000000Z.json"
    tiny = suite.output_path("pde", "cpu-x-2c", tiny=True)
    assert tiny.parent == BENCH / "runs" / "pde" and tiny.name.endswith(".tiny.json")
    assert suite.output_path("pde", "cpu-x-2c", record=True) == \
        BENCH / "results" / "pde" / "cpu-x-2c.json"
    for path in (plain, tiny):
        assert _git("check-ignore", str(path.relative_to(ROOT))).strip(), path
    try:
        suite.output_path("pde", "cpu-x-2c", record=True, tiny=True)
    except ValueError:
        pass
    else:
        raise AssertionError("a tiny run must not be recorded")


def test_scripts_alone_write_under_runs():
    """A benchmark script run alone writes to benchmarks/runs/ (common.RESULTS), ignored."""
    p = subprocess.run([sys.executable, "-c", "import common; print(common.RESULTS)"],
                       cwd=BENCH, capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in __import__("os").environ.items()
                            if k != "JAXDYN_BENCH_RESULTS"})
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()) == BENCH / "runs"
    assert _git("check-ignore", "benchmarks/runs/x.json").strip()
    # a script with an --outdir option of its own defaults to the same folder
    for script in sorted(BENCH.glob("bench_*.py")):
        text = script.read_text()
        at = text.find('"--outdir"')
        if at >= 0:
            option = text[at:at + 200]
            assert "RESULTS" in option or '"runs"' in option, (script.name, option)


def test_tiny_run_writes_under_runs_only(monkeypatch):
    """``suite.run(["pde"], tiny=True)`` writes its one result file under benchmarks/runs/ and
    changes nothing git tracks or shows in benchmarks/ (the script's child process replaced by
    its JSON: the real child runs in test_tiny_run_leaves_the_tree_unchanged, -m slow)."""
    suite = _suite()
    before = _git("status", "--porcelain", "--untracked-files=all", "benchmarks/")
    data = {"rows": [{"n": 8}]}

    def run_once(w, extra, tiny, gpu, max_isa, timeout):
        assert tiny and w.name == "pde"
        return {"rc": 0, "wall_s": 0.1, "argv": [w.script, *w.tiny_args], "data": data,
                "png": None}

    monkeypatch.setattr(suite, "_run_once", run_once)
    monkeypatch.delenv("OUT", raising=False)
    written = suite.run(["pde"], tiny=True)
    try:
        assert len(written) == 1 and written[0].is_relative_to(BENCH / "runs" / "pde"), written
        assert written[0].name.endswith(".tiny.json")
        rec = json.loads(written[0].read_text())
        assert rec["tiny"] is True and rec["result"] == data and rec["workload"] == "pde"
    finally:
        for w in written:
            w.unlink()
    assert _git("status", "--porcelain", "--untracked-files=all", "benchmarks/") == before


@pytest.mark.slow  # a child process that starts JAX; the suite's writing: the test above
def test_tiny_run_leaves_the_tree_unchanged(tmp_path):
    """`python -m benchmarks run pde --tiny` changes nothing git tracks or shows in benchmarks/."""
    before = _git("status", "--porcelain", "--untracked-files=all", "benchmarks/")
    p = subprocess.run([sys.executable, "-m", "benchmarks", "run", "pde", "--tiny"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    written = [Path(line.split("wrote ", 1)[1]) for line in p.stdout.splitlines()
               if line.startswith("wrote ")]
    written = [w for w in written if w.is_relative_to(ROOT)]  # not the script's scratch copy
    assert written and all(w.is_relative_to(BENCH / "runs") for w in written), written
    for w in written:
        w.unlink()
    assert _git("status", "--porcelain", "--untracked-files=all", "benchmarks/") == before


def test_every_workload_has_a_cost_model():
    """cost.py counts every workload, and every tracked result records its count."""
    suite = _suite()
    spec = importlib.util.spec_from_file_location("jaxdyn_benchmark_cost", BENCH / "cost.py")
    cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cost)
    assert set(cost.COSTS) == set(suite.BY_NAME)
    for name, kind, rec in suite.committed_results():
        c = rec.get("cost")
        assert c and c["flops"] > 0 and c["bytes_min"] > 0 and "transcendentals" in c, (name, kind)
    h = cost.H200
    assert h["fp32_flops_per_s"] == 67e12 and h["bytes_per_s"] == 4.8e12
    assert all(h["sources"][k] for k in ("fp32_flops_per_s", "exp_per_s", "bytes_per_s"))


def test_floor_is_the_binding_term():
    """The floor is the largest of exps, FLOPs and bytes over their rates."""
    suite = _suite()
    rates = {"exp_per_s_per_core": 1e9, "cores": 2, "matmul_flops_per_s": 1e11, "bytes_per_s": 1e10}
    f = suite.floor({"flops": 1e11, "transcendentals": 4e9, "bytes_min": 1e9}, rates)
    assert f["bound"] == "exp" and abs(f["floor_s"] - 2.0) < 1e-12
    f = suite.floor({"flops": 1e12, "transcendentals": 4e9, "bytes_min": 1e9}, rates)
    assert f["bound"] == "flop" and abs(f["floor_s"] - 10.0) < 1e-12
    assert suite.floor({"flops": 1.0}, rates) is None
    assert suite.floor({"flops": 1.0, "transcendentals": 1.0}, None) is None


def test_docs_show_measured_over_floor_for_every_result():
    """The generated cost table has a row per tracked result with its measured / floor."""
    suite = _suite()
    table = suite.table().split("### Cost model")[1]
    for name, kind, rec in suite.committed_results():
        row = next(line for line in table.splitlines()
                   if line.startswith(f"| `{name}` | `{kind}` |"))
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[5] != "— (no rates)" and cells[7] != "—", row
