"""The cluster count over all particles (the radius graph of a k-d tree): planted clusters
counted exactly in float32 and float64, agreement with jaxdyn.clusters' δ-graph on small clouds,
a uniform cloud's components below the counted size, the dynamics study's count on planted
frames, and named refusals."""

import math

import numpy as np
import pytest

from jaxdyn import clusters
from jaxdyn import long_context as lc
from jaxdyn.experiments.long_context import run as lc_run
from jaxdyn.experiments.long_context.schema import GRAPH_MIN_SIZE
from jaxdyn.experiments.planning import resolve_config


def _unit(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _fibonacci(k):
    """k nearly evenly spread centres on S² (the Fibonacci lattice)."""
    i = np.arange(k) + 0.5
    z = 1 - 2 * i / k
    phi = math.pi * (1 + math.sqrt(5)) * i
    s = np.sqrt(1 - z * z)
    return np.stack([s * np.cos(phi), s * np.sin(phi), z], axis=1)


def _planted(rng, centres, per, spread, noise):
    """``per`` points a centre within an angle of about ``spread``, then ``noise`` uniform points."""
    k, d = centres.shape
    pts = _unit(np.repeat(centres, per, axis=0) + spread * rng.normal(size=(k * per, d)))
    return np.concatenate([pts, _unit(rng.normal(size=(noise, d)))])


def test_mean_spacing_and_radius():
    assert lc.mean_spacing(1000, 3) == pytest.approx(math.sqrt(4 * math.pi / 1000))
    assert lc.mean_spacing(1000, 2) == pytest.approx(2 * math.pi / 1000)
    assert lc.mean_spacing(1000, 4) == pytest.approx((2 * math.pi ** 2 / 1000) ** (1 / 3))
    assert lc.cluster_graph_radius(1000, 3) == pytest.approx(lc.mean_spacing(1000, 3) / 3)
    assert lc.cluster_graph_radius(1000, 3, 0.5) == pytest.approx(lc.mean_spacing(1000, 3) / 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_planted_caps_counted_exactly(dtype):
    """k tight caps at known, well separated centres plus uniform stragglers: exactly k clusters,
    holding the planted points (a straggler that lands within r of a cap joins it)."""
    rng = np.random.default_rng(0)
    k, per, noise = 200, 30, 2000
    centres = _fibonacci(k)  # neighbours ≈ √(4π/k) ≈ 0.25 apart
    x = _planted(rng, centres, per, 2e-3, noise).astype(dtype)
    n = len(x)
    r = lc.cluster_graph_radius(n, 3)  # ≈ 0.0069: the caps (spread 2e-3, 30 points) connect
    counts, frac = lc.graph_cluster_counts(x, r, min_size=per // 4)
    assert int(counts) == k
    # the caps and their reach r cover about 1% of the sphere: ~1% of the stragglers join them
    assert k * per / n <= float(frac) <= (k * per + 0.05 * noise) / n
    sizes = lc.graph_cluster_sizes(x, r)
    assert sizes.sum() == n and np.all(np.diff(sizes) <= 0)
    assert np.all(sizes[:k] >= per) and np.all(sizes[k:] < per // 4)
    # each counted cluster sits at its centre: the largest components' points are near one centre
    assert np.all(sizes[:k] <= per + 5)


def test_planted_arcs_on_the_circle_and_batched_frames():
    rng = np.random.default_rng(1)
    k, per = 40, 25
    ang = 2 * np.pi * np.arange(k) / k
    centres = np.stack([np.cos(ang), np.sin(ang)], axis=1)
    x = _planted(rng, centres, per, 1e-4, 300)
    uniform = _unit(rng.normal(size=x.shape))
    frames = np.stack([uniform, x]).astype(np.float32)  # (2, n, 2): before and after
    r = lc.cluster_graph_radius(len(x), 2)
    counts, frac = lc.graph_cluster_counts(frames, r, min_size=per // 4)
    assert counts.shape == (2,) and counts.dtype == np.int64
    assert counts[1] == k and frac[1] >= k * per / len(x)
    assert frac[0] < 0.1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_the_delta_graph_of_clusters(seed):
    """Points within chord r ⇔ ⟨x_i, x_j⟩ ≥ 1 − r²/2: the sizes equal cluster_masses' at δ = r²/2."""
    rng = np.random.default_rng(seed)
    centres = _unit(rng.normal(size=(12, 3)))
    x = _planted(rng, centres, 20, 0.05, 60)  # loose caps, some merged: a non-trivial graph
    r = 0.08
    sizes = lc.graph_cluster_sizes(x, r)
    masses = np.asarray(clusters.cluster_masses(x, r * r / 2))
    ref = np.rint(masses[masses > 0] * len(x)).astype(int)
    np.testing.assert_array_equal(np.sort(sizes), np.sort(ref))
    assert 1 < len(sizes) < len(x)


@pytest.mark.parametrize("seed", [0, 3])
def test_uniform_cloud_components_stay_below_the_counted_size(seed):
    """At r = h/3 a uniform cloud of 10⁵ points has at most a few components of GRAPH_MIN_SIZE
    points and none of 3 more: next to thousands of clusters, a negligible count."""
    rng = np.random.default_rng(seed)
    n = 100_000
    x = _unit(rng.normal(size=(n, 3))).astype(np.float32)
    sizes = lc.graph_cluster_sizes(x, lc.cluster_graph_radius(n, 3))
    assert sizes[0] < GRAPH_MIN_SIZE + 3
    counts, frac = lc.graph_cluster_counts(x, lc.cluster_graph_radius(n, 3), GRAPH_MIN_SIZE)
    assert counts <= 3 and frac < 1e-3


def test_named_refusals():
    x = np.zeros((10, 3))
    x[:, 0] = 1.0
    for args, msg in [((x, 0.0), "radius must be a finite number > 0"),
                      ((x, float("nan")), "radius"),
                      ((x[None], 0.1), r"one \(n, d\) cloud"),
                      ((np.ones((10, 3), int), 0.1), "floating"),
                      ((np.full((10, 3), np.nan), 0.1), "finite"),
                      ((np.ones(3), 0.1), r"\(..., n, d\)")]:
        with pytest.raises(ValueError, match=msg):
            lc.graph_cluster_sizes(*args)
    for size in (0, 2.5, True):
        with pytest.raises(ValueError, match="min_size must be an integer >= 1"):
            lc.graph_cluster_counts(x, 0.1, size)
    with pytest.raises(ValueError, match="factor"):
        lc.cluster_graph_radius(100, 3, -1.0)
    with pytest.raises(ValueError, match="n .the number of points"):
        lc.mean_spacing(0, 3)


def test_dynamics_count_all_on_planted_frames():
    """The dynamics study's count (count: all) on frames: 0 until the clusters hold
    formed_fraction of the particles, then their number; the minimum size from the prediction."""
    rng = np.random.default_rng(4)
    k, per = 60, 40
    cfg = resolve_config({"kind": "long_context", "study": "dynamics", "count": "all", "d": 3,
                          "n": k * per, "beta": {"scale": "power", "c": 0.05}})
    mode = 10  # the predicted count l(l+1)/(2√3) ≈ 31.8: clusters of ≥ ⌈0.25 · 2400/31.8⌉ = 19
    assert lc_run.graph_min_size(cfg, mode) == math.ceil(0.25 * k * per / lc.first_cluster_count(3, mode))
    planted = _planted(rng, _fibonacci(k), per, 1e-3, 0)
    half = planted.copy()
    half[: k * per // 2] = _unit(rng.normal(size=(k * per // 2, 3)))  # half the caps dissolved
    uniform = _unit(rng.normal(size=planted.shape))
    counts, held = lc_run._counts(cfg, np.stack([uniform, half, planted]), mode)
    assert list(counts) == [0, k // 2, k]
    assert held[0] == 0.0 and held[1] == pytest.approx(0.5, abs=0.01) and held[2] == 1.0
