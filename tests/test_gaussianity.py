"""The Gaussianity measurement: closed forms of its building blocks, invariances, exact
Gaussian clouds at the noise floor, known non-Gaussian maps clearly above it."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from conftest import tol

from jaxdyn.encoder._gaussianity import (
    GAUSSIANITY_METRICS,
    METRICS,
    effective_rank,
    gaussian_tokens,
    gaussianity_profile,
    measure_gaussianity,
    moments,
    nongaussian_stack,
    projected_moments,
    random_directions,
    sliced_w2,
    sort_columns,
)

# The clouds of the statistical tests. Every profile below uses these sizes and options
# (4 layers of N points in R^D), so the jitted measurement compiles once per dtype. The z-scores
# are in units of the floor's own sampling spread, so "at the floor" (|z| < 4) and the exact
# identities (invariances, the mask, closed forms) do not depend on N; the measurement's cost
# grows with it. Measured at N = 512: largest |z| of exact Gaussians 2.5 (float64) and 2.2
# (float32), smallest Bures z of the layer changes 95, the encoder's input erank 15.8 of 16.
N, D = 512, 16
KW = dict(n_dirs=64, n_floor=16, n_pc=3)
# The non-Gaussian controls: twice as many points, so that the weakest signal flagged under
# -m slow (the split map's kurt_pc) stays clear of the z > 10 line (measured z = 10.9 at 2048
# points, 5.1 at 1024).
N_CONTROL = 2048

# The building blocks as the profile runs them: jitted (one program a shape and dtype; op by op
# each of their small ops compiles on its own)
_sliced_w2 = jax.jit(sliced_w2)
_projected_moments = jax.jit(projected_moments)
_effective_rank = jax.jit(effective_rank)
_moments = jax.jit(moments)


# ---------------------------------------------------------------------------------------
# Building blocks


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_sort_columns_is_a_sort(dtype):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(257, 5)).astype(dtype) * np.array([1e-30, 1e-3, 1.0, 1e3, 1e30], dtype)
    a[0, 0], a[1, 0], a[2, 1], a[3, 1], a[4, 2] = -0.0, 0.0, np.inf, -np.inf, 0.0
    np.testing.assert_array_equal(np.asarray(sort_columns(jnp.asarray(a))), np.sort(a, axis=0))


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_sliced_w2_of_a_translation(dtype):
    # Every projection is shifted by θ·c, so SW2² = mean_k (θ_k·c)² exactly.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 6)).astype(dtype)
    c = np.array([1.0, -2.0, 0.5, 0.0, 3.0, 1.0], dtype)
    dirs = random_directions(jax.random.PRNGKey(0), 6, 40, dtype)
    expected = math.sqrt(np.mean((np.asarray(dirs, np.float64).T @ c.astype(np.float64)) ** 2))
    got = _sliced_w2(jnp.asarray(x), jnp.asarray(x + c), dirs)
    assert got.dtype == dtype
    np.testing.assert_allclose(float(got), expected, rtol=tol(dtype, 1e-5, 1e-12))
    # A relabelling of the points is at distance 0.
    perm = rng.permutation(300)
    assert float(_sliced_w2(jnp.asarray(x), jnp.asarray(x[perm]), dirs)) == 0.0
    np.testing.assert_allclose(np.linalg.norm(np.asarray(dirs), axis=0), 1.0, rtol=tol(dtype, 1e-6, 1e-14))


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_sliced_w2_one_dimensional_closed_form(dtype):
    # d = 1: directions are ±1 and SW2 is the 1-D W2 of sorted samples.
    x = np.array([[0.0], [1.0], [5.0]], dtype)
    y = np.array([[2.0], [-1.0], [3.0]], dtype)  # sorted: -1, 2, 3
    dirs = jnp.asarray(np.array([[1.0, -1.0]], dtype))
    expected = math.sqrt((1.0 + 1.0 + 4.0) / 3.0)
    np.testing.assert_allclose(float(_sliced_w2(jnp.asarray(x), jnp.asarray(y), dirs)), expected, rtol=1e-6)


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_projected_moments_closed_forms(dtype):
    # Two atoms ±a along e1 (and anything symmetric elsewhere): g1 = 0, g2 = 1 − 3 = −2.
    x = np.array([[2.0, 1.0], [-2.0, -1.0], [2.0, -1.0], [-2.0, 1.0]], dtype)
    e1 = jnp.asarray(np.array([[1.0], [0.0]], dtype))
    g1, g2 = _projected_moments(jnp.asarray(x), e1)
    np.testing.assert_allclose(np.asarray(g1), 0.0, atol=1e-7)
    np.testing.assert_allclose(np.asarray(g2), -2.0, rtol=1e-6)
    # Bernoulli(p) centred: g1 = (1 − 2p)/sqrt(p q), g2 = (1 − 6 p q)/(p q); p = 1/4.
    p, q = 0.25, 0.75
    b = np.array([1.0, 0.0, 0.0, 0.0] * 5, np.float64)
    xc = (b - b.mean()).astype(dtype)[:, None]
    g1, g2 = _projected_moments(jnp.asarray(xc), jnp.ones((1, 1), dtype))
    np.testing.assert_allclose(float(g1[0]), (1 - 2 * p) / math.sqrt(p * q), rtol=tol(dtype, 1e-5, 1e-12))
    np.testing.assert_allclose(float(g2[0]), (1 - 6 * p * q) / (p * q), rtol=tol(dtype, 1e-5, 1e-12))


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_effective_rank_closed_forms(dtype):
    def er(lam):
        a, b = _effective_rank(jnp.asarray(np.array(lam, dtype)))
        return float(a), float(b)

    r = tol(dtype, 1e-5, 1e-12)
    np.testing.assert_allclose(er([2.0, 2.0, 2.0, 0.0, 0.0]), [3.0, 3.0], rtol=r)
    np.testing.assert_allclose(er([0.0, 0.0, 5.0]), [1.0, 1.0], rtol=r)
    # p = (1/2, 1/4, 1/4): entropy 1.5 log 2 → 2^1.5; PR = 1 / Σp² = 8/3.
    np.testing.assert_allclose(er([1.0, 2.0, 1.0]), [2.0**1.5, 8.0 / 3.0], rtol=r)
    np.testing.assert_allclose(er([1.0, -1e-7, 1.0]), [2.0, 2.0], rtol=r)  # rounding negatives


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_moments_match_numpy(dtype):
    x = np.random.default_rng(2).normal(size=(500, 4)) @ np.diag([1.0, 2.0, 3.0, 0.1])
    x = x.astype(dtype)
    m, c = _moments(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(m), x.astype(np.float64).mean(0), atol=tol(dtype, 1e-5, 1e-13))
    np.testing.assert_allclose(
        np.asarray(c), np.cov(x.astype(np.float64).T, bias=True), atol=tol(dtype, 1e-4, 1e-12)
    )


# ---------------------------------------------------------------------------------------
# The profile: structure, exact values, invariances


def _gaussian_layers(dtype, n=N, d=D):
    """Four exact Gaussian clouds: isotropic, anisotropic and shifted, rank-deficient, tiny."""
    rng = np.random.default_rng(3)
    z = rng.normal(size=(4, n, d))
    a = rng.normal(size=(d, d)) / math.sqrt(d)
    proj = np.eye(d)
    proj[-1, -1] = proj[-2, -2] = 0.0  # rank d − 2, like post-LN clouds (rank d − 1)
    layers = [z[0], z[1] @ a + 3.0, z[2] @ (a @ proj), 1e-3 * z[3] @ np.diag(np.linspace(0.1, 2.0, d))]
    return [jnp.asarray(x.astype(dtype)) for x in layers]


class _ByDtype(dict):
    """The profiles of the exact Gaussian layers, computed for a dtype when first asked (the
    default suite reads only float64's: float32's run is not paid for there)."""

    def __missing__(self, dt):
        self[dt] = gaussianity_profile(_gaussian_layers(dt), jax.random.PRNGKey(5), **KW)
        return self[dt]


@pytest.fixture(scope="module")
def gauss_profiles():
    return _ByDtype()


@pytest.mark.slow_dtype("f64")  # the model's own dtype (f32) in the default suite, f64 under -m slow
@pytest.mark.slow
def test_profile_structure(gauss_profiles, dtype):
    prof = gauss_profiles[dtype]
    assert set(prof.values) == set(METRICS) == set(prof.floors)
    for k in METRICS:
        n_l = 3 if k.startswith("bures") else 4
        assert prof.values[k].shape == (n_l,), k
        assert prof.floors[k].shape == (16, n_l), k
        assert prof.values[k].dtype == dtype, k
        assert np.all(np.isfinite(np.asarray(prof.values[k]))), k
        assert np.all(np.asarray(prof.floor_std[k]) > 0), k
    assert (prof.n_points, prof.dim, prof.n_dirs) == (N, D, KW["n_dirs"])
    d = prof.to_dict()
    assert set(d["sw2"]) == {"value", "floor_mean", "floor_std"} and len(d["sw2"]["value"]) == 4
    assert "sw2" in prof.table()
    with pytest.raises(ValueError, match="name"):
        prof.zscore("nope")


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_exact_gaussians_sit_at_the_floor(gauss_profiles, dtype):
    prof = gauss_profiles[dtype]
    for k in GAUSSIANITY_METRICS:
        z = np.asarray(prof.zscore(k))
        assert np.all(np.abs(z) < 4.0), (k, z)


@pytest.mark.filterwarnings("ignore::scipy.linalg.LinAlgWarning")  # singular Σ on purpose
@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_profile_descriptors_and_bures_are_exact(gauss_profiles, dtype):
    # scale, erank, pr and the consecutive-layer Bures distance, recomputed in float64 with
    # NumPy/SciPy from the same clouds (scipy.linalg.sqrtm, an independent square root).
    prof = gauss_profiles[dtype]
    clouds = [np.asarray(x, np.float64) for x in _gaussian_layers(dtype)]
    mom = [(x.mean(0), np.cov(x.T, bias=True)) for x in clouds]
    r = tol(dtype, 2e-4, 1e-9)
    for i, (m, c) in enumerate(mom):
        lam = np.clip(np.linalg.eigvalsh(c), 0, None)
        p = lam / lam.sum()
        ent = -np.sum(p[p > 0] * np.log(p[p > 0]))
        np.testing.assert_allclose(float(prof.values["erank"][i]), math.exp(ent), rtol=r)
        np.testing.assert_allclose(float(prof.values["pr"][i]), lam.sum() ** 2 / (lam**2).sum(), rtol=r)
        np.testing.assert_allclose(float(prof.values["scale"][i]), math.sqrt(np.trace(c) / D), rtol=r)
    for i in range(3):
        (m0, c0), (m1, c1) = mom[i], mom[i + 1]
        r1 = np.real(scipy.linalg.sqrtm(c1))
        cross = np.trace(np.real(scipy.linalg.sqrtm(r1 @ c0 @ r1)))
        w2 = math.sqrt(max(np.sum((m0 - m1) ** 2) + np.trace(c0) + np.trace(c1) - 2 * cross, 0.0))
        np.testing.assert_allclose(float(prof.values["bures"][i]), w2, rtol=tol(dtype, 1e-3, 1e-7))
        rel = w2 / math.sqrt(0.5 * (np.trace(c0) + np.trace(c1)))
        np.testing.assert_allclose(float(prof.values["bures_rel"][i]), rel, rtol=tol(dtype, 1e-3, 1e-7))
    # The layer-to-layer changes are far above the sampling noise of the Bures distance.
    assert np.all(np.asarray(prof.zscore("bures")) > 10)


@pytest.mark.slow_dtype("f32")  # dtype-independent check: f64 (tighter) in the default suite, f32 under -m slow
def test_profile_is_affine_invariant(dtype):
    # Scaling and translating every point leaves the normalised metrics unchanged (the
    # Gaussian reference and floor samples scale with the cloud for a fixed key).
    rng = np.random.default_rng(7)
    cube = rng.normal(size=(N, D)) ** 3
    scales = np.linspace(1.0, 3.0, D)
    xs = [cube, cube[:, ::-1] * scales, rng.normal(size=(N, D)), np.abs(cube)]  # 4 layers
    xs = [x.astype(dtype) for x in xs]
    key = jax.random.PRNGKey(8)
    a = gaussianity_profile([jnp.asarray(x) for x in xs], key, **KW)
    shift = np.arange(D, dtype=dtype)
    b = gaussianity_profile([jnp.asarray(7.0 * x + shift) for x in xs], key, **KW)
    r = tol(dtype, 2e-3, 1e-8)
    for k in ("sw2", "skew", "kurt", "skew_pc", "kurt_pc", "radial_w2", "erank", "pr", "bures_rel"):
        for field in ("values", "floors"):
            got, want = np.asarray(getattr(b, field)[k]), np.asarray(getattr(a, field)[k])
            np.testing.assert_allclose(got, want, rtol=r, atol=r * 1e-2, err_msg=f"{field} {k}")
    np.testing.assert_allclose(np.asarray(b.values["scale"]), 7.0 * np.asarray(a.values["scale"]), rtol=r)


def test_mask_pools_only_real_tokens():
    # N/128 + 1 sequences of 128 tokens, 128 of them padding: N real tokens (the shared shapes).
    rng = np.random.default_rng(9)
    h = rng.normal(size=(4, N // 128 + 1, 128, D)).astype(np.float32)  # (layers, batch, seq, d)
    mask = np.ones((N // 128 + 1, 128), bool)
    mask[3, 100:] = mask[1, 50:] = mask[0, :22] = False  # 28 + 78 + 22 = 128 pads
    assert mask.sum() == N
    h_bad = h.copy()
    h_bad[:, ~mask] = 1e6  # garbage in the padding
    key = jax.random.PRNGKey(0)
    a = gaussianity_profile(jnp.asarray(h_bad), key, mask=mask, **KW)
    b = gaussianity_profile([jnp.asarray(x[mask]) for x in h], key, **KW)
    for k in METRICS:
        np.testing.assert_allclose(np.asarray(a.values[k]), np.asarray(b.values[k]), rtol=1e-6, err_msg=k)
    assert a.n_points == N


def test_effective_rank_of_a_nan_spectrum_is_nan():
    # (the where on p > 0 read NaN as 0: erank 1, a "full collapse")
    er, pr = _effective_rank(jnp.asarray([jnp.nan, 1.0, 2.0]))
    assert np.isnan(float(er)) and np.isnan(float(pr))
    er, _ = _effective_rank(jnp.asarray([1.0, 1.0, 0.0]))
    assert float(er) == pytest.approx(2.0)


def test_profile_errors():
    x = jnp.zeros((3, 50, 4), jnp.float32)
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="n_floor"):
        gaussianity_profile(x, key, n_floor=2)  # (2: both Bures pairs the same pair)
    with pytest.raises(ValueError, match="n_pc"):
        gaussianity_profile(x, key, n_pc=5)
    with pytest.raises(ValueError, match="hidden_states"):
        gaussianity_profile(jnp.zeros((50, 4)), key)
    with pytest.raises(ValueError, match="one shape"):
        gaussianity_profile([jnp.zeros((50, 4)), jnp.zeros((40, 4))], key)
    with pytest.raises(ValueError, match="mask"):
        gaussianity_profile(jnp.zeros((2, 3, 4, 5)), key, mask=np.ones((3, 3)))
    with pytest.raises(ValueError, match="floating"):
        gaussianity_profile(jnp.zeros((2, 50, 4), jnp.int32), key)


# ---------------------------------------------------------------------------------------
# Known non-Gaussian maps are flagged


@pytest.fixture(scope="module")
def control_stacks():
    """The three controls on a Gaussian input of scale 2.5: (h0, {kind: stack})."""
    h0 = gaussian_tokens(jax.random.PRNGKey(11), 16, N_CONTROL // 16, D, 2.5, jnp.float32)
    return h0, {kind: nongaussian_stack(h0, jax.random.PRNGKey(12), n_layers=3, kind=kind)
                for kind in ("cube", "relu", "split")}


@pytest.fixture(scope="module")
def control_profiles(control_stacks):
    """The controls and their profiles: (h0, {kind: (stack, profile)})."""
    h0, stacks = control_stacks
    return h0, {kind: (hs, gaussianity_profile(hs, jax.random.PRNGKey(13), **KW))
                for kind, hs in stacks.items()}


@pytest.mark.parametrize(
    "kind,metrics",
    [
        ("cube", ("sw2", "kurt", "kurt_pc", "radial_w2")),  # heavy tails
        ("relu", ("skew", "radial_w2")),  # skewed, mass on hyperplanes (isotropic Σ: no PCs)
        ("split", ("kurt_pc", "sw2")),  # bimodal along one axis
    ],
)
@pytest.mark.slow
def test_nongaussian_maps_are_flagged(control_profiles, kind, metrics):
    _, prof = control_profiles[1][kind]
    for k in GAUSSIANITY_METRICS:  # the Gaussian input (layer 0) is at the floor
        assert abs(float(prof.zscore(k)[0])) < 4.0, (kind, k)
    for k in metrics:  # every layer applies the map once: all are flagged
        z = np.asarray(prof.zscore(k)[1:])
        assert np.all(z > 10.0), (kind, k, z)


def test_nongaussian_stack_keeps_the_scale(control_stacks):
    h0, out = control_stacks
    assert h0.shape == (16, N_CONTROL // 16, D)
    np.testing.assert_allclose(float(jnp.std(h0)), 2.5, rtol=0.02)
    rms = float(jnp.sqrt(jnp.mean(h0**2)))
    for kind, hs in out.items():
        assert len(hs) == 4
        np.testing.assert_array_equal(np.asarray(hs[0]), np.asarray(h0))
        for h in hs[1:]:
            assert h.shape == h0.shape and h.dtype == h0.dtype
            np.testing.assert_allclose(float(jnp.sqrt(jnp.mean(h**2))), rms, rtol=1e-5)
        assert not np.allclose(np.asarray(hs[1]), np.asarray(hs[2]))  # fresh rotation per layer
    with pytest.raises(ValueError, match="kind"):
        nongaussian_stack(h0, jax.random.PRNGKey(1), kind="tanh")


def test_measure_gaussianity_on_a_small_encoder():
    from jaxdyn.encoder._bert import BertConfig, init_bert

    cfg = BertConfig(
        hidden_size=D, num_attention_heads=2, intermediate_size=32, num_hidden_layers=3, vocab_size=10
    )
    params = init_bert(cfg, jax.random.PRNGKey(0))
    key = jax.random.PRNGKey(1)
    res = measure_gaussianity(params, cfg, key, scales=(0.5, 2.0), batch=16, seq=N // 16, **KW)
    assert sorted(res) == [0.5, 2.0]
    for s, prof in res.items():
        assert prof.values["sw2"].shape == (4,) and prof.n_points == N
        # Layer 0 is the input N(0, s² I): its scale is s, its spectrum nearly flat.
        np.testing.assert_allclose(float(prof.values["scale"][0]), s, rtol=0.05)
        assert float(prof.values["erank"][0]) > 0.9 * D
        for k in GAUSSIANITY_METRICS:
            assert abs(float(prof.zscore(k)[0])) < 4.0, (s, k)
        # After a post-LN layer with γ = 1, β = 0 every token has mean 0 and unit variance
        # over features, so tr Σ/d + |m|²/d = 1.
        assert float(prof.values["scale"][1]) <= 1.0 + 1e-5
