"""One subprocess for the checks that need JAX started with other device settings
(tests/test_sharding.py, tests/test_sweeps.py): the device count of a running process cannot
change, and each fresh process pays Python's, JAX's and jaxdyn's start-up (≈ 1.5 CPU-s).

``python tests/_device_worker.py SPEC_JSON`` prints one JSON line:

* ``host``: ``configure_host_devices`` before JAX starts, one case a forked child (forked
  after ``import jax``, before any backend starts: each child starts its own backend with its
  own ``XLA_FLAGS`` and environment, as a fresh process would);
* then this process exposes 4 host devices (``--xla_force_host_platform_device_count=4``):
  ``sweep``: ``run_experiment(SWEEP_4)`` on 4 devices into ``spec["sweep_out"]``;
* ``f32``/``f64`` (the dtypes in ``spec["dtypes"]``): query-sharded fields against the
  unsharded ones (float64 by default: :data:`DEFAULT_FIELDS`); with ``spec["full"]`` (a slow
  test selected) also sharded sweeps, the other models and multi-head attentions, the
  interaction and simulate on the query-sharded fields.

:func:`four_devices` runs it once per pytest run (shared by the xdist workers).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# test_sweeps.py's sweep (chunk_size 0: one chunk over all devices), run on 4 devices here
# and on 1 in the test's process
SWEEP = {
    "kind": "sphere", "name": "sweep", "d": 3, "n": 64, "t1": 2.0, "dt": 0.05, "save_every": 10,
    "snapshots": [0.0, 2.0], "chunk_size": 1,
    "sweep": {"beta": [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0], "seed": [0]},
}
SWEEP_4 = {**SWEEP, "chunk_size": 0}

# the query-sharded fields checked on 4 devices in the default suite: the blocked softmax
# field and the multi-head one whose rows keep their positions (causal mask, ALiBi, RoPE);
# the other models, the interaction and simulate on the sharded field under -m slow
DEFAULT_FIELDS = ["blocked-softmax", "mha-causal-alibi-rope"]

# configure_host_devices cases: (name, n, keyword arguments, environment)
HOST_CASES = [
    ("n3_w512", 3, {"vector_width": 512}, {}),
    ("n2_wnone", 2, {"vector_width": None}, {}),
    ("opt_out", 3, {}, {"JAXDYN_NO_HOST_DEVICES": "1"}),
    ("user_flags", 3, {}, {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}),
]


def _in_child(fn):
    """``fn()`` (JSON-able) in a forked child; its result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        code = 0
        try:
            data = json.dumps(fn())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            data, code = json.dumps({"error": repr(e)}), 1
        os.write(w, data.encode())
        os.close(w)
        os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def _host_case(n, kw, env):
    from jaxdyn.simulation._sharding import configure_host_devices

    def run():
        os.environ.update(env)
        took = configure_host_devices(n, **kw)
        import jax

        return {"took": took, "devices": len(jax.devices()), "again": configure_host_devices(2),
                "flags": os.environ.get("XLA_FLAGS", "")}

    return _in_child(run)


def _fields(query_sharded_field, model, x):
    """The query-sharded field of ``model`` at ``x`` and the model's own, each one program."""
    import equinox as eqx
    import numpy as np

    return (np.asarray(eqx.filter_jit(query_sharded_field(model))(0.0, x)),
            np.asarray(eqx.filter_jit(model)(0.0, x)))


def _sharded_checks(dt, full=True):
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxdyn
    from jaxdyn.simulation._sharding import (
        query_sharded_field,
        query_sharded_interaction,
        sharded_vmap,
        sweep_mesh,
    )

    r = {}
    rng = np.random.default_rng(0)
    d = 3
    Q, K, V = (jnp.asarray(rng.normal(size=(d, d)) * 0.5 + np.eye(d), dt) for _ in range(3))
    betas = [0.3, 1.0, 2.0, 4.0, 7.0, 9.0]  # 6 systems on 4 devices: padding exercised
    models = jaxdyn.stack_models([jaxdyn.SphereAttention(Q, K, V, b) for b in betas])
    x0 = jnp.stack([jaxdyn.sample_sphere(jax.random.PRNGKey(i), 24, d, dt) for i in range(6)])

    def sim(model, x):
        return jaxdyn.simulate(model, x, t1=2.0, dt=0.1, method="euler", save_every=5).xs

    if full:  # sharded_vmap over 4 devices (tests/test_sharding.py, -m slow)
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
    for kern, norm in [("blocked", "softmax"), ("blocked", "hardmax")][:2 if full else 1]:
        m = jaxdyn.SphereAttention(Q, K, V, 3.0, kernel=kern, normalization=norm, k_block=16,
                                   q_block=8)
        a, b = _fields(query_sharded_field, m, x)
        fields[f"{kern}-{norm}"] = [float(np.max(np.abs(a - b))), float(np.max(np.abs(b)))]
    if full:  # the other models, the interaction and simulate on the sharded field
        a, b = _fields(query_sharded_field, jaxdyn.ZeroTemperature(Q, K, V), x)
        fields["zero"] = [float(np.max(np.abs(a - b))), 1.0]
        e = jaxdyn.EuclideanAttention(0.1 * Q, 0.5 * K, V, jnp.ones(d, dt), activation="relu")
        a, b = _fields(query_sharded_field, e, 2 * x)
        fields["euclid"] = [float(np.max(np.abs(a - b))), 1.0]
        B = jnp.matmul(Q.T, K)
        qi = np.asarray(query_sharded_interaction(x, x, B, 2.0, kernel="dense"))
        ri = np.asarray(jaxdyn.kernels.interaction(x, x, B, 2.0, kernel="dense"))
        fields["interaction"] = [float(np.max(np.abs(qi - ri))), float(np.max(np.abs(ri)))]
        m = jaxdyn.SphereAttention(Q, K, V, 3.0, kernel="blocked", k_block=16)
        t_sh = np.asarray(jaxdyn.simulate(query_sharded_field(m), x, t1=1.0, dt=0.1,
                                          method="euler").xs)
        t_un = np.asarray(jaxdyn.simulate(m, x, t1=1.0, dt=0.1, method="euler").xs)
        fields["simulate"] = [float(np.max(np.abs(t_sh - t_un))), 1.0]
    # MultiHeadAttention: each device's rows keep their positions (mask, ALiBi, RoPE); the
    # Sinkhorn potentials come from the whole cloud
    H = 2
    Qh, Kh, Vh = (jnp.asarray(rng.normal(size=(H, d, d)) * 0.5, dt) for _ in range(3))
    blk = dict(kernel="blocked", k_block=16, q_block=8)
    heads = [("mha-causal-alibi-rope", dict(mask="causal", alibi=0.1, rope=True, **blk))]
    if full:  # by default: the rows at any offset of causal-dense and sinkhorn heads in
        # tests/test_sharding.py (one device)
        heads += [("mha-causal-dense", dict(mask="causal", alibi=0.2, kernel="dense")),
                  ("mha-l2", dict(attention="l2", **blk)),
                  ("mha-sinkhorn", dict(attention="sinkhorn", sinkhorn_iters=3, **blk))]
    for label, kw in heads:
        a, b = _fields(query_sharded_field, jaxdyn.MultiHeadAttention(Qh, Kh, Vh, 2.0, **kw), x)
        fields[label] = [float(np.max(np.abs(a - b))), float(np.max(np.abs(b)))]
    if full:
        mh = jaxdyn.MultiHeadAttention(Qh, Kh, Vh, 2.0, mask="causal", **blk)
        t_sh = np.asarray(jaxdyn.simulate(query_sharded_field(mh), x, t1=1.0, dt=0.1,
                                          method="euler").xs)
        t_un = np.asarray(jaxdyn.simulate(mh, x, t1=1.0, dt=0.1, method="euler").xs)
        fields["mha-simulate"] = [float(np.max(np.abs(t_sh - t_un))), 1.0]
    r["fields"] = fields
    return r


def main(spec):
    out = {"host": {name: _host_case(n, kw, env) for name, n, kw, env in HOST_CASES}}
    os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=4 "
                               + os.environ.get("JAXDYN_TEST_XLA_FLAGS", "")).strip()
    import jax

    out["devices"] = len(jax.devices())
    if spec.get("sweep_out"):  # x64 off, as in a fresh `jaxdyn run`
        from jaxdyn.experiments import run_experiment

        r = run_experiment(SWEEP_4, spec["sweep_out"], progress=False, log=lambda *_: None)
        out["sweep"] = {"status": r.status, "devices": r.summary["versions"]["devices"]}
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    for name in spec.get("dtypes", []):
        out[name] = _sharded_checks({"f32": jnp.float32, "f64": jnp.float64}[name],
                                    spec.get("full", True))
    return out


def four_devices(request, tmp_path_factory, worker_id, timeout=600):
    """The worker's JSON, computed once per pytest run for the dtypes of the selected
    ``name``-parametrized tests that use the ``four_devices`` fixture; ``["sweep_dir"]`` is
    the 4-device run's folder."""
    from conftest import run_once, selected_items

    items = [it for it in selected_items(request.config) if "four_devices" in getattr(it, "fixturenames", ())]
    names = sorted({it.callspec.params["name"] for it in items
                    if "name" in getattr(getattr(it, "callspec", None), "params", {})})
    # every check when a slow test uses the worker (-m slow), else the default set
    full = any(it.get_closest_marker("slow") is not None for it in items)
    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent  # shared by the xdist workers
    key = "device_worker_" + "_".join(names) + ("_full" if full else "")
    sweep_dir = root / (key + "_sweep")

    def compute():
        env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXDYN_NO_HOST_DEVICES")}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("JAX_PLATFORMS", "cpu")
        spec = {"dtypes": names, "full": full, "sweep_out": str(sweep_dir)}
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), json.dumps(spec)],
                           env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, f"device worker failed:\n{p.stdout}\n{p.stderr[-4000:]}"
        return json.loads(p.stdout.strip().splitlines()[-1])

    if key not in _DONE:  # both test files in one process (pytest -n 0, or one xdist worker)
        _DONE[key] = {**run_once(tmp_path_factory, worker_id, key, compute),
                      "sweep_dir": str(sweep_dir)}
    return _DONE[key]


_DONE = {}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
