"""The local (block-sparse) attention kernel against the dense one, against its own certificate,
and through jit, vmap and reverse mode.

The clouds here are built for this file (none of the other tests' clouds): uniform points on
S², a mixture of tight von Mises–Fisher clusters, one tight cluster in a uniform background,
points on a great circle, and a cloud of exact duplicates. The guarantee checked at every
query: ``|m_i − m_i^dense| ≤ bound_i · max_j |y_j| ≤ tol · max_j |y_j|``, and the true skipped
mass (from the dense weights) never above the certified ``mass_i``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn.kernels import _blocks, _local

N = 2048  # one shape for every cloud of the float64 checks: one compiled program
TOL = 1e-6


def _unit(a):
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _cloud(kind, n=N, d=3, seed=11):
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return _unit(rng.normal(size=(n, d)))
    if kind == "clustered":  # eight tight vMF-like clusters
        centres = _unit(rng.normal(size=(8, d)))
        pick = rng.integers(0, 8, size=n)
        return _unit(centres[pick] + 0.03 * rng.normal(size=(n, d)))
    if kind == "cluster_in_background":  # a quarter in one tight cluster, the rest uniform
        k = n // 4
        c = _unit(rng.normal(size=(1, d)))
        return np.concatenate([_unit(c + 0.005 * rng.normal(size=(k, d))),
                               _unit(rng.normal(size=(n - k, d)))])[rng.permutation(n)]
    if kind == "great_circle":
        ang = rng.uniform(0, 2 * np.pi, size=n)
        x = np.zeros((n, d))
        x[:, 0], x[:, 1] = np.cos(ang), np.sin(ang)
        rot = np.linalg.qr(rng.normal(size=(d, d)))[0]
        return x @ rot.T
    if kind == "duplicates":  # 64 distinct points, each 32 times
        base = _unit(rng.normal(size=(n // 32, d)))
        return np.repeat(base, 32, axis=0)[rng.permutation(n)]
    raise ValueError(kind)


def _dense64(x, y, B, beta):
    """The softmax average in float64 NumPy (the reference), and its weights."""
    x, y, B = (np.asarray(a, np.float64) for a in (x, y, B))
    logits = beta * (x @ B) @ y.T
    logits -= logits.max(axis=1, keepdims=True)
    w = np.exp(logits)
    w /= w.sum(axis=1, keepdims=True)
    return w @ y, w


@jax.jit
def _local64(x, B, beta):
    return jaxdyn.local_interaction(x, x, B, beta, tol=TOL)


CLOUDS = ["uniform", "clustered", "cluster_in_background", "great_circle", "duplicates"]


@pytest.mark.parametrize("kind", CLOUDS)
def test_local_meets_its_certificate_at_every_query(kind):
    x = _cloud(kind)
    B = np.eye(3) + 0.2 * np.random.default_rng(5).normal(size=(3, 3))  # a general B = QᵀK
    beta = 3000.0
    out, st = _local64(jnp.asarray(x), jnp.asarray(B), beta)
    ref, _ = _dense64(x, x, B, beta)
    err = np.linalg.norm(np.asarray(out) - ref, axis=1) / np.abs(x).max()
    bound = np.asarray(st.bound)
    assert not bool(st.overflow) and not bool(st.dense)
    assert np.all(bound <= TOL)
    # the certificate: every query's error below its own bound (plus float64 rounding)
    assert np.all(err <= bound + 1e-12), (err - bound).max()
    assert np.all(err <= TOL)
    assert float(st.visited) < 1.0  # something was skipped


def test_the_true_skipped_mass_never_exceeds_the_certified_mass():
    # values = the identity: out_ij > 0 exactly on the keys the kernel visited for query i, so
    # the dense weights give the mass it skipped, Σ_skipped w_ij / Σ_visited w_ij (a loose
    # tolerance, so that the skipped mass is far above rounding)
    x = _cloud("cluster_in_background")
    beta, tol = 3000.0, 1e-3
    out, st = jax.jit(lambda q, x, v: _local.local_attention(q, x, v, self_keys=True, tol=tol))(
        jnp.asarray(beta * x), jnp.asarray(x), jnp.eye(N))
    _, w = _dense64(x, x, np.eye(3), beta)
    visited = np.asarray(out) > 0
    skipped = np.sum(np.where(visited, 0.0, w), axis=1) / np.sum(np.where(visited, w, 0.0), axis=1)
    mass = np.asarray(st.mass)
    # (below the smallest normal float64 a bound's exponentials underflow to 0)
    assert np.all(skipped <= mass * (1 + 1e-9) + 1e-300)
    assert np.all(mass <= tol / 2)
    assert np.max(skipped) > 1e-12  # keys with mass were skipped, and it is accounted for
    assert np.all(visited.sum(axis=1) < N)


# S¹ and S³ under -m slow (one compiled program each); R³ cross attention is the default case
@pytest.mark.parametrize("d, kind", [pytest.param(2, "uniform", marks=pytest.mark.slow),
                                     pytest.param(4, "uniform", marks=pytest.mark.slow),
                                     (3, "gaussian")], ids=["S1", "S3", "R3"])
def test_other_spaces_and_cross_attention(d, kind):
    # S¹ and S³ take their own curves, Gaussian points in R³ the box's; queries apart from keys
    rng = np.random.default_rng(d)
    if kind == "gaussian":
        y = rng.normal(size=(N, d))
        x = rng.normal(size=(N // 2, d))
        B, beta = np.eye(d), 4.0
    else:
        y, x = _cloud(kind, d=d), _cloud(kind, n=N // 2, d=d, seed=3)
        B, beta = np.eye(d), 400.0
    out, st = jax.jit(lambda x, y: jaxdyn.local_interaction(x, y, jnp.asarray(B), beta,
                                                            tol=TOL))(jnp.asarray(x),
                                                                      jnp.asarray(y))
    ref, _ = _dense64(x, y, B, beta)
    err = np.linalg.norm(np.asarray(out) - ref, axis=1) / np.abs(y).max()
    assert not bool(st.dense)
    assert np.all(err <= np.asarray(st.bound) + 1e-12)
    assert np.all(err <= TOL)


@pytest.mark.slow  # an expensive second dtype (5.5 CPU-s); not in the default suite: the float32 local kernel's error (float64: the certificate tests)
def test_float32_error_is_the_bound_plus_rounding():
    x32 = jnp.asarray(_cloud("clustered"), jnp.float32)
    beta = 3000.0
    out, st = jax.jit(lambda x: jaxdyn.local_interaction(x, x, jnp.eye(3, dtype=jnp.float32),
                                                         beta, tol=TOL))(x32)
    assert out.dtype == jnp.float32
    ref, _ = _dense64(np.asarray(x32), np.asarray(x32), np.eye(3), beta)
    err = np.linalg.norm(np.asarray(out, np.float64) - ref, axis=1)
    # float32 logits of size β carry rounding of order β · eps; the float32 blocked kernel
    # makes the same error, so compare with it too
    blk = jaxdyn.interaction(x32, x32, jnp.eye(3, dtype=jnp.float32), beta, kernel="blocked")
    err_blocked = np.linalg.norm(np.asarray(blk, np.float64) - ref, axis=1)
    assert np.all(np.asarray(st.bound) <= TOL)
    assert np.max(err) <= np.max(err_blocked) + TOL + 1e-5


def test_gradients_match_the_blocked_kernel():
    x = jnp.asarray(_cloud("clustered", n=1024))
    B = jnp.eye(3) + 0.1 * jnp.asarray(np.random.default_rng(2).normal(size=(3, 3)))
    c = jnp.asarray(np.random.default_rng(3).normal(size=(1024, 3)))

    def loss(kernel):
        def f(x, B, beta):
            if kernel == "auto":  # the choice kernel="auto" makes (a branch on the spread)
                m = jaxdyn.local_interaction(x, x, B, beta, tol=1e-12, max_visited=0.25)[0]
            else:
                m = jaxdyn.interaction(x, x, B, beta, kernel=kernel, tol=1e-12)
            return jnp.sum(m * c)
        return jax.value_and_grad(f, argnums=(0, 1, 2))

    # the three kernels' values and gradients as one compiled program (it compiles in about
    # two thirds of the CPU time of three separate ones)
    kernels = ("blocked", "local", "auto")
    out = jax.jit(lambda x, B, beta: [loss(k)(x, B, beta) for k in kernels])(x, B, 800.0)
    v2, g2 = out[0]
    for kernel, (v1, g1) in zip(kernels[1:], out[1:]):
        np.testing.assert_allclose(v1, v2, rtol=1e-11, err_msg=kernel)
        for a, b in zip(g1, g2):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9 * np.max(np.abs(np.asarray(b))),
                                       err_msg=kernel)


@pytest.mark.slow  # 6 CPU-s, its own vmapped program; not in the default suite: vmap over β (jit and reverse mode: test_gradients_match_the_blocked_kernel)
def test_vmap_over_beta_and_the_auto_choice():
    x = jnp.asarray(_cloud("uniform"))
    betas = jnp.asarray([5.0, 3000.0])
    out, st = jax.jit(jax.vmap(lambda b: jaxdyn.local_interaction(x, x, jnp.eye(3), b,
                                                                  tol=TOL)))(betas)
    for i, b in enumerate([5.0, 3000.0]):
        ref, _ = _dense64(np.asarray(x), np.asarray(x), np.eye(3), b)
        assert np.max(np.abs(np.asarray(out[i]) - ref)) <= TOL
    # each member's lists are its own (those of β = 3000 shorter)
    for i, b in enumerate([5.0, 3000.0]):
        alone = _local64(x, jnp.eye(3), b)[1]  # the certificate tests' program
        assert float(st.visited[i]) == float(alone.visited)
    assert float(st.visited[0]) > float(st.visited[1])


@pytest.mark.slow  # the dense answer equal to the blocked kernel's by default: test_an_overflow_is_answered_or_reported_never_truncated; the auto branch: test_gradients_match_the_blocked_kernel
def test_the_auto_choice_answers_wide_lists_with_the_blocked_kernel():
    x = jnp.asarray(_cloud("uniform"))
    # max_visited (what kernel="auto" sets): the blocked kernel answers the wide lists
    # at β = 5 no row's logits spread over 2β = 10 < log(2 / tol): nothing can be skipped and
    # the blocked kernel answers before any ordering (visited and listed 1); at β = 80 the
    # lists are built and found too wide
    for b, screened in ((5.0, True), (80.0, False)):
        o, s = jaxdyn.local_interaction(x, x, jnp.eye(3), b, max_visited=0.25)
        assert bool(s.dense)
        assert (float(s.listed) == 1.0) == screened
        np.testing.assert_allclose(o, jaxdyn.interaction(x, x, jnp.eye(3), b, kernel="blocked"),
                                   rtol=1e-12, atol=1e-14)


@pytest.mark.slow  # default counterparts: the two tests above (vmap over β; the auto choice)
def test_under_vmap_the_auto_choice_is_one_branch_for_every_member():
    x = jnp.asarray(_cloud("uniform"))
    betas = jnp.asarray([5.0, 3000.0])
    # under vmap one member that can skip keys makes every member build its lists
    out, s = jax.vmap(lambda b: jaxdyn.local_interaction(x, x, jnp.eye(3), b,
                                                         max_visited=0.25))(betas)
    assert float(s.listed[1]) < float(s.listed[0]) == 1.0
    for i, b in enumerate([5.0, 3000.0]):
        ref, _ = _dense64(np.asarray(x), np.asarray(x), np.eye(3), b)
        assert np.max(np.abs(np.asarray(out[i]) - ref)) <= TOL


def test_an_overflow_is_answered_or_reported_never_truncated():
    x = jnp.asarray(_cloud("uniform", n=1024))
    out, st = jaxdyn.local_interaction(x, x, jnp.eye(3), 50.0, capacity=1)
    assert bool(st.overflow) and bool(st.dense)
    np.testing.assert_allclose(out, jaxdyn.interaction(x, x, jnp.eye(3), 50.0, kernel="blocked"),
                               rtol=1e-12, atol=1e-14)


@pytest.mark.slow  # default counterpart: the overflow answered by the blocked kernel above
def test_an_overflow_can_be_reported_as_nan():
    x = jnp.asarray(_cloud("uniform", n=1024))
    q = 50.0 * x
    out, st = jax.jit(lambda q, x: _local.local_attention(q, x, x, self_keys=True, capacity=1,
                                                          on_overflow="nan"))(q, x)
    assert bool(st.overflow) and bool(jnp.all(jnp.isnan(out)))


@pytest.mark.slow  # 16 CPU-s (the model's step and a simulate program); not in the default suite: models forwarding kernel='local' and simulate's record_local statistics (the kernel itself: the certificate tests)
def test_models_take_the_local_kernel_and_simulate_records_its_certificate():
    x = jnp.asarray(_cloud("uniform", n=1024))
    eye = jnp.eye(3)
    loc = jaxdyn.SphereAttention(eye, eye, eye, 2000.0, kernel="local", tol=TOL)
    den = jaxdyn.SphereAttention(eye, eye, eye, 2000.0, kernel="dense")
    assert float(jnp.max(jnp.abs(loc(0.0, x) - den(0.0, x)))) <= 2 * TOL
    tr = jaxdyn.simulate(loc, x, t1=0.2, dt=0.05, method="euler", record_local=True)
    assert tr.stats["local_bound"].shape == tr.ts.shape
    assert float(jnp.max(tr.stats["local_bound"])) <= TOL
    assert not bool(jnp.any(tr.stats["local_dense"]))


@pytest.mark.slow  # one compiled program each; default counterparts: the sphere model above and
# the R³ cross-attention case of test_other_spaces_and_cross_attention
def test_multihead_and_euclidean_models_take_the_local_kernel():
    x = jnp.asarray(_cloud("uniform", n=1024))
    eye = jnp.eye(3)
    Q = jnp.asarray(np.random.default_rng(4).normal(size=(2, 3, 3)))
    heads = [jaxdyn.MultiHeadAttention(Q, Q, jnp.stack([eye, eye]), 40.0, kernel=k)
             for k in ("local", "dense")]
    assert float(jnp.max(jnp.abs(heads[0](0.0, x) - heads[1](0.0, x)))) <= 4 * TOL
    y = jnp.asarray(np.random.default_rng(6).normal(size=(1024, 3)))
    euc = [jaxdyn.EuclideanAttention(-eye, 3 * eye, eye, kernel=k) for k in ("local", "dense")]
    assert float(jnp.max(jnp.abs(euc[0](0.0, y) - euc[1](0.0, y)))) <= 2 * TOL * float(
        jnp.max(jnp.abs(y)))


@pytest.mark.parametrize("make, match", [
    (lambda e: jaxdyn.SphereAttention(e, e, e, 1.0, kernel="local", normalization="hardmax"),
     "softmax weights only"),
    (lambda e: jaxdyn.SphereAttention(e, e, e, 1.0, kernel="local", tol=0.0), "tol must be"),
    (lambda e: jaxdyn.SphereAttention(e, e, e, 1.0, kernel="local", capacity=0), "capacity"),
    (lambda e: jaxdyn.MultiHeadAttention(e, e, e, 1.0, kernel="local", mask="causal"),
     "without mask"),
    (lambda e: jaxdyn.interaction(jnp.ones((4, 3)), jnp.ones((4, 3)), e, 1.0, kernel="local",
                                  normalization="unnormalized"), "softmax weights only"),
], ids=["hardmax", "tol", "capacity", "causal-heads", "unnormalized"])
def test_bad_local_options_name_the_problem(make, match):
    with pytest.raises(ValueError, match=match):
        make(jnp.eye(3))


def test_the_curve_orders_points_into_compact_leaves():
    # leaves of 64 consecutive points along the cube-map Hilbert curve of 2^15 uniform points
    # on S²: a compact leaf covers 64 / 2^15 of the sphere, a cap of radius ≈ 0.088; the
    # curve's leaves stay within a few times that (a random order's leaves span the sphere)
    x = jnp.asarray(_cloud("uniform", n=2 ** 15), jnp.float32)

    @jax.jit  # one program (op by op, the ordering compiled a hundred small ones)
    def leaves(x):
        order = _local.spatial_order(x)[0]
        return order, _blocks.balls(x[order.perm].reshape(-1, 64, 3)).radius

    order, r = leaves(x)
    r = np.asarray(r)
    assert np.median(r) < 0.15 and np.quantile(r, 0.99) < 0.3
    assert sorted(np.asarray(order.perm)[np.asarray(order.valid)].tolist()) == list(range(2 ** 15))


@pytest.mark.slow  # default counterparts: the certificate tests above at N = 2048
def test_local_at_1e5_uniform_beta_n_in_float32():
    n = 100_000
    x = jaxdyn.sample_sphere(jax.random.PRNGKey(7), n, 3)
    out, st = jax.jit(lambda x: jaxdyn.local_interaction(x, x, jnp.eye(3, dtype=x.dtype),
                                                         float(n), tol=TOL))(x)
    rows = np.random.default_rng(0).choice(n, 200, replace=False)
    xs = np.asarray(x, np.float64)
    ref, _ = _dense64(xs[rows], xs, np.eye(3), float(n))
    err = np.linalg.norm(np.asarray(out, np.float64)[rows] - ref, axis=1)
    assert not bool(st.dense)
    assert float(st.visited) < 0.02
    assert np.max(err) <= TOL + 1e-4  # float32 logits of size 1e5 round at about 1e5 · 6e-8


def test_keys_ordered_by_other_positions_need_self_keys():
    x = jnp.asarray(_cloud("uniform", n=64))
    with pytest.raises(ValueError, match="need self_keys=True"):
        _local.local_attention(x, x, x, kpos=-x)


def test_complex_input_and_one_dimensional_points_are_named():
    """A complex y (its imaginary part would be dropped) and points in d = 1 (the curve orders
    points in d >= 2) are named before compute; kernel='auto' answers d = 1 by the blocked
    kernel."""
    x = np.ones((4, 2)) / np.sqrt(2)
    for fn in (jaxdyn.interaction, jaxdyn.local_interaction):
        with pytest.raises(ValueError, match="y must hold real numbers"):
            fn(x, x.astype(np.complex64), np.eye(2), 2.0)
    x1 = np.ones((3, 1))
    with pytest.raises(ValueError, match="d >= 2"):
        jaxdyn.local_interaction(x1, x1, np.eye(1), 2.0)
    with pytest.raises(ValueError, match="d >= 2"):
        jaxdyn.interaction(x1, x1, np.eye(1), 2.0, kernel="local")
    np.testing.assert_allclose(jaxdyn.interaction(x1, x1, np.eye(1), 2.0, kernel="auto"), x1)
