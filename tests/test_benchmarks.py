"""The benchmark suite's entry point and its generated docs table (no benchmark is run).

``python -m benchmarks list`` works; every workload's script exists; the table in
docs/benchmarks.md is what ``python -m benchmarks docs`` generates from the committed result
files (deterministically), and each file's headline is the one its script JSON gives.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

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
             if p.is_dir() and p.name not in suite.BY_NAME and p.name != "compare"]
    assert not stray, stray


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
