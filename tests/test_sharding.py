"""Sharding: sweeps split across devices and query-sharded fields equal the unsharded ones.

The multi-device checks run in one subprocess (tests/_device_worker.py, shared with
tests/test_sweeps.py) that sets ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` before
JAX starts (the device count of a running process cannot change), after checking
``configure_host_devices`` in forked children that start JAX themselves; the rest run
in-process on whatever devices exist.
"""

import os

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
import _device_worker as device_worker
from conftest import tol


@pytest.fixture(scope="module")
def four_devices(request, tmp_path_factory, worker_id):
    # one subprocess (tests/_device_worker.py) for the whole pytest run, shared with
    # tests/test_sweeps.py: the configure_host_devices cases (forked children), then the
    # 4-device checks for the dtypes of the selected tests (f64, whose tolerance is 1e-12, by
    # default; f32 under -m slow: 1-device sharded_vmap in f32 is checked in-process below);
    # by default two fields (tests/_device_worker.py's DEFAULT_FIELDS: the blocked softmax
    # field and the causal multi-head one with ALiBi and RoPE); the sharded sweeps, the other
    # models, the interaction and simulate on a sharded field only when a slow test here is
    # selected
    return device_worker.four_devices(request, tmp_path_factory, worker_id)


NAMES = ["f64", pytest.param("f32", marks=pytest.mark.slow)]


@pytest.mark.slow
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
    assert set(device_worker.DEFAULT_FIELDS) <= set(four_devices[name]["fields"])
    for label, (diff, scale) in four_devices[name]["fields"].items():
        assert diff <= rtol * max(scale, 1.0), (label, diff, scale)


def test_configure_host_devices_before_jax_starts(four_devices):
    r = four_devices["host"]["n3_w512"]  # configure_host_devices(3, vector_width=512)
    assert r["took"] is True and r["devices"] == 3
    assert r["again"] is False  # JAX is running now (and the flag is set): no change
    assert "--xla_force_host_platform_device_count=3" in r["flags"]
    assert "--xla_cpu_prefer_vector_width=512" in r["flags"]
    r = four_devices["host"]["n2_wnone"]  # configure_host_devices(2, vector_width=None)
    assert r["took"] is True and r["devices"] == 2
    assert "prefer_vector_width" not in r["flags"]


def test_configure_host_devices_opt_out_and_user_flags_win(four_devices):
    r = four_devices["host"]["opt_out"]  # configure_host_devices(3), JAXDYN_NO_HOST_DEVICES=1
    assert r["took"] is False and r["devices"] == 1 and r["flags"] == ""
    r = four_devices["host"]["user_flags"]  # the user's XLA_FLAGS name 2 devices
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
@pytest.mark.slow
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


@pytest.mark.slow_dtype("f32")  # a code-path identity: f64 (1e-12) in the default suite, f32 under -m slow
def test_query_sharded_interaction_one_device_is_plain(dtype):
    x = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 50, 3, dtype)
    B = jnp.eye(3, dtype=dtype)
    got = query_sharded_interaction(x, x, B, 4.0, mesh=jax.devices()[:1])
    ref = jaxdyn.kernels.interaction(x, x, B, 4.0, kernel="dense")
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=0,
                               atol=tol(dtype, 1e-5, 1e-12))


@pytest.mark.slow_dtype("f64")  # the model path in f32 by default; f64 under -m slow
@pytest.mark.parametrize("kw", [
    # blocked, causal, ALiBi and RoPE by default on 4 devices (the worker's
    # "mha-causal-alibi-rope" field, f64, a ragged last share): here under -m slow
    pytest.param(dict(mask="causal", alibi=0.15, rope=True, kernel="blocked", k_block=8,
                      q_block=8), marks=pytest.mark.slow),
    dict(mask="causal", alibi=0.15, rope=True, kernel="dense"),
    # the rows of the L2 attention: the same rows-at-an-offset identity as the dot-product
    # rows (causal-dense, sinkhorn here by default): under -m slow
    pytest.param(dict(attention="l2", kernel="blocked", k_block=8, q_block=8),
                 marks=pytest.mark.slow),
    dict(attention="sinkhorn", sinkhorn_iters=2, alibi=0.1, kernel="blocked", k_block=8,
         q_block=8),
], ids=["causal-alibi-rope", "causal-dense", "l2", "sinkhorn"])
def test_multihead_rows_equal_the_whole_field(dtype, kw):
    # the rows a device holds (any offset, a ragged last share, padded rows past the end)
    # give the whole field's rows: the positions, masks and potentials of the whole cloud
    rng = np.random.default_rng(3)
    Q, K, V = (jnp.asarray(rng.normal(size=(2, 3, 3)), dtype) for _ in range(3))
    model = jaxdyn.MultiHeadAttention(Q, K, V, 2.0, **kw)
    x = jaxdyn.sample_sphere(jax.random.PRNGKey(2), 37, 3, dtype)
    whole = np.asarray(eqx.filter_jit(model.ambient)(0.0, x))
    scale = float(np.max(np.abs(whole)))
    # shares of 10 rows at a traced offset, as on a device of the mesh: one compiled program
    rows = eqx.filter_jit(lambda t, q, y, a: model.ambient_rows(t, q, y, a))
    for a, b in [(0, 10), (10, 20), (20, 30), (27, 37)]:
        got = np.asarray(rows(0.0, x[a:b], x, jnp.int32(a)))
        np.testing.assert_allclose(got, whole[a:b], rtol=0, atol=tol(dtype, 1e-5, 1e-12) * scale)
    # the ragged last share padded to 10 rows (repeats of the last particle past the end):
    # the padded rows stay finite
    pad = jnp.concatenate([x[30:], jnp.broadcast_to(x[-1], (3, 3))])
    got = np.asarray(rows(0.0, pad, x, jnp.int32(30)))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got[:7], whole[30:], rtol=0, atol=tol(dtype, 1e-5, 1e-12) * scale)


@pytest.mark.slow  # default-suite counterpart: the 4-device fields "mha-causal-*" (f64, 1e-12)
def test_query_sharded_multihead_on_present_devices_equals_model():
    Q = jnp.asarray(np.random.default_rng(4).normal(size=(2, 3, 3)))
    model = jaxdyn.MultiHeadAttention(Q, Q, Q, 1.5, mask="causal", kernel="blocked", k_block=8,
                                      q_block=8)
    x = jaxdyn.sample_sphere(jax.random.PRNGKey(3), 29, 3, jnp.float64)
    field = query_sharded_field(model)
    np.testing.assert_allclose(np.asarray(eqx.filter_jit(field)(0.0, x)),
                               np.asarray(eqx.filter_jit(model)(0.0, x)), rtol=0, atol=1e-12)
