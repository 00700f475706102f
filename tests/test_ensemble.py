"""simulate_ensemble (systems on the vector lanes, bound-shifted softmax) against
jax.vmap(simulate), the generic path: same schemes, same save times, equal up to rounding;
both branches of the shift (bound and running maximum) exercised; errors for bad input."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from conftest import tol
from jaxdyn.simulation._ensemble import simulate_ensemble


def _unit(a):
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def _systems(nb, n, d, betas, dtype, seed=0, normalization="softmax"):
    rng = np.random.default_rng(seed)
    ms = []
    for i in range(nb):
        Q, K, V = (rng.standard_normal((d, d)) / np.sqrt(d) + np.eye(d) for _ in range(3))
        ms.append(jaxdyn.SphereAttention(jnp.asarray(Q, dtype), jnp.asarray(K, dtype),
                                         jnp.asarray(V, dtype), float(betas[i % len(betas)]),
                                         normalization=normalization))
    x0 = jnp.asarray(_unit(rng.standard_normal((nb, n, d))), dtype)
    return jaxdyn.stack_models(ms), x0


def _reference(models, x0, **kw):
    return jax.vmap(lambda m, x: jaxdyn.simulate(m, x, **kw))(models, x0)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["euler", "rk4", "exp_euler"])
def test_equals_vmapped_simulate(dtype, method):
    # non-symmetric random Q, K, V per system, β from 0.3 to 40: with |Bᵀx| up to ~2 the
    # largest β exceed the safe bound, so chunks take both branches of the shift
    betas = [0.3, 1.0, 4.0, 9.0, 40.0]
    models, x0 = _systems(13, 17, 3, betas, dtype, seed=1)  # 13 systems, chunks of 4: padding
    kw = dict(t1=2.0, dt=0.05, save_every=8, method=method)
    ref = _reference(models, x0, **kw)
    got = simulate_ensemble(models, x0, chunk=4, **kw)
    assert got.xs.shape == ref.xs.shape and got.xs.dtype == ref.xs.dtype
    np.testing.assert_allclose(np.asarray(got.ts), np.asarray(ref.ts[0]), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(got.xs), np.asarray(ref.xs),
                               atol=tol(dtype, 2e-4, 1e-11), rtol=0)
    assert np.all(np.asarray(got.ok))
    norms = np.linalg.norm(np.asarray(got.xs), axis=-1)
    np.testing.assert_allclose(norms, 1.0, atol=tol(dtype, 1e-6, 1e-13))


@pytest.mark.slow
@pytest.mark.parametrize("branch,safe", [("maximum", -1.0), ("bound", 1e30)])
def test_each_shift_branch_alone_equals_the_reference(monkeypatch, branch, safe):
    # SAFE_SHIFT = -1 forces the running maximum everywhere, 1e30 the bound everywhere: at
    # moderate β both equal the generic path (which always subtracts the maximum) ...
    import jaxdyn.simulation._ensemble as ens

    monkeypatch.setitem(ens.SAFE_SHIFT, "float32", safe)
    models, x0 = _systems(6, 10, 3, [0.5, 3.0, 8.0], np.float32, seed=2)
    kw = dict(t1=0.5, dt=0.01, save_every=10, method="rk4")
    ref = _reference(models, x0, **kw)
    got = simulate_ensemble(models, x0, **kw)
    np.testing.assert_allclose(np.asarray(got.xs), np.asarray(ref.xs), atol=1e-4, rtol=0)
    # ... while at β = 2000 with random weights only the maximum keeps the weights in range:
    # forcing the bound there loses them (so the switch between the branches is live)
    models, x0 = _systems(4, 8, 2, [2000.0], np.float32, seed=4)
    kw = dict(t1=0.05, dt=0.001, save_every=50, method="euler")
    fin = np.asarray(simulate_ensemble(models, x0, **kw).ok)
    assert fin.all() if branch == "maximum" else not fin.any()


def _assert_finite_and_matches(models, x0, atol, **kw):
    """Every system stays finite and equals the generic vmap(simulate) path to ``atol``."""
    got = simulate_ensemble(models, x0, **kw)
    ref = _reference(models, x0, **kw)
    assert np.all(np.asarray(got.ok))
    np.testing.assert_allclose(np.asarray(got.xs), np.asarray(ref.xs), atol=atol, rtol=0)


@pytest.mark.slow
def test_identity_weights_take_the_bound_at_any_beta():
    # Q = K = V = I on the sphere: l_ii equals the bound, so even β = 5000 (logits 5000,
    # weights spanning e^-10000) runs on the bound branch and matches the generic path
    eye = np.eye(3, dtype=np.float32)
    x0 = jnp.asarray(_unit(np.random.default_rng(2).standard_normal((4, 9, 3))), jnp.float32)
    models = jaxdyn.stack_models([jaxdyn.SphereAttention(eye, eye, eye, 5000.0)] * 4)
    _assert_finite_and_matches(models, x0, 2e-5, t1=0.02, dt=0.001, save_every=10, method="rk4")


@pytest.mark.slow
def test_saveat_after_t0_and_mixed_precision_inputs():
    # float32 clouds with float64 models are accepted (as by simulate), and saveat times
    # that do not start at t0 label the right states
    models, x0 = _systems(5, 7, 3, [1.0, 4.0], np.float64, seed=8)
    x32 = x0.astype(jnp.float32)
    full = simulate_ensemble(models, x32, t1=1.0, dt=0.1, save_every=3, method="rk4")
    late = simulate_ensemble(models, x32, t1=1.0, dt=0.1, saveat=[0.3, 0.9, 1.0], method="rk4")
    assert late.xs.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(late.ts), [0.3, 0.9, 1.0], atol=1e-12)
    np.testing.assert_allclose(np.asarray(late.xs), np.asarray(full.xs)[:, [1, 3, 4]], atol=1e-13)


@pytest.mark.slow_dtype("f32")
@pytest.mark.slow
def test_unnormalized_weights(dtype):
    models, x0 = _systems(6, 11, 3, [0.5, 2.0], dtype, seed=3, normalization="unnormalized")
    kw = dict(t1=1.0, dt=0.05, save_every=5, method="rk4")
    ref = _reference(models, x0, **kw)
    got = simulate_ensemble(models, x0, **kw)
    np.testing.assert_allclose(np.asarray(got.xs), np.asarray(ref.xs),
                               atol=tol(dtype, 1e-4, 1e-11), rtol=0)


@pytest.mark.slow
def test_large_beta_float32_stays_finite_and_matches():
    # β = 2000 on S¹: logits of order 10³, far outside the bound's safe range; the maximum
    # branch must keep every weight finite
    models, x0 = _systems(4, 8, 2, [2000.0], np.float32, seed=4)
    _assert_finite_and_matches(models, x0, 2e-3, t1=0.2, dt=0.001, save_every=50, method="euler")


@pytest.mark.slow
def test_nonfinite_is_a_status():
    models, x0 = _systems(3, 5, 3, [1.0], np.float32, seed=5)
    x0 = x0.at[1, 0, 0].set(jnp.nan)
    # a NaN cloud fails the unit-norm check with a clear message ...
    with pytest.raises(ValueError, match="unit vectors"):
        simulate_ensemble(models, x0, t1=0.2, dt=0.1, method="euler")
    # ... while a NaN weight is a per-system status
    V = models.V.at[2].set(jnp.nan)
    bad = jaxdyn.stack_models([jaxdyn.SphereAttention(models.Q[i], models.K[i], V[i], 1.0)
                               for i in range(3)])
    x0 = x0.at[1, 0].set(jnp.asarray([1.0, 0.0, 0.0], jnp.float32))
    got = simulate_ensemble(bad, x0, t1=0.2, dt=0.1, method="euler")
    assert np.asarray(got.ok).tolist() == [True, True, False]
    # one code and one message per system, as from vmap(simulate); throw=True names it
    assert got.status.shape == (3,)
    assert list(got.names) == ["successful", "successful", "nonfinite"]
    assert "NaN" in got.messages[2]
    ref = jax.vmap(lambda m, x: jaxdyn.simulate(m, x, t1=0.2, dt=0.1, method="euler"))(bad, x0)
    np.testing.assert_array_equal(np.asarray(got.status), np.asarray(ref.status))
    with pytest.raises(RuntimeError, match=r"member 2.*nonfinite"):
        simulate_ensemble(bad, x0, t1=0.2, dt=0.1, method="euler", throw=True)
    # float16 rows from jaxdyn.normalize (unit to ~1e-4) pass the unit check as in simulate
    x16 = jaxdyn.normalize(x0.astype(jnp.float16))
    got16 = simulate_ensemble(models, x16, t1=0.2, dt=0.1, method="euler")
    assert got16.xs.dtype == jnp.float32 and bool(np.all(np.asarray(got16.ok)))


def test_bad_input_is_named():
    models, x0 = _systems(4, 6, 3, [1.0], np.float32)
    with pytest.raises(ValueError, match="stack of 3 models"):
        simulate_ensemble(models, x0[:3], t1=1.0, dt=0.1)
    with pytest.raises(ValueError, match="method"):
        simulate_ensemble(models, x0, t1=1.0, dt=0.1, method="dopri8")
    with pytest.raises(ValueError, match="N <= "):
        big = jnp.asarray(_unit(np.random.default_rng(0).standard_normal((4, 300, 3))), jnp.float32)
        simulate_ensemble(models, big, t1=1.0, dt=0.1)
    with pytest.raises(ValueError, match="SphereAttention"):
        simulate_ensemble(jaxdyn.ZeroTemperature(np.eye(3), np.eye(3), np.eye(3)), x0, t1=1.0, dt=0.1)
    hard = jaxdyn.stack_models([jaxdyn.SphereAttention(np.eye(3), np.eye(3), np.eye(3), 1.0,
                                                       normalization="hardmax")] * 4)
    with pytest.raises(ValueError, match="hardmax"):
        simulate_ensemble(hard, x0, t1=1.0, dt=0.1)
    with pytest.raises(ValueError, match="chunk"):
        simulate_ensemble(models, x0, t1=1.0, dt=0.1, chunk=2.5)
    with pytest.raises(ValueError, match="unit vectors"):
        simulate_ensemble(models, 2 * x0, t1=1.0, dt=0.1)


@pytest.mark.slow  # 5 s; several devices by default: tests/test_sharding.py and test_sweeps.py
def test_split_over_three_devices_equals_one(tmp_path):
    # in a subprocess with 3 host devices: 10 systems (padded to 3 x 4) give the same
    # trajectories as on one device
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(
        "import os, sys\n"
        "os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=3'\n"
        "import jax, numpy as np\n"
        "sys.path.insert(0, %r)\n"
        "from test_ensemble import _systems\n"
        "from jaxdyn.simulation._ensemble import simulate_ensemble\n"
        "assert jax.device_count() == 3\n"
        "models, x0 = _systems(10, 12, 3, [0.5, 3.0, 50.0], np.float32, seed=7)\n"
        "kw = dict(t1=1.0, dt=0.05, save_every=5, method='rk4', chunk=4)\n"
        "a = simulate_ensemble(models, x0, **kw)\n"
        "b = simulate_ensemble(models, x0, devices=jax.devices()[:1], **kw)\n"
        "print(float(np.max(np.abs(np.asarray(a.xs) - np.asarray(b.xs)))))\n" % str(Path(__file__).parent))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) == 0.0


def _multihead_systems(nb, n, dtype, seed=0, **kw):
    """A stack of MultiHeadAttention systems (2 heads, d = 3) and their clouds."""
    rng = np.random.default_rng(seed)
    ms = []
    for i in range(nb):
        Q, K, V = (jnp.asarray(rng.standard_normal((2, 3, 3)) / np.sqrt(3), dtype)
                   for _ in range(3))
        ms.append(jaxdyn.MultiHeadAttention(Q, K, V, 1.0 + i, **kw))
    x0 = jnp.asarray(_unit(rng.standard_normal((nb, n, 3))), dtype)
    return jaxdyn.stack_models(ms), x0


@pytest.mark.slow_dtype("f64")  # the model path in f32 by default; f64 under -m slow
@pytest.mark.parametrize("kw", [
    # 6 s of compiles; the ensemble path of stacked MultiHeadAttention (vmap of simulate per
    # chunk, whatever the mask) in the default suite: the causal-alibi-rope case
    pytest.param(dict(), marks=pytest.mark.slow),
    dict(mask="causal", alibi=0.1, rope=True)], ids=["full", "causal-alibi-rope"])
def test_multihead_equals_vmapped_simulate(dtype, kw):
    # stacked MultiHeadAttention: each system's own field, chunks of 2 over 5 systems
    models, x0 = _multihead_systems(5, 9, dtype, seed=11, **kw)
    run = dict(t1=0.6, dt=0.1, save_every=2, method="rk4")
    ref = _reference(models, x0, **run)
    got = simulate_ensemble(models, x0, chunk=2, **run)
    assert got.xs.shape == ref.xs.shape and got.xs.dtype == ref.xs.dtype
    assert got.ts.shape == ref.ts.shape[1:] and np.asarray(got.ok).shape == (5,)
    np.testing.assert_allclose(np.asarray(got.ts), np.asarray(ref.ts[0]), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(got.xs), np.asarray(ref.xs),
                               atol=tol(dtype, 1e-5, 1e-12), rtol=0)
    assert np.all(np.asarray(got.ok))
    assert int(got.num_steps) == int(ref.num_steps[0])


def test_multihead_bad_input_is_named():
    models, x0 = _multihead_systems(3, 5, np.float32)
    with pytest.raises(ValueError, match="stack of 2 models"):
        simulate_ensemble(models, x0[:2], t1=1.0, dt=0.1)
    with pytest.raises(ValueError, match="method"):
        simulate_ensemble(models, x0, t1=1.0, dt=0.1, method="dopri8")
    with pytest.raises(ValueError, match="unit vectors"):
        simulate_ensemble(models, 2 * x0, t1=1.0, dt=0.1)
