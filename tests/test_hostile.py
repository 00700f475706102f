"""Hostile inputs: every bad input to the CLI or the library ends in a named error
(its class, a message naming the input, the exit code) or a correct status, and changes no
file outside the run folder.

Cost rule: the CLI cases call ``jaxdyn.cli.main(argv)`` in-process (argument parsing, config
loading, the engine's refusals, and the few runs here use a 3-point sphere sweep of N = 48
that compiles once per pytest run); a subprocess is used only where a second process or a
real signal is essential (two concurrent runs into one folder, SIGTERM mid-run). The runs
build their figures but do not render them: ``plots.save`` writes a placeholder PNG through the
same atomic write (the figures' files, names, fsync and modes are the real ones; rendering is
checked in tests/test_cli.py and tests/test_figures_layout.py). The whole corpus costs well
under a CPU-minute.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
import yaml

import jaxdyn
from jaxdyn import cli
from jaxdyn import io as jio
from jaxdyn.config import ConfigError, load_yaml
from jaxdyn.experiments import engine, run_experiment

TINY = {
    "kind": "sphere", "name": "tiny", "d": 3, "n": 48, "t1": 1.0, "dt": 0.1, "save_every": 2,
    "snapshots": [0.0, 1.0], "sweep": {"beta": [1.0, 10.0, 100.0]}, "chunk_size": 1,
}
QUIET = dict(progress=False, log=lambda *_: None)
# another config whose chunks are computed by TINY's compiled program (the same shapes)
OTHER = {**TINY, "sweep": {"beta": [2.0]}}


# ----------------------------------------------------------------------------- helpers

# a 1×1 PNG: what plots.save writes here in place of the rendered figure
PLACEHOLDER_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000b49444154789c6360000200000500017a5eab3f0000000049454e44ae426082")


@pytest.fixture(autouse=True, scope="module")
def _figures_not_rendered():
    """plots.save without the rendering (module doc): the figure is built, then closed."""
    from jaxdyn import plots

    def save(fig, path):
        plots.pyplot().close(fig)
        return jio.atomic_write_bytes(path, PLACEHOLDER_PNG)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "save", save)
        yield


def _snapshot(root: Path, exclude: Path | None):
    """(size, mtime, mode) of every file under root outside ``exclude``."""
    out = {}
    for p in root.rglob("*"):
        if exclude is not None and (p == exclude or exclude in p.parents):
            continue
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
    return out


def _yaml(tmp: Path, cfg, name="c.yaml") -> str:
    p = tmp / name
    p.write_text(cfg if isinstance(cfg, str) else yaml.safe_dump(cfg, sort_keys=False))
    return str(p)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished TINY run (copied by the cases that need one)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    res = run_experiment(TINY, out, **QUIET)
    assert res.status == "ok"
    return out


@pytest.fixture(scope="module")
def other_run(tmp_path_factory):
    """One finished OTHER run (its chunk and data.nc are foreign to TINY's runs; copied by
    the cases that change it)."""
    out = tmp_path_factory.mktemp("other") / "run"
    assert run_experiment(OTHER, out, **QUIET).status == "ok"
    return out


def _copy_run(finished, tmp, name="run"):
    dst = tmp / name
    shutil.copytree(finished, dst)
    return dst


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty folder (default outputs land in tmp_path/runs), umask 022."""
    monkeypatch.chdir(tmp_path)
    old = os.umask(0o022)
    yield tmp_path
    os.umask(old)


def _main(argv, capsys):
    rc = cli.main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _refused(tmp, argv, capsys, rc_want, needles, run_dir=None, created=False):
    """main(argv) exits rc_want with one error line holding every needle; nothing outside
    ``run_dir`` changes (and run_dir is not created unless ``created``)."""
    run_dir = Path(run_dir) if run_dir else None
    existed = run_dir is not None and run_dir.exists()
    before = _snapshot(tmp, run_dir)
    inside = _snapshot(run_dir, None) if existed else None
    rc, out, err = _main(argv, capsys)
    assert rc == rc_want, (rc, err)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxdyn: error:"), err
    for n in needles:
        assert n in err, (n, err)
    assert _snapshot(tmp, run_dir) == before
    if run_dir is not None and not created:
        if existed:  # a refusal leaves the folder as it was (the lock file aside)
            assert {k: v for k, v in _snapshot(run_dir, None).items() if k != jio.LOCK_FILE} \
                == {k: v for k, v in inside.items() if k != jio.LOCK_FILE}
        else:
            assert not run_dir.exists()
    return err


# ----------------------------------------------------------------------------- config files


BAD_CONFIGS = [
    ("dup_top", "kind: sphere\nbeta: 1.0\nbeta: 100.0\n", ["duplicate key 'beta' (line 3", "line 2"]),
    ("dup_nested", "kind: sphere\ninit:\n  dist: vmf\n  dist: uniform\n", ["duplicate key 'dist' (line 4"]),
    ("python_tag", "kind: sphere\nn: !!python/object/apply:os.system ['touch PWNED']\n",
     ["not valid YAML", "python/object/apply"]),
    ("bad_syntax", "kind: sphere\nsweep: {beta: [1, 2}\n", ["not valid YAML"]),
    ("top_list", "- kind\n- sphere\n", ["expected a mapping at the top level"]),
    ("seed_huge", {**TINY, "seed": 99999999999999999999}, ["'seed': a seed must be in [0, 2**32)"]),
    ("seed_2_32", {**TINY, "seed": 2**32}, ["'seed': a seed must be in [0, 2**32)"]),
    ("seed_negative", {**TINY, "seed": -1}, ["'seed': a seed must be in [0, 2**32)"]),
    ("sweep_seed_huge", {**TINY, "sweep": {"seed": [0, 2**40]}}, ["'sweep.seed[1]'", "2**32"]),
    ("weights_seed", {**TINY, "weights": {"ensemble": "gaussian", "seed": 2**33}},
     ["'weights.seed'"]),
    ("int_overflow", {**TINY, "save_every": 2**70}, ["'save_every'", "out of range"]),
    ("mixture_weight", {**TINY, "init": {"dist": "mixture", "weight": 1.5}},
     ["'init.weight': must be in [0, 1)"]),
    ("mixture_weight_neg", {**TINY, "init": {"dist": "mixture", "weight": -0.1}}, ["'init.weight'"]),
    ("vmf_mu_zero", {**TINY, "init": {"dist": "vmf", "mu": [0, 0, 0]}},
     ["'init.mu': the mean direction must be a non-zero vector"]),
    ("vmf_mu_len", {**TINY, "init": {"dist": "vmf", "mu": [1, 0]}}, ["'init.mu': expected 3 numbers"]),
    ("name_up", {**TINY, "name": "../../x"}, ["'name': must be a plain file name"]),
    ("name_abs", {**TINY, "name": "/abs/path"}, ["'name': must be a plain file name"]),
    ("name_dot", {**TINY, "name": ".hidden"}, ["'name': must be a plain file name"]),
    ("beta_nan", {**TINY, "beta": float("nan"), "sweep": {}}, ["'beta': must be finite"]),
    ("beta_inf_sweep", {**TINY, "sweep": {"beta": [1.0, float("inf")]}}, ["'sweep.beta[1]': must be finite"]),
    ("dt_string", {**TINY, "dt": "fast"}, ["'dt': expected a number"]),
    ("no_kind", {k: v for k, v in TINY.items() if k != "kind"}, ["'kind' is required"]),
    ("unknown_field", {**TINY, "colour": "red"}, ["unknown config field 'colour'"]),
    ("sweep_not_map", {**TINY, "sweep": [1, 2]}, ["'sweep': expected a mapping"]),
    ("sweep_dup_values", {**TINY, "sweep": {"beta": [1.0, 1.0]}}, ["values must be distinct"]),
    ("bad_linspace", {**TINY, "sweep": {"beta": {"linspace": [1, 2]}}}, ["'sweep.beta.linspace'"]),
    ("chunk_negative", {**TINY, "chunk_size": -1}, ["'chunk_size': must be >= 0"]),
    ("steps_unreasonable", {**TINY, "t1": 1e6, "dt": 1e-3}, ["'t1'/'dt'"]),
]


@pytest.mark.parametrize("case,cfg,needles", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_file(in_tmp, capsys, case, cfg, needles):
    path = _yaml(in_tmp, cfg)
    out = in_tmp / "out"
    _refused(in_tmp, ["run", path, "--out", str(out), "--quiet"], capsys, 2, needles, out)
    assert not (in_tmp / "PWNED").exists()  # a YAML tag is never executed
    # `jaxdyn config` refuses the same file with the same message
    rc, _, err = _main(["config", path], capsys)
    assert rc == 2 and needles[0] in err


def test_name_never_escapes_runs(in_tmp, capsys):
    # without --out the folder is runs/NAME-TIMESTAMP; a name with a path is refused above,
    # and a plain one lands under runs/
    path = _yaml(in_tmp, {**TINY, "name": "../../escape"})
    _refused(in_tmp, ["run", path, "--quiet"], capsys, 2, ["'name'"], in_tmp / "runs")
    assert not (in_tmp.parent.parent / "escape").exists()


def test_config_file_missing_dir_and_binary(in_tmp, capsys):
    _refused(in_tmp, ["run", str(in_tmp / "nope.yaml"), "--quiet"], capsys, 2,
             ["config file not found", "nope.yaml"])
    (in_tmp / "adir").mkdir()
    _refused(in_tmp, ["run", str(in_tmp / "adir"), "--quiet"], capsys, 2, ["is not a file", "adir"])
    (in_tmp / "bin.yaml").write_bytes(b"kind: sphere\nname: \xff\xfe\n")
    _refused(in_tmp, ["run", str(in_tmp / "bin.yaml"), "--quiet"], capsys, 2,
             ["bin.yaml is not UTF-8"])


OVERRIDES = [
    ("set_tag", "name=!!python/object/apply:os.system ['touch PWNED']", ["override", "not valid YAML"]),
    ("set_no_equals", "n", ["expected KEY=VALUE"]),
    ("set_empty_key", ".n=3", ["empty field name"]),
    ("set_dup_flow", "init={dist: vmf, dist: uniform}", ["override", "duplicate key 'dist'"]),
    ("set_bad_flow", "sweep.beta=[1, 2", ["override 'sweep.beta=[1, 2'", "not valid YAML"]),
    ("set_not_section", "n.x=3", ["'n' is not a section"]),
]


@pytest.mark.parametrize("case,item,needles", OVERRIDES, ids=[c[0] for c in OVERRIDES])
def test_bad_override(in_tmp, capsys, case, item, needles):
    path = _yaml(in_tmp, TINY)
    out = in_tmp / "out"
    _refused(in_tmp, ["run", path, "--out", str(out), "--set", item, "--quiet"], capsys, 2,
             needles, out)
    assert not (in_tmp / "PWNED").exists()


def test_huge_n_refused_before_allocating(in_tmp, capsys, monkeypatch):
    path = _yaml(in_tmp, {**TINY, "n": 1_000_000_000, "sweep": {}})
    out = in_tmp / "out"

    def must_not_run(*a, **k):
        raise AssertionError("the particles were sampled: the refusal came after allocating")

    # "before allocating" shown directly: the refusal comes before the first cloud is drawn
    import jaxdyn.experiments.sphere_common as sc
    monkeypatch.setattr(sc, "initial_clouds", must_not_run)
    err = _refused(in_tmp, ["run", path, "--out", str(out), "--quiet"], capsys, 2,
                   ["config field 'n' (= 1000000000)", "MiB", "more than the"], out)
    est = int(err.split("estimated ")[1].split(" MiB")[0])
    assert est > 10_000  # N² logits of 10⁹ particles are far beyond any host
    # the same through the library: ConfigError, no folder made
    with pytest.raises(ConfigError, match=r"'n' \(= 1000000000\)"):
        run_experiment({**TINY, "n": 1_000_000_000, "sweep": {}}, out, **QUIET)
    assert not out.exists()


def test_memory_check_uses_ulimit(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (2**30, 2**30))
    avail, where = engine.host_memory_available()
    assert avail == 2**30 and "ulimit -v" in where
    with pytest.raises(ConfigError, match="ulimit -v"):
        engine.check_memory({"n": 5}, 2**30, 2**30, 2**31)


def test_device_memory_check(monkeypatch):
    monkeypatch.setattr(engine, "device_memory_limit", lambda: 2**20)
    with pytest.raises(ConfigError, match="on each device"):
        engine.check_memory({"n": 5}, 2**21, 2**21, 2**22)


# ----------------------------------------------------------------------------- output folders


def test_out_is_a_file(in_tmp, capsys):
    path = _yaml(in_tmp, TINY)
    f = in_tmp / "afile"
    f.write_text("mine")
    _refused(in_tmp, ["run", path, "--out", str(f), "--quiet"], capsys, 2,
             [f"--out {f} exists and is not a folder"])
    assert f.read_text() == "mine"


def test_chunks_that_is_a_file_is_named(in_tmp, capsys, finished):
    """A file named ``chunks`` in the run folder is refused before any compute, for a fresh run
    and for a resume (exit 2, naming it), instead of a write error whose hint to resume led to
    the same error; the file is left alone."""
    path = _yaml(in_tmp, TINY)
    out = in_tmp / "fresh"
    out.mkdir()
    (out / "chunks").write_text("mine")
    _refused(in_tmp, ["run", path, "--out", str(out), "--quiet"], capsys, 2,
             [f"{out / 'chunks'} is not a folder"], out)
    run = _copy_run(finished, in_tmp)
    shutil.rmtree(run / "chunks")
    (run / "chunks").write_text("mine")
    (run / "data.nc").unlink()
    _refused(in_tmp, ["run", "--resume", str(run), "--quiet"], capsys, 2,
             [f"{run / 'chunks'} is not a folder"], run)
    assert (run / "chunks").read_text() == "mine"


def test_out_cannot_be_created(in_tmp, capsys):
    path = _yaml(in_tmp, TINY)
    _refused(in_tmp, ["run", path, "--out", "/proc/x/y", "--quiet"], capsys, 2,
             ["--out /proc/x/y: cannot create the folder"])


def test_out_under_a_file(in_tmp, capsys):
    path = _yaml(in_tmp, TINY)
    (in_tmp / "afile").write_text("mine")
    _refused(in_tmp, ["run", path, "--out", str(in_tmp / "afile" / "sub"), "--quiet"], capsys, 2,
             ["cannot create the folder"])


def test_user_files_in_out_are_not_taken_over(in_tmp, capsys):
    path = _yaml(in_tmp, TINY)
    out = in_tmp / "mine"
    out.mkdir()
    for f in ("config.yaml", "summary.json", "data.nc"):
        (out / f).write_text(f"my own {f}\n")
    _refused(in_tmp, ["run", path, "--out", str(out), "--quiet"], capsys, 2,
             [f"--out {out} is not empty", "not a run of this config", "--force"], out)
    for f in ("config.yaml", "summary.json", "data.nc"):
        assert (out / f).read_text() == f"my own {f}\n"


def test_force_overwrites_results_only(in_tmp, capsys):
    path = _yaml(in_tmp, TINY)
    out = in_tmp / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "config.yaml").write_text("not: mine\n")
    before = _snapshot(in_tmp, out)
    rc, _, err = _main(["run", path, "--out", str(out), "--quiet", "--force"], capsys)
    assert rc == 0, err
    assert (out / "notes.txt").read_text() == "keep me"
    assert json.loads((out / "summary.json").read_text())["status"] == "ok"
    assert _snapshot(in_tmp, out) == before


def test_finished_run_without_chunks_not_overwritten_by_another_config(in_tmp, capsys, finished):
    run = _copy_run(finished, in_tmp)
    shutil.rmtree(run / "chunks")
    path = _yaml(in_tmp, {**TINY, "n": 40})
    _refused(in_tmp, ["run", path, "--out", str(run), "--quiet"], capsys, 2,
             ["is a run of another config", "--force"], run)
    # same config, no --resume: a finished run is not redone silently either
    _refused(in_tmp, ["run", _yaml(in_tmp, TINY, "same.yaml"), "--out", str(run), "--quiet"],
             capsys, 2, ["already holds a finished run of this config", f"--resume {run}"], run)


def test_rerun_into_results_is_refused(in_tmp, capsys, finished):
    run = _copy_run(finished, in_tmp)
    _refused(in_tmp, ["run", _yaml(in_tmp, TINY), "--out", str(run), "--quiet"], capsys, 2,
             ["already holds results", f"--resume {run}"], run)


def test_resume_with_another_config(in_tmp, capsys, finished):
    run = _copy_run(finished, in_tmp)
    _refused(in_tmp, ["run", _yaml(in_tmp, {**TINY, "n": 40}), "--resume", str(run), "--quiet"],
             capsys, 2, ["the config differs"], run)


RESUME_CASES = [
    ("resume_missing", lambda t: t / "nowhere", ["no such folder"]),
    ("resume_empty", lambda t: (t / "empty").mkdir() or t / "empty", ["nothing to resume"]),
    ("resume_bad_yaml", lambda t: _mk_run(t, "kind: sphere\nsweep: {beta: [1\n"), ["not valid YAML"]),
    ("resume_tag", lambda t: _mk_run(t, "kind: !!python/object/apply:os.system ['touch PWNED']\n"),
     ["not valid YAML", "python/object/apply"]),
    ("resume_dup", lambda t: _mk_run(t, "kind: sphere\nn: 3\nn: 4\n"), ["duplicate key 'n'"]),
    ("resume_bad_field", lambda t: _mk_run(t, "kind: sphere\nn: -3\n"), ["'n': must be >= 1"]),
]


def _mk_run(t, text):
    d = t / "run"
    d.mkdir()
    (d / "config.yaml").write_text(text)
    return d


@pytest.mark.parametrize("case,make,needles", RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
def test_bad_resume(in_tmp, capsys, case, make, needles):
    d = make(in_tmp)
    _refused(in_tmp, ["run", "--resume", str(d), "--quiet"], capsys, 2, needles + [str(d)], d)
    assert not (in_tmp / "PWNED").exists()


def test_resume_argument_conflicts(in_tmp, capsys, finished):
    run = _copy_run(finished, in_tmp)
    _refused(in_tmp, ["run", "--resume", str(run), "--out", str(in_tmp / "other")], capsys, 2,
             ["not both"], run)
    _refused(in_tmp, ["run", "--resume", str(run), "--set", "n=3"], capsys, 2,
             ["--set cannot change"], run)
    _refused(in_tmp, ["run", "--resume", str(run), "--force"], capsys, 2,
             ["cannot be combined with --resume"], run)


# ----------------------------------------------------------------------------- report


def test_report_refusals(in_tmp, capsys, finished):
    _refused(in_tmp, ["report", str(in_tmp / "nowhere")], capsys, 2, ["no such folder"])
    (in_tmp / "plain").mkdir()
    _refused(in_tmp, ["report", str(in_tmp / "plain")], capsys, 2, ["not a jaxdyn run folder"])
    run = _copy_run(finished, in_tmp)
    (run / "data.nc").unlink()
    _refused(in_tmp, ["report", str(run)], capsys, 2, ["has not finished", f"--resume {run}"], run)
    with open(finished / "data.nc", "rb") as f:
        (run / "data.nc").write_bytes(f.read(100))
    _refused(in_tmp, ["report", str(run)], capsys, 2, ["data.nc is damaged", "100 bytes",
                                                      f"--resume {run}"], run)
    # and --resume rebuilds the damaged data.nc from the chunks, nothing recomputed
    computed = []
    res = run_experiment(TINY, run, resume=True, compute_hook=computed.append, **QUIET)
    assert res.status == "ok" and computed == []
    xr.testing.assert_identical(jio.open_results(run).drop_attrs(),
                                jio.open_results(finished).drop_attrs())


# ----------------------------------------------------------------------------- chunks


@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage", "flipped"])
def test_damaged_chunk_is_named_and_recomputed(in_tmp, capsys, finished, damage):
    run = _copy_run(finished, in_tmp)
    c = run / "chunks" / "chunk_00001.npz"
    if damage == "truncate":
        os.truncate(c, 100)
    elif damage == "empty":
        os.truncate(c, 0)
    elif damage == "flipped":  # one byte of the array data: the meta record still reads
        data = bytearray(c.read_bytes())
        data[len(data) // 2] ^= 0xFF
        c.write_bytes(bytes(data))
        jio.read_chunk(c, meta_only=True)
    else:
        c.write_bytes(b"PK\x03\x04 not a zip at all")
    (run / "data.nc").unlink()
    before = _snapshot(in_tmp, run)
    rc, out, err = _main(["run", "--resume", str(run), "--quiet"], capsys)
    assert rc == 0, err
    assert f"chunk file {c} is damaged" in out and "recomputed" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["chunks_computed"] == 1 and summary["chunks_resumed"] == 2
    assert any("chunk_00001.npz" in w for w in summary["warnings"])
    xr.testing.assert_identical(jio.open_results(run).drop_attrs(),
                                jio.open_results(finished).drop_attrs())
    assert _snapshot(in_tmp, run) == before


def test_read_chunk_names_the_file(tmp_path, finished):
    p = tmp_path / "c.npz"
    p.write_bytes((finished / "chunks" / "chunk_00000.npz").read_bytes()[:50])
    with pytest.raises(jio.DamagedFileError, match=r"c\.npz is damaged \(50 bytes"):
        jio.read_chunk(p)


def test_chunk_of_another_config_is_refused(in_tmp, capsys, finished, other_run):
    run = _copy_run(finished, in_tmp)
    shutil.copy(other_run / "chunks" / "chunk_00000.npz", run / "chunks" / "chunk_00001.npz")
    _refused(in_tmp, ["run", "--resume", str(run), "--quiet"], capsys, 2,
             ["chunk_00001.npz was written by another config"], run, created=True)


def test_merge_verifies_every_chunk(tmp_path, other_run):
    """A chunk swapped in by another process after the skip-check is caught at the merge:
    the run fails naming the chunk, and no data.nc is written."""
    out = tmp_path / "run"
    foreign = (other_run / "chunks" / "chunk_00000.npz").read_bytes()

    def swap(ci):
        if ci == 2:
            (out / "chunks" / "chunk_00000.npz").write_bytes(foreign)

    with pytest.raises(ConfigError, match=r"chunk_00000\.npz was written by another config"):
        run_experiment(TINY, out, compute_hook=swap, **QUIET)
    assert not (out / "data.nc").exists()
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"


# ----------------------------------------------------------------------------- the lock


def test_locked_folder_is_refused_naming_the_holder(in_tmp, capsys):
    out = in_tmp / "run"
    out.mkdir()
    fd = os.open(out / jio.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    os.write(fd, b"pid 4242 on elsewhere, since 2026-01-01T00:00:00")
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        _refused(in_tmp, ["run", _yaml(in_tmp, TINY), "--out", str(out), "--quiet"], capsys, 4,
                 ["in use by another jaxdyn run (pid 4242 on elsewhere"], out)
        _refused(in_tmp, ["run", "--resume", str(out), "--quiet"], capsys, 2,
                 ["nothing to resume"], out)
    finally:
        os.close(fd)
    # released: the lock file left behind does not block a run, nor make the folder "non-empty"
    rc, _, err = _main(["run", _yaml(in_tmp, TINY), "--out", str(out), "--quiet"], capsys)
    assert rc == 0, err


@pytest.mark.slow
def test_two_concurrent_runs_into_one_folder(tmp_path, capsys):
    """A second process running into a folder held by a first one (another config, or the
    same) is refused naming the holder; SIGTERM then stops the first with status
    interrupted and exit code 143 (wherever it lands: a chunk, the merge or the figures);
    a resume finishes it, computing only the missing chunks."""
    slow = {**TINY, "name": "slow", "n": 64, "t1": 4.0, "dt": 0.02,
            "sweep": {"beta": [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0,
                               1024.0]}}
    a = Path(_yaml(tmp_path, slow, "a.yaml"))
    out = tmp_path / "R"
    env = dict(os.environ, JAXDYN_NO_HOST_DEVICES="1")
    proc = subprocess.Popen([sys.executable, "-m", "jaxdyn.cli", "run", str(a), "--out", str(out),
                             "--quiet"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if (out / "chunks" / "chunk_00000.npz").exists():
                proc.send_signal(signal.SIGSTOP)  # hold it mid-run (it keeps its lock)
                break
            time.sleep(0.01)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        for cfg in ({**TINY, "name": "other"}, slow):
            rc, _, err = _main(["run", _yaml(tmp_path, cfg, "b.yaml"), "--out", str(out),
                                "--quiet"], capsys)
            assert rc == 4 and f"in use by another jaxdyn run (pid {proc.pid} on" in err, err
            rc, _, err = _main(["run", "--resume", str(out), "--quiet"], capsys)
            assert rc == 4 and f"pid {proc.pid}" in err, err
        proc.send_signal(signal.SIGTERM)  # delivered on SIGCONT: mid-compute, merge or figures
        proc.send_signal(signal.SIGCONT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode()
    assert rc == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "resume with: jaxdyn run --resume" in err, err
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    done = len(list((out / "chunks").glob("chunk_*.npz")))
    assert 1 <= done <= 12
    computed = []
    res = run_experiment(yaml.safe_load((out / "config.yaml").read_text()), out, resume=True,
                         compute_hook=computed.append, **QUIET)
    assert res.status == "ok" and len(computed) == 12 - done
    assert json.loads((out / "summary.json").read_text())["config_hash"] == \
        res.summary["config_hash"]


# ----------------------------------------------------------------------------- signals, disk


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_signal_swallowed_in_gc_callback_still_interrupts(in_tmp, capsys, monkeypatch):
    """SIGTERM whose KeyboardInterrupt is raised inside a garbage-collection callback (as
    XLA's during the merge or the figures) is ignored by Python; the run still ends as
    interrupted (exit 143), not as done."""
    from jaxdyn.experiments import sphere

    real_plot = sphere.plot

    def plot(cfg, ds, out):
        def cb(phase, info):
            if phase == "start":
                gc.callbacks.remove(cb)
                cli._raise_interrupt(signal.SIGTERM, None)  # what the handler does there
        gc.callbacks.append(cb)
        gc.collect()  # "Exception ignored in ...: KeyboardInterrupt"
        return real_plot(cfg, ds, out)

    monkeypatch.setattr(sphere, "plot", plot)
    out = in_tmp / "run"
    rc, _, err = _main(["run", _yaml(in_tmp, TINY), "--out", str(out), "--quiet"], capsys)
    assert rc == 143, err
    assert "interrupted" in err
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["data", "figure", "chunk"])
def test_disk_full(in_tmp, capsys, monkeypatch, where):
    """ENOSPC while writing data.nc, a figure or a chunk: status failed, one line, exit 1,
    no temporary file left; a resume afterwards finishes the run."""
    out = in_tmp / "run"
    real_fsync = os.fsync
    marks = {"data": ".data.nc.", "figure": ".png.", "chunk": "chunk_00001"}

    def fsync(fd):  # the written bytes are in the file; the disk is full when they are flushed
        if marks[where] in os.readlink(f"/proc/self/fd/{fd}"):
            _enospc()
        return real_fsync(fd)
    monkeypatch.setattr(jio.os, "fsync", fsync)
    rc, _, err = _main(["run", _yaml(in_tmp, TINY), "--out", str(out), "--quiet"], capsys)
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0] and "Traceback" not in err
    assert f"--resume {out}" in lines[0]
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp") or ".tmp." in p.name]
    monkeypatch.undo()
    rc, _, err = _main(["run", "--resume", str(out), "--quiet"], capsys)
    assert rc == 0, err


def test_file_modes_follow_the_umask(in_tmp, finished, capsys):
    out = in_tmp / "run"
    rc, _, err = _main(["run", _yaml(in_tmp, TINY), "--out", str(out), "--quiet"], capsys)
    assert rc == 0, err
    files = [out / "config.yaml", out / "summary.json", out / "data.nc",
             *out.glob("*.png"), *(out / "chunks").glob("*.npz")]
    assert len(files) >= 7
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, (f, oct(f.stat().st_mode))


# ----------------------------------------------------------------------------- library


def _f32(x):
    return jnp.asarray(x, jnp.float32)


NAN2 = [[np.nan, 0.0], [0.0, 1.0]]
EYE2 = np.eye(2)


LIBRARY = [
    ("moments_nan_A", lambda: jaxdyn.solve_moments(None, EYE2, A=NAN2, B=EYE2, V=EYE2, t1=1.0),
     ValueError, "A must be finite"),
    ("moments_nan_B", lambda: jaxdyn.solve_moments(None, EYE2, A=EYE2, B=NAN2, V=EYE2, t1=1.0),
     ValueError, "B must be finite"),
    ("moments_inf_V", lambda: jaxdyn.solve_moments(None, EYE2, A=EYE2, B=EYE2, V=np.full((2, 2), np.inf), t1=1.0),
     ValueError, "V must be finite"),
    ("moments_nan_b", lambda: jaxdyn.solve_moments(None, EYE2, A=EYE2, B=EYE2, V=EYE2, b=[np.nan, 0], t1=1.0),
     ValueError, "b must be finite"),
    ("moments_nan_m0", lambda: jaxdyn.solve_moments([np.nan, 0], EYE2, A=EYE2, B=EYE2, V=EYE2, t1=1.0),
     ValueError, "m0 must be finite"),
    ("moments_nan_S0", lambda: jaxdyn.solve_moments(None, NAN2, A=EYE2, B=EYE2, V=EYE2, t1=1.0),
     ValueError, "S0 must be finite"),
    ("moments_t1_zero", lambda: jaxdyn.solve_moments(None, EYE2, A=EYE2, B=EYE2, V=EYE2, t1=0.0),
     ValueError, "t1 must be > 0"),
    ("moments_S0_asym", lambda: jaxdyn.solve_moments(None, [[1, 0.5], [0, 1]], A=EYE2, B=EYE2, V=EYE2, t1=1.0),
     ValueError, "S0 must be symmetric"),
    ("batch_nan_S0_member", lambda: jaxdyn.solve_moments_batch(
        None, np.stack([EYE2, NAN2]), A=EYE2, B=EYE2, V=EYE2, t1=1.0),
     ValueError, "S0 must be finite (it holds NaN or inf: member 1)"),
    ("batch_nan_A_member", lambda: jaxdyn.solve_moments_batch(
        None, EYE2, A=np.stack([EYE2, EYE2, NAN2]), B=EYE2, V=EYE2, t1=1.0),
     ValueError, "A must be finite (it holds NaN or inf: member 2)"),
    ("reach_nan_m1", lambda: jaxdyn.reach(None, EYE2, [np.nan, 0.0], EYE2),
     ValueError, "m1 must be finite"),
    ("reach_nan_S1", lambda: jaxdyn.reach(None, EYE2, None, NAN2), ValueError, "S1 must be finite"),
    ("stack_dense_blocked", lambda: jaxdyn.stack_models([
        jaxdyn.SphereAttention(jnp.eye(3), jnp.eye(3), jnp.eye(3), 1.0, kernel="dense"),
        jaxdyn.SphereAttention(jnp.eye(3), jnp.eye(3), jnp.eye(3), 1.0, kernel="blocked")]),
     ValueError, "model 1 differs from model 0 in its static fields (kernel"),
    ("stack_types", lambda: jaxdyn.stack_models([
        jaxdyn.SphereAttention(jnp.eye(3), jnp.eye(3), jnp.eye(3), 1.0),
        jaxdyn.ZeroTemperature(jnp.eye(3), jnp.eye(3), jnp.eye(3))]),
     ValueError, "model 1 is a ZeroTemperature"),
    ("stack_empty", lambda: jaxdyn.stack_models([]), ValueError, "at least one model"),
    ("simulate_nan_x0", lambda: jaxdyn.simulate(
        jaxdyn.SphereAttention(jnp.eye(3), jnp.eye(3), jnp.eye(3), 1.0),
        jnp.full((4, 3), jnp.nan), t1=0.1, dt=0.05), ValueError, "x0 must be finite"),
    ("simulate_not_unit", lambda: jaxdyn.simulate(
        jaxdyn.SphereAttention(jnp.eye(3), jnp.eye(3), jnp.eye(3), 1.0),
        jnp.full((4, 3), 2.0), t1=0.1, dt=0.05), ValueError, "x0 rows must be unit vectors"),
    ("load_yaml_dup", lambda: load_yaml(_write_tmp("kind: sphere\nn: 1\nn: 2\n")),
     ConfigError, "duplicate key 'n' (line 3"),
    ("run_experiment_out_file", lambda: run_experiment(TINY, _write_tmp("x"), **QUIET),
     ConfigError, "exists and is not a folder"),
    ("open_results_unfinished", lambda: jio.open_results(_write_tmp("x").parent),
     FileNotFoundError, "has not finished"),
]

_TMP = []


def _write_tmp(text):
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="jaxdyn-hostile-"))
    _TMP.append(d)
    p = d / "f.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("case,call,exc,needle", LIBRARY, ids=[c[0] for c in LIBRARY])
def test_library_refusals(in_tmp, case, call, exc, needle):
    before = _snapshot(in_tmp, None)
    with pytest.raises(exc) as ei:
        call()
    assert needle in str(ei.value), str(ei.value)
    assert _snapshot(in_tmp, None) == before  # nothing written in the working folder
    for d in _TMP:
        shutil.rmtree(d, ignore_errors=True)
    _TMP.clear()


def _float16_cloud():
    return jaxdyn.normalize(jaxdyn.sample_sphere(jax.random.PRNGKey(0), 16, 3).astype(jnp.float16))


def test_float16_after_normalize_passes_the_check():
    """The unit-vector check's tolerance follows x0's dtype: the advice of its own message
    (jaxdyn.normalize) can be followed in float16. The check simulate runs on a concrete x0,
    on the host (nothing compiled; the run itself: the slow test below)."""
    from jaxdyn.simulation._simulate import _check_x0

    x = _float16_cloud()
    assert x.dtype == jnp.float16
    model = jaxdyn.SphereAttention(jnp.eye(3), jnp.eye(3), jnp.eye(3), 1.0)
    err = np.max(np.abs(np.linalg.norm(np.asarray(x, np.float64), axis=-1) - 1))
    assert err > 1e-5  # float16's rounding: far above a float32 or float64 tolerance
    assert _check_x0(model, x).shape == (16, 3)
    with pytest.raises(ValueError, match="x0 rows must be unit vectors"):  # the check is on
        _check_x0(model, 1.05 * x)


@pytest.mark.slow  # a simulate compilation; the check itself: the test above
def test_float16_after_normalize_is_accepted():
    """The unit-vector check's tolerance follows x0's dtype: the advice of its own message
    (jaxdyn.normalize) can be followed in float16."""
    x = _float16_cloud()
    sol = jaxdyn.simulate(jaxdyn.SphereAttention(jnp.eye(3), jnp.eye(3), jnp.eye(3), 1.0), x,
                          t1=0.1, dt=0.05)
    assert list(np.atleast_1d(sol.names)) == ["successful"]
    assert np.allclose(np.linalg.norm(np.asarray(sol.xs[-1], np.float64), axis=-1), 1, atol=1e-5)


# ----------------------------------------------------------------------------- kill / resume


def test_killed_during_the_merge_resumes(in_tmp, capsys, finished):
    """SIGKILL during the merge leaves every chunk, summary 'running', no data.nc and perhaps
    a temporary file: the resume recomputes nothing, removes the temporary, gives the same data."""
    run = _copy_run(finished, in_tmp)
    (run / "data.nc").unlink()
    (run / ".data.nc.k1ll3d.tmp").write_bytes(b"\0" * 4096)
    s = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**s, "status": "running"}))
    before = _snapshot(in_tmp, run)
    computed = []
    res = run_experiment(TINY, run, resume=True, compute_hook=computed.append, **QUIET)
    assert res.status == "ok" and computed == [] and res.chunks_skipped == 3
    assert not (run / ".data.nc.k1ll3d.tmp").exists()
    xr.testing.assert_identical(jio.open_results(run).drop_attrs(),
                                jio.open_results(finished).drop_attrs())
    assert _snapshot(in_tmp, run) == before


def test_ctrl_c_mid_sweep_resumes(in_tmp, capsys, finished, monkeypatch):
    """Ctrl-C after the first chunk: exit 130, status interrupted, the hint names the folder;
    the resume computes only the two missing chunks and gives the uninterrupted data."""
    out = in_tmp / "run"
    real = engine.run_experiment

    def interrupting(*a, **k):
        def hook(ci):
            if ci == 0:
                raise KeyboardInterrupt
        return real(*a, **{**k, "compute_hook": hook})

    monkeypatch.setattr("jaxdyn.experiments.run_experiment", interrupting)
    rc, _, err = _main(["run", _yaml(in_tmp, TINY), "--out", str(out), "--quiet"], capsys)
    assert rc == 130 and f"resume with: jaxdyn run --resume {out}" in err, err
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    monkeypatch.undo()
    computed = []
    res = run_experiment(TINY, out, resume=True, compute_hook=computed.append, **QUIET)
    assert computed == [1, 2] and res.status == "ok"
    xr.testing.assert_identical(jio.open_results(out).drop_attrs(),
                                jio.open_results(finished).drop_attrs())


def test_device_out_of_memory_is_one_line(in_tmp, capsys, monkeypatch):
    from jaxdyn.experiments import sphere

    def run_points(pcs):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.0TiB.")

    monkeypatch.setattr(sphere, "run_points", run_points)
    out = in_tmp / "run"
    rc, _, err = _main(["run", _yaml(in_tmp, TINY), "--out", str(out), "--quiet"], capsys)
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "out of memory" in err, err
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"


def test_library_resume_of_nothing_makes_no_folder(tmp_path):
    with pytest.raises(ConfigError, match="nothing to resume"):
        run_experiment(TINY, tmp_path / "nowhere", resume=True, **QUIET)
    assert not (tmp_path / "nowhere").exists()


def test_report_of_a_live_run_and_of_foreign_results(in_tmp, capsys, finished, other_run):
    """``report`` takes the folder's lock: a run still writing the folder is named (exit 4, no
    advice to resume what is running); a ``data.nc`` written by another config than the
    folder's ``config.yaml`` is refused (exit 2) rather than drawn, and the folder is unchanged."""
    from jaxdyn.experiments.engine import RunLock

    run = _copy_run(finished, in_tmp)
    lock = RunLock(run).acquire()
    try:
        err = _refused(in_tmp, ["report", str(run)], capsys, 4, ["still writing", f"pid {os.getpid()}"],
                       run)
        assert "--resume" not in err
    finally:
        lock.release()
    other = _copy_run(other_run, in_tmp, "other")  # a finished run of another config
    shutil.copyfile(other / "data.nc", run / "data.nc")
    _refused(in_tmp, ["report", str(run)], capsys, 2, ["written by another config", "config.yaml",
                                                      f"--resume {run}"], run)
    assert cli.main(["report", str(other)]) == 0
