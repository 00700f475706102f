"""The block-sparse core shared by the local attention kernel and the multiscale W2 solver
(jaxdyn.kernels._sparse, jaxdyn.kernels._blocks): ball distances, the listed log-sum-exp
against dense log-sum-exps in float64 and float32, and a certified selection's skipped mass
against its bound."""

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

from jaxdyn.distances import _multiscale as M
from jaxdyn.kernels._blocks import balls, block_lists, neighbours, pack_lists
from jaxdyn.kernels._sparse import ball_distances, listed_lse


def _clusters(n, seed):
    rng = np.random.default_rng(seed)
    c = np.zeros((n, 3))
    c[:, 0] = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    x = c + 0.05 * rng.standard_normal((n, 3))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_ball_distances_bound_every_pair():
    """Every distance between points of two leaves lies between the balls' near and far."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((40, 16, 3)) * rng.random((40, 1, 1)) + rng.standard_normal((40, 1, 3))
    b = rng.standard_normal((30, 16, 3)) * rng.random((30, 1, 1)) + rng.standard_normal((30, 1, 3))
    ba, bb = balls(jnp.asarray(a)), balls(jnp.asarray(b))
    near, far = ball_distances(ba.centre[:, None, :], ba.radius[:, None], bb.centre[None],
                               bb.radius[None])
    d = np.linalg.norm(a[:, :, None, None, :] - b[None, None, :, :, :], axis=-1)  # (40,16,30,16)
    lo, hi = d.min(axis=(1, 3)), d.max(axis=(1, 3))
    assert np.all(np.asarray(near) <= lo + 1e-12) and np.all(hi <= np.asarray(far) + 1e-12)
    assert np.any(np.asarray(near) > 0)  # (not vacuous)


def test_pack_lists_reports_an_overflow_never_truncates_silently():
    """The list builder of both kernels: kept entries in order, the count past the capacity."""
    keep = np.array([[True, False, True, True], [False, False, False, False]])
    lists, counts = pack_lists(jnp.asarray(keep), jnp.asarray(np.arange(8).reshape(2, 4)), 2)
    assert np.asarray(counts).tolist() == [3, 0]  # 3 > 2 slots: the caller sees the overflow
    assert np.asarray(lists)[0].tolist() == [0, 2]
    full, n = block_lists(jnp.asarray(keep), 4)
    assert np.asarray(full).tolist() == [[0, 2, 3, 4], [4, 4, 4, 4]]  # padded with nb = 4


# float64 under -m slow: the float64 listed log-sum-exp against a masked dense one by default in
# tests/test_multiscale.py::test_sparse_lse_visits_exactly_the_listed_blocks
@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=pytest.mark.slow)])
def test_listed_lse_equals_the_dense_lse_of_the_listed_terms(dtype):
    """Random lists of different lengths: the listed log-sum-exp and, with a lower bound, the
    exact margins equal the dense ones over the listed blocks (float64 reference)."""
    rng = np.random.default_rng(1)
    block = 32
    x = M.make_blocks(rng.standard_normal((400, 3)), dtype, block)
    y = M.make_blocks(rng.standard_normal((350, 3)), dtype, block)
    nq, nk = x.centers.shape[0], y.centers.shape[0]
    keep = rng.random((nq, nk)) < 0.3
    keep[np.arange(nq), rng.integers(0, nk, nq)] = True
    lists = neighbours(keep, rng.random((nq, nk)))
    xp, yp = np.asarray(x.pts, np.float64), np.asarray(y.pts, np.float64)
    pot = np.where(np.asarray(y.valid), 0.3 * rng.standard_normal(yp.shape[0]), -np.inf)
    eps = 0.05
    mask = np.repeat(np.repeat(keep, block, axis=0), block, axis=1)
    terms = np.where(mask, pot[None, :] - ((xp[:, None] - yp[None]) ** 2).sum(-1), -np.inf)
    ref = eps * scipy.special.logsumexp(terms / eps, axis=1)
    low = np.where(np.asarray(x.valid), -np.inf, np.inf)
    got, marg = listed_lse(x.pts, y.pts, jnp.asarray(pot, dtype), jnp.asarray(eps, dtype),
                           jnp.asarray(lists), jnp.asarray(low, dtype), block=block)
    plain = listed_lse(x.pts, y.pts, jnp.asarray(pot, dtype), eps, jnp.asarray(lists),
                       block=block)
    assert np.array_equal(np.asarray(got), np.asarray(plain))  # one pass, the same sums
    # float32: terms of order 1 carry ~1e-7 of rounding: 1e-5 of ε here
    err = np.abs(np.asarray(got, np.float64) - ref) / eps
    assert err.max() <= (1e-4 if dtype == np.float32 else 1e-11), err.max()
    want = (terms - np.where(np.asarray(x.valid), ref, np.inf)[:, None])
    want = want.reshape(nq, block, nk, block).max(axis=(1, 3))
    want = np.take_along_axis(np.concatenate([want, np.full((nq, 1), -np.inf)], 1), lists, 1)
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(np.asarray(marg)))
    np.testing.assert_allclose(np.asarray(marg, np.float64)[fin], want[fin],
                               atol=1e-4 if dtype == np.float32 else 1e-11)


# both dtypes under -m slow (7.2 CPU-s in float32): a certified selection keeps every block that
# matters by default in tests/test_multiscale.py::test_selection_certified_for_a_transport_potential,
# the listed log-sum-exp by default in test_listed_lse_equals_the_dense_lse_of_the_listed_terms
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_certified_lists_skip_no_more_than_their_bound(dtype):
    """A certified selection (margin T) at small ε: the listed log-sum-exp is the dense one
    to the certificate's bound, the realised skipped mass within the bound."""
    block = 32
    x = _clusters(1500, seed=2)
    A, t = np.diag([1.0, 1.5, 0.7]), np.array([0.0, 0.02, 0.0])
    y = x @ A.T + t
    bx, by = M.make_blocks(x, dtype, block), M.make_blocks(y, dtype, block)
    xp, yp = np.asarray(bx.pts, np.float64), np.asarray(by.pts, np.float64)
    d = yp - t
    pot = np.where(np.asarray(by.valid),
                   (yp ** 2).sum(1) - (d @ np.linalg.inv(A) * d).sum(1), -np.inf)
    eps, margin = 2e-5, 20.0
    keep, _ = M.select(bx, by, jnp.asarray(pot, dtype), eps, margin, block)
    assert keep.mean() < 0.3  # (sparse: the check is not the dense pass)
    lists = neighbours(keep, keep.astype(float))
    got = np.asarray(listed_lse(bx.pts, by.pts, jnp.asarray(pot, dtype),
                                jnp.asarray(eps, dtype), jnp.asarray(lists), block=block),
                     np.float64)
    terms = pot[None, :] - ((xp[:, None] - yp[None]) ** 2).sum(-1)
    dense = eps * scipy.special.logsumexp(terms / eps, axis=1)
    valid = np.asarray(bx.valid)
    # the skipped share of every row's mass: at most (dropped terms) e^{-margin}
    skipped = -np.expm1(-(dense - got)[valid] / eps)  # 1 - e^{(listed - dense) / eps}
    bound = (~keep).sum(1).max() * block * np.exp(-margin)
    # float32: the log-sum-exps' rounding, ~1e-7 |R| / ε, beside the bound of ~1e-6
    rounding = 0.0 if dtype == np.float64 else 2e-7 * np.max(np.abs(dense)) / eps
    assert np.all(skipped <= bound + rounding + 1e-12), (skipped.max(), bound)
    assert np.all(skipped >= -rounding - 1e-12)
