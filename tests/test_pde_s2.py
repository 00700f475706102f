"""Particles ↔ density on S² (jaxdyn.pde): exact cell averages, sampling from cell averages,
the kernel density of a cloud on the grid, the W2 check's null level; slow: the ``s2`` mode of
the pde kind end to end."""

import math

import jax
import numpy as np
import pytest

from jaxdyn import pde

I3 = np.eye(3)


def _model(nl=8):
    return pde.SphereDensity(I3, I3, I3, 2.0, nl, 2 * nl)


def test_sphere_cell_averages_exact_for_polynomials():
    # the average of 1 is 1; of z = cos ϑ over a cell (uniform in cos ϑ by area) is (c0 + c1)/2;
    # of z³ it is (c0⁴ − c1⁴)/(4(c0 − c1)); of x = sinϑ cosφ a closed form in ϑ and φ
    m = _model()
    te = np.arange(m.n_lat + 1) * math.pi / m.n_lat
    pe = np.arange(m.n_lon + 1) * 2 * math.pi / m.n_lon
    c0, c1 = np.cos(te[:-1])[:, None], np.cos(te[1:])[:, None]
    np.testing.assert_allclose(pde.sphere_cell_averages(m, lambda p: np.ones(p.shape[:-1])), 1, atol=1e-15)
    np.testing.assert_allclose(pde.sphere_cell_averages(m, lambda p: p[..., 2]),
                               np.broadcast_to((c0 + c1) / 2, (m.n_lat, m.n_lon)), atol=1e-15)
    np.testing.assert_allclose(pde.sphere_cell_averages(m, lambda p: p[..., 2] ** 3),
                               np.broadcast_to((c0 ** 4 - c1 ** 4) / (4 * (c0 - c1)), (m.n_lat, m.n_lon)),
                               atol=1e-15)
    # ∫ sinϑ cosφ dA / A over the cell: (∫ sin²ϑ dϑ)(∫ cosφ dφ) / (Δφ (c0 − c1))
    t0, t1 = te[:-1][:, None], te[1:][:, None]
    sint = (t1 - t0) / 2 - (np.sin(2 * t1) - np.sin(2 * t0)) / 4
    cosp = (np.sin(pe[1:]) - np.sin(pe[:-1]))[None, :]
    want = sint * cosp / ((pe[1] - pe[0]) * (c0 - c1))
    # (sin ϑ = √(1 − z²) is smooth in z away from the poles: Gauss in z is then spectrally
    # accurate; in the two pole rows the square-root singularity leaves ~1e-4)
    got = pde.sphere_cell_averages(m, lambda p: p[..., 0])
    np.testing.assert_allclose(got[1:-1], want[1:-1], atol=1e-12)
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_sample_sphere_density_cells_and_uniform_by_area():
    m = _model()
    rng = np.random.default_rng(0)
    rho = np.where(rng.random(m.shape) < 0.2, 0.0, rng.random(m.shape))
    area = np.asarray(m.cell_measure)
    p = (rho * area).ravel() / (rho * area).sum()
    n = 40000
    x = pde.sample_sphere_density(jax.random.PRNGKey(1), m, rho, n)
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1, atol=1e-14)
    th = np.arccos(np.clip(x[:, 2], -1, 1))
    ph = np.mod(np.arctan2(x[:, 1], x[:, 0]), 2 * math.pi)
    i = np.minimum((th / (math.pi / m.n_lat)).astype(int), m.n_lat - 1)
    j = np.minimum((ph / (2 * math.pi / m.n_lon)).astype(int), m.n_lon - 1)
    counts = np.bincount(i * m.n_lon + j, minlength=p.size)
    assert np.all(counts[p == 0] == 0)  # never in an empty cell
    z = (counts - n * p) / np.sqrt(n * p * (1 - p) + 1e-300)
    assert np.max(np.abs(z[p > 0])) < 5, np.max(np.abs(z))
    # uniform by area inside the cells: the mean of cos ϑ given the cell is the midpoint in cos ϑ
    c0 = np.cos(i * math.pi / m.n_lat)
    c1 = np.cos((i + 1) * math.pi / m.n_lat)
    u = (x[:, 2] - c0) / (c1 - c0)  # uniform on [0, 1] within each cell
    assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / n) and abs((u ** 2).mean() - 1 / 3) < 5e-3
    with pytest.raises(ValueError, match="shape"):
        pde.sample_sphere_density(jax.random.PRNGKey(0), m, rho[:-1], 10)


def test_kde_sphere_is_a_density_and_w2_check_null_law_at_t0():
    m = _model(16)
    rho = pde.sphere_cell_averages(m, lambda p: np.exp(3 * (p[..., 0] - 1)))
    rho = rho / float(np.sum(rho * np.asarray(m.cell_measure)))
    x = pde.sample_sphere_density(jax.random.PRNGKey(2), m, rho, 400)
    k = pde.kde_sphere(x, m, 0.3)
    # each vMF kernel integrates to 1: the midpoint rule on the grid gives 1 to O(h²)
    assert abs(float(np.sum(k * np.asarray(m.cell_measure))) - 1) < 1e-2
    assert np.all(k >= 0)
    # at t = 0 the cloud is itself a sample of ρ: d_pρ and d_ρρ have the same law
    dp, dd = np.array([pde.w2_sphere_check(jax.random.PRNGKey(10 + s),
                                           pde.sample_sphere_density(jax.random.PRNGKey(50 + s), m, rho, 100),
                                           m, rho) for s in range(6)]).T
    assert 0.7 < dp.mean() / dd.mean() < 1.4, (dp, dd)
    with pytest.raises(ValueError, match="bandwidth"):
        pde.kde_sphere(x, m, 0.0)


@pytest.mark.slow  # default-suite counterparts: the three tests above
def test_pde_kind_s2_mode_end_to_end(tmp_path):
    from jaxdyn.experiments import run_experiment

    cfg = {"kind": "pde", "mode": "s2", "dtype": "float64", "beta": 2.0, "n_lat": 8, "t1": 0.5,
           "n_save": 3, "growth_k": 3, "particles": {"n": [20, 40], "repeats": [2], "times": [0.0, 0.5],
                                                   "dt": 0.1, "kde_bandwidth": 0.3}}
    res = run_experiment(cfg, tmp_path / "s2", progress=False, log=lambda *a: None)
    assert res.status == "ok"
    pt = res.summary["results"]["points"][0]
    assert pt["mass_error"] < 1e-12 and pt["min_rho"] >= 0
    assert set(pt["per_time"]) == {"t=0", "t=0.5"}
    assert {p.rsplit("/", 1)[-1] for p in res.figures} == {"s2_density_vs_kde.png", "s2_w2.png"}
