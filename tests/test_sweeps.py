"""Sweeps at scale: a killed sweep resumes without recomputing finished chunks and gives the
same Dataset; a sweep sharded over 4 (fake CPU) devices gives the same Dataset as on 1."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

import _device_worker as device_worker

from jaxdyn.experiments import run_experiment

# the sweep (8 systems, 64 particles) and the 4-device run live in tests/_device_worker.py,
# whose one subprocess also serves tests/test_sharding.py
SWEEP = device_worker.SWEEP


@pytest.fixture(scope="module")
def four_devices(request, tmp_path_factory, worker_id):
    return device_worker.four_devices(request, tmp_path_factory, worker_id)


def _env(**extra):
    env = dict(os.environ)
    env.update(extra)
    return env


def _load(d):
    with xr.open_dataset(Path(d) / "data.nc", engine="h5netcdf") as ds:
        return ds.load().drop_attrs()


@pytest.mark.slow
def test_killed_sweep_resumes_without_recomputation(tmp_path):
    cfg_file = tmp_path / "sweep.yaml"
    cfg_file.write_text(yaml.safe_dump(SWEEP))
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxdyn.cli", "run", str(cfg_file), "--out", str(out), "--quiet"],
        env=_env(JAXDYN_NO_HOST_DEVICES="1"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    chunks = out / "chunks"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if len(list(chunks.glob("chunk_*.npz"))) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    finished = {p.name: p.stat().st_mtime_ns for p in chunks.glob("chunk_*.npz")}
    assert 2 <= len(finished) < 8
    assert not (out / "data.nc").exists()  # no complete-looking results after a kill
    assert json.loads((out / "summary.json").read_text())["status"] == "running"

    computed = []
    res = run_experiment(yaml.safe_load((out / "config.yaml").read_text()), out, resume=True,
                         progress=False, log=lambda *_: None, compute_hook=computed.append)
    assert res.status == "ok"
    assert len(computed) == 8 - len(finished)
    assert not {f"chunk_{i:05d}.npz" for i in computed} & set(finished)
    for name, mtime in finished.items():  # finished chunks untouched
        assert (chunks / name).stat().st_mtime_ns == mtime

    ref = tmp_path / "uninterrupted"
    run_experiment(SWEEP, ref, progress=False, log=lambda *_: None)
    xr.testing.assert_identical(_load(out), _load(ref))


def test_sweep_on_4_devices_equals_1(tmp_path, four_devices):
    # device_worker.SWEEP_4 (chunk_size 0) run on 4 host devices in the device worker
    one, four = tmp_path / "one", four_devices["sweep_dir"]
    cfg = device_worker.SWEEP_4
    run_experiment(cfg, one, progress=False, log=lambda *_: None)
    assert four_devices["devices"] == 4
    assert four_devices["sweep"] == {"status": "ok", "devices": 4}
    a, b = _load(one), _load(four)
    assert a.sizes == b.sizes
    for v in a.data_vars:
        np.testing.assert_allclose(b[v].values, a[v].values, rtol=0, atol=1e-6, err_msg=v)


@pytest.mark.slow
def test_resume_keeps_the_chunks_of_another_plan(tmp_path, monkeypatch):
    """The automatic chunk size follows the device count and the memory budget, so a resume
    on another machine or with another process count plans other chunks: the finished ones
    are kept (at their indices) and the remaining points fill the other slots. (It was
    refused as 'written by another config or plan', and the finished work lost.)"""
    from jaxdyn.experiments import engine

    plan = engine.plan_chunks
    cfg = {**SWEEP, "chunk_size": 0}
    out = tmp_path / "run"

    class Stop(Exception):
        pass

    def stop_after_two(ci):  # called once chunk ci is written
        if ci == 1:
            raise Stop

    monkeypatch.setattr(engine, "plan_chunks", lambda c, *a, **k: plan({**c, "chunk_size": 2}, *a, **k))
    with pytest.raises(Stop):
        run_experiment(cfg, out, progress=False, log=lambda *_: None, compute_hook=stop_after_two)
    finished = {p.name: p.stat().st_mtime_ns for p in (out / "chunks").glob("chunk_*.npz")}
    assert sorted(finished) == ["chunk_00000.npz", "chunk_00001.npz"]  # points 0-3
    monkeypatch.setattr(engine, "plan_chunks", lambda c, *a, **k: plan({**c, "chunk_size": 3}, *a, **k))
    computed = []
    res = run_experiment(yaml.safe_load((out / "config.yaml").read_text()), out, resume=True,
                         progress=False, log=lambda *_: None, compute_hook=computed.append)
    assert res.status == "ok"
    assert computed == [2, 3]  # points 4-5, 6-7: the finished chunks were not recomputed
    for name, mtime in finished.items():
        assert (out / "chunks" / name).stat().st_mtime_ns == mtime
    ref = tmp_path / "ref"
    assert run_experiment(cfg, ref, progress=False, log=lambda *_: None).status == "ok"
    got, want = _load(out), _load(ref)
    for v in want.data_vars:
        np.testing.assert_allclose(got[v].values, want[v].values, rtol=0, atol=1e-6, err_msg=v)


def test_points_split_items_and_records():
    """A kind whose points split over processes: whole chunks are dealt out when there are at
    least as many as processes, else contiguous parts of each chunk's points; a chunk's parts
    packed, gathered and joined give its record."""
    from types import SimpleNamespace

    from jaxdyn.experiments import runner

    run = SimpleNamespace(plan=SimpleNamespace(chunks=[[0, 1, 2], [3, 4], [5]]))
    assert runner.work_items(run, [0, 1, 2], 2) == [(0, [0, 1, 2]), (1, [0, 1]), (2, [0])]
    assert runner.work_items(run, [0], 2) == [(0, [0, 1]), (0, [2])]
    assert runner.work_items(run, [2], 4) == [(2, [0])]
    assert runner.work_items(run, [0, 1], 4) == [(0, [0, 1]), (0, [2]), (1, [0]), (1, [1])]
    rows = np.arange(12.0).reshape(3, 4)
    whole = {"a": rows, "ok": np.array([True, False, True]), "coord__t": np.arange(4.0)}
    parts = [runner.unpack_record(runner.pack_record(
        {"a": rows[s], "ok": whole["ok"][s], "coord__t": whole["coord__t"]}, {"a": ["t"], "ok": []}))
        for s in (slice(0, 2), slice(2, 3))]
    arrays, dims = runner.join_parts(parts)
    assert dims == {"a": ["t"], "ok": []}
    for k, v in whole.items():
        np.testing.assert_array_equal(arrays[k], v)
        assert arrays[k].dtype == v.dtype
