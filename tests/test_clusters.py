"""Cluster statistics, energies, merge detection and the published step (docs/math.md §F).

Every statistic is checked against an independent brute-force NumPy computation (Python
loops, union–find); the energy against a direct double sum; monotonicity of the energy
along the gradient-flow case; merge detection against a two-point-mass reference whose
merge time is a quadrature of a scalar ODE; the published ``euler_renormalise`` step
against a NumPy re-implementation of its loop and against projected Euler."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import quad

import jaxdyn
from jaxdyn import clusters as C


# ------------------------------------------------------------------ brute force

def bf_pairs(x, thr):
    n = len(x)
    c = sum(1 for i in range(n) for j in range(i + 1, n) if float(np.dot(x[i], x[j])) > thr)
    return c / (n * (n - 1) / 2)


def bf_components(x, delta):
    """Union–find over the edges ⟨x_i, x_j⟩ > 1 − δ; components as sorted lists."""
    n = len(x)
    parent = list(range(n))

    def find(a):
        while parent[a] != a:
            a = parent[a]
        return a

    for i in range(n):
        for j in range(i + 1, n):
            if float(np.dot(x[i], x[j])) > 1.0 - delta:
                ri, rj = find(i), find(j)
                if ri != rj:
                    parent[max(ri, rj)] = min(ri, rj)
    comps = {}
    for i in range(n):
        comps.setdefault(find(i), []).append(i)
    return sorted(comps.values())


def clustered(rng, n, d, k, spread):
    """n points around k random centres on S^{d-1} with angular noise ``spread``."""
    c = rng.normal(size=(k, d))
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    x = c[rng.integers(0, k, n)] + spread * rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def clouds(seed=0, frames=6, n=40, d=3):
    rng = np.random.default_rng(seed)
    return np.stack([clustered(rng, n, d, k=int(rng.integers(1, 7)),
                               spread=float(rng.choice([0.003, 0.01, 0.03, 0.2])))
                     for _ in range(frames)])


# ------------------------------------------------------------------ statistics

def test_pair_fraction_and_counts_match_brute_force():
    xs = clouds(0, frames=8)
    for thr in (0.999, 0.99, 0.9):
        pf = np.asarray(C.pair_fraction(xs, thr))
        pf_self = np.asarray(C.pair_fraction(xs, thr, include_self=True))
        n = xs.shape[1]
        for s in range(len(xs)):
            ref = bf_pairs(xs[s], thr)
            assert pf[s] == ref  # exact: the same count over the same denominator
            assert pf_self[s] == pytest.approx((ref * n * (n - 1) + n) / n**2, abs=1e-15)
    for delta in (1e-4, 1e-3, 1e-2, 0.1):
        cnt = np.asarray(C.cluster_count(xs, delta))
        lab = np.asarray(C.cluster_labels(xs, delta))
        masses = np.asarray(C.cluster_masses(xs, delta))
        centres = np.asarray(C.cluster_centres(xs, delta))
        for s in range(len(xs)):
            comps = bf_components(xs[s], delta)
            assert cnt[s] == len(comps)
            assert sorted(min(c) for c in comps) == sorted(set(lab[s].tolist()))
            for c in comps:
                assert np.all(lab[s][c] == min(c))
            ref_m = sorted((len(c) / n for c in comps), reverse=True)
            np.testing.assert_allclose(masses[s][:len(comps)], ref_m, rtol=0, atol=1e-15)
            assert np.all(masses[s][len(comps):] == 0)
            # centres: each reference centre appears, paired with its mass
            for c in comps:
                v = xs[s][c].sum(0)
                v /= np.linalg.norm(v)
                k = np.argmin(np.linalg.norm(centres[s] - v, axis=1))
                assert np.linalg.norm(centres[s][k] - v) < 1e-12
                assert masses[s][k] == pytest.approx(len(c) / n, abs=1e-15)


def test_gram_rank_is_the_count_on_cliques_and_not_on_chains():
    rng = np.random.default_rng(1)
    # well-separated tight clusters: the threshold graph is a union of cliques
    for k in (1, 2, 3, 5):
        x = clustered(rng, 30, 3, k, spread=1e-4)
        comps = bf_components(x, 1e-4)
        if all(float(np.dot(x[i], x[j])) > 1 - 1e-4 for c in comps for i in c for j in c):
            assert int(C.gram_rank(x, 1 - 1e-4)) == len(comps) == int(C.cluster_count(x, 1e-4))
    # a chain of three points on S^1: 0 ~ 1 ~ 2, 0 ≁ 2 — one component, rank 3
    a = np.array([0.0, 0.012, 0.024])
    x = np.stack([np.cos(a), np.sin(a)], 1)
    assert int(C.cluster_count(x, 1e-4)) == 1
    assert int(C.gram_rank(x, 1 - 1e-4)) == 3


def test_span_dimension():
    rng = np.random.default_rng(2)
    one = clustered(rng, 20, 4, 1, 0.0)
    assert int(C.span_dimension(one)) == 1
    two = np.concatenate([clustered(rng, 10, 4, 1, 0.0), clustered(rng, 10, 4, 1, 0.0)])
    assert int(C.span_dimension(two)) == 2
    assert int(C.span_dimension(rng.normal(size=(50, 4)))) == 4


def test_permutation_invariance():
    xs = clouds(3, frames=8)  # the shape of the brute-force test's clouds: its programs
    perm = np.random.default_rng(0).permutation(xs.shape[1])
    for f in (lambda x: C.pair_fraction(x, 0.999), lambda x: C.cluster_count(x, 1e-3),
              lambda x: C.gram_rank(x), lambda x: C.cluster_masses(x, 1e-3)):
        np.testing.assert_array_equal(np.asarray(f(xs)), np.asarray(f(xs[:, perm])))
    e0 = C.interaction_energy(xs, 3.0)
    np.testing.assert_allclose(np.asarray(e0), np.asarray(C.interaction_energy(xs[:, perm], 3.0)),
                               rtol=1e-14)


def test_batching_and_jit():
    xs = clouds(4, frames=6).reshape(2, 3, 40, 3)
    beta = np.array([[1.0], [5.0]])  # a β per system, broadcast over frames
    e = jax.jit(C.interaction_energy)(xs, beta)
    assert e.shape == (2, 3)
    for a in range(2):
        for s in range(3):
            assert float(e[a, s]) == pytest.approx(float(C.interaction_energy(xs[a, s], beta[a, 0])),
                                                   rel=1e-14)
    cnt = jax.jit(jax.vmap(lambda x: C.cluster_count(x, 1e-3)))(xs)
    np.testing.assert_array_equal(np.asarray(cnt), np.asarray(C.cluster_count(xs, 1e-3)))


@pytest.mark.slow
def test_traced_parameters_under_vmap_and_jit():
    """Thresholds, δ and β traced (vmapped): each member equals the call with that number."""
    xs = clouds(7, frames=4)
    deltas = jnp.asarray([1e-3, 0.05, 0.5])
    counts = jax.vmap(lambda d: C.cluster_count(xs, d))(deltas)
    fracs = jax.vmap(lambda t: C.pair_fraction(xs, t))(1 - deltas)
    ranks = jax.jit(jax.vmap(lambda t: C.gram_rank(xs, t)))(1 - deltas)
    masses = jax.vmap(lambda d: C.cluster_masses(xs, d))(deltas)
    energies = jax.vmap(lambda b: C.log_partition_energy(xs, b))(jnp.asarray([0.5, 4.0]))
    for i, d in enumerate(np.asarray(deltas)):
        np.testing.assert_array_equal(np.asarray(counts[i]), np.asarray(C.cluster_count(xs, float(d))))
        np.testing.assert_array_equal(np.asarray(fracs[i]), np.asarray(C.pair_fraction(xs, float(1 - d))))
        np.testing.assert_array_equal(np.asarray(ranks[i]), np.asarray(C.gram_rank(xs, float(1 - d))))
        np.testing.assert_array_equal(np.asarray(masses[i]), np.asarray(C.cluster_masses(xs, float(d))))
    for i, b in enumerate((0.5, 4.0)):
        np.testing.assert_allclose(np.asarray(energies[i]), np.asarray(C.log_partition_energy(xs, b)),
                                   rtol=1e-14)
    assert len(set(np.asarray(counts).sum(1).tolist())) > 1  # the δ matter
    levels = jnp.asarray([1, 2])
    ts = jnp.arange(4.0)
    hit = jax.vmap(lambda c: C.hitting_times(ts, c, levels))(counts)
    np.testing.assert_array_equal(np.asarray(hit[1]), np.asarray(C.hitting_times(ts, counts[1], levels)))
    with pytest.raises(ValueError, match="hitting_times"):
        jax.jit(lambda c: C.merge_events(ts, c).times)(counts[0])


def test_energy_gradients_match_finite_differences():
    rng = np.random.default_rng(11)
    x = jnp.asarray(clustered(rng, 9, 3, 2, 0.4))
    B = jnp.asarray(rng.normal(size=(3, 3)))
    d = jnp.asarray(rng.normal(size=x.shape))
    for fn in (C.interaction_energy, C.log_partition_energy):
        gx, gb = jax.jit(jax.grad(lambda x, b: fn(x, b, B), argnums=(0, 1)))(x, 1.7)
        h = 1e-5
        fd_b = (fn(x, 1.7 + h, B) - fn(x, 1.7 - h, B)) / (2 * h)
        fd_x = (fn(x + h * d, 1.7, B) - fn(x - h * d, 1.7, B)) / (2 * h)
        assert float(gb) == pytest.approx(float(fd_b), rel=1e-6)
        assert float(jnp.sum(gx * d)) == pytest.approx(float(fd_x), rel=1e-6)


# ------------------------------------------------------------------ energies

def test_energies_against_direct_sums():
    rng = np.random.default_rng(5)
    x = clustered(rng, 17, 3, 3, 0.3)
    B = rng.normal(size=(3, 3))
    beta = 2.5
    n = len(x)
    direct = sum(math.exp(beta * x[i] @ B @ x[j]) for i in range(n) for j in range(n)) / (2 * beta * n * n)
    assert float(C.interaction_energy(x, beta, B)) == pytest.approx(direct, rel=1e-12)
    lp = sum(math.log(sum(math.exp(beta * x[i] @ B @ x[j]) for j in range(n)) / n)
             for i in range(n)) / (beta * n)
    assert float(C.log_partition_energy(x, beta, B)) == pytest.approx(lp, rel=1e-12)
    # Q, K form: ⟨Q x_i, K x_j⟩ = x_iᵀ QᵀK x_j
    Q, K = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    direct = sum(math.exp(beta * (Q @ x[i]) @ (K @ x[j])) for i in range(n)
                 for j in range(n)) / (2 * beta * n * n)
    assert float(C.interaction_energy(x, beta, Q.T @ K)) == pytest.approx(direct, rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("normalization", ["unnormalized", "softmax"])
def test_energy_nondecreasing_along_gradient_flow(normalization):
    """V = B = QᵀK symmetric (indefinite here): USA is N × the gradient flow of E_β, SA its
    flow in a metric weighted by Z_i/N² (§F.3); E_β(t) must not decrease."""
    rng = np.random.default_rng(6)
    S = rng.normal(size=(3, 3))
    Bm = (S + S.T) / 2
    Q, K, V = np.eye(3), Bm, Bm
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 24, 3, dtype=jnp.float64)
    m = jaxdyn.SphereAttention(Q, K, V, 2.0, normalization=normalization)
    tr = jaxdyn.simulate(m, x0, t1=6.0, dt=0.01, method="rk4", save_every=5)
    e = np.asarray(C.interaction_energy(tr.xs, 2.0, m.B))
    assert np.all(np.diff(e) >= -1e-13 * np.abs(e[1:]))
    assert e[-1] > e[0] * 1.01  # it moves


# ------------------------------------------------------------------ merges

def two_masses_merge_time(n1, n2, beta, theta0, delta):
    """Two point masses on S¹ (Q = K = V = I): their angle θ obeys θ' = −g(θ),
    g = sinθ e^{βcosθ} (n2/(n1 e^β + n2 e^{βcosθ}) + n1/(n2 e^β + n1 e^{βcosθ})).
    The graph joins them when cosθ > 1 − δ: t* = ∫_{θ*}^{θ0} dθ/g(θ), θ* = arccos(1 − δ)."""
    def g(th):
        e, c = math.exp(beta), math.exp(beta * math.cos(th))
        return math.sin(th) * c * (n2 / (n1 * e + n2 * c) + n1 / (n2 * e + n1 * c))

    t, err = quad(lambda th: 1.0 / g(th), math.acos(1 - delta), theta0, epsabs=1e-13, epsrel=1e-13)
    assert err < 1e-10
    return t


@pytest.mark.slow
def test_merge_time_of_two_point_masses_within_one_save_interval():
    n1, n2, beta, theta0, delta = 3, 5, 1.0, 2.0, 1e-3
    t_star = two_masses_merge_time(n1, n2, beta, theta0, delta)
    ang = np.array([0.0] * n1 + [theta0] * n2) + 0.3
    x0 = np.stack([np.cos(ang), np.sin(ang)], 1)
    m = jaxdyn.SphereAttention(np.eye(2), np.eye(2), np.eye(2), beta)
    perm = np.random.default_rng(0).permutation(n1 + n2)
    for se in (1, 25, 60):
        tr = jaxdyn.simulate(m, jnp.asarray(x0), t1=12.0, dt=0.01, method="rk4", save_every=se)
        counts = np.asarray(C.cluster_count(tr.xs, delta))
        ev = C.merge_events(np.asarray(tr.ts), counts)
        assert list(ev.from_count) == [2] and list(ev.to_count) == [1]
        assert ev.before[0] < t_star <= ev.times[0], (se, ev, t_star)
        assert ev.times[0] - ev.before[0] == pytest.approx(se * 0.01)
        assert ev.plateau_length[0] == pytest.approx(ev.times[0])
        hit = np.asarray(C.hitting_times(tr.ts, counts, [1, 2]))
        assert hit[0] == ev.times[0] and hit[1] == 0.0
        if se != 25:
            continue
        # permuting the particles permutes the trajectory: the same counts and events
        trp = jaxdyn.simulate(m, jnp.asarray(x0[perm]), t1=12.0, dt=0.01, method="rk4",
                              save_every=se)
        np.testing.assert_array_equal(np.asarray(C.cluster_count(trp.xs, delta)), counts)


def test_merge_events_and_plateaus_on_a_given_count_sequence():
    ts = np.arange(9) * 0.5
    counts = np.array([5, 5, 4, 4, 4, 5, 3, 3, 1])
    ev = C.merge_events(ts, counts)  # the flicker 4 → 5 is ignored (running minimum)
    np.testing.assert_array_equal(ev.times, [1.0, 3.0, 4.0])
    np.testing.assert_array_equal(ev.before, [0.5, 2.5, 3.5])
    np.testing.assert_array_equal(ev.from_count, [5, 4, 3])
    np.testing.assert_array_equal(ev.to_count, [4, 3, 1])
    np.testing.assert_array_equal(ev.plateau_counts, [5, 4, 3, 1])
    np.testing.assert_array_equal(ev.plateau_length, [1.0, 2.0, 1.0, 0.0])
    raw = C.merge_events(ts, counts, monotone=False)
    np.testing.assert_array_equal(raw.times, [1.0, 3.0, 4.0])  # 5 → 3 from the flicker
    np.testing.assert_array_equal(raw.from_count, [5, 5, 3])
    hit = np.asarray(C.hitting_times(ts, counts, [4, 2, 1, 0]))
    np.testing.assert_array_equal(hit, [1.0, 4.0, 4.0, np.inf])
    with pytest.raises(ValueError, match="increasing"):
        C.merge_events(ts[::-1], counts)


# ------------------------------------------------------------------ the published step

def numpy_rotf_step_loop(x, beta, h, steps):
    """x ← normalise(x + h softmax(β x xᵀ) x), Q = K = V = I: the loop of the published
    phase-diagram script, written independently here in NumPy (float64)."""
    for _ in range(steps):
        logits = beta * x @ x.T
        w = np.exp(logits - logits.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        x = x + h * (w @ x)
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    return x


@pytest.mark.slow
def test_euler_renormalise_is_the_published_step_in_both_drivers():
    I = np.eye(2)
    betas = (0.5, 2.0, 9.0)
    keys = jax.random.split(jax.random.PRNGKey(3), len(betas))
    x0 = jax.vmap(lambda k: jaxdyn.sample_sphere(k, 32, 2, dtype=jnp.float64))(keys)
    ms = jaxdyn.stack_models([jaxdyn.SphereAttention(I, I, I, b) for b in betas])
    ens = jaxdyn.simulate_ensemble(ms, x0, t1=5.0, dt=0.1, method="euler_renormalise",
                                   save_every=50)
    vm = jax.vmap(lambda m, x: jaxdyn.simulate(m, x, t1=5.0, dt=0.1, method="euler_renormalise",
                                               save_every=50).xs)(ms, x0)
    for i, b in enumerate(betas):
        ref = numpy_rotf_step_loop(np.asarray(x0[i]), b, 0.1, 50)
        np.testing.assert_allclose(np.asarray(vm[i, -1]), ref, rtol=0, atol=1e-13)
        np.testing.assert_allclose(np.asarray(ens.xs[i, -1]), ref, rtol=0, atol=1e-13)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(ens.xs), axis=-1), 1.0, atol=1e-14)


@pytest.mark.slow
def test_euler_renormalise_local_difference_and_order():
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(4), 16, 3, dtype=jnp.float64)
    rng = np.random.default_rng(7)
    Q, K, V = (rng.normal(size=(3, 3)) for _ in range(3))
    m = jaxdyn.SphereAttention(Q, K, V, 1.5)
    ren, proj = jaxdyn.integrators.EulerRenormalise(), jaxdyn.integrators.ProjectedEuler()
    step = jaxdyn.integrators.scheme_step  # one step of a scheme on the model
    hs = [0.04, 0.02, 0.01, 0.005]
    diffs = [float(jnp.max(jnp.abs(step(ren, m, 0.0, x0, h) - step(proj, m, 0.0, x0, h))))
             for h in hs]
    slopes = np.diff(np.log(diffs)) / np.diff(np.log(hs))
    assert np.all(np.abs(slopes - 2.0) < 0.1), slopes  # one step: O(h²) apart
    ref = jaxdyn.simulate(m, x0, t1=1.0, dt=1e-3, method="rk4", save_every=1000).xs[-1]
    errs = [float(jnp.max(jnp.abs(jaxdyn.simulate(m, x0, t1=1.0, dt=h, method="euler_renormalise",
                                                  save_every=round(1 / h)).xs[-1] - ref)))
            for h in hs]
    slopes = np.diff(np.log(errs)) / np.diff(np.log(hs))
    assert np.all(np.abs(slopes - 1.0) < 0.15), slopes  # order 1
    xs = jaxdyn.simulate(m, x0, t1=1.0, dt=0.04, method="euler_renormalise", save_every=1).xs
    np.testing.assert_allclose(np.linalg.norm(np.asarray(xs), axis=-1), 1.0, atol=1e-14)


def test_euler_renormalise_needs_an_ambient_field():
    class Tangent(jaxdyn.SphereAttention):
        ambient = None

    m = Tangent(np.eye(2), np.eye(2), np.eye(2), 1.0)
    x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 4, 2, dtype=jnp.float64)
    with pytest.raises(ValueError, match="ambient"):
        jaxdyn.simulate(m, x0, t1=0.1, dt=0.1, method="euler_renormalise")


def test_euler_renormalise_is_projected_euler_with_a_rescaled_step():
    """x + h a = (1 + h s)(x + h/(1 + h s) P⊥a), s = ⟨x, a⟩ (docs/math.md §F.4)."""
    x = jaxdyn.sample_sphere(jax.random.PRNGKey(5), 20, 3, dtype=jnp.float64)
    rng = np.random.default_rng(8)
    m = jaxdyn.SphereAttention(*(rng.normal(size=(3, 3)) for _ in range(3)), 3.0)
    h = 0.1
    a = m.ambient(0.0, x)
    s = jnp.sum(x * a, axis=-1, keepdims=True)
    p = m(0.0, x)
    np.testing.assert_allclose(np.asarray(p), np.asarray(a - s * x), atol=1e-15)
    hi = h / (1 + h * s)
    ref = jaxdyn.normalize(x + hi * p)
    got = jaxdyn.integrators.scheme_step(jaxdyn.integrators.EulerRenormalise(), m, 0.0, x, h)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=0, atol=2e-15)


def test_component_count_above_the_closure_size_uses_label_propagation():
    """N > CLOSURE_MAX_PARTICLES takes the while-loop labelling: same answer as brute force."""
    rng = np.random.default_rng(9)
    n = C.CLOSURE_MAX_PARTICLES + 44
    x = clustered(rng, n, 3, 7, spread=0.02)
    comps = bf_components(x, 2e-3)
    assert int(C.cluster_count(x, 2e-3)) == len(comps)
    lab = np.asarray(C.cluster_labels(x, 2e-3))
    for c in comps:
        assert np.all(lab[c] == min(c))


@pytest.mark.slow  # a whole CLI experiment with a movie; the statistics themselves are tested by default
def test_sphere_kind_records_cluster_statistics_and_writes_a_movie(tmp_path):
    """``cluster_stats: true`` writes the per-frame statistics (equal to jaxdyn.clusters on
    the saved snapshots), the heat maps, and ``jaxdyn report --movie`` an animation."""
    from jaxdyn import cli

    cfg = tmp_path / "pd.yaml"
    cfg.write_text(
        "kind: sphere\nname: pd\nd: 2\nn: 8\nt1: 2.0\ndt: 0.1\nmethod: euler_renormalise\n"
        "save_every: 5\ndtype: float64\nweights: {ensemble: identity}\n"
        "snapshots: [0.0, 0.5, 1.0, 1.5, 2.0]\ncluster_stats: true\n"
        "sweep:\n  beta: [1.0, 5.0]\n  seed: {range: [0, 3]}\n")
    out = tmp_path / "out"
    assert cli.main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    ds = jaxdyn.open_results(out)
    for v in ("pair_fraction", "cluster_count", "gram_rank", "energy"):
        assert ds[v].dims == ("beta", "seed", "t")
    xs = ds["x_snapshot"].values  # (beta, seed, S, N, d): every saved frame here
    np.testing.assert_array_equal(ds["cluster_count"].values, np.asarray(C.cluster_count(xs, 1e-4)))
    np.testing.assert_array_equal(ds["pair_fraction"].values, np.asarray(C.pair_fraction(xs, 0.999)))
    beta = ds["beta"].values[:, None, None]
    np.testing.assert_allclose(ds["energy"].values, np.asarray(C.interaction_energy(xs, beta)),
                               rtol=1e-13)
    assert (out / "phase_diagram.png").exists()
    assert cli.main(["report", str(out), "--movie"]) == 0
    assert (out / "movie.gif").stat().st_size > 0


def test_particle_movie_on_s2_and_the_mp4_fallback(tmp_path):
    from jaxdyn import plots

    x = np.random.default_rng(0).normal(size=(3, 20, 3))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    p = plots.particle_movie(x, np.arange(3.0), tmp_path / "s2.gif")
    assert p.suffix == ".gif" and p.stat().st_size > 0
    p = plots.particle_movie(x, np.arange(3.0), tmp_path / "s2.mp4")  # gif without ffmpeg
    assert p.exists() and p.suffix in (".mp4", ".gif")
    with pytest.raises(ValueError, match="shape"):
        plots.particle_movie(x[0], np.arange(3.0), tmp_path / "bad.gif")
