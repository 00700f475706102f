"""Programs traced once (jaxdyn._cache.cached_program): an executable written by one process is
loaded by the next without tracing, gives the same bits, and is never loaded when anything
that can change the trace changed (each part of the key: a miss, then the right value)."""

from __future__ import annotations

import os
import shutil
import types

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn import _cache


def _f(x, s):
    return jnp.sin(x) * s + 1.0


def _g(t, s):
    return jnp.cos(t[0]) * s


def _beta(m, s):
    return m.beta * s


@pytest.fixture
def cache(tmp_path):
    folder = jaxdyn.enable_compilation_cache(tmp_path / "cache")
    assert folder is not None
    try:
        yield folder / "jaxdyn-programs"
    finally:
        _cache.disable_compilation_cache()


def _files(folder):
    return sorted(folder.glob("*.jaxexe")) if folder.exists() else []


def _run(fn, key, *args):
    """A fresh program (what a new process has in memory) called once:
    (outputs, programs written, programs loaded, seconds traced)."""
    s0 = _cache.compile_stats()
    out = _cache.cached_program(fn, key)(*args)
    s1 = _cache.compile_stats()
    return (jax.block_until_ready(out), s1["programs_written"] - s0["programs_written"],
            s1["program_hits"] - s0["program_hits"], s1["trace_seconds"] - s0["trace_seconds"])


X = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3)


def test_a_written_program_is_loaded_without_tracing_and_gives_the_same_bits(cache):
    x = jax.device_put(X)
    out1, written, hits, _ = _run(_f, ("t", 1), x, 2.0)
    assert (written, hits) == (1, 0) and len(_files(cache)) == 1
    out2, written, hits, traced = _run(_f, ("t", 1), x, 2.0)
    assert (written, hits) == (0, 1) and traced == 0.0
    want = eqx.filter_jit(_f)(x, 2.0)  # the ordinary path: same program, same bits
    np.testing.assert_array_equal(np.asarray(out1), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(want))
    # the cache off: compiled in memory only, nothing written, the same bits
    _cache.disable_compilation_cache()
    out3, written, hits, _ = _run(_f, ("t", 1), x, 2.0)
    assert (written, hits) == (0, 0)
    np.testing.assert_array_equal(np.asarray(out3), np.asarray(want))


def _variants(monkeypatch):
    """(name, function, key, args, context) of calls that each differ from the base call
    (_f, ("t", 1), (x, 2.0)) in one part of the key."""
    x = jax.device_put(X)
    other_devices = [types.SimpleNamespace(platform=d.platform, device_kind="another kind", id=d.id,
                                           process_index=d.process_index, client=d.client)
                     for d in jax.devices()]
    return {
        "caller key": (_f, ("t", 2), (x, 2.0), {}),
        "shape": (_f, ("t", 1), (jax.device_put(X[:1]), 2.0), {}),
        "dtype": (_f, ("t", 1), (jax.device_put(X.astype(np.float16)), 2.0), {}),
        "weak type": (_f, ("t", 1), (jnp.asarray(0.5), 2.0), {}),
        "committed": (_f, ("t", 1), (jax.device_put(X, jax.devices()[0]), 2.0), {}),
        "host array": (_f, ("t", 1), (X, 2.0), {}),
        "static value": (_f, ("t", 1), (x, 3.0), {}),
        "static type": (_f, ("t", 1), (x, 2), {}),
        "jax config": (_f, ("t", 1), (x, 2.0), {"config": ("jax_numpy_rank_promotion", "warn")}),
        "trace context": (_f, ("t", 1), (x, 2.0), {"precision": "highest"}),
        "environment": (_f, ("t", 1), (x, 2.0), {"env": ("JAXDYN_TEST_KEY_PART", "1")}),
        "jaxdyn sources": (_f, ("t", 1), (x, 2.0), {"patch": ("_sources_digest", lambda: "0" * 64)}),
        "dependencies": (_f, ("t", 1), (x, 2.0), {"patch": ("_dependencies_part", lambda: "jax:0")}),
        "devices": (_f, ("t", 1), (x, 2.0), {"devices": other_devices}),
        "equinox error mode": (_f, ("t", 1), (x, 2.0), {"eqx": "nan"}),
    }


VARIANTS = ["caller key", "shape", "dtype", "weak type", "committed", "host array", "static value",
            "static type", "jax config", "trace context", "environment", "jaxdyn sources",
            "dependencies", "devices", "equinox error mode"]


def test_every_part_of_the_key_changes_it(cache, monkeypatch):
    x = jax.device_put(X)
    _, written, _, _ = _run(_f, ("t", 1), x, 2.0)
    assert written == 1
    for name, (fn, key, args, ctx) in _variants(monkeypatch).items():
        with monkeypatch.context() as mp:
            mp.setattr(_cache, "_process_part", [None])  # recomputed (sources, versions)
            if "patch" in ctx:
                mp.setattr(_cache, ctx["patch"][0], ctx["patch"][1])
            if "env" in ctx:
                mp.setenv(*ctx["env"])
            if "devices" in ctx:
                mp.setattr(jax, "devices", lambda *a, **k: ctx["devices"])
            if "eqx" in ctx:  # a program traced with equinox's checks in another mode
                from equinox import _errors
                mp.setattr(_errors, "EQX_ON_ERROR", ctx["eqx"])
            old = None
            if "config" in ctx:
                old = getattr(jax.config, ctx["config"][0])
                jax.config.update(*ctx["config"])
            try:
                with jax.default_matmul_precision(ctx.get("precision", None)) if "precision" in ctx \
                        else _nothing():
                    out, written, hits, _ = _run(fn, key, *args)
            finally:
                if old is not None:
                    jax.config.update(ctx["config"][0], old)
        assert (written, hits) == (1, 0), name  # a miss: compiled and written anew
        np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.jit(fn, static_argnums=1)(*args)),
                                      err_msg=name)
    _, written, hits, _ = _run(_f, ("t", 1), x, 2.0)  # the base call still hits
    assert (written, hits) == (0, 1)
    assert len(_files(cache)) == 1 + len(VARIANTS)
    assert sorted(_variants(monkeypatch)) == sorted(VARIANTS)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_tree_structure_and_static_fields_are_part_of_the_key(cache):
    x = jax.device_put(X)
    assert _run(_g, ("g",), (x,), 2.0)[1:3] == (1, 0)
    assert _run(_g, ("g",), [x], 2.0)[1:3] == (1, 0)  # a list, not a tuple
    I = np.eye(3, dtype=np.float32)
    m_auto = jaxdyn.SphereAttention(I, I, I, np.float32(2.0))
    m_dense = jaxdyn.SphereAttention(I, I, I, np.float32(2.0), kernel="dense")
    assert _run(_beta, ("b",), m_auto, 2.0)[1:3] == (1, 0)
    assert _run(_beta, ("b",), m_dense, 2.0)[1:3] == (1, 0)  # another static field
    assert _run(_beta, ("b",), m_auto, 2.0)[1:3] == (0, 1)


def test_key_texts_of_sources_and_installed_files_follow_edits(tmp_path, monkeypatch):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.py").write_text("x = 1\n")
    (src / "sub" / "b.py").write_text("y = 2\n")
    d0 = _cache._sources_digest(src)
    (src / "sub" / "b.py").write_text("y = 3\n")
    assert _cache._sources_digest(src) != d0
    assert _cache._sources_digest() == _cache._sources_digest()  # the package's: stable
    pkg = tmp_path / "site" / "hj_fake_dependency"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("z = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(_cache, "_STAT_PACKAGES", ("hj_fake_dependency",))
    p0 = _cache._dependencies_part()
    st = os.stat(pkg / "__init__.py")
    os.utime(pkg / "__init__.py", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # edited in place
    assert _cache._dependencies_part() != p0


def test_damaged_or_foreign_files_are_misses(cache):
    x = jax.device_put(X)
    want = np.asarray(eqx.filter_jit(_f)(x, 2.0))
    _run(_f, ("d", 1), x, 2.0)
    (path,) = _files(cache)
    path.write_bytes(b"not a program")
    out, written, hits, _ = _run(_f, ("d", 1), x, 2.0)
    assert (written, hits) == (1, 0)
    np.testing.assert_array_equal(np.asarray(out), want)
    # another key's file under this key's name (a hash collision): the stored key text differs
    _run(_f, ("d", 2), x, 3.0)
    other = [p for p in _files(cache) if p != path][0]
    shutil.copy(other, path)
    out, written, hits, _ = _run(_f, ("d", 1), x, 2.0)
    assert (written, hits) == (1, 0)
    np.testing.assert_array_equal(np.asarray(out), want)


def test_what_cannot_be_keyed_runs_uncached(cache):
    x = jax.device_put(X)
    want = np.asarray(eqx.filter_jit(_f)(x, 2.0))
    out, written, hits, _ = _run(_f, ("lambda", lambda: 0), x, 2.0)  # a key with a lambda
    assert (written, hits) == (0, 0)
    np.testing.assert_array_equal(np.asarray(out), want)
    y = 2.0
    out, written, hits, _ = _run(lambda x, f: _f(x, f()), ("c",), x, lambda: y)  # a closure leaf
    assert (written, hits) == (0, 0)
    np.testing.assert_array_equal(np.asarray(out), want)
    prog = _cache.cached_program(_f, ("traced",))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: prog(x, 2.0))(x)), want)  # a tracer
    assert not _files(cache)
    # a program with a host callback is compiled but never written (JAX's cache refuses it too)
    seen = []

    def with_callback(x, s):
        jax.debug.callback(lambda v: seen.append(np.asarray(v)), x)
        return _f(x, s)

    out, written, hits, _ = _run(with_callback, ("cb",), x, 2.0)
    assert (written, hits) == (0, 0) and len(seen) == 1
    np.testing.assert_array_equal(np.asarray(out), want)


def test_token_texts_are_exact():
    t = _cache.token
    assert t(0.1) != t(0.1 + 2**-56) and t(1) != t(1.0) != t(True) and t("1") != t(1)
    assert t((1, 2)) != t([1, 2]) and t(np.float32) != t(np.float64)
    assert t({"b": 1, "a": 2}) == t({"a": 2, "b": 1})
    assert t(_cache.token) == "fn:jaxdyn._cache:token:NoneType:None:list()"
    import functools

    part = functools.partial(_cache.token)
    assert t(part) == t(functools.partial(_cache.token)) != t(functools.partial(_cache.token, 1))
    assert t(functools.partial(_cache.token, v=1)) != t(functools.partial(_cache.token, v=2))
    for bad in (lambda: 0, object(), _f, np.zeros(2), functools.partial(_f, 1),
                functools.partial(_cache.token, object())):  # no identifying text: not keyed
        with pytest.raises(_cache.Uncacheable):
            t(bad)


def test_sharded_vmap_with_a_cache_key_equals_without(cache):
    def one(x, s):
        return jnp.tanh(x * s).sum(), x[::-1]

    x = jax.device_put(np.arange(30, dtype=np.float32).reshape(5, 6) / 7)
    s = jax.device_put(np.linspace(0.5, 2.0, 5, dtype=np.float32))
    want = jaxdyn.sharded_vmap(one)(x, s)
    for _ in range(2):  # written, then loaded by a fresh wrapper
        got = jaxdyn.sharded_vmap(one, cache_key=("test_sharded_vmap",))(x, s)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert len(_files(cache)) == 1


_CHILD = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
import jaxdyn
from jaxdyn import _cache
jaxdyn.enable_compilation_cache(sys.argv[1])
x = jax.device_put(np.linspace(-1.0, 2.0, 9, dtype=np.float32).reshape(3, 3))  # no program
outs = {}
for name, fn in (("tanh", lambda x: jnp.tanh(x) @ x), ("svd", lambda x: jnp.linalg.svd(x, compute_uv=False))):
    outs[name] = np.asarray(_cache.cached_program(fn, ("child", name))(x)).tolist()
s = _cache.compile_stats()
print("RESULT" + json.dumps({"outs": outs, "hits": s["program_hits"], "written": s["programs_written"],
                             "trace": s["trace_seconds"], "lower": s["lower_seconds"]}))
"""


def test_a_fresh_process_loads_and_runs_the_stored_program(tmp_path):
    """The real use: another process. Its loaded programs give the first process's bits
    without tracing, a LAPACK call (SVD) included (loaded without lowering, its kernel table
    must be set up first: without that, a crash in jax 0.10.2)."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(__import__("pathlib").Path(jaxdyn.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "cache")], env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        runs.append(json.loads(p.stdout.split("RESULT", 1)[1]))
    first, second = runs
    assert (first["written"], first["hits"]) == (2, 0)
    assert (second["written"], second["hits"]) == (0, 2)
    assert second["outs"] == first["outs"]  # the same bits (floats round-trip through JSON)
    assert second["trace"] == second["lower"] == 0.0


@pytest.mark.parametrize("method", ["rk4", "geodesic_em"])
def test_simulate_programs_are_stored_and_give_the_same_trajectory(cache, method):
    """``simulate``'s fixed-step program and ``simulate_sde``'s geodesic Euler–Maruyama
    program go through ``trajectory_program``: written once, loaded by a fresh wrapper
    (another process's view) without tracing, the same bits and status as the plain jit."""
    from jaxdyn.simulation import _noise, _simulate

    eye = jnp.eye(3, dtype=jnp.float32)
    model = jaxdyn.SphereAttention(eye, eye, eye, 2.0)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(3), 16, 3)
    if method == "rk4":
        leaves_fn, args = _simulate._run_fixed_leaves, (model, x0, None, 0.0, 0.05, (0, 10, 20), "rk4")
    else:
        leaves_fn, args = _noise._run_gem_leaves, (model, x0, jax.random.PRNGKey(4), jnp.float32(0.3),
                                                   None, 0.0, 0.05, (0, 10, 20))
    want = _simulate.trajectory_from_leaves(eqx.filter_jit(leaves_fn)(*args))
    got = []
    for expect in ((1, 0), (0, 1)):  # written, then loaded by a fresh wrapper
        s0 = _cache.compile_stats()
        traj = jax.block_until_ready(_simulate.trajectory_program(leaves_fn)(*args))
        s1 = _cache.compile_stats()
        assert (s1["programs_written"] - s0["programs_written"],
                s1["program_hits"] - s0["program_hits"]) == expect
        got.append(traj)
    assert s1["trace_seconds"] == s0["trace_seconds"]
    for traj in got:
        assert isinstance(traj, _simulate.Trajectory) and bool(traj.ok)
        for a, b in zip(jax.tree.leaves(traj), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the public drivers take that path (same bits as the plain jit)
    if method == "rk4":
        pub = jaxdyn.simulate(model, x0, t1=1.0, dt=0.05, saveat=[0.0, 0.5, 1.0])
        np.testing.assert_array_equal(np.asarray(pub.xs), np.asarray(want.xs))


def test_a_stored_program_that_fails_to_run_is_rebuilt(cache, monkeypatch):
    """A loaded executable that raises on its first call (XLA once said "Function
    copy_copy_fusion not found" for one) is deleted, compiled again from the trace, run, and
    counted; the caller gets the right value and a warning."""
    x = jax.device_put(X)
    want, written, _, _ = _run(_f, ("t", 9), x, 2.0)
    assert written == 1 and len(_files(cache)) == 1

    class Broken:
        def __call__(self, *a):
            raise RuntimeError("NOT_FOUND: Function copy_copy_fusion not found (type id: 1)")

    monkeypatch.setattr(_cache, "_load_program", lambda *a, **k: Broken())
    s0 = _cache.compile_stats()
    with pytest.warns(RuntimeWarning, match="failed to run"):
        got = _cache.cached_program(_f, ("t", 9))(x, 2.0)
    s1 = _cache.compile_stats()
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert s1["program_load_failures"] - s0["program_load_failures"] == 1
    assert s1["programs_written"] - s0["programs_written"] == 1  # the file replaced
    monkeypatch.undo()
    again, written, hits, _ = _run(_f, ("t", 9), x, 2.0)  # the new file loads and runs
    assert (written, hits) == (0, 1)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(want))


def test_a_program_that_jax_cache_answers_is_compiled_again_before_it_is_stored(cache):
    """JAX's persistent cache holds the program (our file is gone: another jaxdyn version,
    a cleaned folder): an executable JAX loads from its cache serializes without its
    kernels' object code ("Function ... not found" once loaded, jax 0.10.2), so the build is
    compiled again with that cache off before it is stored; the stored file then loads and
    runs without the rebuild guard."""
    import warnings

    x = jax.device_put(X)
    want, written, _, _ = _run(_f, ("t", 11), x, 2.0)
    assert written == 1
    for f in _files(cache):
        f.unlink()
    s0 = _cache.compile_stats()
    again, written, hits, _ = _run(_f, ("t", 11), x, 2.0)
    assert (written, hits) == (1, 0)
    assert _cache.compile_stats()["cache_hits"] > s0["cache_hits"]  # JAX's cache answered first
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded, written, hits, _ = _run(_f, ("t", 11), x, 2.0)
    assert (written, hits) == (0, 1)
    assert _cache.compile_stats()["program_load_failures"] == s0["program_load_failures"]
    for out in (again, loaded):
        np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
