"""Transformer variants in the particle engine: the noisy dynamics
(geodesic Euler–Maruyama and diffrax's Stratonovich solvers), the LayerNorm placements
against independent NumPy steps, depth-varying weights and MiniLM's trained heads."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special

import jaxdyn
from jaxdyn.models import DepthAttention, EuclideanAttention, layer_norm, redrawn_weights
from jaxdyn.simulation import simulate_sde

# ---------------------------------------------------------------------------------------
# Noise: Brownian motion on S^{d-1} (β plays no role: one particle, V = I, so the drift
# P⊥(x) V x is 0)


def _pure_noise_means(d, sigma, t1, dt, n_paths, seed=0, method="geodesic_em"):
    eye = jnp.eye(d, dtype=jnp.float64)
    model = jaxdyn.SphereAttention(eye, eye, eye, 1.0)
    x0 = jnp.zeros((1, d)).at[0, -1].set(1.0)
    keys = jax.random.split(jax.random.PRNGKey(seed), n_paths)
    run = jax.vmap(lambda k: simulate_sde(model, x0, k, sigma=sigma, t1=t1, dt=dt,
                                          method=method, save_every=10**6).xs[-1, 0])
    return np.asarray(run(keys))


def _gem_step_mean(d, a2):
    """E cos(a χ_{d−1}) (a² = σ² dt): the exact one-step contraction of the geodesic E–M mean
    (E[exp_x(v)] = E[cos|v|] x for v ~ N(0, a² P⊥(x)), the sine part averaging out)."""
    k = d - 1

    def dens(r):  # χ_k density
        return r ** (k - 1) * np.exp(-r * r / 2) / (2 ** (k / 2 - 1) * special.gamma(k / 2))

    return integrate.quad(lambda r: np.cos(math.sqrt(a2) * r) * dens(r), 0, np.inf)[0]


@pytest.mark.slow  # default-suite counterpart: test_geodesic_em_weak_order_one (unit norm and
# transverse means on its paths; the scheme's mean c(dt)^n, whose limit is this one, order 1)
def test_brownian_mean_on_sphere_and_unit_norm():
    """β = 0, 10⁴ paths: E[x(t)] = x0 exp(−σ²(d−1)t/2) within 3 standard errors; |x| = 1."""
    d, sigma, t1, dt, n = 3, 1.0, 1.0, 0.02, 10_000
    xs = _pure_noise_means(d, sigma, t1, dt, n)
    np.testing.assert_allclose(np.linalg.norm(xs, axis=-1), 1.0, atol=1e-14)
    exact = math.exp(-sigma**2 * (d - 1) * t1 / 2)
    z = xs[:, -1]
    se = z.std(ddof=1) / math.sqrt(n)
    assert abs(z.mean() - exact) < 3 * se, (z.mean(), exact, se)
    # transverse components have mean 0 (the sine part of the step averages out)
    for c in range(d - 1):
        assert abs(xs[:, c].mean()) < 3 * xs[:, c].std(ddof=1) / math.sqrt(n)


def test_geodesic_em_weak_order_one():
    """The scheme's mean is exactly x0 c(dt)^n with c = E cos(σ√dt χ_{d−1}) (10⁴·4 Monte-Carlo
    paths at a coarse step follow c^n, not the exact law); its weak error |c^n − e^{−σ²(d−1)t/2}|
    then has order 1 (slope of log error vs log dt). The paths stay on the sphere and their
    transverse components have mean 0 (the sine part of the step averages out)."""
    d, sigma, t1 = 3, 1.0, 1.0
    exact = math.exp(-sigma**2 * (d - 1) * t1 / 2)
    dt, n = 0.25, 40_000
    xs = _pure_noise_means(d, sigma, t1, dt, n, seed=1)
    np.testing.assert_allclose(np.linalg.norm(xs, axis=-1), 1.0, atol=1e-14)
    for c in range(d - 1):
        assert abs(xs[:, c].mean()) < 3 * xs[:, c].std(ddof=1) / math.sqrt(n)
    z = xs[:, -1]
    se = z.std(ddof=1) / math.sqrt(n)
    scheme = _gem_step_mean(d, sigma**2 * dt) ** round(t1 / dt)
    assert abs(z.mean() - scheme) < 3 * se, (z.mean(), scheme, se)
    assert abs(scheme - exact) > 5 * se  # the check discriminates the bias
    for dd in (3, 5):
        ex = math.exp(-sigma**2 * (dd - 1) * t1 / 2)
        dts = np.array([0.1, 0.05, 0.025, 0.0125])
        err = [abs(_gem_step_mean(dd, sigma**2 * h) ** round(t1 / h) - ex) for h in dts]
        slope = np.polyfit(np.log(dts), np.log(err), 1)[0]
        assert abs(slope - 1.0) < 0.05, (dd, slope, err)


@pytest.mark.slow
def test_geodesic_em_weak_order_by_monte_carlo():
    """The weak order measured from the implementation alone: 10⁶ paths (common keys) at
    h = 0.5, 0.25, 0.125, error of E[⟨x(1), x0⟩] against e^{−σ²(d−1)/2}; slope ≈ 1
    (default-suite counterpart: test_geodesic_em_weak_order_one)."""
    d, sigma, t1, n = 3, 1.0, 1.0, 1_000_000
    exact = math.exp(-sigma**2 * (d - 1) * t1 / 2)
    dts = np.array([0.5, 0.25, 0.125])
    err, se = [], []
    for h in dts:
        z = _pure_noise_means(d, sigma, t1, float(h), n, seed=5)[:, -1]
        err.append(abs(z.mean() - exact))
        se.append(z.std(ddof=1) / math.sqrt(n))
    assert max(se) < 0.1 * min(err), (err, se)
    slope = np.polyfit(np.log(dts), np.log(err), 1)[0]
    assert abs(slope - 1.0) < 0.15, (slope, err)


@pytest.mark.slow
def test_sde_keys_reproducible_and_independent():
    eye = jnp.eye(3, dtype=jnp.float64)
    model = jaxdyn.SphereAttention(eye, eye, 0.5 * eye, 4.0)
    x0 = jaxdyn.normalize(jaxdyn.sample_sphere(jax.random.PRNGKey(3), 5, 3).astype(jnp.float64))
    key = jax.random.PRNGKey(7)
    a = simulate_sde(model, x0, key, sigma=0.3, t1=1.0, dt=0.05, save_every=5)
    b = simulate_sde(model, x0, key, sigma=0.3, t1=1.0, dt=0.05, save_every=20)
    assert bool(a.ok)
    # a run is a function of its key alone (not of how often it is saved)
    np.testing.assert_array_equal(a.xs[-1], b.xs[-1])
    c = simulate_sde(model, x0, jax.random.fold_in(key, 1), sigma=0.3, t1=1.0, dt=0.05,
                     save_every=20)
    assert float(jnp.max(jnp.abs(c.xs[-1] - a.xs[-1]))) > 1e-3
    # σ = 0 is the deterministic exponential-map Euler run
    f = simulate_sde(model, x0, key, sigma=0.0, t1=1.0, dt=0.05, save_every=20)
    x = jax.jit(lambda m, x: jax.lax.fori_loop(
        0, 20, lambda k, x: jaxdyn.sphere.exp_map(x, 0.05 * m(0.0, x)), x))(model, x0)
    np.testing.assert_allclose(f.xs[-1], x, atol=1e-14)
    with pytest.raises(ValueError, match="sigma"):
        simulate_sde(model, x0, key, sigma=-1.0, t1=1.0, dt=0.05)
    with pytest.raises(ValueError, match="method"):
        simulate_sde(model, x0, key, sigma=1.0, t1=1.0, dt=0.05, method="milstein")


@pytest.mark.slow
def test_diffrax_stratonovich_brownian_mean():
    """diffrax Heun on a VirtualBrownianTree, 10⁴ paths: E[x(t)] within 3 standard errors
    (default-suite counterpart: test_brownian_mean_on_sphere_and_unit_norm, geodesic scheme)."""
    d, sigma, t1, n = 3, 1.0, 1.0, 10_000
    xs = _pure_noise_means(d, sigma, t1, 0.005, n, method="heun")
    z = xs[:, -1]
    se = z.std(ddof=1) / math.sqrt(n)
    assert abs(z.mean() - math.exp(-sigma**2 * (d - 1) * t1 / 2)) < 3 * se


@pytest.mark.slow
def test_diffrax_sde_runs_and_is_reproducible():
    """(slow: diffrax's compilation; default-suite counterpart: test_sde_keys_reproducible_and_
    independent, the same driver with the geodesic scheme)"""
    eye = jnp.eye(3, dtype=jnp.float64)
    model = jaxdyn.SphereAttention(eye, eye, eye, 2.0)
    x0 = jaxdyn.normalize(jaxdyn.sample_sphere(jax.random.PRNGKey(0), 4, 3).astype(jnp.float64))
    key = jax.random.PRNGKey(2)
    a = simulate_sde(model, x0, key, sigma=0.5, t1=0.2, dt=0.02, method="heun", save_every=5)
    b = simulate_sde(model, x0, key, sigma=0.5, t1=0.2, dt=0.02, method="heun", save_every=5)
    assert bool(a.ok)
    np.testing.assert_array_equal(a.xs, b.xs)
    # the exact Stratonovich flow keeps |x| = 1; Heun's error is O(dt)
    assert float(jnp.max(jnp.abs(jnp.linalg.norm(a.xs, axis=-1) - 1))) < 0.05


# ---------------------------------------------------------------------------------------
# LayerNorm placements against an independent NumPy computation


def _np_attention(x, Q, K, V, beta):
    s = beta * (x @ Q.T) @ (x @ K.T).T
    s = s - s.max(axis=1, keepdims=True)
    w = np.exp(s)
    w /= w.sum(axis=1, keepdims=True)
    return (w @ x) @ V.T


def _np_unit(v):
    return v / np.sqrt((v * v).sum(axis=1, keepdims=True))


def _np_proj(x, v):
    return v - (x * v).sum(axis=1, keepdims=True) * x


def _np_field(placement, z, Q, K, V, beta, alpha=0.2):
    x = _np_unit(z)
    A = _np_attention(x, Q, K, V, beta)
    return {"postln": _np_proj(x, A), "preln": A, "periln": _np_unit(A),
            "ngpt": alpha * _np_proj(x, _np_unit(A))}[placement]


@pytest.fixture(scope="module")
def qkv():
    rng = np.random.default_rng(0)
    d = 4
    Q, K, V = (rng.normal(size=(d, d)) for _ in range(3))
    z = rng.normal(size=(7, d)) * rng.uniform(0.5, 2.0, size=(7, 1))
    return Q, K, V, 1.7, z


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["postln", "preln", "periln", "ngpt"])
def test_layernorm_placement_against_numpy(placement, qkv):
    Q, K, V, beta, z = qkv
    field = jaxdyn.SphereAttention(Q, K, V, beta, kernel="dense")
    model = layer_norm(field, placement)
    sphere = model.manifold == "sphere"
    state = _np_unit(z) if sphere else z
    ours = np.asarray(model(0.0, jnp.asarray(state)))
    ref = _np_field(placement, state, Q, K, V, beta)
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-13)
    if placement in ("periln", "ngpt"):
        return  # the step below differs from post-/pre-LN's only in the field checked above
    # one projected-Euler step through simulate against the NumPy step (with the retraction
    # on the sphere placements, none in R^d)
    dt = 0.1
    step = np.asarray(jaxdyn.simulate(model, jnp.asarray(state), t1=dt, dt=dt, method="euler").xs[-1])
    ref_step = state + dt * ref
    if sphere:
        ref_step = _np_unit(ref_step)
    np.testing.assert_allclose(step, ref_step, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("placement", ["preln", "periln"])
def test_prenorm_polar_form(placement, qkv):
    """ż = F(z/|z|) in polar coordinates: ṙ = ⟨x, F⟩, ẋ = P⊥(x) F / r (simuformer's form)."""
    Q, K, V, beta, z = qkv
    model = layer_norm(jaxdyn.SphereAttention(Q, K, V, beta, kernel="dense"), placement)
    zj = jnp.asarray(z)
    zdot = model(0.0, zj)
    r, rdot = jax.jvp(model.radius, (zj,), (zdot,))
    x, xdot = jax.jvp(model.direction, (zj,), (zdot,))
    F = _np_field(placement, z, Q, K, V, beta)
    xn, rn = _np_unit(z), np.linalg.norm(z, axis=1)
    np.testing.assert_allclose(rdot, (xn * F).sum(axis=1), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(xdot, _np_proj(xn, F) / rn[:, None], rtol=1e-12, atol=1e-13)


def test_prenorm_accepts_euclidean_models(qkv):
    Q, K, V, beta, z = qkv
    rng = np.random.default_rng(1)
    A, b = rng.normal(size=(4, 4)), rng.normal(size=4)
    model = layer_norm(EuclideanAttention(A, K.T @ Q, V, b), "preln")
    x = _np_unit(z)
    s = (x @ Q.T) @ (x @ K.T).T  # logits x_jᵀ B x_i with B = KᵀQ: ⟨Q x_i, K x_j⟩
    w = np.exp(s - s.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    ref = x @ A.T + b + (w @ x) @ V.T
    np.testing.assert_allclose(model(0.0, jnp.asarray(z)), ref, rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match="placement"):
        layer_norm(model.field, "sandwich")


# ---------------------------------------------------------------------------------------
# Depth-varying weights


@pytest.mark.slow
def test_depth_attention_reduces_and_switches_layers(qkv):
    Q, K, V, beta, z = qkv
    x0 = jnp.asarray(_np_unit(z))
    one = DepthAttention(Q[None], K[None], V[None], beta)
    ref = jaxdyn.SphereAttention(Q, K, V, beta, kernel="dense")
    np.testing.assert_allclose(one(0.3, x0), ref(0.3, x0), rtol=1e-12, atol=1e-13)
    # H identical heads with V/H are one head
    H = 3
    heads = DepthAttention(np.stack([Q] * H)[None], np.stack([K] * H)[None],
                           np.stack([V / H] * H)[None], beta)
    np.testing.assert_allclose(heads(0.0, x0), ref(0.0, x0), rtol=1e-12, atol=1e-13)
    # two layers of period τ: layer 0 on [0, τ), layer 1 from τ on (clamped after 2τ), with the
    # step-grid times k·dt that land on τ counted in the layer they start
    Qs, Ks, Vs = redrawn_weights({"ensemble": "gaussian", "scale": 1.0, "seed": 4}, 4, 2)
    assert Qs.shape == (2, 1, 4, 4) and not np.allclose(Qs[0], Qs[1])
    np.testing.assert_array_equal(
        Qs, redrawn_weights({"ensemble": "gaussian", "scale": 1.0, "seed": 4}, 4, 2)[0])
    tau, dt = 0.5, 0.05
    deep = DepthAttention(Qs, Ks, Vs, beta, tau)
    m0, m1 = (jaxdyn.SphereAttention(Qs[l, 0], Ks[l, 0], Vs[l, 0], beta, kernel="dense")
              for l in (0, 1))
    ev = eqx.filter_jit(lambda m, t, x: m(t, x))
    for t, m in ((0.0, m0), (9 * dt, m0), (10 * dt, m1), (0.99 * tau, m0), (1.7 * tau, m1),
                 (5 * tau, m1)):
        t = jnp.asarray(t, jnp.float64)
        np.testing.assert_allclose(ev(deep, t, x0), ev(m, t, x0), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(deep.layer_model(1)(0.0, x0), m1(0.0, x0), rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match="V must have shape"):
        DepthAttention(Qs, Ks, Vs[:, :, :3], beta)


def _old_layer_ambient(m, l, x):
    """DepthAttention's former per-layer field (its own dense softmax), in NumPy."""
    Q, K, V, u, c = (np.asarray(a)[l] for a in (m.Q, m.K, m.V, m.u, m.c))
    out = np.asarray(c)[None, :].copy()
    for h in range(Q.shape[0]):
        s = float(m.beta) * ((x @ Q[h].T) @ (x @ K[h].T).T + (x @ u[h])[None, :])
        w = np.exp(s - s.max(axis=1, keepdims=True))
        out = out + (w / w.sum(axis=1, keepdims=True)) @ x @ V[h].T
    return out


def test_depth_attention_through_the_heads_kernel():
    """DepthAttention's layer field now runs on MultiHeadAttention's kernel (heads vmapped,
    the bias β⟨u, x_j⟩ a key bias): dense and blocked (ragged blocks) equal the former dense
    softmax on random weights with biases u, c, every layer (1e−12, float64)."""
    r = np.random.default_rng(3)
    L, H, k, d, n = 2, 3, 2, 4, 37
    Q, K = r.normal(size=(2, L, H, k, d))
    V = r.normal(size=(L, H, d, d))
    u, c = r.normal(size=(L, H, d)), r.normal(size=(L, d))
    x = r.normal(size=(n, d)) * 1.5  # any radius (pre-LN states)
    ev = eqx.filter_jit(lambda m, l, x: m.layer_ambient(l, x))
    for kernel in ("dense", "blocked"):
        m = DepthAttention(Q, K, V, 2.0, 0.5, u=u, c=c, kernel=kernel, k_block=8, q_block=16)
        for l in range(L):
            np.testing.assert_allclose(ev(m, jnp.asarray(l), jnp.asarray(x)),
                                       _old_layer_ambient(m, l, x), rtol=0, atol=1e-12)
    assert m.layer_model(1).kernel == "blocked" and m.layer_model(1).k_block == 8
    with pytest.raises(ValueError, match="kernel must be one of"):
        DepthAttention(Q, K, V, 2.0, kernel="flash")


# ---------------------------------------------------------------------------------------
# MiniLM's trained heads


@pytest.fixture(scope="module")
def minilm_f64():
    pytest.importorskip("safetensors")
    from jaxdyn.encoder import find_minilm, load_bert

    try:
        path = find_minilm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return load_bert(path, dtype=np.float64)


@pytest.mark.slow
@pytest.mark.models
def test_minilm_heads_equal_the_encoders_attention(minilm_f64):
    """Per layer l: the encoder's attention sublayer a = concat_h(A_h v_h) Wo + bo on hidden
    states equals Σ_h V_h Σ_j softmax(β(⟨Q_h x_i, K_h x_j⟩ + ⟨u_h, x_j⟩)) x_j + c with the
    extracted weights at β = 1/√32 (1e-10, f64); the residual, LayerNorms and feed-forward
    block are what the particle dynamics leaves out."""
    from jaxdyn.encoder import attention_heads, self_attention

    params, cfg = minilm_f64
    heads = attention_heads(params, cfg)
    assert heads["Q"].shape == (6, 12, 32, 384) and heads["V"].shape == (6, 12, 384, 384)
    model = DepthAttention.from_heads(heads)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 9, 384)))  # hidden states of norm ≈ 20 (MiniLM's ≈ 12)
    encoder_attention = jax.jit(lambda layers, l, x: self_attention(
        jax.tree.map(lambda a: a[l], layers), cfg, x))
    particles = jax.jit(jax.vmap(lambda m, l, x: m.layer_ambient(l, x), (None, None, 0)))
    by_time = jax.jit(lambda m, t, x: m.ambient(t, x))
    for l in range(cfg.num_hidden_layers):
        a = encoder_attention(params.layers, l, x)
        scale = float(jnp.abs(a).max())
        np.testing.assert_allclose(particles(model, l, x), a, rtol=1e-10, atol=1e-10 * scale)
        # the layer is selected by time: layer l acts on [l, l+1)
        np.testing.assert_allclose(by_time(model, l + 0.5, x[0]), a[0], rtol=1e-10,
                                   atol=1e-10 * scale)


# ---------------------------------------------------------------------------------------
# The experiment kind ``variants``


def _variants_cfg(**kw):
    from jaxdyn.experiments import resolve_config

    raw = {"kind": "variants", "d": 3, "n": 6, "t1": 1.0, "dt": 0.1, "save_every": 1,
           "dtype": "float64", **kw}
    return resolve_config(raw)


def test_variants_config_checks():
    from jaxdyn.config import ConfigError
    from jaxdyn.experiments import get_kind

    kind = get_kind("variants")
    with pytest.raises(ConfigError, match="d: 384"):
        kind.check(_variants_cfg(depth={"source": "minilm"}))
    with pytest.raises(ConfigError, match="whole number of saved steps"):
        kind.check(_variants_cfg(depth={"source": "redraw", "period": 0.25}))
    with pytest.raises(ConfigError, match="2 heads"):
        kind.check(_variants_cfg(depth={"heads": 2}, head=2))
    with pytest.raises(ConfigError, match="init_tokens"):
        kind.check(_variants_cfg(init_tokens=True))
    with pytest.raises(ConfigError, match="norm"):
        _variants_cfg(norm="sandwich")
    with pytest.raises(ConfigError, match="sigma"):
        _variants_cfg(sigma=-0.1)


def test_variants_point_keys_and_layers():
    """Each point's noise key is reproducible and differs across the sweep (same seed); a
    redraw point's layer models are the ensemble's draws, period by period."""
    from jaxdyn.experiments.engine import point_config
    from jaxdyn.experiments.variants.run import noise_key, point_model

    cfg = _variants_cfg(depth={"source": "redraw", "period": 0.5},
                        weights={"ensemble": "gaussian", "seed": 3}, norm="preln")
    pcs = [point_config(cfg, {"sigma": s}) for s in (0.1, 0.2)]
    k = [np.asarray(jax.random.key_data(noise_key(p))) for p in pcs]
    assert not np.array_equal(k[0], k[1])
    np.testing.assert_array_equal(k[0], np.asarray(jax.random.key_data(noise_key(pcs[0]))))
    Q, _, _ = redrawn_weights(cfg["weights"], 3, 2)
    for layer in (0, 1):
        m = point_model(pcs[0], layer)
        assert m.placement == "preln"
        np.testing.assert_array_equal(m.field.Q[0], Q[layer])


@pytest.mark.slow
@pytest.mark.parametrize("config,sets", [
    ("variants_layernorm", ["n=32", "t1=4.0"]),
    ("noisy_metastability", ["n=16", "t1=4.0", "sweep.seed=[0]"]),
    ("minilm_heads", ["n=8", "t1=2.0", "sweep.head=[-1,3]"]),
])
def test_variant_configs_run_from_the_cli(config, sets, tmp_path):
    """The three configs from the CLI at reduced sizes (default-suite counterparts: the
    variants tests above, which check each piece)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if config == "minilm_heads":
        pytest.importorskip("safetensors")
        from jaxdyn.encoder import find_minilm

        try:
            find_minilm()
        except FileNotFoundError as e:
            pytest.skip(str(e))
    cmd = [sys.executable, "-m", "jaxdyn.cli", "run", str(root / "configs" / f"{config}.yaml"),
           "--out", str(tmp_path / "run"), "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert summary["results"]["per_point"]
