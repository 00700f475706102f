"""Several processes, one JAX cluster (``jax.distributed`` over gloo on CPU): two processes
on localhost, a free port chosen at run time, one CPU device each.

* The CLI form (``jaxdyn run CONFIG --out DIR --distributed``): a process started with another
  config is refused on every process; a sweep whose chunks are split over both processes'
  devices gives the Dataset of one process with two devices (the rule of the 4-devices-vs-1
  test in ``tests/test_sweeps.py``: float32 config, ``atol = 1e-6``); only process 0 writes,
  process 1 prints one line naming itself.
* ``query_sharded_field`` with the queries split over both processes equals the field of one
  process (float64, ``1e-12`` relative: the rule of ``tests/test_sharding.py``).
* A process killed mid-run (SIGKILL after its second chunk): the other stops with a
  ``ProcessLostError`` message and status 1, leaves no ``data.nc`` and a ``failed`` summary;
  ``--resume`` on one process (two devices) finishes the run with the Dataset of an
  uninterrupted run on that process, identical (the same device count: every device runs the
  same program; across device counts the 1e-6 rule above applies).

Every process is started with a hard timeout; ``JAXDYN_NO_HOST_DEVICES=1`` and single-threaded
XLA keep each on one core. One two-process launch serves all the cluster checks (the refused
config, the sweep, the fields, then the kill, which ends it): each process's start-up, cluster
join and compilations are paid once; the resume runs in one more process (two devices). That
launch runs under ``-m slow``, as do two processes that only join one cluster and compare the
query-sharded field; the default suite checks the start-up refusals across two processes (no
cluster forms) and the lost-process path in-process.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

from jaxdyn.experiments import run_experiment
from jaxdyn.simulation import DistributedSetupError, cluster_from_env, is_lost_process_error

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 240  # seconds: a hang guard for each process, never reached when things work

# 3 chunks of 2 systems (on 2 devices: one system of each chunk per process)
SWEEP = {
    "kind": "sphere", "name": "dist", "d": 3, "n": 32, "t1": 1.0, "dt": 0.05, "save_every": 10,
    "snapshots": [0.0, 1.0], "chunk_size": 2,
    "sweep": {"beta": [0.5, 1.0, 2.0, 4.0, 8.0, 16.0], "seed": [0]},
}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(port, pid, nproc=2, slurm=False):
    """One process's environment: the coordinator's address, and the process count and id
    as jaxdyn's variables or (``slurm``) as a SLURM job step's, for JAX's SLURM detection."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "JAXDYN_NUM_PROCESSES", "JAXDYN_PROCESS_ID")
           and not k.startswith(("JAX_", "SLURM_", "OMPI_"))
           or k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE",  # conftest's cache
                            "JAX_DISABLE_MOST_OPTIMIZATIONS"))}  # and its compile options
    env.update(JAX_PLATFORMS="cpu", JAXDYN_NO_HOST_DEVICES="1", OPENBLAS_NUM_THREADS="1",
               XLA_FLAGS=("--xla_cpu_multi_thread_eigen=false "
                          + os.environ.get("JAXDYN_TEST_XLA_FLAGS", "")).strip(),
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if slurm:  # what srun sets for task `pid` of a one-node step (JAX's SlurmCluster reads it)
        env.update(SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="localhost", SLURM_NTASKS=str(nproc),
                   SLURM_STEP_NUM_NODES="1", SLURM_PROCID=str(pid), SLURM_LOCALID=str(pid))
    else:
        env.update(JAXDYN_NUM_PROCESSES=str(nproc), JAXDYN_PROCESS_ID=str(pid))
    return env


def _launch(cmds, port, slurm=False, extra=None):
    return [subprocess.Popen(cmd, env={**_env(port, i, slurm=slurm), **(extra or {})},
                             cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
            for i, cmd in enumerate(cmds)]


def _finish(procs, timeout=TIMEOUT):
    """Wait for every process (killing all of them past ``timeout``); (rc, out, err) each."""
    deadline = time.time() + timeout
    res = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            pytest.fail(f"a process hung past {timeout}s:\n{out}\n{err[-3000:]}")
        res.append((p.returncode, out, err))
    return res


def _load(d):
    with xr.open_dataset(Path(d) / "data.nc", engine="h5netcdf") as ds:
        return ds.load().drop_attrs()


# The field of one cluster (x64 on): query_sharded_field with the queries split over every
# process's devices against the field of this process; the sweep mesh's devices and processes.
FIELDS = """
import equinox as eqx
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import jaxdyn
from jaxdyn.simulation import query_sharded_field, sweep_mesh
res["devices"] = [len(jax.devices()), len(jax.local_devices())]
res["mesh_processes"] = len({d.process_index for d in sweep_mesh().devices.flat})
rng = np.random.default_rng(0)
d = 3
Q, K, V = (jnp.asarray(rng.normal(size=(d, d)) * 0.5 + np.eye(d), jnp.float64) for _ in range(3))
x = jaxdyn.sample_sphere(jax.random.PRNGKey(5), 103, d, jnp.float64)  # 103: padding exercised
fields = {}
m = jaxdyn.SphereAttention(Q, K, V, 3.0, kernel="blocked", k_block=16, q_block=8)
a = np.asarray(eqx.filter_jit(query_sharded_field(m))(0.0, x))
b = np.asarray(eqx.filter_jit(m)(0.0, x))
fields["field"] = [float(np.max(np.abs(a - b))), float(np.max(np.abs(b)))]
"""

# simulate on the query-sharded field of one cluster against this process's (full launch)
SIMULATE = """
m = jaxdyn.SphereAttention(Q, K, V, 3.0, kernel="blocked", k_block=16)
t_sh = np.asarray(jaxdyn.simulate(query_sharded_field(m), x, t1=0.5, dt=0.1, method="euler").xs)
t_un = np.asarray(jaxdyn.simulate(m, x, t1=0.5, dt=0.1, method="euler").xs)
fields["simulate"] = [float(np.max(np.abs(t_sh - t_un))), float(np.max(np.abs(t_un[-1] - t_un[0])))]
"""
RESULT = """
res["fields"] = fields
print("RESULT " + json.dumps(res), flush=True)
"""

# Two processes that join one cluster (as the CLI's --distributed does) and compute the field
# (under -m slow, where the full launch below is not selected; the query-sharded field runs by
# default on 4 devices in tests/test_sharding.py).
FIELD_WORKER = """
import json
import numpy as np
from jaxdyn.experiments.processes import join_cluster
join_cluster()
res = {}
""" + FIELDS + RESULT


WORKER = """
import json, os, signal, sys
import numpy as np
from jaxdyn.cli import main
good, bad, out_bad, out, out_killed = sys.argv[1:6]
pid = int(os.environ["SLURM_PROCID"])  # launched as a SLURM job step
res = {}
print("--- mismatch", flush=True)
res["rc_mismatch"] = main(["run", bad if pid == 1 else good, "--out", out_bad, "--distributed", "--quiet"])
print("--- run", flush=True)
res["rc_run"] = main(["run", good, "--out", out, "--distributed", "--quiet"])
print("--- field", flush=True)
""" + FIELDS + SIMULATE + RESULT + """# last: process 1 SIGKILLs itself once it has computed its share of the second chunk
print("--- killed", flush=True)
print("--- killed", file=sys.stderr, flush=True)
if pid == 0:
    sys.exit(main(["run", good, "--out", out_killed, "--distributed", "--quiet"]))
import yaml
from jaxdyn.experiments import run_experiment

def hook(ci):
    if ci == 1:
        os.kill(os.getpid(), signal.SIGKILL)

run_experiment(yaml.safe_load(open(good)), out_killed, progress=False, compute_hook=hook)
"""


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """One launch of two processes: the refused config, the sweep and the fields (RESULT), then
    the killed run (process 1 SIGKILLs itself); then one process (two devices) resumes the
    killed run and runs the sweep uninterrupted (the single-process reference)."""
    tmp = tmp_path_factory.mktemp("dist")
    good, bad = tmp / "good.yaml", tmp / "bad.yaml"
    good.write_text(yaml.safe_dump(SWEEP))
    bad.write_text(yaml.safe_dump({**SWEEP, "n": 24}))
    killed = tmp / "killed"
    cmd = [sys.executable, "-c", textwrap.dedent(WORKER), str(good), str(bad),
           str(tmp / "refused"), str(tmp / "run"), str(killed)]
    t0 = time.time()
    # JAX_COORDINATOR_ADDRESS alone: JAX's SLURM detection gives the count and ids
    res = _finish(_launch([cmd, cmd], _free_port(), slurm=True), timeout=2 * TIMEOUT)
    for rc, out, err in res:
        assert "RESULT " in out, f"worker failed (rc {rc}):\n{out}\n{err[-4000:]}"
    results = [json.loads(out.split("RESULT ", 1)[1].split("\n", 1)[0]) for _, out, _ in res]
    (rc0, _, err0), (rc1, _, _) = res
    after_kill = {"rc": [rc0, rc1], "err0": _section(err0, "killed"), "seconds": time.time() - t0,
                  "data_nc": (killed / "data.nc").exists(),
                  "summary": json.loads((killed / "summary.json").read_text()),
                  "chunks": sorted(p.name for p in (killed / "chunks").glob("chunk_*.npz"))}
    env = {k: v for k, v in _env(0, 0).items()
           if not k.startswith("JAX_") or k == "JAX_DISABLE_MOST_OPTIMIZATIONS"}
    env.update(JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(SINGLE_WORKER), str(killed),
                        str(tmp / "single"), str(good)], env=env, cwd=str(ROOT), capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert p.returncode == 0 and "RESULT " in p.stdout, p.stderr[-4000:]
    return {"tmp": tmp, "procs": res, "results": results, "after_kill": after_kill,
            "resumed": json.loads(p.stdout.split("RESULT ", 1)[1]), "out": killed,
            "single": tmp / "single"}


@pytest.fixture(scope="module")
def cluster_fields(request):
    """Each process's RESULT of the fields over one two-process cluster: from the full launch
    when a selected test uses it (``-m slow``), else from two processes that only join the
    cluster and compute the fields."""
    from conftest import selected_items

    if any("two_processes" in getattr(it, "fixturenames", ()) for it in selected_items(request.config)):
        return request.getfixturevalue("two_processes")["results"]
    cmd = [sys.executable, "-c", textwrap.dedent(FIELD_WORKER)]
    res = _finish(_launch([cmd, cmd], _free_port(), slurm=True))
    for rc, out, err in res:
        assert rc == 0 and "RESULT " in out, f"worker failed (rc {rc}):\n{out}\n{err[-4000:]}"
    return [json.loads(out.split("RESULT ", 1)[1].split("\n", 1)[0]) for _, out, _ in res]


def _section(out, name):
    return out.split(f"--- {name}\n", 1)[1].split("\n--- ", 1)[0]


@pytest.mark.slow
def test_mismatched_config_is_refused_on_every_process(two_processes):
    (_, out0, err0), (_, out1, err1) = two_processes["procs"]
    r0, r1 = two_processes["results"]
    assert r0["rc_mismatch"] == r1["rc_mismatch"] == 2
    assert "process 1's config differs from process 0's" in err0
    assert "this process's config differs from process 0's" in err1
    # refused before process 0 touched the folder
    refused = two_processes["tmp"] / "refused"
    assert not refused.exists() or not any(refused.iterdir())


@pytest.mark.slow
def test_sweep_over_two_processes_equals_one_process(two_processes):
    r0, r1 = two_processes["results"]
    assert r0["rc_run"] == r1["rc_run"] == 0
    assert r0["devices"] == r1["devices"] == [2, 1]  # one cluster: 2 devices, 1 per process
    assert r0["mesh_processes"] == 2
    run = two_processes["tmp"] / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["versions"]["devices"] == 2
    assert summary["versions"]["processes"] == 2
    got, reference = _load(run), _load(two_processes["single"])
    assert got.sizes == reference.sizes
    for v in reference.data_vars:  # the 4-devices-vs-1 rule (float32 config)
        np.testing.assert_allclose(got[v].values, reference[v].values, rtol=0, atol=1e-6,
                                   err_msg=v)
    moved = reference["mean_inner_product"].values
    assert np.max(np.abs(moved[..., -1] - moved[..., 0])) > 1e-2  # the dynamics did something


@pytest.mark.slow
def test_only_process_0_writes_and_the_other_names_itself(two_processes):
    (_, out0, _), (_, out1, _) = two_processes["procs"]
    lines1 = [ln for ln in _section(out1, "run").splitlines() if ln.strip()]
    assert len(lines1) == 1, lines1
    assert lines1[0].startswith("jaxdyn: process 1 of 2 on ")
    assert "process 0 writes" in lines1[0]
    assert "jaxdyn: done" in _section(out0, "run")
    assert len(list((two_processes["tmp"] / "run" / "chunks").glob("chunk_*.npz"))) == 3


@pytest.mark.slow  # two processes joining (≈ 13 CPU-s, the rest of the file's default ≈ 8): not in the default suite: a formed two-process cluster; the query-sharded field over several devices: tests/test_sharding.py::test_query_sharded_field_equals_unsharded
def test_query_sharded_field_over_two_processes_equals_one_process(cluster_fields):
    for r in cluster_fields:
        assert r["devices"] == [2, 1] and r["mesh_processes"] == 2  # one device on each process
        for label, (diff, scale) in r["fields"].items():
            assert diff <= 1e-12 * max(scale, 1.0), (label, diff, scale)
        assert "field" in r["fields"]
        if "simulate" in r["fields"]:  # the full launch (-m slow)
            assert r["fields"]["simulate"][1] > 1e-2  # the particles moved


KILLED_WORKER = """
import os, signal, sys
from jaxdyn.experiments.processes import join_cluster
join_cluster()  # what the CLI's --distributed does: the check-in, then the cluster
from jaxdyn.experiments import run_experiment
import yaml

def hook(ci):  # SIGKILL this process once it has computed its share of its second chunk
    if ci == 1:
        os.kill(os.getpid(), signal.SIGKILL)

run_experiment(yaml.safe_load(open(sys.argv[1])), sys.argv[2], progress=False, compute_hook=hook)
"""

# One process with two (host) devices: resumes the killed run, then runs the sweep
# uninterrupted (the single-process reference); started by the two_processes fixture.
SINGLE_WORKER = """
import json, sys
import jax
import yaml
from jaxdyn.experiments import run_experiment
assert len(jax.devices()) == 2 and jax.process_count() == 1
killed, ref, cfg = sys.argv[1:4]
computed = []
r = run_experiment(yaml.safe_load(open(killed + "/config.yaml")), killed, resume=True,
                   progress=False, log=lambda *_: None, compute_hook=computed.append)
r2 = run_experiment(yaml.safe_load(open(cfg)), ref, progress=False, log=lambda *_: None)
print("RESULT " + json.dumps({"computed": computed, "status": [r.status, r2.status]}))
"""


@pytest.mark.slow  # default-suite counterpart: test_a_lost_process_is_named_and_the_cluster_left
def test_killed_process_stops_the_other_cleanly(two_processes):
    k = two_processes["after_kill"]
    rc0, rc1 = k["rc"]
    assert rc1 == -signal.SIGKILL
    assert rc0 == 1, k["err0"][-3000:]
    err0 = k["err0"]
    assert "ProcessLostError" in err0 and "another process of this run stopped" in err0, err0[-3000:]
    assert "resume with: jaxdyn run --resume" in err0
    assert "Check failure stack trace" not in err0  # ended by us, not by JAX's shutdown abort
    assert not k["data_nc"]
    assert k["summary"]["status"] == "failed" and "ProcessLostError" in k["summary"]["error"]
    assert k["chunks"] == ["chunk_00000.npz", "chunk_00001.npz"]


@pytest.mark.slow  # resumes in one process: tests/test_cli.py, tests/test_hostile.py
def test_resume_with_another_process_count_gives_the_identical_dataset(two_processes):
    r = two_processes["resumed"]
    assert r["status"] == ["ok", "ok"] and r["computed"] == [2]
    xr.testing.assert_identical(_load(two_processes["out"]), _load(two_processes["single"]))


def test_a_lost_process_is_named_and_the_cluster_left(monkeypatch):
    """A collective that fails because another process went away (gloo's message) becomes a
    ProcessLostError naming it, and the cluster is marked left (the process exits without
    JAX's shutdown barrier); other errors, interrupts and a single process pass through.
    (The two-process runs of this path are under -m slow.)"""
    from jaxdyn.config import ConfigError
    from jaxdyn.experiments.processes import Processes, ProcessLostError, exit_status
    from jaxdyn.simulation import _distributed

    left = []
    monkeypatch.setattr(_distributed, "_LOST", left)  # not this test process's exit status
    gloo = ValueError("UNKNOWN: Gloo all-to-all failed: Read error: Connection reset by peer")
    assert Processes().lost(gloo) is None and Processes().stopping(gloo) is gloo
    assert left == []
    two = Processes(multi=True, writer=False, index=1, count=2)
    for other in (ValueError("shapes do not match"), KeyboardInterrupt()):
        assert two.lost(other) is None
    assert left == []
    lost = two.stopping(gloo)
    assert isinstance(lost, ProcessLostError)
    assert "another process of this run stopped (UNKNOWN: Gloo all-to-all failed" in str(lost)
    assert left == [_distributed.LOST_EXIT_STATUS]
    assert two.lost(lost) is lost
    # this process stopping on its own (a refusal, an interrupt) leaves the cluster with its
    # own exit status
    for own in (ConfigError("refused"), KeyboardInterrupt()):
        assert two.stopping(own) is own
        assert left[-1] == exit_status(own) != _distributed.LOST_EXIT_STATUS


@pytest.mark.slow  # default-suite counterpart: test_a_lost_process_is_named_and_the_cluster_left
def test_killed_coordinator_stops_the_other(tmp_path):
    """Process 0 (the coordinator and the writer) SIGKILLed after writing two chunks: process 1
    ends within the hang guard with a failure status (our ProcessLostError, or JAX's own
    termination when its coordination service notices first), and no data.nc exists."""
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(yaml.safe_dump(SWEEP))
    out = tmp_path / "killed"
    procs = _launch([[sys.executable, "-c", textwrap.dedent(KILLED_WORKER), str(cfg), str(out)],
                     [sys.executable, "-m", "jaxdyn.cli", "run", str(cfg), "--out", str(out),
                      "--distributed", "--quiet"]], _free_port())
    (rc0, _, _), (rc1, _, err1) = _finish(procs)
    assert rc0 == -signal.SIGKILL
    assert rc1 != 0, err1[-3000:]
    assert ("another process of this run stopped" in err1
            or "JAX distributed service detected fatal errors" in err1), err1[-3000:]
    assert not (out / "data.nc").exists()
    assert sorted(p.name for p in (out / "chunks").glob("chunk_*.npz")) == [
        "chunk_00000.npz", "chunk_00001.npz"]


TERM_WORKER = """
import os, signal, sys
from jaxdyn.experiments import engine
from jaxdyn.cli import main

def hook(ci):  # a preemption notice to process 1 only, once it has computed its second chunk
    if ci == 1 and os.environ["JAXDYN_PROCESS_ID"] == "1":
        os.kill(os.getpid(), signal.SIGTERM)

run = engine.run_experiment
engine.run_experiment = lambda *a, **k: run(*a, **k, compute_hook=hook)
import jaxdyn.experiments
jaxdyn.experiments.run_experiment = engine.run_experiment
sys.exit(main(["run", sys.argv[1], "--out", sys.argv[2], "--distributed", "--quiet"]))
"""


@pytest.mark.slow  # default-suite counterpart: test_killed_process_stops_the_other_cleanly
def test_sigterm_to_one_process_stops_all_at_one_chunk(tmp_path):
    """SIGTERM to process 1 (JAX's preemption service catches it): both processes stop at the
    same chunk boundary as interrupted (exit 143, status interrupted, chunks kept)."""
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(yaml.safe_dump({**SWEEP, "t1": 10.0,
                                   "sweep": {"beta": [0.5 * (i + 1) for i in range(20)], "seed": [0]}}))
    out = tmp_path / "term"
    cmd = [sys.executable, "-c", textwrap.dedent(TERM_WORKER), str(cfg), str(out)]
    (rc0, _, err0), (rc1, _, err1) = _finish(_launch([cmd, cmd], _free_port()))
    assert rc0 == rc1 == 128 + signal.SIGTERM, (err0[-2000:], err1[-2000:])
    assert "interrupted; finished chunks are kept" in err0
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    assert not (out / "data.nc").exists()
    assert 2 <= len(list((out / "chunks").glob("chunk_*.npz"))) < 10


def test_cluster_from_env_names_what_is_wrong():
    """What the environment and the arguments say of the cluster, checked; the rest is left to
    JAX's detection (nothing, or the address alone, is a valid description)."""
    assert cluster_from_env({}) == {}
    assert cluster_from_env({"JAX_COORDINATOR_ADDRESS": "h:1"}) == {"coordinator_address": "h:1"}
    assert cluster_from_env({"JAX_COORDINATOR_ADDRESS": "h:1234", "JAXDYN_NUM_PROCESSES": "4",
                             "JAXDYN_PROCESS_ID": "3"}) == {
        "coordinator_address": "h:1234", "num_processes": 4, "process_id": 3}
    # arguments win over the environment; names JAX does not read are not read either
    assert cluster_from_env({"JAXDYN_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "1"},
                            num_processes=2, process_id=None) == {"num_processes": 2}
    cases = [({"JAX_COORDINATOR_ADDRESS": "h"}, {}, "JAX_COORDINATOR_ADDRESS='h' must be HOST:PORT"),
             ({"JAXDYN_NUM_PROCESSES": "two"}, {}, "JAXDYN_NUM_PROCESSES='two' is not an integer"),
             ({"JAXDYN_NUM_PROCESSES": "0"}, {}, "JAXDYN_NUM_PROCESSES='0' must be >= 1"),
             ({"JAXDYN_NUM_PROCESSES": "2", "JAXDYN_PROCESS_ID": "2"}, {},
              "JAXDYN_PROCESS_ID=2 must be below JAXDYN_NUM_PROCESSES=2"),
             ({"JAXDYN_NUM_PROCESSES": "4"}, {"process_id": 4},
              "process_id=4 must be below JAXDYN_NUM_PROCESSES=4"),
             ({}, {"num_processes": 2.5}, "num_processes=2.5 is not an integer"),
             ({}, {"rank": 1}, "unknown cluster argument")]
    for env, given, msg in cases:
        with pytest.raises(DistributedSetupError, match=msg):
            cluster_from_env(env, **given)
    assert is_lost_process_error(ValueError("UNKNOWN: Gloo all-to-all failed: Read error: "
                                            "Connection reset by peer"))
    assert not is_lost_process_error(ValueError("shapes do not match"))


def test_cli_distributed_refusals_name_the_problem(tmp_path, monkeypatch, capsys):
    from jaxdyn.cli import main

    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(yaml.safe_dump(SWEEP))
    for k in [k for k in os.environ if k.startswith(("JAX_COORDINATOR", "JAXDYN_NUM_PROC",
                                                     "JAXDYN_PROCESS_ID", "SLURM_", "OMPI_"))]:
        monkeypatch.delenv(k)
    assert main(["run", str(cfg), "--distributed", "--quiet"]) == 2
    assert "--distributed needs --out DIR" in capsys.readouterr().err
    monkeypatch.setenv("JAXDYN_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAXDYN_PROCESS_ID", "2")
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--distributed"]) == 2
    assert ("--distributed: JAXDYN_PROCESS_ID=2 must be below JAXDYN_NUM_PROCESSES=2"
            in capsys.readouterr().err)
    monkeypatch.delenv("JAXDYN_NUM_PROCESSES")
    monkeypatch.delenv("JAXDYN_PROCESS_ID")
    import jax

    jax.devices()  # JAX runs in this process: too late to join a cluster
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--distributed"]) == 2
    assert "--distributed: JAX has already started in this process" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# Both processes of one launch run three starts: process 1 given a field its kind lacks, then
# process 0 given one, each on its own port; then process 0 alone with the address only and no
# cluster manager to detect (JAX's refusal, named).
REFUSAL_WORKER = """
import os, sys
from jaxdyn.cli import main
cfg, out, port_a, port_b = sys.argv[1:5]
pid = os.environ["JAXDYN_PROCESS_ID"]
rcs = []
for port, bad in ((port_a, "1"), (port_b, "0")):
    os.environ["JAX_COORDINATOR_ADDRESS"] = "127.0.0.1:" + port
    extra = ["--set", "no_such_field=3"] if pid == bad else []
    print("--- start", flush=True)
    print("--- start", file=sys.stderr, flush=True)
    rcs.append(main(["run", cfg, "--out", out, "--distributed", "--quiet", *extra]))
if pid == "0":
    for k in ("JAXDYN_NUM_PROCESSES", "JAXDYN_PROCESS_ID"):
        del os.environ[k]
    print("--- start", file=sys.stderr, flush=True)
    rcs.append(main(["run", cfg, "--out", out, "--distributed", "--quiet"]))
print("RCS", *rcs, "JAX", "jax" in sys.modules and sys.modules["jax"].distributed.is_initialized())
sys.exit(max(rcs))
"""


def test_config_refused_before_the_processes_connect(tmp_path):
    """A process given a --set field its kind lacks prints its own named error and exits 2
    before any process connects; the other stops at the check-in with exit 2, naming the
    refusing process and its reason, whichever process refused. The coordinator's address
    alone, with no cluster manager to detect, is JAX's refusal, named. No folder is made and
    no JAX cluster forms; each process exits by itself (no native abort, no time-out)."""
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(yaml.safe_dump(SWEEP))
    out = tmp_path / "o"
    cmd = [sys.executable, "-c", textwrap.dedent(REFUSAL_WORKER), str(cfg), str(out),
           str(_free_port()), str(_free_port())]
    # the check-in answers at once, not at a time-out: the start-up time-out is set far past
    # the hang guard, so a process that waited for it fails the guard
    (rc0, out0, err0), (rc1, out1, err1) = _finish(
        _launch([cmd, cmd], 1, extra={"JAXDYN_DISTRIBUTED_TIMEOUT": "3600"}), timeout=120)
    assert (rc0, rc1) == (2, 2), (err0[-2000:], err1[-2000:])
    assert "RCS 2 2 2 JAX False" in out0 and "RCS 2 2 JAX False" in out1
    own = "unknown config field 'no_such_field'"
    starts0, starts1 = err0.split("--- start\n")[1:], err1.split("--- start\n")[1:]
    # process 1 refused: its own message; process 0 names process 1 and the reason
    assert starts1[0].startswith("jaxdyn: error: ") and own in starts1[0]
    assert "--distributed" not in starts1[0] and len(starts1[0].strip().splitlines()) == 1
    assert "process 1 refused the run: " in starts0[0] and own in starts0[0]
    # process 0 refused: the same the other way round
    assert starts0[1].startswith("jaxdyn: error: ") and own in starts0[1]
    assert "process 0 stopped the start: process 0 refused the run: " in starts1[1]
    assert own in starts1[1]
    # the address alone and nothing to detect the rest from: JAX's reason, and what to set
    assert "Number of processes must be defined" in starts0[2]
    assert "JAXDYN_NUM_PROCESSES and JAXDYN_PROCESS_ID" in starts0[2] and "SLURM" in starts0[2]
    assert "Check failure" not in err0 + err1
    assert not out.exists()


def test_coordinator_port_in_use_is_refused_before_joining(tmp_path, monkeypatch, capsys):
    """Process 0 refuses a coordinator port another program listens on (exit 2, one line naming
    the port) instead of starting JAX's coordinator there (which crashed, and left the other
    processes waiting for their time-out); a free port and another host's address pass."""
    import socket

    from jaxdyn.cli import main
    from jaxdyn.simulation._distributed import check_coordinator_port

    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(yaml.safe_dump(SWEEP))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", f"127.0.0.1:{port}")
        monkeypatch.setenv("JAXDYN_NUM_PROCESSES", "2")
        monkeypatch.setenv("JAXDYN_PROCESS_ID", "0")
        assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--distributed", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"port {port} is in use on this host" in err and len(err.strip().splitlines()) == 1
        with pytest.raises(DistributedSetupError, match="in use"):
            check_coordinator_port(f"localhost:{port}")
    check_coordinator_port(f"127.0.0.1:{port}")  # free again
    check_coordinator_port("192.0.2.1:1234")  # another host (TEST-NET-1): not checked here
    assert not (tmp_path / "o").exists()


LONG_WORKER = """
import sys
from jaxdyn.cli import main
sys.exit(main(["run", sys.argv[1], "--out", sys.argv[2], "--distributed", "--quiet"]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("n", [64, 16])  # vmap(simulate) (N > 48) and simulate_ensemble
def test_two_processes_many_segments_equal_one_process(tmp_path, n):
    """Two processes give one process's Dataset for N > 48 and for runs of several segments
    (more than 250 steps): the initial clouds, which every process holds whole, are not
    gathered again (that would double the batch), and the state between segments is made
    whole before the ensemble integrator's host check."""
    cfg = {**SWEEP, "n": n, "t1": 13.0, "dt": 0.05, "save_every": 20, "snapshots": [0.0, 13.0],
           "sweep": {"beta": [1.0, 4.0], "seed": [0]}}
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "two"
    cmd = [sys.executable, "-c", textwrap.dedent(LONG_WORKER), str(path), str(out)]
    res = _finish(_launch([cmd, cmd], _free_port()))
    assert [r[0] for r in res] == [0, 0], [r[2][-3000:] for r in res]
    one = tmp_path / "one"
    assert run_experiment(cfg, one, progress=False, log=lambda *_: None).status == "ok"
    got, want = _load(out), _load(one)
    assert got["mean_inner_product"].shape == (2, 1, 14)
    for v in want.data_vars:
        np.testing.assert_allclose(got[v].values, want[v].values, rtol=0, atol=1e-5, err_msg=v)


# ---------------------------------------------------------------- kinds whose points split

VARIANTS = {"kind": "variants", "name": "var", "d": 3, "n": 8, "t1": 1.0, "dt": 0.1,
            "save_every": 2, "dtype": "float64",
            "sweep": {"norm": ["postln", "preln", "periln"], "beta": [1.0, 4.0]}}
PDE = {"kind": "pde", "name": "pde", "mode": "clusters", "m": 32, "t1": 2.0, "n_save": 5,
       "particles": {"cluster_n": 200, "dtype": "float64"}, "sweep": {"beta": [1.0, 2.0, 3.0]}}

POINTS_WORKER = """
import os, signal, sys
import yaml
from jaxdyn.cli import main
from jaxdyn.experiments import engine
import jaxdyn.experiments
kill = sys.argv[3] == "kill" and os.environ["JAXDYN_PROCESS_ID"] == "1"

def hook(ci):  # process 1 SIGKILLs itself once its first item has been gathered
    if kill:
        os.kill(os.getpid(), signal.SIGKILL)

run = engine.run_experiment
jaxdyn.experiments.run_experiment = lambda *a, **k: run(*a, **k, compute_hook=hook)
sys.exit(main(["run", sys.argv[1], "--out", sys.argv[2], "--distributed", "--quiet"]))
"""


def _points_run(tmp_path, cfg, mode="run"):
    path = tmp_path / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / f"{cfg['name']}-{mode}"
    cmd = [sys.executable, "-c", textwrap.dedent(POINTS_WORKER), str(path), str(out), mode]
    return _finish(_launch([cmd, cmd], _free_port())), out


@pytest.mark.slow  # two processes of each kind (about 30 s each on two shared cores)
@pytest.mark.parametrize("cfg", [VARIANTS, PDE], ids=["variants", "pde"])
def test_points_kinds_split_over_two_processes_equal_one_process(tmp_path, cfg):
    """The variants and pde kinds deal their chunks out to the processes (process 1 computes
    its own, process 0 writes them all) and give one process's Dataset, value for value (the
    wall-clock seconds aside)."""
    res, out = _points_run(tmp_path, cfg)
    assert [r[0] for r in res] == [0, 0], [r[2][-3000:] for r in res]
    assert "computing its share of the chunks" in res[1][1]
    one = tmp_path / "one"
    same = yaml.safe_load((tmp_path / f"{cfg['name']}.yaml").read_text())  # its sweep's order
    assert run_experiment(same, one, progress=False, log=lambda *_: None).status == "ok"
    got, want = _load(out), _load(one)
    assert set(got.data_vars) == set(want.data_vars)
    for v in want.data_vars:
        if not v.endswith("seconds"):
            xr.testing.assert_identical(got[v], want[v])


@pytest.mark.slow
def test_killed_process_of_a_points_kind_is_noticed(tmp_path):
    """Process 1 of a variants run SIGKILLed after its first chunk: process 0 stops at the next
    gather (ProcessLostError, exit 1, no data.nc, the finished chunks kept), and ``--resume``
    in one process finishes the run."""
    res, out = _points_run(tmp_path, VARIANTS, "kill")
    (rc0, _, err0), (rc1, _, _) = res
    assert rc1 == -signal.SIGKILL
    assert rc0 == 1, err0[-3000:]
    assert "another process of this run stopped" in err0 and "--resume" in err0, err0[-3000:]
    assert not (out / "data.nc").exists()
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"
    assert len(list((out / "chunks").glob("chunk_*.npz"))) == 2  # the first round's
    r = run_experiment(yaml.safe_load((out / "config.yaml").read_text()), out, resume=True,
                       progress=False, log=lambda *_: None)
    assert r.status == "ok" and r.chunks_computed == 1


# ---------------------------------------------------------------- start-up faults in one line


def _check_in(specs, timeout=3.0, port=None):
    """Run :func:`rendezvous` for ``(id, count)`` specs in threads; each one's error or None."""
    import threading

    from jaxdyn.experiments.processes import rendezvous

    port = port or _free_port()
    errors = [None] * len(specs)

    def one(k, pid, count):
        try:
            rendezvous(f"127.0.0.1:{port}", count, pid, timeout)
        except Exception as e:  # noqa: BLE001 - recorded for the assertions
            errors[k] = e

    threads = [threading.Thread(target=one, args=(k, *s)) for k, s in enumerate(specs)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(timeout + 30)
    return errors, port


def test_check_in_names_every_start_up_fault():
    """The processes check in with process 0 before JAX joins them: a good cluster goes on
    (and leaves the port free for JAX's coordinator); counts that disagree, two processes with
    one id, a process that never starts (either side), a port in use and another program at
    the address each end every process concerned with a ClusterStartError naming the cause,
    within the wait given."""
    from jaxdyn.experiments.processes import ClusterStartError
    from jaxdyn.simulation._distributed import check_coordinator_port

    errors, port = _check_in([(0, 3), (1, 3), (2, 3)])
    assert errors == [None, None, None]
    check_coordinator_port(f"127.0.0.1:{port}")  # free again

    errors, _ = _check_in([(0, 2), (1, 3)])
    assert all(isinstance(e, ClusterStartError) for e in errors)
    assert all("process 1 was started with a process count of 3 and process 0 with 2" in str(e)
               for e in errors)

    errors, _ = _check_in([(0, 3), (1, 3), (1, 3)])
    assert all("two processes were started with process id 1" in str(e) for e in errors)

    errors, _ = _check_in([(0, 3), (1, 3)], timeout=1.0)
    assert all("process(es) 2 of 3 did not check in" in str(e) for e in errors), errors
    assert "--distributed-timeout" in str(errors[0])

    (e,), _ = _check_in([(1, 2)], timeout=1.0)
    assert "process 0 at 127.0.0.1:" in str(e) and "did not answer within 1 s" in str(e)

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        (e,), _ = _check_in([(0, 2)], port=busy.getsockname()[1])
        assert "is in use on this host" in str(e) and "process id 0" in str(e)
        (e,), _ = _check_in([(1, 2)], port=busy.getsockname()[1], timeout=1.0)
        assert "is not a waiting process 0 of this run" in str(e)  # another program's port


def test_start_timeout_option_and_environment(monkeypatch):
    from jaxdyn.config import ConfigError
    from jaxdyn.experiments.processes import START_TIMEOUT_ENV, start_timeout

    monkeypatch.delenv(START_TIMEOUT_ENV, raising=False)
    assert start_timeout() == 120.0 and start_timeout("2.5") == 2.5
    monkeypatch.setenv(START_TIMEOUT_ENV, "30")
    assert start_timeout() == 30.0 and start_timeout("5") == 5.0
    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(ConfigError, match=f"--distributed-timeout={bad!r}: must be a positive"):
            start_timeout(bad)
    monkeypatch.setenv(START_TIMEOUT_ENV, "x")
    with pytest.raises(ConfigError, match=f"{START_TIMEOUT_ENV}='x'"):
        start_timeout()


STALL_WORKER = """
import sys, time
import jaxdyn.simulation
jaxdyn.simulation.initialize_distributed = lambda **k: time.sleep(60)  # JAX's start-up stalls
from jaxdyn.cli import main
sys.exit(main(["run", sys.argv[1], "--out", sys.argv[2], "--distributed", "--quiet",
               "--distributed-timeout", "1.5"]))
"""


def test_stalled_cluster_start_ends_in_one_line(tmp_path):
    """JAX's own start-up past the wait (it would abort natively after its time-out): the
    watchdog ends the process with exit 2 and one line, without touching the folder."""
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(yaml.safe_dump(SWEEP))
    env = {**_env(_free_port(), 0, nproc=1)}
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(STALL_WORKER), str(cfg),
                        str(tmp_path / "o")], env=env, cwd=str(ROOT), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "the cluster did not form within 1.5 s" in lines[0], p.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # the README's two-process example as written (about a minute on two cores)
def test_readme_two_process_example(tmp_path):
    """``examples/two_process_sweep.sh`` (sweep_large made small, N = 64) runs on two processes
    and gives the Dataset of one process with two devices."""
    out = tmp_path / "two"
    env = {k: v for k, v in _env(0, 0).items()
           if not k.startswith(("JAX_COORDINATOR", "JAXDYN_NUM_PROC", "JAXDYN_PROCESS_ID",
                                "JAXDYN_NO_HOST", "SLURM_"))}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    p = subprocess.run(["bash", str(ROOT / "examples" / "two_process_sweep.sh"), str(out)], env=env,
                       cwd=str(ROOT), capture_output=True, text=True, timeout=2 * TIMEOUT)
    assert p.returncode == 0, p.stderr[-3000:]
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["sweep"]["n"] == [64]
    env1 = {k: v for k, v in env.items() if k != "XLA_FLAGS"}
    env1["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false"
    one = tmp_path / "one"
    q = subprocess.run([sys.executable, "-m", "jaxdyn.cli", "--no-host-devices", "run",
                        str(out / "config.yaml"), "--out", str(one), "--quiet"], env=env1,
                       cwd=str(ROOT), capture_output=True, text=True, timeout=TIMEOUT)
    assert q.returncode == 0, q.stderr[-3000:]
    got, want = _load(out), _load(one)
    for v in want.data_vars:  # the 4-devices-vs-1 rule (float32 config)
        np.testing.assert_allclose(got[v].values, want[v].values, rtol=0, atol=1e-6, err_msg=v)
