"""Sharding: sweeps split across devices and query-sharded fields equal the unsharded ones.

The multi-device checks run in a subprocess that sets
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` before JAX starts (the device count
of a running process cannot change); the rest run in-process on whatever devices exist.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn.simulation._sharding import (
    configure_host_devices,
    query_sharded_field,
    query_sharded_interaction,
    shard_batch,
    sharded_vmap,
    sweep_mesh,
)
from conftest import run_once, tol

ROOT = Path(__file__).resolve().parents[1]


def _run_worker(code, env_extra, timeout=240):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXDYN_NO_HOST_DEVICES")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


SHARDED_WORKER = """
import json, os, sys
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
import jaxdyn
from jaxdyn.simulation._sharding import sharded_vmap, query_sharded_field, query_sharded_interaction, sweep_mesh

out = {"devices": len(jax.devices())}
for name, dt in [("f32", jnp.float32), ("f64", jnp.float64)]:
    if name not in os.environ["SHARDED_DTYPES"].split(","):
        continue
    r = {}
    rng = np.random.default_rng(0)
    d = 3
    Q, K, V = (jnp.asarray(rng.normal(size=(d, d)) * 0.5 + np.eye(d), dt) for _ in range(3))
    betas = [0.3, 1.0, 2.0, 4.0, 7.0, 9.0]  # 6 systems on 4 devices: padding exercised
    models = jaxdyn.stack_models([jaxdyn.SphereAttention(Q, K, V, b) for b in betas])
    x0 = jnp.stack([jaxdyn.sample_sphere(jax.random.PRNGKey(i), 24, d, dt) for i in range(6)])

    def sim(model, x):
        return jaxdyn.simulate(model, x, t1=2.0, dt=0.1, method="euler", save_every=5).xs

    ref = np.asarray(jax.vmap(sim)(models, x0))
    for label, fn in [("sweep", sharded_vmap(sim)),
                      ("sweep_chunked", sharded_vmap(sim, mesh=sweep_mesh(), batch_size=1))]:
        got = np.asarray(fn(models, x0))
        r[label] = {"shape": list(got.shape), "ref_shape": list(ref.shape),
                    "maxdiff": float(np.max(np.abs(got - ref))), "dtype": str(got.dtype)}
    r["moved"] = float(np.max(np.abs(ref[:, -1] - ref[:, 0])))

    # One large system: query rows split over 4 devices, N = 103 (not a multiple of 4).
    x = jaxdyn.sample_sphere(jax.random.PRNGKey(5), 103, d, dt)
    fields = {}
    for kern, norm in [("blocked", "softmax"), ("blocked", "hardmax")]:
        m = jaxdyn.SphereAttention(Q, K, V, 3.0, kernel=kern, normalization=norm, k_block=16,
                                   q_block=8)
        a = np.asarray(query_sharded_field(m)(0.0, x))
        b = np.asarray(m(0.0, x))
        fields[f"{kern}-{norm}"] = [float(np.max(np.abs(a - b))), float(np.max(np.abs(b)))]
    z = jaxdyn.ZeroTemperature(Q, K, V)
    fields["zero"] = [float(np.max(np.abs(np.asarray(query_sharded_field(z)(0.0, x))
                                              - np.asarray(z(0.0, x))))), 1.0]
    e = jaxdyn.EuclideanAttention(0.1 * Q, 0.5 * K, V, jnp.ones(d, dt), activation="relu")
    fields["euclid"] = [float(np.max(np.abs(np.asarray(query_sharded_field(e)(0.0, 2 * x))
                                                - np.asarray(e(0.0, 2 * x))))), 1.0]
    B = jnp.matmul(Q.T, K)
    qi = np.asarray(query_sharded_interaction(x, x, B, 2.0, kernel="dense"))
    ri = np.asarray(jaxdyn.kernels.interaction(x, x, B, 2.0, kernel="dense"))
    fields["interaction"] = [float(np.max(np.abs(qi - ri))), float(np.max(np.abs(ri)))]
    m = jaxdyn.SphereAttention(Q, K, V, 3.0, kernel="blocked", k_block=16)
    t_sh = np.asarray(jaxdyn.simulate(query_sharded_field(m), x, t1=1.0, dt=0.1, method="euler").xs)
    t_un = np.asarray(jaxdyn.simulate(m, x, t1=1.0, dt=0.1, method="euler").xs)
    fields["simulate"] = [float(np.max(np.abs(t_sh - t_un))), 1.0]
    r["fields"] = fields
    out[name] = r
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def four_devices(request, tmp_path_factory, worker_id):
    # one subprocess (about 20 s) for the whole session, for the dtypes of the selected tests
    # (f64, whose tolerance is 1e-12, by default; f32 under -m slow: 1-device sharded_vmap
    # in f32 is checked in-process below)
    names = sorted({it.callspec.params["name"] for it in request.session.items
                    if "four_devices" in getattr(it, "fixturenames", ())})
    return run_once(tmp_path_factory, worker_id, "four_devices_" + "_".join(names),
                    lambda: _run_worker(SHARDED_WORKER, {
                        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
                        "SHARDED_DTYPES": ",".join(names)}))


NAMES = ["f64", pytest.param("f32", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", NAMES)
def test_sweep_sharded_over_four_devices_equals_unsharded(four_devices, name):
    assert four_devices["devices"] == 4
    r = four_devices[name]
    atol = tol(np.float32 if name == "f32" else np.float64, 1e-5, 1e-12)
    assert r["moved"] > 1e-2  # the dynamics did something
    for label in ("sweep", "sweep_chunked"):
        assert r[label]["shape"] == r[label]["ref_shape"] == [6, 5, 24, 3], label
        assert r[label]["dtype"] == ("float32" if name == "f32" else "float64")
        assert r[label]["maxdiff"] <= atol, (label, r[label])


@pytest.mark.parametrize("name", NAMES)
def test_query_sharded_field_equals_unsharded(four_devices, name):
    rtol = tol(np.float32 if name == "f32" else np.float64, 1e-5, 1e-12)
    for label, (diff, scale) in four_devices[name]["fields"].items():
        assert diff <= rtol * max(scale, 1.0), (label, diff, scale)


HOST_WORKER = """
import json, os
from jaxdyn.simulation._sharding import configure_host_devices
took = configure_host_devices({n}{kw})
import jax
print(json.dumps({{"took": took, "devices": len(jax.devices()),
                  "again": configure_host_devices(2), "flags": os.environ.get("XLA_FLAGS", "")}}))
"""


def test_configure_host_devices_before_jax_starts():
    r = _run_worker(HOST_WORKER.format(n=3, kw=", vector_width=512"), {})
    assert r["took"] is True and r["devices"] == 3
    assert r["again"] is False  # JAX is running now (and the flag is set): no change
    assert "--xla_force_host_platform_device_count=3" in r["flags"]
    assert "--xla_cpu_prefer_vector_width=512" in r["flags"]
    r = _run_worker(HOST_WORKER.format(n=2, kw=", vector_width=None"), {})
    assert r["took"] is True and r["devices"] == 2
    assert "prefer_vector_width" not in r["flags"]


def test_configure_host_devices_opt_out_and_user_flags_win():
    r = _run_worker(HOST_WORKER.format(n=3, kw=""), {"JAXDYN_NO_HOST_DEVICES": "1"})
    assert r["took"] is False and r["devices"] == 1 and r["flags"] == ""
    r = _run_worker(HOST_WORKER.format(n=3, kw=""),
                    {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert r["took"] is False and r["devices"] == 2


def test_configure_host_devices_after_start_changes_nothing(monkeypatch):
    jax.devices()  # make sure the backend is running in this process
    monkeypatch.delenv("JAXDYN_NO_HOST_DEVICES", raising=False)
    before = os.environ.get("XLA_FLAGS")
    assert configure_host_devices(4) is False
    assert os.environ.get("XLA_FLAGS") == before
    with pytest.raises(ValueError, match="n \\(number of host devices\\)"):
        configure_host_devices(0)
    with pytest.raises(ValueError, match="vector_width"):
        configure_host_devices(2, vector_width=100)


# ---------------------------------------------------------------------------- in-process


def _models(dtype, betas):
    eye = jnp.eye(2, dtype=dtype)
    return jaxdyn.stack_models([jaxdyn.SphereAttention(eye, eye, eye, b) for b in betas])


@pytest.mark.slow_dtype("f64")  # a code-path identity: f32 (the runs' default dtype) in the default suite, f64 under -m slow
def test_sharded_vmap_equals_vmap_on_present_devices(dtype):
    betas = [0.5, 2.0, 9.0]
    models = _models(dtype, betas)
    th = np.random.default_rng(1).uniform(0, 2 * np.pi, (3, 16))
    x0 = jnp.asarray(np.stack([np.cos(th), np.sin(th)], -1), dtype)

    def sim(model, x):
        return jaxdyn.simulate(model, x, t1=3.0, dt=0.1, method="euler", save_every=30).xs[-1]

    ref = jax.vmap(sim)(models, x0)
    for bs in (None, 2):
        got = sharded_vmap(sim, batch_size=bs)(models, x0)
        assert got.dtype == ref.dtype and got.shape == ref.shape == (3, 16, 2)
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=0,
                                   atol=tol(dtype, 1e-5, 1e-12))
    # Larger β concentrates faster: mean pairwise inner product grows with β.
    g = np.asarray(jnp.einsum("bnd,bmd->b", ref, ref)) / 16**2
    assert g[0] < g[2]


def test_shard_batch_pads_with_last_entry_and_places():
    mesh = sweep_mesh()
    k = mesh.devices.size
    tree = {"a": jnp.arange(5.0), "b": jnp.ones((5, 2)), "s": "static"}
    out = shard_batch(tree, mesh)
    size = -(-5 // k) * k
    assert out["a"].shape == (size,) and out["b"].shape == (size, 2) and out["s"] == "static"
    np.testing.assert_array_equal(np.asarray(out["a"])[:5], np.arange(5.0))
    assert np.all(np.asarray(out["a"])[5:] == 4.0)
    assert out["a"].sharding.spec == jax.sharding.PartitionSpec(mesh.axis_names[0])


def test_sharding_errors_name_the_argument():
    with pytest.raises(ValueError, match="leading"):
        shard_batch({"a": jnp.ones(3), "b": jnp.ones(4)})
    with pytest.raises(ValueError, match="batch_size"):
        sharded_vmap(lambda a: a, batch_size=0)
    with pytest.raises(ValueError, match="one axis"):
        devs = np.array(jax.devices()[:1]).reshape(1, 1)
        shard_batch({"a": jnp.ones(2)}, jax.sharding.Mesh(devs, ("a", "b")))

    class Other(eqx.Module):
        def __call__(self, t, x, args=None):
            return x

    with pytest.raises(ValueError, match="supports SphereAttention"):
        query_sharded_field(Other())


def test_query_sharded_interaction_one_device_is_plain(dtype):
    x = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 50, 3, dtype)
    B = jnp.eye(3, dtype=dtype)
    got = query_sharded_interaction(x, x, B, 4.0, mesh=jax.devices()[:1])
    ref = jaxdyn.kernels.interaction(x, x, B, 4.0, kernel="dense")
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=0,
                               atol=tol(dtype, 1e-5, 1e-12))
