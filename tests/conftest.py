"""Test configuration: x64 is enabled so that every test can choose float32 or float64
explicitly (arrays are created with an explicit dtype; weak-typed Python scalars keep
float32 computations in float32)."""

import os

# SciPy's OpenBLAS threads fight XLA's on a 2-core machine; set before SciPy loads LAPACK.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# The CLI's persistent compilation cache stays off in tests (the user's cache folder is never
# written; tests/test_startup.py turns it on in a temporary folder).
os.environ.setdefault("JAXDYN_NO_CACHE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

# The export cases (tests/export/) run in tests/test_export.py's child process, with
# EQX_ON_ERROR=nan; collected here only there.
collect_ignore = [] if os.environ.get("EQX_ON_ERROR") in ("nan", "off") else ["export"]

# One persistent compilation cache per pytest run, in a temporary folder shared by the xdist
# workers and the subprocesses of the tests (created by the controller before the workers start; they inherit the variable), so
# that a program compiled by one worker (the same step of the same model in several test files)
# is loaded, not compiled again, by the other. Removed when the run ends. The user's cache
# folder is never touched (JAXDYN_NO_CACHE above keeps the CLI's own cache off).
_RUN_CACHE = "JAXDYN_TEST_RUN_JIT_CACHE"
if not os.environ.get(_RUN_CACHE):
    import atexit
    import shutil
    import tempfile

    os.environ[_RUN_CACHE] = tempfile.mkdtemp(prefix="jaxdyn-tests-jit-")
    atexit.register(shutil.rmtree, os.environ[_RUN_CACHE], True)
    # the subprocesses that tests start (the CLI, the 4-device and the multi-process runs) read
    # JAX's options from the environment: they share the run's cache too
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_RUN_CACHE]
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"


def _use_run_cache():
    jax.config.update("jax_compilation_cache_dir", os.environ[_RUN_CACHE])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


_use_run_cache()


@pytest.fixture(autouse=True)
def _run_cache_back():
    """A test that turns the persistent cache elsewhere or off (tests/test_startup.py) gets
    the run's cache back afterwards."""
    yield
    if jax.config.jax_compilation_cache_dir != os.environ[_RUN_CACHE]:
        from jax.experimental.compilation_cache import compilation_cache as cc

        cc.reset_cache()
        _use_run_cache()


# ``JAXDYN_TEST_CPU=PREFIX``: per-test CPU seconds (user + system of this process and of the
# subprocesses it waited for, ``resource.getrusage``) and wall seconds, setup + call + teardown,
# written to ``PREFIX.<worker>.json`` when the run ends (one file per xdist worker; the
# controller writes ``PREFIX.master.json``). A module- or run-scoped fixture is charged to
# the first test that uses it; "_outside_tests" holds what the process spent outside the tests
# (imports, collection). Off unless the variable is set.
_CPU_LOG = os.environ.get("JAXDYN_TEST_CPU")
_cpu_records = {}


def _cpu_now():
    import resource
    import time

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime,
            kids.ru_utime + kids.ru_stime, time.perf_counter())


if _CPU_LOG:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        """Record the CPU and wall seconds of one test (setup, call and teardown)."""
        cpu0, kids0, wall0 = _cpu_now()
        yield
        cpu1, kids1, wall1 = _cpu_now()
        _cpu_records[item.nodeid] = {"cpu": round(cpu1 - cpu0, 3),
                                     "children": round(kids1 - kids0, 3),
                                     "wall": round(wall1 - wall0, 3)}

    def pytest_unconfigure(config):
        """Write this process's records to ``JAXDYN_TEST_CPU.<worker>.json``."""
        import json

        worker = getattr(config, "workerinput", {}).get("workerid", "master")
        cpu, kids, _ = _cpu_now()
        tests = sum(r["cpu"] for r in _cpu_records.values())
        _cpu_records["_outside_tests"] = {"cpu": round(cpu - tests, 3), "children": round(kids, 3),
                                          "total_cpu": round(cpu, 3)}
        with open(f"{_CPU_LOG}.{worker}.json", "w") as f:
            json.dump(_cpu_records, f, indent=0)

# A run without the slow tests (the default ``-m 'not slow and not docs'``, the documentation's
# ``-m 'docs and not slow'``) compiles without LLVM's optimisations: its programs are
# small and many, so compiling them is most of its cost. Measured on the 2-core CI machine, the
# whole default suite: 401 CPU-s at optimisation level 0 against 503 CPU-s at XLA's default (the
# same 775 tests, each passing both ways). The generated HLO (XLA's own passes, fusion, the
# numerics) is unchanged; only the machine code is less tuned, which costs execution-bound
# programs up to 6x (N = 4096 attention steps), so a run that selects slow tests (whole
# experiments) keeps XLA's default, as does ``JAXDYN_TEST_XLA_OPT=1``. Subprocesses that tests
# start with their own ``XLA_FLAGS`` append ``JAXDYN_TEST_XLA_FLAGS``. XLA's legacy emitters
# (``--xla_cpu_use_fusion_emitters=false``) would compile faster still, but at optimisation
# level 0 they miscompile one program here (``pde.growth_rate`` with noise off by 8 %), so they
# are not used.
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def pytest_configure(config):
    """Choose the run's XLA compile flags (above), before any test initialises a backend."""
    default_run = "not slow" in (config.option.markexpr or "")
    flags = _FAST_COMPILE if default_run and not os.environ.get("JAXDYN_TEST_XLA_OPT") else ""
    os.environ["JAXDYN_TEST_XLA_FLAGS"] = flags
    if flags and flags not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()


DTYPES = [np.float32, np.float64]


@pytest.fixture(params=DTYPES, ids=["f32", "f64"])
def dtype(request):
    return request.param


_SELECTED = pytest.StashKey[list]()


def selected_items(config):
    """The tests this run selected (after ``-m`` / ``-k`` deselection)."""
    return config.stash.get(_SELECTED, [])


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.slow_dtype("f32")``: the f32 instances of a test (parametrized by the
    ``dtype`` fixture) are marked ``slow`` (run with ``-m slow``); the others stay default.
    Used where one dtype in the default suite checks the property and the other dtype's
    compilations would double its cost. Once every other hook has deselected, the selected
    tests are kept for :func:`selected_items`."""
    for item in items:
        mark = item.get_closest_marker("slow_dtype")
        if mark is None or not hasattr(item, "callspec"):
            continue
        dt = item.callspec.params.get("dtype")
        if dt is not None and {np.dtype(np.float32): "f32",
                               np.dtype(np.float64): "f64"}[np.dtype(dt)] in mark.args:
            item.add_marker(pytest.mark.slow)
    yield
    config.stash[_SELECTED] = list(items)


def tol(dtype, f32, f64):
    """Pick a tolerance by dtype."""
    return f32 if np.dtype(dtype) == np.float32 else f64


def run_once(tmp_path_factory, worker_id, key, compute):
    """``compute()`` (JSON-able) once per pytest run, shared by the xdist workers.

    Each worker of ``pytest -n`` is a pytest process of its own (a fixture scoped to the whole run
    runs once per worker); an expensive result, such as a subprocess, is computed by the
    first worker that asks and read back from the shared base temporary directory by the
    others (they wait on a lock meanwhile)."""
    import fcntl
    import json

    if worker_id == "master":  # no xdist
        return compute()
    root = tmp_path_factory.getbasetemp().parent
    path = root / f"{key}.json"
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.is_file():
                return json.loads(path.read_text())
            data = compute()
            path.write_text(json.dumps(data))
            return data
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
