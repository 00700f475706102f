"""The first experience: an instant CLI (what `--help` imports), the persistent
compilation cache (in a temporary folder: the user's cache is never written), the timings in
summary.json, the progress bar within a chunk, and stack_models on the host.
Speed itself is measured in benchmarks/bench_startup.py, not here."""

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

import jaxdyn
from jaxdyn.experiments import progress, segments

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("jax", "jaxlib", "diffrax", "equinox", "ott", "optax", "scipy", "matplotlib", "xarray")


def _heavy_modules_after(body: str):
    """Run ``body`` in a fresh interpreter (jaxdyn on the path) and return its completed
    process; the last line of its stdout lists the HEAVY modules it imported. No speed is
    asserted here (that is bench_startup.py's)."""
    code = body + f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_help_imports_no_jax():
    """`jaxdyn --help` and `jaxdyn run --help` load neither JAX nor the numerical stack (checked
    by the modules imported)."""
    out = _heavy_modules_after(
        "import sys\n"
        "from jaxdyn.cli import main\n"
        "for argv in (['--help'], ['run', '--help'], ['report', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n")
    assert out.returncode == 0, out.stderr
    assert "--no-cache" in out.stdout  # run --help names the cache switch
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_config_check_imports_no_jax():
    """`jaxdyn config` (the embedded default, every shipped config, an override, a float64
    config) resolves and checks without loading JAX, SciPy or matplotlib (checked by the
    modules imported); gaussianity_minilm's checkpoint is located through the JAX-free
    jaxdyn.encoder_host (its check may fail where the checkpoint is not installed)."""
    configs = [str(p) for p in sorted((ROOT / "configs").glob("*.yaml"))]
    out = _heavy_modules_after(
        "import contextlib, io, sys\n"
        "from jaxdyn.cli import main\n"
        f"for argv in [['config'], ['config', '--set', 'n=64', '--set', 'dtype=float64']] + "
        f"[['config', c] for c in {configs!r}]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        assert main(argv) == 0 or argv[-1].endswith('gaussianity_minilm.yaml'), argv\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_jax_free_schemas_agree_with_the_library():
    """The JAX-free schemas name the library's own choices (jaxdyn.choices, one source); the
    config check's eigenspaces (NumPy) equal those of jaxdyn.projection; the weights built
    without JAX equal jaxdyn.spectral_weights in float64."""
    from jaxdyn import choices
    from jaxdyn.experiments import sphere_fields
    from jaxdyn.experiments.concentration import schema as cschema
    from jaxdyn.experiments.variants import schema as vschema

    assert sphere_fields.MASKS is choices.MASKS and jaxdyn.kernels.MASKS is choices.MASKS
    assert sphere_fields.ATTENTIONS is choices.ATTENTIONS and jaxdyn.models.ATTENTIONS is choices.ATTENTIONS
    assert vschema.PLACEMENTS is choices.PLACEMENTS and jaxdyn.models.PLACEMENTS is choices.PLACEMENTS
    assert vschema.SDE_METHODS is choices.SDE_METHODS and jaxdyn.simulation.SDE_METHODS is choices.SDE_METHODS
    assert sphere_fields.SPHERE_FIELDS["kernel"].choices is choices.KERNELS
    assert sphere_fields.SPHERE_FIELDS["normalization"].choices is choices.NORMALIZATIONS
    pc = {"d": 3, "weights": {"ensemble": "spectral", "mu": [1.0, 0.4, -0.2],
                              "eigenspace_angle_deg": 8.0, "plane": [0, 1], "seed": 0}}
    bE, bV = cschema.eigenspace_bases(pc)
    pi, bV2 = cschema.spectral_info(pc)
    np.testing.assert_array_equal(bE, np.asarray(pi.basis))
    np.testing.assert_array_equal(bV, bV2)
    Q, K, V = sphere_fields.build_weights(pc["weights"], 3)
    with jax.enable_x64(True):
        sw = jaxdyn.spectral_weights([1.0, 0.4, -0.2], eigenspace_angle=np.radians(8.0), plane=(0, 1),
                                     dtype=jnp.float64)
        for a, b in ((Q, sw.Q), (K, sw.K), (V, sw.V)):
            np.testing.assert_array_equal(a, np.asarray(b))
    assert abs(sw.angle - np.radians(8.0)) < 1e-14  # the bisection reaches the angle


def test_initial_clouds_keys_made_inside_the_sampler():
    """The chunk's clouds, their keys PRNGKey(seed) made inside the sampler's program, equal
    the library's sample_initial (jitted, vmapped) with the keys made outside, up to the
    largest seed."""
    from jaxdyn.experiments import sphere_common as sc

    seeds = (0, 7, 2**31, 2**32 - 1)
    pcs = [{"n": 8, "d": 3, "dtype": "float32", "init": {"dist": "uniform"}, "seed": s} for s in seeds]
    got = np.asarray(sc.initial_clouds(pcs))
    keys = np.stack([np.asarray(jax.random.PRNGKey(s)) for s in seeds])
    want = jax.jit(jax.vmap(lambda k: jaxdyn.sphere.sample_initial(k, 8, 3, "uniform", np.float32)))(keys)
    np.testing.assert_array_equal(got, np.asarray(want))


def test_lazy_top_level_names_match_their_imports():
    """jaxdyn/__init__.py: the lazily loaded names are exactly those its (type-checking)
    imports name, and each resolves to the object of its module."""
    tree = ast.parse((ROOT / "jaxdyn" / "__init__.py").read_text())
    declared = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for a in node.names:
                declared[a.asname or a.name] = "." + node.module
    where = {n: m for m, names in jaxdyn._NAMES.items() for n in names}
    assert declared == where
    assert jaxdyn.stack_models is jaxdyn.models.stack_models
    assert "simulate" in dir(jaxdyn) and "sphere" in dir(jaxdyn)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        jaxdyn.nope


def test_cache_folder_is_keyed_by_versions_and_cpu(monkeypatch, tmp_path):
    from jaxdyn import _compile

    key = _compile.cache_key_folder()
    assert f"jax{jax.__version__}" in key and "cpu" in key
    monkeypatch.setattr(_compile, "_cpu_signature", lambda: "another CPU\navx2 fma")
    assert _compile.cache_key_folder() != key
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("JAXDYN_CACHE_DIR", raising=False)
    assert _compile.default_cache_dir() == tmp_path / "jaxdyn" / "jax"
    monkeypatch.setenv("JAXDYN_CACHE_DIR", str(tmp_path / "c"))
    assert _compile.default_cache_dir() == tmp_path / "c"
    # an unwritable place leaves the cache off instead of failing
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert jaxdyn.enable_compilation_cache(blocker / "sub") is None


TINY = {"kind": "sphere", "name": "tiny", "d": 3, "n": 16, "t1": 0.4, "dt": 0.1, "save_every": 2,
        "snapshots": [0.0, 0.4], "sweep": {"beta": [1.0]}}


@pytest.mark.slow
def test_second_run_loads_every_program_from_the_cache(tmp_path):
    """``jaxdyn run`` writes every program it compiles to the persistent cache (small programs
    included: none holds a host callback); a second process loads them all (every program a
    cache hit), and summary.json reports compile and compute seconds apart."""
    import os

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAXDYN_NO_CACHE", "EQX_ON_ERROR") and not k.startswith("JAX_")}
    env.update(JAXDYN_CACHE_DIR=str(tmp_path / "cache"), JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runs = []
    for name in ("a", "b"):
        r = subprocess.run([sys.executable, "-m", "jaxdyn.cli", "run", str(cfg), "--out",
                            str(tmp_path / name), "--quiet"], env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(json.loads((tmp_path / name / "summary.json").read_text()))
    first, second = runs
    folder = Path(first["compilation_cache"])
    assert folder.parent == tmp_path / "cache" and first["compiled_programs"] > 0
    # the split is reported (what the timings are worth is benchmarks/bench_startup.py's)
    assert all(isinstance(s[k], float) and math.isfinite(s[k])
               for s in runs for k in ("compile_seconds", "compute_seconds"))
    assert len(list(folder.iterdir())) >= first["compiled_programs"] - first["compile_cache_hits"]
    assert second["compile_cache_hits"] == second["compiled_programs"] > 0


def test_progress_moves_within_a_chunk():
    """The segment loop reports after every segment: the engine's sink sees fractions rising
    strictly inside the chunk; stages split the chunk by their shares."""
    seen = []
    I3 = jnp.eye(3, dtype=jnp.float32)
    models = jaxdyn.stack_models([jaxdyn.SphereAttention(I3, I3, I3, 1.0)] * 2)
    x0 = jnp.stack([jaxdyn.sample_sphere(jax.random.PRNGKey(i), 8, 3, dtype=jnp.float32)
                    for i in range(2)])
    with progress.within_chunk(seen.append):
        progress.plan(integrate=3, w2=1)
        progress.stage("integrate")
        (xs,), fin = segments.integrate_segments(
            models, x0, _frames, schedule=segments.Schedule(0.8, 0.1, 1, "euler", max_steps_per_call=2))
        progress.stage("w2")
        for j in range(4):
            progress.advance(j + 1, 4)
    assert xs.shape == (2, 9, 8, 3) and fin.all()
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    inside = [f for f in seen if 0 < f < 0.75]
    assert len(inside) >= 3 and seen[-1] == pytest.approx(1.0)
    assert 0.75 in [pytest.approx(f) for f in seen]  # the integration's end: 3 of 4 shares
    progress.advance(1, 2)  # no chunk in flight: a no-op


def _frames(model, xs):
    return (xs,)


def test_stack_models_on_the_host_equals_jnp_stack():
    """Concrete leaves are stacked on the host; traced and weakly typed leaves keep
    jnp.stack's result (values, dtype, weak type)."""
    rng = np.random.default_rng(0)
    mats = [jnp.asarray(rng.standard_normal((3, 3)), jnp.float64) for _ in range(3)]
    ms = [jaxdyn.SphereAttention(m, m.T, m, b) for m, b in zip(mats, (0.5, 2.0, 8.0))]
    ref = jax.tree.map(lambda *a: jnp.stack(a), *ms)
    got = jaxdyn.stack_models(ms)

    def same(a, b):
        return (a.dtype == b.dtype and a.shape == b.shape and a.weak_type == b.weak_type
                and bool(jnp.all(a == b)))

    assert jax.tree.all(jax.tree.map(same, ref, got))
    assert type(got.beta) is type(ref.beta) and got.beta.dtype == jnp.float64
    traced = jax.jit(lambda b: jaxdyn.stack_models(
        [jaxdyn.SphereAttention(mats[0], mats[0], mats[0], bb) for bb in (b, 2 * b)]).beta)(1.5)
    np.testing.assert_array_equal(traced, [1.5, 3.0])
    weak = jaxdyn.models.stack_models.__globals__["_stack_leaves"]([jnp.asarray(1.0), jnp.asarray(2.0)])
    assert weak.weak_type


def test_w2_to_two_atoms_equals_the_optimal_assignment():
    """The default run's exact W2 to Π#ρ0 (two atoms ±u when dim E = 1) by a partial sort
    equals the N × N assignment (jaxdyn.w2_exact): exactly two atoms, atoms rounded within
    64 ulps (difference ≤ the rounding, the triangle inequality), one atom; a spread cloud
    is not taken for two atoms."""
    from jaxdyn.experiments.concentration import run as crun

    rng = np.random.default_rng(3)
    n, d = 96, 3
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    xs = rng.standard_normal((4, n, d))
    xs /= np.linalg.norm(xs, axis=-1, keepdims=True)
    for m_a in (0, 1, 37, n):
        tg = np.where((np.arange(n) < m_a)[:, None], u, -u)[rng.permutation(n)]
        got = crun._w2_exact_frames(xs, tg)
        want = [jaxdyn.w2_exact(x, tg) for x in xs]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    rounded = (tg + 1e-7 * rng.standard_normal(tg.shape)).astype(np.float32)
    assert crun.two_atoms(rounded) is not None
    got = crun._w2_exact_frames(xs, rounded)
    want = [jaxdyn.w2_exact(x, rounded) for x in xs]
    np.testing.assert_allclose(got, want, rtol=0, atol=64 * np.finfo(np.float32).eps)
    assert crun.two_atoms(xs[0]) is None
    np.testing.assert_allclose(crun._w2_exact_frames(xs[:2], xs[0]),
                               [0.0, jaxdyn.w2_exact(xs[1], xs[0])], atol=1e-12)
